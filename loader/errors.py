"""Errors raised by the loader, each carrying the bad value or the sample it is about.

They subclass :class:`imgshards.converter.format.errors.ImgshardsError`, so ``except ImgshardsError`` catches
every problem imgshards reports. A missing shard or a bad index is the converter's
:class:`~imgshards.converter.format.errors.ManifestError`, raised when a :class:`ShardDataset` is built.
"""

from __future__ import annotations

import errno

from imgshards.converter.format.errors import ImgshardsError, ManifestError

__all__ = [
    "BatchingError",
    "ConfigError",
    "CorruptImageError",
    "DatasetNotFoundError",
    "ImageShapeError",
    "LoaderTimeoutError",
    "ManifestError",
    "ResourceLimitError",
    "ResumeError",
    "SettingFixedError",
    "ShardAccessError",
    "ShardReadError",
    "WorkerError",
    "check_choice",
]


class ConfigError(ImgshardsError, ValueError):
    """A loader argument is out of range or not one of the allowed values (the message lists them)."""


class DatasetNotFoundError(ManifestError, FileNotFoundError):
    """No packed dataset, or no such split, at the path given: a ``FileNotFoundError``, as torchvision's."""


class SettingFixedError(ConfigError, AttributeError):
    """A dataset's setting set after the dataset was made: settings are fixed (make a new dataset).

    Also raised for a new attribute whose name is one slip from a setting's (``ds.shufle = True``:
    the message names ``shuffle``), which nothing would read (``PassDataset._slip`` says the rule).
    Also an ``AttributeError``, as setting any read-only attribute is in Python: code that tries
    ``setattr`` and falls back on ``AttributeError`` (a framework probing a dataset) goes on as it would.
    """


class BatchingError(ConfigError):
    """A ``DataLoader`` batches again what a dataset of imgshards already batched (``batch_size=N``).

    Raised in a DataLoader worker, and re-raised by the DataLoader in the training process with the
    worker's traceback in its message: this class keeps only its own line, which names the fix.
    """

    def __init__(self, message: str) -> None:
        if message.startswith("Caught ") and "\nOriginal Traceback" in message:
            last = message.rstrip().rsplit("\n", 1)[-1]  # "imgshards.loader.errors.BatchingError: ..."
            message = last.partition(": ")[2] or message
        super().__init__(message)


class CorruptImageError(ImgshardsError):
    """A sample in a shard is unusable: its image does not decode or is refused, or its label is bad.

    Its image does not decode or the transform refuses it, or its label is not one of the classes.
    Raised with ``on_error="raise"``, else skipped and counted: then :meth:`skipped` is the warning,
    which gives no advice about ``on_error``. :meth:`named` names the file the sample was packed
    from (its ``.json`` says), where the message named only its key.

    Built from one message string (:meth:`for_sample` writes it), so a DataLoader can re-raise it
    in the main process as this class.
    """

    def __init__(
        self,
        message: str,
        *,
        key: str | None = None,
        shard: str | None = None,
        problem: str | None = None,
        remedy: str = "",
        path: str | None = None,
        noun: str = "image",
    ) -> None:
        super().__init__(message)
        self.key, self.shard, self.path = key, shard, path
        # The parts of the message: what the sample is called, what is wrong, what fixes the data.
        self.noun, self.problem, self.remedy = noun, problem, remedy

    @classmethod
    def about(
        cls,
        key: str,
        shard: str,
        problem: str,
        remedy: str = "",
        *,
        path: str | None = None,
        noun: str = "image",
    ) -> CorruptImageError:
        """The error for the ``noun`` ``key`` of ``shard`` (packed from ``path``), which ``problem``s.

        ``problem`` follows the subject ("does not decode (...)"); ``remedy``: what fixes the data.
        """
        advice = f'pass on_error="skip" to skip such {noun}s{", or " + remedy if remedy else ""}'
        return cls(
            f"{_subject(noun, key, shard, path)} {problem}; {advice}",
            key=key,
            shard=shard,
            problem=problem,
            remedy=remedy,
            path=path,
            noun=noun,
        )

    @classmethod
    def for_sample(cls, key: str, shard: str, reason: str) -> CorruptImageError:
        """Return the error for sample ``key`` of ``shard``, ``reason`` being the decoder's complaint."""
        return cls.about(key, shard, f"does not decode ({reason})", "re-pack with the default checks")

    @classmethod
    def for_transform(cls, key: str, shard: str, reason: str) -> CorruptImageError:
        """Return the error for sample ``key`` of ``shard`` that the transform refused for ``reason``."""
        return cls.about(key, shard, f"is refused by the transform ({reason})")

    def named(self, path: str | None) -> CorruptImageError:
        """The same error naming the source file ``path`` too (itself if ``path`` is None or it cannot)."""
        if path is None or self.problem is None or self.key is None or self.shard is None:
            return self
        return self.about(self.key, self.shard, self.problem, self.remedy, path=path, noun=self.noun)

    def skipped(self) -> str:
        """The warning for this sample skipped with ``on_error="skip"`` (in force: no advice to pass it)."""
        if self.problem is None or self.key is None or self.shard is None:
            return f"skipped: {self}"
        remedy = f"; {self.remedy}" if self.remedy else ""
        return f"skipped {_subject(self.noun, self.key, self.shard, self.path)}, which {self.problem}{remedy}"


def _subject(noun: str, key: str, shard: str, path: str | None) -> str:
    """How a message names a sample: by the file it was packed from if known, and by key and shard."""
    if path is None:
        return f"{noun} {key!r} in shard {shard}"
    return f"{noun} {path} (sample {key!r} in shard {shard})"


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
