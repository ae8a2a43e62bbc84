"""What the command line's tests share: running ``imgshards`` in-process, and reading its one-line errors."""

from __future__ import annotations

from click.testing import CliRunner, Result

from imgshards.cli.main import cli


def run(*args: object) -> Result:
    """``imgshards ARGS`` in this process: never a traceback, whatever the exit code."""
    result = CliRunner().invoke(cli, [str(a) for a in args], prog_name="imgshards")
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.output
    return result


def one_line_error(result: Result) -> str:
    """The error printed on stderr, asserted to be a single line."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]
