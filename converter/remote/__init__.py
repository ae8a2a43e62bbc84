"""Remote destinations: a pack, a verify and an index at a URL (``s3://``, ``gs://``, any fsspec file system).

    upload    pack_to_url (a local pack into staging, each shard uploaded as it is committed) and
              verify_url
    indexurl  write_index_url: ``_info.json``, then ``index.json``, at a URL

Import each module by its name: this package re-exports nothing.
"""
