"""``imgshards info DST``."""

from __future__ import annotations

import json
from pathlib import Path

import click

from imgshards.converter import read_manifest

from .options import format_bytes, shown
from .storage import PathOrURL, storage_option

__all__ = ["info"]


@click.command()
@click.argument("dst", type=PathOrURL())
@click.option("--json", "as_json", is_flag=True, help="Print the whole index as JSON.")
@storage_option
def info(dst: Path | str, as_json: bool, storage_options: dict[str, object]) -> None:
    """Describe the packed dataset in DST (directory or URL): classes, splits, shards, balance, rejects."""
    manifest = read_manifest(dst, storage_options=storage_options)
    if as_json:
        click.echo(json.dumps(manifest.to_json(), indent=1))
        return
    click.echo(f"{dst}: {len(manifest.classes):,} classes")
    for name, split in sorted(manifest.splits.items()):
        sizes = [s.bytes for s in split.shards]
        counts = split.class_counts
        click.echo(
            f"  {name}: {split.samples:,} samples in {len(split.shards):,} shards "
            f"({format_bytes(split.bytes)}; "
            f"shard {format_bytes(min(sizes, default=0))}..{format_bytes(max(sizes, default=0))})"
        )
        if counts:
            low = min(range(len(counts)), key=counts.__getitem__)
            high = max(range(len(counts)), key=counts.__getitem__)
            click.echo(
                f"    per class: {counts[low]:,} ({shown(manifest.classes[low])}) .. {counts[high]:,} "
                f"({shown(manifest.classes[high])})"
            )
        reasons = ", ".join(f"{shown(r)} {n:,}" for r, n in split.rejects_by_reason.items()) or "none"
        click.echo(f"    rejected: {split.rejects_total:,} ({reasons})")
