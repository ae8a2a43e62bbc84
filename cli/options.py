"""Parameter types and formatting shared by the commands."""

from __future__ import annotations

import re
from typing import Any

import click

from imgshards.converter.errors import printable

__all__ = ["ByteSize", "format_bytes", "plural", "shown"]

_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "k": 10**3,
    "m": 10**6,
    "g": 10**9,
    "t": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


_FORMS = "256MB, 1GiB, 500kB or 30000B (units B, kB, MB, GB, TB of 1000; KiB, MiB, GiB, TiB of 1024)"


class ByteSize(click.ParamType):
    """A size in bytes with its unit: ``256MB``, ``1GiB``, ``500k``, ``30000B``.

    A number alone is refused: ``--shard-size 10`` meant 10 MB far more often than 10 bytes (which
    makes a shard of every image).
    """

    name = "size"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        """Parse ``value`` into a number of bytes."""
        if isinstance(value, int):
            return value
        match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", str(value))
        if match and not match.group(2):
            self.fail(f"{value!r} has no unit; write it like {_FORMS}", param, ctx)
        unit = match.group(2).lower() if match else ""
        if not match or unit not in _UNITS:
            self.fail(f"{value!r} is not a size; write it like {_FORMS}", param, ctx)
        size = int(float(match.group(1)) * _UNITS[unit])
        if size < 1:
            self.fail(f"{value!r} is not a positive size", param, ctx)
        return size


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """``plural(1, "shard")`` -> ``'1 shard'``, ``plural(1200, "shard")`` -> ``'1,200 shards'``."""
    return f"{n:,} {noun if n == 1 else nouns or noun + 's'}"


def format_bytes(n: float) -> str:
    """``1234567`` -> ``'1.2 MB'``."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def shown(text: str) -> str:
    """``text`` safe to print on a terminal: control characters (escape codes) and undecodable bytes escaped.

    Class names and reject reasons come from a dataset's index, which is untrusted input.
    """
    return printable(text)
