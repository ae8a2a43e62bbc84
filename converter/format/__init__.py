"""The packed format: the one contract between the converter (which writes it) and the loader.

Both halves import these modules, and they import nothing else of the converter, so a change to
packing cannot break the loader's import (``tests/test_layout.py`` checks both)::

    manifest      index.json: Manifest, SplitInfo, ShardInfo, read_manifest
    validate      what an index may say (names, counts, bounds); opening a dataset's files
    tables        a shard's tables of starts, labels, keys and sources
    labels        what a label member holds
    imagesizes    the sizes of a split's images, as the index records them
    tarstream     the one tar member parser
    tarsamples    samples out of a tar's members, and what makes one unusable
    tarwriter     the deterministic ustar writer
    headers       an image's size from its header; the pixel bound
    imageformats  the table of image formats
    formats       one image format per split: conversions, EXIF orientation
    protocols     the table of storage protocols
    locate        where a dataset is: a path or a URL, its index.json
    remotefs      a URL's file system: timeouts, retries, atomic uploads
    errors        the errors both halves raise

Import each module by its name (``from imgshards.converter.format.manifest import read_manifest``):
this package re-exports nothing, so importing one module loads only what that module needs.
"""
