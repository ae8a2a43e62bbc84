"""Engines: where ``pack``'s shard tasks run.

    engine     the Engine protocol, the engine names (ENGINES) and make_engine; the local PoolEngine
    pool       the local process pool: its workers, their count, the shared progress counter
    rayengine  Ray Core tasks across a cluster's machines (imported only when ``engine="ray"``)

Import each module by its name: this package re-exports nothing.
"""
