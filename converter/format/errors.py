"""Errors raised by the converter, one class per thing a user can get wrong.

Every error carries the offending path or value and says what to do; the CLI prints ``str(error)``
as a one-line message, never a traceback. Names from a tree or a dataset (a path, a class, a split,
a key) go into a message through :func:`shown`: a terminal escape code in a directory name is shown,
not obeyed, and a name of a million characters is cut to its ends and its length.
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
    "shown",
]


# What a long value keeps of its start and its end (a name may be 10 MB). A path a person may copy
# from a message (a command to run) is seldom over 256 characters, so those are shown whole.
_HEAD, _TAIL = 190, 63
MOST_SHOWN = _HEAD + _TAIL + 3  # "..." between them


def shown(value: object, *, quoted: bool = False, most: int | None = MOST_SHOWN) -> str:
    r"""``value`` as a person may read it on a terminal: the one way an untrusted name is shown.

    Control characters (ESC, CR, BEL...), bidi controls (U+202E) and undecodable bytes (surrogates)
    come out as their Python escapes (``\x1b``, ``\u202e``), so a folder name cannot clear the
    screen, rewrite the line or reverse what is read; printable text, backslashes included, is
    unchanged. A value over ``most`` characters is cut to its start and end with its length:
    ``aaaa...zzzz (10,000,000 characters)``.

    Args:
        value: A path, class, split or key (anything else is shown as its ``str``).
        quoted: Put the shown text between single quotes (sample keys: ``sample '00042'``).
        most: The longest value shown whole; ``None`` never cuts (a whole message of shown parts).

    """
    text = value if isinstance(value, str) else str(value)
    if most is not None and len(text) > most:
        head, tail = max(1, most * _HEAD // MOST_SHOWN), max(1, most * _TAIL // MOST_SHOWN)
        out = f"{_escaped(text[:head])}...{_escaped(text[-tail:])}"
        note = f" ({len(text):,} characters)"
    else:
        out, note = _escaped(text), ""
    return f"'{out}'{note}" if quoted else out + note


def _escaped(text: str) -> str:
    if text.isprintable():  # letters, digits, punctuation, spaces: nothing to escape
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
