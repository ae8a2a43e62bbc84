"""Errors raised by the loader, each carrying the bad value or the sample it is about.

They subclass :class:`imgshards.converter.errors.ImgshardsError`, so ``except ImgshardsError`` catches
every problem imgshards reports. A missing shard or a bad index is the converter's
:class:`~imgshards.converter.errors.ManifestError`, raised when a :class:`ShardDataset` is built.
"""

from __future__ import annotations

import errno

from imgshards.converter.errors import ImgshardsError, ManifestError

__all__ = [
    "ConfigError",
    "CorruptImageError",
    "ImageShapeError",
    "LoaderTimeoutError",
    "ManifestError",
    "ResourceLimitError",
    "ResumeError",
    "ShardAccessError",
    "ShardReadError",
    "WorkerError",
    "check_choice",
]


class ConfigError(ImgshardsError, ValueError):
    """A loader argument is out of range or not one of the allowed values (the message lists them)."""


class CorruptImageError(ImgshardsError):
    """A sample in a shard is unusable: its image does not decode or is refused, or its label is bad.

    Its image does not decode or the transform refuses it, or its label is not one of the classes.
    Raised with ``on_error="raise"``, else skipped and counted.

    Built from one message string (:meth:`for_sample` writes it), so a DataLoader can re-raise it
    in the main process as this class.
    """

    def __init__(self, message: str, *, key: str | None = None, shard: str | None = None) -> None:
        super().__init__(message)
        self.key, self.shard = key, shard

    @classmethod
    def for_sample(cls, key: str, shard: str, reason: str) -> CorruptImageError:
        """Return the error for sample ``key`` of ``shard``, ``reason`` being the decoder's complaint."""
        return cls(
            f"image {key!r} in shard {shard} does not decode ({reason}); "
            'pass on_error="skip" to skip such images, or re-pack with the default checks',
            key=key,
            shard=shard,
        )

    @classmethod
    def for_transform(cls, key: str, shard: str, reason: str) -> CorruptImageError:
        """Return the error for sample ``key`` of ``shard`` that the transform refused for ``reason``."""
        return cls(
            f"image {key!r} in shard {shard} is refused by the transform ({reason}); "
            'pass on_error="skip" to skip such images',
            key=key,
            shard=shard,
        )


class ImageShapeError(ImgshardsError, ValueError):
    """A preset refuses an image whose shape would make its work unbounded (the message says why).

    The eval preset resizes the whole image before its centre crop: a valid 17 KB JPEG of 65500x1
    pixels would be resized to 16,768,000x256 (12.9 GB). In a :class:`~imgshards.loader.ShardDataset`
    it becomes a :class:`CorruptImageError` for the sample: skipped and counted, or raised.
    """


class LoaderTimeoutError(ImgshardsError, TimeoutError):
    """No batch came from the DataLoader workers within ``make_loader(timeout=...)`` seconds."""


class WorkerError(ImgshardsError, RuntimeError):
    """A DataLoader worker ended (killed, crashed, exited) or could not start; the message says why."""


class ResumeError(ImgshardsError):
    """A loader state does not fit this loader (other world size, worker count, batch size, seed...)."""


class ShardReadError(ImgshardsError, OSError):
    """A remote shard could not be read: a permanent error, or a transient one that outlasted the retries.

    Raised with ``on_error="raise"``; with ``on_error="skip"`` the rest of the shard is skipped, counted
    and warned about. Built from one message string, so a DataLoader can re-raise it in the main process.
    """

    def __init__(self, message: str, *, shard: str | None = None) -> None:
        super().__init__(message)
        self.shard = shard


class ShardAccessError(ShardReadError):
    """A listed shard cannot be read for a cause that neither retrying nor skipping mends.

    No credentials, no permission (401, 403), not found (404, a local file gone), or the object
    replaced on the server while the pass read it. Raised at once, whatever ``on_error`` says, by
    the first worker that meets it: one line naming the shard, the cause and the fix.
    """


class ResourceLimitError(ShardAccessError):
    """A shard could not be opened, mapped or read because the process ran out of a resource.

    Out of file descriptors (``EMFILE``, ``ENFILE``) or memory (``ENOMEM``, ``MemoryError``): a
    setting to fix (``ulimit -n``, the workers' memory), not damage, so it is raised at once whatever
    ``on_error`` says instead of being counted as an unreadable shard.
    """

    @classmethod
    def of(cls, error: BaseException, *, path: str, shard: str) -> ResourceLimitError | None:
        """The error to raise for ``error`` met on ``shard`` (at ``path``) if it is running out; else None."""
        if isinstance(error, MemoryError):
            cause = "out of memory"
        elif isinstance(error, OSError) and error.errno in _OUT_OF:
            cause = f"{error.strerror or error} ({_OUT_OF[error.errno]})"
        else:
            return None
        try:
            import resource  # not on Windows

            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            limit = f"the soft limit of open files is {soft}; "
        except (ImportError, OSError, ValueError):
            limit = ""
        return cls(
            f"cannot read shard {path}: {cause}; {limit}raise it (ulimit -n), give the workers more "
            "memory, or use fewer workers: this is a setting, not a damaged shard",
            shard=shard,
        )


_OUT_OF = {
    errno.EMFILE: "this process has no file descriptor left",
    errno.ENFILE: "the system has no file descriptor left",
    errno.ENOMEM: "out of memory",
}


def check_choice(name: str, value: object, allowed: tuple[str, ...]) -> None:
    """Raise ConfigError naming ``name``, ``value`` and the allowed values unless ``value`` is one.

    The loader's arguments are checked when a dataset is built: a typo fails there, naming the choices.
    """
    if value not in allowed:
        raise ConfigError(f"unknown {name} {value!r}; expected one of {list(allowed)}")
