"""Remote destinations: a pack and a verify at a URL (``s3://``, ``gs://``, any fsspec file system).

    upload    pack_to_url (a local pack into staging, each shard uploaded as it is committed) and
              verify_url

An index at a URL is written by :mod:`..write.indexurl`, which ``index`` uses too.

Import each module by its name: this package re-exports nothing.
"""
