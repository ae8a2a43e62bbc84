"""Errors raised by the converter, one class per thing a user can get wrong.

Every error carries the offending path or value and says what to do; the CLI prints ``str(error)``
as a one-line message, never a traceback.
"""

from __future__ import annotations

__all__ = [
    "DestinationError",
    "EngineError",
    "ImgshardsError",
    "ManifestError",
    "PackError",
    "SourceError",
    "SplitFileError",
    "UnreadableSamplesError",
    "UnsafeFileError",
]


class ImgshardsError(Exception):
    """Base class of every error imgshards raises for bad input or a bad state on disk."""


class SourceError(ImgshardsError):
    """The ImageFolder tree to pack is missing, unreadable, or has no usable classes."""


class UnreadableSamplesError(SourceError):
    """Shards to index hold samples the loader cannot read: no image, no label, or a damaged tar."""


class DestinationError(ImgshardsError):
    """The output directory holds something that conflicts with the requested pack."""


class ManifestError(ImgshardsError):
    """The index file is missing, unreadable, of an unknown version, or names a shard that is absent."""


class SplitFileError(ImgshardsError):
    """The ``--split-file`` is unreadable, malformed, or names files the tree does not have."""


class UnsafeFileError(ImgshardsError, OSError):
    """A dataset's index or shard is not a regular file (FIFO, device, directory) or links out of its root."""


class PackError(ImgshardsError):
    """``pack`` could not finish (the disk is full, a worker process died); rerunning it resumes."""


class EngineError(ImgshardsError):
    """``pack --engine ray`` cannot run: Ray is missing, no cluster answers, or a node's libraries differ."""
