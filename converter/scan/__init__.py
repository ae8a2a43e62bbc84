"""Scan the tree: the pack's first stage, from an ImageFolder tree to a table of its images.

    tree         walk the tree: ScanResult (paths, labels, sizes), the rejects and the warnings
    check        how far a source image is checked (Check) and why one is rejected (Reason)
    sourcefiles  reading a source file: bounded, regular files only, and why a read failed
    readorder    the order the files are read in (disk order or the plan's)

Import each module by its name: this package re-exports nothing.
"""
