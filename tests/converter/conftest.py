"""Fixtures of the converter's tests: a small file system of its own, for a full or read-only disk."""

from __future__ import annotations

import errno
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    """Mount a tmpfs of ``size`` bytes at a new directory (root only; skips the test where it cannot).

    ``tmpfs(size)`` returns the mount point; ``tmpfs.remount(path, "ro")`` changes its options;
    ``tmpfs.fill(path)`` writes ``path/filler`` until the device is full.
    Everything mounted is unmounted (lazily) at teardown.
    """
    mounted: list[Path] = []

    def mount(size: int, name: str = "disk") -> Path:
        path = tmp_path / name
        path.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
            capture_output=True,
            check=False,
        )
        if done.returncode:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
        mounted.append(path)
        return path

    mount.remount = remount  # type: ignore[attr-defined]
    mount.fill = fill  # type: ignore[attr-defined]
    yield mount
    for path in mounted:
        subprocess.run(["umount", "-l", str(path)], check=False)


def remount(path: Path, options: str) -> None:
    """Change the mount options of the tmpfs at ``path`` (``"ro"``, ``"rw"``)."""
    subprocess.run(["mount", "-o", f"remount,{options}", str(path)], check=True)


def fill(disk: Path) -> None:
    """Write ``disk/filler`` until the device is full."""
    with open(disk / "filler", "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError as e:
            assert e.errno == errno.ENOSPC
