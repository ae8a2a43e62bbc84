"""Attempts at a shard: each writes under a temporary name of its own, so that two never mix.

A task can run twice: Ray retries a task whose node died while a straggler of the first attempt may
still be running there, and two drivers may race for one shard. Each attempt writes
``.{shard}.{host}.{pid}.{random}.partial`` beside the shard, then renames it to the shard's name:
both attempts write the same bytes, so whichever rename lands last changes nothing. An attempt cut
off (its worker or node killed) leaves its temporary file behind; :func:`cut_off` reports and
removes those of a split once the driver has every shard, and a re-run removes any left over.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
from pathlib import Path

__all__ = ["attempt_path", "cut_off"]

log = logging.getLogger(__name__)


def attempt_path(dst: Path, name: str) -> Path:
    """A temporary name for one attempt at writing the file ``name`` of ``dst``, unique to it."""
    host = socket.gethostname().replace("/", "_")
    return dst / f".{name}.{host}.{os.getpid()}.{secrets.token_hex(4)}.partial"


def cut_off(dst: Path, split: str) -> list[str]:
    """The shards of ``split`` an attempt at which was cut off; their leftover files are removed.

    Called once every shard of the split is written (by another attempt), so what is left is dead.
    """
    shards = set()
    for leftover in sorted(dst.glob(f".{split}-*.tar.*.partial")):
        shard, _, attempt = leftover.name[1:].partition(".tar.")
        host, _, pid = attempt.removesuffix(".partial").rpartition(".")[0].rpartition(".")
        log.warning(
            "an attempt at %s.tar on %s (pid %s) was cut off (its worker or node died); another wrote it",
            shard,
            host,
            pid,
        )
        shards.add(f"{shard}.tar")
        leftover.unlink(missing_ok=True)
    return sorted(shards)
