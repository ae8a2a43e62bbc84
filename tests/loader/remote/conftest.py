"""Fixtures of the loader's remote tests: a cache's bytes, and each served image's sample key.

The servers and the dataset they serve (``http_serve``, ``s3``, ``remote_packed``...) are in
tests/remote_servers.py, shared with the converter's remote tests; tests/conftest.py takes them.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import tarfile
from pathlib import Path

import pytest
import torch

from imgshards.converter import read_manifest
from imgshards.loader import preset
from imgshards.loader.image.decode import decode

from ...remote_servers import _no_aws_env  # noqa: F401  (autouse: for the remote tests only)


@pytest.fixture(scope="session")
def cache_bytes():
    """``cache_bytes(dir)``: bytes of the files in a cache directory, added up under its lock.

    Under the lock no file appears or is renamed, so the sum is a snapshot (a partial file aborted
    meanwhile may go, which only lowers it).
    """

    def total(cache: Path) -> int:
        with open(cache / ".lock", "a") as lock:
            fcntl.lockf(lock, fcntl.LOCK_EX)
            return sum(_size(entry) for entry in os.scandir(cache))

    return total


def _size(entry: os.DirEntry) -> int:
    try:
        return entry.stat().st_size
    except FileNotFoundError:
        return 0


SIZE = 32  # eval preset at 32 px: deterministic, so a batch image maps back to its sample key


def pixel_hash(image: torch.Tensor) -> str:
    return hashlib.sha1(image.contiguous().numpy().tobytes()).hexdigest()


@pytest.fixture(scope="session")
def key_of(remote_packed) -> dict[str, str]:
    """Pixel hash (after the eval preset) -> sample key, for every sample of ``remote_packed``."""
    transform = preset("eval", size=SIZE)
    out: dict[str, str] = {}
    for shard in read_manifest(remote_packed).split("train").shards:
        with tarfile.open(remote_packed / shard.name) as tar:
            for member in tar:
                key, ext = member.name.split(".", 1)
                if ext in ("cls", "json"):
                    continue
                data = tar.extractfile(member).read()  # type: ignore[union-attr]
                out[pixel_hash(transform(decode(data, ext)))] = key
    assert len(out) == read_manifest(remote_packed).split("train").samples, "two images look alike"
    return out
