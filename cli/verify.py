"""``imgshards verify DST``."""

from __future__ import annotations

from pathlib import Path

import click

from imgshards.converter import verify as verify_dataset

__all__ = ["verify"]


@click.command()
@click.argument("dst", type=click.Path(path_type=Path, file_okay=False))
@click.option("--split", "splits", multiple=True, help="Verify only this split (repeatable).")
@click.option(
    "--workers", type=click.IntRange(min=1), default=None, help="Worker processes [default: all cores]."
)
def verify(dst: Path, splits: tuple[str, ...], workers: int | None) -> None:
    """Re-hash and recount every shard in DST against its index; exit 1 naming any mismatch."""
    report = verify_dataset(dst, splits=list(splits) or None, workers=workers)
    for problem in report.problems:
        click.echo(f"BAD {problem}", err=True)
    if not report.ok:
        raise click.ClickException(f"{len(report.problems)} problem(s) in {report.shards} shards of {dst}")
    click.echo(f"ok: {report.shards} shards, {report.samples:,} samples match {dst / 'index.json'}")
