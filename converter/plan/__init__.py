"""Plan the splits and shards: which sample goes to which split, shard and task, before a byte is written.

    splits      the split of a tree into parts: whole, stratified by a seed, or by a split file
    shards      the shard plan of a part: a seeded shuffle, shards closed by size; shard names
    tasks       a part's plan as shard tasks for the engines
    resizehint  whether the images are much larger than training needs (a sampled hint)
    dryrun      the plan shown without writing: what ``pack --dry-run`` prints

Import each module by its name: this package re-exports nothing.
"""
