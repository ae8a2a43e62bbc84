"""Parameter types and formatting shared by the commands."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import click

__all__ = ["ByteSize", "SectionedCommand", "format_bytes", "plural", "workers_option"]

F = TypeVar("F", bound=Callable[..., Any])

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


if TYPE_CHECKING:  # click's ParamType is generic from 8.4: the floor, 8.1, cannot subscript it
    _SizeParam = click.ParamType[int]
else:
    _SizeParam = click.ParamType


class ByteSize(_SizeParam):
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


class SectionedCommand(click.Command):
    """A command whose ``--help`` lists its options in titled sections, the common ones first.

    Click has no option groups; ``sections`` names each section's options by parameter name
    (``("Common options", ("split", "workers", "help"))``, ``help`` for ``-h/--help``). An option
    no section names is listed last under "Other options", never left out.
    """

    def __init__(self, *args: Any, sections: Sequence[tuple[str, Sequence[str]]] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sections = tuple(sections)

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """Write each section's options, in the sections' order, then any option left."""
        rows: dict[str, tuple[str, str]] = {}
        help_option = self.get_help_option(ctx)
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None or not isinstance(param, click.Option):
                continue  # the arguments are in the usage line and the text
            # The help option's own name differs between click versions: it is "help" here.
            rows["help" if param is help_option else str(param.name)] = record
        for title, names in self.sections:
            listed = [rows.pop(name) for name in names if name in rows]
            if listed:
                with formatter.section(title):
                    formatter.write_dl(listed)
        if rows:
            with formatter.section("Other options"):
                formatter.write_dl(list(rows.values()))


def workers_option(help_text: str, *, min_workers: int = 1) -> Callable[[F], F]:
    """``-j/--workers N``, as ``make -j`` spells it: the same two names on every command."""
    return click.option("-j", "--workers", type=click.IntRange(min=min_workers), default=None, help=help_text)
