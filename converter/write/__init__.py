"""Write the shards: each atomically, resumably, under the destination's lock.

    shard        one shard task: gather its files, check them, write the tar and its record
    attempts     each attempt at a shard under a temporary name of its own
    safefs       file operations that stay inside the destination: atomic writes, no links followed
    destination  the destination's state: its lock, plan, records, rejects and index writes
    indexurl     an index written at a URL: its table files, ``_info.json``, then ``index.json``
    resume       which shards of an earlier run are still good (their files' digests)
    failures     what ``pack`` says when it stops for a reason outside the tree (disk full...)

Import each module by its name: this package re-exports nothing.
"""
