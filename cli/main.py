"""The ``imgshards`` command group: one module per command, library errors mapped to one-line messages."""

from __future__ import annotations

from typing import Any

import click

from imgshards.converter import ImgshardsError

from .bench import bench
from .demo import demo
from .exits import EXIT_INTERRUPTED, CantRun
from .index import index
from .info import info
from .options import shown
from .pack import pack
from .verify import verify

__all__ = ["cli", "main"]


class _Group(click.Group):
    """Turns a user's mistake (an :class:`ImgshardsError`) into a one-line message, not a traceback.

    Exit codes are those of :mod:`.exits`: 1 the data is bad, 2 cannot run, 130 interrupted.
    """

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ImgshardsError as e:
            raise CantRun(shown(str(e))) from e  # a name in it may hold escape codes
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(EXIT_INTERRUPTED)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="imgshards")
def cli() -> None:
    """Pack an ImageFolder tree into WebDataset shards once; stream them into PyTorch training."""


cli.add_command(pack)
cli.add_command(index)
cli.add_command(verify)
cli.add_command(info)
cli.add_command(demo)
cli.add_command(bench)


def main() -> None:
    """Console-script entry point."""
    cli()
