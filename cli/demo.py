"""``imgshards demo``: make a small synthetic tree, pack it, verify it, print the summary."""

from __future__ import annotations

import tempfile
from pathlib import Path

import click

from imgshards.converter import PackConfig, make_synthetic_tree, pack, verify

from .exits import BadData
from .pack import print_summary

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
def demo(keep: Path | None, workers: int | None) -> None:
    """Pack a synthetic 8-class tree (with a few bad files) end to end; needs no data of your own."""
    with tempfile.TemporaryDirectory(prefix="imgshards-demo-") as tmp:
        root = keep or Path(tmp)
        src = make_synthetic_tree(root / "src", classes=8, per_class=40, bad=True)
        click.echo(f"made a synthetic ImageFolder tree in {src} (8 classes x 40 images + 4 bad files)")
        result = pack(src, root / "shards", PackConfig(shard_size=500_000, workers=workers))
        print_summary(result)
        report = verify(root / "shards", workers=workers)
        if not report.ok:
            raise BadData("; ".join(map(str, report.problems)))
        click.echo(f"verified: {report.shards} shards, {report.samples} samples match the index")
        if keep:
            click.echo(f"kept in {root}; try: imgshards info {root / 'shards'}")
