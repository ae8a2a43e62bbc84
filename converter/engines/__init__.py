"""Engines: where ``pack``'s shard tasks run.

    engine     the Engine protocol and make_engine (the names: config.ENGINES); the local PoolEngine
    pool       the local process pool: its workers, their count, the shared progress counter
    rayengine  Ray Core tasks across a cluster's machines (imported only when ``engine="ray"``)

Import each module by its name: this package re-exports nothing.
"""
