"""The ``imgshards`` command group: one module per command, library errors mapped to one-line messages."""

from __future__ import annotations

from typing import Any

import click
from click.exceptions import NoArgsIsHelpError

from imgshards.converter import ImgshardsError
from imgshards.converter.format.errors import shown
from imgshards.converter.format.locate import redact_url

from .bench import bench
from .demo import demo
from .exits import EXIT_INTERRUPTED, BadUsage, CantRun
from .index import index
from .info import info
from .pack import pack
from .verify import verify

__all__ = ["cli", "main"]

_MESSAGE_MOST = 4096  # the longest error line printed whole; its values are cut to far less

# The commands in the order of a workflow, each with one line of what it does and one example.
_COMMANDS = (
    (
        pack,
        "Pack an ImageFolder tree into shards in a directory or at a URL.",
        "imgshards pack photos/train shards",
    ),
    (verify, "Re-hash every shard against the index.", "imgshards verify shards"),
    (info, "Describe a packed dataset: classes, splits, balance, rejects.", "imgshards info shards"),
    (index, "Index shards another tool wrote, to read them as a dataset.", "imgshards index their-shards"),
    (bench, "Is data loading the bottleneck? Stream the shards, time each stage.", "imgshards bench shards"),
    (demo, "Pack a synthetic tree end to end; needs no data of your own.", "imgshards demo"),
)
_EXAMPLES = {command.name: example for command, _, example in _COMMANDS}


class _Group(click.Group):
    """Turns a user's mistake (an :class:`ImgshardsError`, a bad command line) into one line, not a traceback.

    Exit codes are those of :mod:`.exits`: 1 the data is bad, 2 cannot run, 130 interrupted.
    """

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as e:  # an unknown command or option, a missing argument
            raise _one_line(e) from e
        except ImgshardsError as e:
            # A name in it may hold escape codes, a URL a password; its values are cut already (a guard).
            raise CantRun(shown(redact_url(str(e)), most=_MESSAGE_MOST)) from e
        except KeyboardInterrupt:
            if ctx.invoked_subcommand == "pack":
                message = (
                    "interrupted; run the same command again to resume: the shards already written are kept"
                )
            else:
                message = "interrupted"
            click.echo(message, err=True)
            ctx.exit(EXIT_INTERRUPTED)

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        try:
            return super().make_context(*args, **kwargs)
        except click.UsageError as e:  # an unknown option of the group itself
            raise _one_line(e) from e

    def list_commands(self, ctx: click.Context) -> list[str]:
        """The commands in workflow order (pack, verify, info, index, bench, demo), not sorted by name."""
        return list(self.commands)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """Each command with its whole one-line summary (never cut mid-word) and one example."""
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is None or command.hidden:
                continue
            rows.append((name, command.short_help or ""))
            rows.append(("", f"e.g. {_EXAMPLES[name]}" if name in _EXAMPLES else ""))
        with formatter.section("Commands, in the order of a workflow"):
            formatter.write_dl(rows, col_max=10)


@click.group(
    cls=_Group,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog="Run `imgshards COMMAND --help` for a command's options. Exit status: 0 done, 1 the data "
    "is bad, 2 cannot run, 130 interrupted.",
)
@click.version_option(package_name="imgshards")
def cli() -> None:
    """Pack an ImageFolder tree into WebDataset shards once; stream them into PyTorch training."""


for _command, _summary, _ in _COMMANDS:
    _command.short_help = _summary
    cli.add_command(_command)


def _one_line(error: click.UsageError) -> click.UsageError:
    """``error`` told in one line, unless it is already, or is the help itself (``imgshards`` alone)."""
    if isinstance(error, (BadUsage, NoArgsIsHelpError)):
        return error
    return BadUsage(error)


def main() -> None:
    """Console-script entry point."""
    cli()
