"""Errors raised by the converter, one class per thing a user can get wrong.

Every error carries the offending path or value and says what to do; the CLI prints ``str(error)``
as a one-line message, never a traceback. Names from a tree or a dataset go into a message through
:func:`printable`: a terminal escape code in a directory name is shown, not obeyed.
"""

from __future__ import annotations

__all__ = [
    "DestinationError",
    "EngineError",
    "ImgshardsError",
    "ManifestError",
    "PackError",
    "ShardEndError",
    "ShardFormatError",
    "SourceError",
    "SplitFileError",
    "UnreadableSamplesError",
    "UnsafeFileError",
    "printable",
]


def printable(text: str) -> str:
    """``text`` safe to print on a terminal: control characters (escape codes) and undecodable bytes escaped.

    An ESC character comes out as the four characters of its escape; printable text, backslashes
    included, is unchanged, so escaping twice changes nothing more.
    """
    if text.isprintable():
        return text
    return "".join(
        c if c.isprintable() else c.encode("unicode_escape", "backslashreplace").decode() for c in text
    )


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


class ShardFormatError(ImgshardsError):
    """A shard is not a tar imgshards reads: cut short, a bad header, a sparse member, a NUL in a name.

    ``index`` refuses such a shard, ``verify`` reports it, and the loader reads the samples before the
    damage and counts the rest as lost.
    """


class ShardEndError(ShardFormatError):
    """A tar member declares more bytes than its shard has left (a shard cut short, or a hostile size)."""

    def __init__(self, message: str, *, member: str, declared: int) -> None:
        super().__init__(message)
        self.member, self.declared = member, declared


class EngineError(ImgshardsError):
    """``pack --engine ray`` cannot run: Ray is missing, no cluster answers, or a node's libraries differ."""
