"""``imgshards index DST``: DST, as in every command, is the dataset's directory (or URL).

``imgshards index --upgrade DST`` rewrites an index of format 1 as format 2 (its tables as files),
reading and changing no shard (:func:`~imgshards.converter.upgrade_index`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from click.core import ParameterSource

from imgshards.converter import IndexConfig, UpgradeResult, read_classes, upgrade_index
from imgshards.converter import index as index_shards
from imgshards.converter.format.errors import UnreadableSamplesError, shown
from imgshards.converter.format.locate import redact_url

from .exits import BadData
from .options import format_bytes, plural, workers_option
from .storage import PathOrURL, join, storage_option

__all__ = ["index"]


@click.command()
@click.argument("dst", type=PathOrURL())
@click.option("--split", default="train", show_default=True, help="Name of the split these shards become.")
@click.option(
    "--shards", default="*.tar", show_default=True, help="Glob of the split's shard files directly in DST."
)
@click.option(
    "--label-field",
    metavar="FIELD",
    default=None,
    help="Read each label from this field of the sample's .json [default: its .cls member].",
)
@click.option(
    "--classes",
    "classes_file",
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    default=None,
    help="Class names, one a line (line N names class id N), or a JSON list [default: those of the "
    "splits already indexed, else derived: ids 0..max, or the label names sorted].",
)
@click.option("--overwrite", is_flag=True, help="Replace a split of this name that `imgshards pack` made.")
@workers_option("Shards read at once [default: all cores].")
@click.option(
    "--progress/--no-progress", default=None, help="Progress bar on stderr [default: when it is a terminal]."
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON document on stdout instead of the summary."
)
@click.option("-q", "--quiet", is_flag=True, help="No summary and no progress; warnings still go to stderr.")
@click.option(
    "--upgrade",
    is_flag=True,
    help="Rewrite DST's index of format 1 (imgshards before 0.2: the tables inside index.json) as "
    "format 2, reading and changing no shard; an index of format 2 is left as it is.",
)
@storage_option
@click.pass_context
def index(
    ctx: click.Context,
    /,
    dst: Path | str,
    split: str,
    shards: str,
    label_field: str | None,
    classes_file: Path | None,
    overwrite: bool,
    workers: int | None,
    progress: bool | None,
    as_json: bool,
    quiet: bool,
    upgrade: bool,
    storage_options: dict[str, object],
) -> None:
    """Write index.json for WebDataset shards in DST (directory or URL) that another tool wrote.

    Reads every shard once (never writes to one): counts its samples, hashes it and reads each
    sample's label, then writes the split's tables, DST/index.json and timm's DST/_info.json.
    Afterwards the loader, verify, info and bench read DST like a packed dataset. Run it once per
    split (--split, --shards). With --upgrade, rewrites an index of format 1 as format 2 instead.
    """
    if isinstance(dst, Path) and storage_options:
        raise click.UsageError("--storage-option applies to a URL only")
    if upgrade:
        given = [
            "--" + name.replace("_file", "").replace("_", "-")
            for name in ("split", "shards", "label_field", "classes_file", "overwrite", "workers")
            if ctx.get_parameter_source(name) is not ParameterSource.DEFAULT
        ]
        if given:
            raise click.UsageError(f"--upgrade reads no shard: {', '.join(given)} does not apply")
        _upgraded(dst, upgrade_index(dst, storage_options=storage_options), as_json, quiet)
        return
    try:
        config = IndexConfig(
            split=split,
            shards=shards,
            label_field=label_field,
            classes=read_classes(classes_file) if classes_file else None,
            overwrite=overwrite,
            workers=workers,
            progress=(not quiet and sys.stderr.isatty()) if progress is None else progress,
        )
    except ValueError as e:
        raise click.UsageError(str(e)) from e
    try:
        result = index_shards(dst, config, storage_options=storage_options)
    except UnreadableSamplesError as e:
        raise BadData(str(e)) from e  # exit 1: the data is bad, as for verify
    info, classes = result.info, result.manifest.classes
    for warning in result.warnings:
        click.secho(f"warning: {shown(warning, most=None)}", fg="yellow", err=True)
    if as_json:
        doc = {
            "index": str(join(dst, "index.json")),
            "split": result.split,
            "samples": info.samples,
            "shards": len(info.shards),
            "bytes": info.bytes,
            "classes": len(classes),
            "classes_from": result.classes_from,
            "labels": info.labels.to_json(),
            "classes_per_shard": round(result.classes_per_shard, 3),
            "shuffled_classes_per_shard": round(result.shuffled_classes_per_shard, 3),
            "warnings": list(result.warnings),
        }
        click.echo(json.dumps(doc, indent=1))
        return
    if quiet:
        return
    click.echo(
        f"indexed split {shown(result.split, quoted=True)} of {shown(redact_url(str(dst)))}: "
        f"{plural(info.samples, 'sample')} of "
        f"{plural(len(classes), 'class', 'classes')} in {plural(len(info.shards), 'shard')} "
        f"({format_bytes(info.bytes)})"
    )
    kind = "names" if info.labels.names else "class ids"
    member = f".json field {info.labels.key!r}" if info.labels.key else ".cls"
    origin = {"given": f"from {classes_file}", "index": "kept from the index", "derived": "derived"}
    click.echo(f"  labels: {kind} in {member}; classes {origin[result.classes_from]}: {_some(classes)}")
    click.echo(
        f"  classes per shard: {result.classes_per_shard:.1f} "
        f"(shuffled shards would hold {result.shuffled_classes_per_shard:.1f})"
    )
    click.echo(
        f"  wrote {shown(redact_url(str(join(dst, 'index.json'))))}, _info.json and "
        f"{plural(len(info.tables), 'table file')}; the shards are unchanged"
    )


def _upgraded(dst: Path | str, result: UpgradeResult, as_json: bool, quiet: bool) -> None:
    """What ``index --upgrade`` did, in one line (or one JSON document)."""
    where = shown(redact_url(str(join(dst, "index.json"))))
    if as_json:
        doc = {
            "index": redact_url(str(join(dst, "index.json"))),
            "upgraded": result.changed,
            "version_found": result.version,
            "version": result.manifest.version,
            "table_files": result.table_files,
            "table_bytes": result.table_bytes,
        }
        click.echo(json.dumps(doc, indent=1))
    elif quiet:
        return
    elif result.changed:
        splits = len(result.manifest.splits)
        click.echo(
            f"upgraded {where} from format {result.version} to {result.manifest.version}: "
            f"{plural(result.table_files, 'table file')} ({format_bytes(result.table_bytes)}) for "
            f"{plural(splits, 'split')}; the shards are unchanged"
        )
    else:
        click.echo(f"{where} is already format {result.version}: nothing to upgrade, nothing changed")


def _some(names: tuple[str, ...]) -> str:
    """A few class names, shown (a name from a foreign dataset may hold control characters)."""
    return ", ".join(map(shown, names[:3])) + (f", ... ({len(names):,} in all)" if len(names) > 3 else "")
