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

__all__ = ["EXIT_BAD_DATA", "EXIT_CANT_RUN", "EXIT_INTERRUPTED", "BadData", "CantRun"]

EXIT_BAD_DATA = 1
EXIT_CANT_RUN = 2
EXIT_INTERRUPTED = 130


class BadData(click.ClickException):
    """The command ran and found the data bad (exit 1)."""

    exit_code = EXIT_BAD_DATA


class CantRun(click.ClickException):
    """The command cannot do its job: a user's mistake or a bad state on disk (exit 2)."""

    exit_code = EXIT_CANT_RUN
