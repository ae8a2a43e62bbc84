"""``imgshards verify DST``."""

from __future__ import annotations

from pathlib import Path

import click

from imgshards.converter import verify as verify_dataset
from imgshards.converter import verify_url

from .options import shown
from .storage import PathOrURL, join, storage_option

__all__ = ["verify"]


@click.command()
@click.argument("dst", type=PathOrURL())
@click.option("--split", "splits", multiple=True, help="Verify only this split (repeatable).")
@click.option(
    "--workers", type=click.IntRange(min=1), default=None, help="Worker processes [default: all cores]."
)
@storage_option
def verify(
    dst: Path | str, splits: tuple[str, ...], workers: int | None, storage_options: dict[str, object]
) -> None:
    """Re-hash and recount every shard in DST (directory or URL) against its index; exit 1 on a mismatch."""
    chosen = list(splits) or None
    if isinstance(dst, str):
        report = verify_url(dst, storage_options=storage_options, splits=chosen, workers=workers)
    else:
        report = verify_dataset(dst, splits=chosen, workers=workers)
    for problem in report.problems:
        click.echo(f"BAD {shown(str(problem))}", err=True)
    if not report.ok:
        raise click.ClickException(f"{len(report.problems)} problem(s) in {report.shards} shards of {dst}")
    click.echo(f"ok: {report.shards} shards, {report.samples:,} samples match {join(dst, 'index.json')}")
