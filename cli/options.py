"""Parameter types and formatting shared by the commands."""

from __future__ import annotations

import re
from typing import Any

import click

from imgshards.converter.errors import printable

__all__ = ["ByteSize", "format_bytes", "shown"]

_UNITS = {
    "": 1,
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


class ByteSize(click.ParamType):
    """A size in bytes written as ``256MB``, ``1GiB``, ``500k`` or a plain integer."""

    name = "size"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        """Parse ``value`` into a number of bytes."""
        if isinstance(value, int):
            return value
        match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", str(value))
        unit = match.group(2).lower() if match else ""
        if not match or unit not in _UNITS:
            self.fail(f"{value!r} is not a size; write it like 256MB, 1GiB or 500000", param, ctx)
        size = int(float(match.group(1)) * _UNITS[unit])
        if size < 1:
            self.fail(f"{value!r} is not a positive size", param, ctx)
        return size


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
