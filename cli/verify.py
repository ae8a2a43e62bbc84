"""``imgshards verify DST``."""

from __future__ import annotations

import json
from pathlib import Path

import click

from imgshards.converter import verify as verify_dataset
from imgshards.converter import verify_url
from imgshards.converter.format.errors import shown
from imgshards.converter.format.locate import redact_url

from .exits import BadData
from .options import plural, workers_option
from .storage import PathOrURL, join, storage_option, timeout_option

__all__ = ["SHOWN_PROBLEMS", "verify"]

SHOWN_PROBLEMS = 20  # the first problems printed one a line; the rest are counted


@click.command()
@click.argument("dst", type=PathOrURL(file_okay=True))
@click.option("--split", "splits", multiple=True, help="Verify only this split (repeatable).")
@workers_option("Worker processes [default: all cores].")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing but errors; the exit status tells.")
@storage_option
@timeout_option
def verify(
    dst: Path | str,
    splits: tuple[str, ...],
    workers: int | None,
    as_json: bool,
    quiet: bool,
    storage_options: dict[str, object],
    timeout: float,
) -> None:
    """Re-hash and recount every shard in DST (directory or URL) against its index, and its tables.

    Each table file of the index (its size, SHA-256), then each shard: its size, SHA-256, samples,
    labels, and the tables' entries for its samples (start, key, class id).

    Exit status: 0 every shard matches, 1 a mismatch (the data is bad), 2 cannot run (no index, a
    server that does not answer...).
    """
    chosen = list(splits) or None
    if isinstance(dst, str):
        report = verify_url(
            dst, storage_options=storage_options, splits=chosen, workers=workers, timeout=timeout
        )
    else:
        report = verify_dataset(dst, splits=chosen, workers=workers)
    index = join(dst, "index.json")
    if as_json:
        problems = [
            {"split": p.split, "shard": p.shard, "problem": redact_url(p.problem)} for p in report.problems
        ]
        doc = {
            "index": redact_url(str(index)),
            "ok": report.ok,
            "shards": report.shards,
            "tables": report.tables,
            "samples": report.samples,
        }
        click.echo(json.dumps({**doc, "problems": problems}, indent=1))
    elif not quiet:
        for problem in report.problems[:SHOWN_PROBLEMS]:
            click.echo(f"BAD {shown(redact_url(str(problem)))}", err=True)
        more = len(report.problems) - SHOWN_PROBLEMS
        if more > 0:  # a flood (a million missing shards) is summed up, not printed
            click.echo(f"BAD ... and {plural(more, 'more problem')}; --json lists every one", err=True)
    if not report.ok:
        raise BadData(
            f"{plural(len(report.problems), 'problem')} in {plural(report.shards, 'shard')} of "
            f"{shown(redact_url(str(dst)))}"
        )
    if not as_json and not quiet:
        tables = f" (and {plural(report.tables, 'table file')})" if report.tables else ""
        click.echo(
            f"ok: {plural(report.shards, 'shard')}, {plural(report.samples, 'sample')} match "
            f"{shown(redact_url(str(index)))}{tables}"
        )
