"""``imgshards demo``: make a small synthetic tree, pack it, verify it, print the summary."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import click

from imgshards.converter import PackConfig, make_synthetic_tree, pack, verify

from .exits import BadData
from .options import plural
from .pack import print_summary, summary_json

__all__ = ["demo"]


@click.command()
@click.option(
    "--keep",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Work in this directory and keep the result, instead of a temporary one.",
)
@click.option(
    "--workers", type=click.IntRange(min=1), default=None, help="Worker processes [default: all cores]."
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON document (the pack and the verify) on stdout."
)
@click.option("-q", "--quiet", is_flag=True, help="Print nothing but errors; the exit status tells.")
def demo(keep: Path | None, workers: int | None, as_json: bool, quiet: bool) -> None:
    """Pack a synthetic 8-class tree (with a few bad files) end to end; needs no data of your own."""
    say = click.echo if not (quiet or as_json) else (lambda message: None)
    with tempfile.TemporaryDirectory(prefix="imgshards-demo-") as tmp:
        root = keep or Path(tmp)
        src = make_synthetic_tree(root / "src", classes=8, per_class=40, bad=True)
        say(f"made a synthetic ImageFolder tree in {src} (8 classes x 40 images + 4 bad files)")
        result = pack(src, root / "shards", PackConfig(shard_size=500_000, workers=workers))
        if not (quiet or as_json):
            print_summary(result)
        report = verify(root / "shards", workers=workers)
        if as_json:
            doc = {
                "source": str(src) if keep else None,
                "pack": summary_json(result),
                "verify": {"ok": report.ok, "shards": report.shards, "samples": report.samples},
                "kept": str(root) if keep else None,
            }
            click.echo(json.dumps(doc, indent=1))
        if not report.ok:
            raise BadData("; ".join(map(str, report.problems)))
        say(f"verified: {plural(report.shards, 'shard')}, {plural(report.samples, 'sample')} match the index")
        if keep:
            say(f"kept in {root}; try: imgshards info {root / 'shards'}")
