"""Read a run of samples from one tar shard as raw (undecoded) bytes, on webdataset's tar iteration.

webdataset's ``tar_file_iterator`` + ``group_by_keys`` do the reading; this module adds what the loader
needs on top: start at a sample offset without handing the skipped members' bytes to Python, stop
at a sample offset without reading the rest of the shard, never read the ``.json`` members, and turn
a truncated shard into a warning that ends the run instead of an exception.
"""

from __future__ import annotations

import tarfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from webdataset.tariterators import base_plus_ext, group_by_keys, tar_file_iterator

from imgshards.converter.manifest import IMAGE_EXTENSIONS

__all__ = ["RawSample", "read_run"]

_READ_BUFFER = 1 << 20
_IMAGE_EXTS = frozenset(IMAGE_EXTENSIONS)


class RawSample(NamedTuple):
    """One sample as stored: image bytes, their format (the member's extension) and the label."""

    key: str
    ext: str
    data: bytes
    label: int
    shard: str


class _RunEnd(Exception):
    """Raised by the member selector at the first member past the run, to stop the tar iteration."""


class _Selector:
    """Member filter for ``tar_file_iterator``: counts samples by key and keeps those in ``[start, stop)``."""

    def __init__(self, start: int, stop: int) -> None:
        self.start, self.stop = start, stop
        self.index = -1
        self.key: str | None = None

    def __call__(self, fname: str) -> bool:
        key, ext = base_plus_ext(fname)
        if key != self.key:
            self.key = key
            self.index += 1
            if self.index >= self.stop:
                raise _RunEnd
        # Skipped members are never read into Python; tarfile steps over their bytes.
        return self.index >= self.start and ext is not None and ext.lower() != "json"


def read_run(
    path: str | Path, start: int, stop: int, *, on_truncated: Callable[[str], None] | None = None
) -> Iterator[RawSample]:
    """Yield samples ``[start, stop)`` of the shard at ``path``, in stored order.

    A shard that ends early (truncated, or cut mid-member) yields what it has; ``on_truncated`` (or a
    warning) is told once, naming the shard and the sample it stopped at.
    """
    path = Path(path)
    problems: list[str] = []

    def handler(exn: BaseException) -> bool:
        if not isinstance(exn, _RunEnd):
            # webdataset appends " @ <file object>" to the message; the shard is named already.
            problems.append(f"{type(exn).__name__}: {str(exn).split(' @ ')[0]}")
        return False  # stop reading this shard either way

    expected = stop - start
    got = 0
    with open(path, "rb", buffering=_READ_BUFFER) as f:
        selector = _Selector(start, stop)
        members = tar_file_iterator(f, handler=handler, select_files=selector)
        samples = group_by_keys(_guard(members, str(path), problems), handler=handler)
        try:
            for sample in samples:
                raw = _to_raw(sample, path.name)
                if raw is None:  # a sample missing its image or label: the shard was cut inside it
                    problems.append(f"sample {sample.get('__key__')!r} is incomplete")
                    break
                yield raw
                got += 1
                if got == expected:
                    break
        finally:
            samples.close()
            members.close()
    if got < expected:
        detail = f"; {problems[0]}" if problems else ""
        message = (
            f"shard {path.name} ended after sample {start + got} of the {stop} expected{detail}: "
            "truncated or rewritten since it was packed; the epoch goes on without the rest of it"
        )
        if on_truncated is not None:
            on_truncated(message)
        else:
            warnings.warn(message, RuntimeWarning, stacklevel=2)


def _guard(members: Iterator[dict[str, Any]], url: str, problems: list[str]) -> Iterator[dict[str, Any]]:
    """Tag members with their shard (as webdataset's expander does); end where tarfile fails unhandled."""
    try:
        for member in members:
            member["__url__"] = url
            yield member
    except (tarfile.TarError, OSError, EOFError) as e:
        problems.append(f"{type(e).__name__}: {e}")


def _to_raw(sample: dict[str, Any], shard: str) -> RawSample | None:
    label = sample.get("cls")
    images = [ext for ext in sample if ext in _IMAGE_EXTS]
    if label is None or len(images) != 1:
        return None
    ext = images[0]
    try:
        value = int(label)
    except ValueError:
        return None
    return RawSample(key=str(sample["__key__"]), ext=ext, data=sample[ext], label=value, shard=shard)
