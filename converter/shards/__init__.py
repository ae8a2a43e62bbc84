"""Shards already written: index them, verify them.

    index   index shards made elsewhere (a directory or a URL of WebDataset tars): the index.json
    read    read each shard once, hashed and counted, in parallel: what ``index`` records
    verify  read the shards an index names again and compare them with it: sizes, hashes, samples

Import each module by its name: this package re-exports nothing.
"""
