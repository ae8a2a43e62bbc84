"""Exit codes of every command, as ``diff`` and ``grep`` use them: 1 the data is bad, 2 cannot run.

======  ==============================================================================================
code    meaning
======  ==============================================================================================
0       done; the data is good (``verify``: every shard matches the index)
1       the data is bad: ``verify`` found a mismatch, ``pack`` rejected every file of a split, or
        ``index`` found samples the loader cannot read
2       cannot run: bad arguments, a missing source or index, a conflicting destination...
130     interrupted (Ctrl-C)
======  ==============================================================================================
"""

from __future__ import annotations

import click

__all__ = ["EXIT_BAD_DATA", "EXIT_CANT_RUN", "EXIT_INTERRUPTED", "BadData", "BadUsage", "CantRun"]

EXIT_BAD_DATA = 1
EXIT_CANT_RUN = 2
EXIT_INTERRUPTED = 130


class BadData(click.ClickException):
    """The command ran and found the data bad (exit 1)."""

    exit_code = EXIT_BAD_DATA


class CantRun(click.ClickException):
    """The command cannot do its job: a user's mistake or a bad state on disk (exit 2)."""

    exit_code = EXIT_CANT_RUN


class BadUsage(click.UsageError):
    """A command line click cannot parse, told in one line that names the help to read (exit 2).

    Click's own form is three lines (usage, a hint, the error); this one is the error and the hint:
    ``Error: Missing argument 'DST'; see `imgshards pack --help`.``
    """

    def __init__(self, error: click.UsageError) -> None:
        super().__init__(error.format_message(), error.ctx)

    def show(self, file: object = None) -> None:
        """Print the one line on stderr."""
        command = self.ctx.command_path if self.ctx is not None else "imgshards"
        message = self.format_message()
        if message.endswith("?"):  # "No such command 'pakc'. Did you mean 'pack'?"
            click.echo(f"Error: {message} See `{command} --help`.", err=True)
        else:
            click.echo(f"Error: {message.rstrip('.')}; see `{command} --help`.", err=True)
