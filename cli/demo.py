"""``imgshards demo``: make a small synthetic tree, pack it, verify it, print the summary.

``--keep DIR`` keeps the tree (``DIR/photos``) and its shards (``DIR/shards``), a tree of one's own to
try the other commands on; without it, both are in a temporary directory removed as the command
ends, so the summary lists the rejected files themselves rather than a rejects file that will be gone.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import click

from imgshards.converter import PackConfig, SplitInfo, make_synthetic_tree, pack, verify

from .exits import BadData
from .options import plural, workers_option
from .pack import print_summary, summary_json

__all__ = ["demo"]

_SHOWN_REJECTS = 10  # the demo's tree has 4 bad files; a kept DIR may have gained more


@click.command()
@click.option(
    "--keep",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Work in this directory and keep the result (DIR/photos, the tree; DIR/shards, its shards), "
    "instead of a temporary one.",
)
@workers_option("Worker processes [default: all cores].")
@click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON document (the pack and the verify) on stdout."
)
@click.option("-q", "--quiet", is_flag=True, help="Print nothing but errors; the exit status tells.")
def demo(keep: Path | None, workers: int | None, as_json: bool, quiet: bool) -> None:
    """Pack a synthetic 8-class tree (with a few bad files) end to end; needs no data of your own."""
    say = click.echo if not (quiet or as_json) else (lambda message: None)
    with tempfile.TemporaryDirectory(prefix="imgshards-demo-") as tmp:
        root = keep or Path(tmp)
        src = make_synthetic_tree(root / "photos", classes=8, per_class=40, bad=True)
        say(f"made a synthetic ImageFolder tree in {src} (8 classes x 40 images + 4 bad files)")
        result = pack(src, root / "shards", PackConfig(shard_size=500_000, workers=workers))
        if not (quiet or as_json):
            # A temporary rejects file is gone when the command ends: list what it holds instead.
            print_summary(result, rejects=None if keep else _rejects(result.dst, result.infos))
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
            shards = root / "shards"
            say(
                f"kept in {root}: the tree {src}, its shards {shards}; next: imgshards info {shards}, "
                f"or pack the tree into train and val: imgshards pack {src} shards --val-fraction 0.2"
            )
        else:
            say(
                "the tree and its shards were in a temporary directory, now removed; "
                "imgshards demo --keep DIR keeps them (DIR/photos, DIR/shards) to try the other commands"
            )


def _rejects(dst: Path | str, infos: list[SplitInfo]) -> dict[str, list[str]]:
    """Each split's rejected files, ``path: reason``, read from its rejects file before it is removed."""
    listed = {}
    for info in infos:
        lines = Path(dst, str(info.rejects_file)).read_text().splitlines()
        rows = [json.loads(line) for line in lines]
        shown = [f"{row['path']}: {row['reason']}" for row in rows[:_SHOWN_REJECTS]]
        if len(rows) > _SHOWN_REJECTS:
            shown.append(f"... and {len(rows) - _SHOWN_REJECTS:,} more")
        listed[info.name] = shown
    return listed
