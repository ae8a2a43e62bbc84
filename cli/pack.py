"""``imgshards pack SRC DST``."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from imgshards.converter import (
    DEFAULT_SHARD_SIZE,
    ENGINES,
    Check,
    DryRun,
    PackConfig,
    PackResult,
    ReadOrder,
    SourceError,
    pack_to_url,
    reader_warnings,
)
from imgshards.converter import dry_run as plan_pack
from imgshards.converter import pack as pack_tree
from imgshards.converter.config import MAX_SEED
from imgshards.converter.format.errors import shown
from imgshards.converter.format.locate import redact_url
from imgshards.converter.format.tarwriter import END_AT_MOST, RECORD
from imgshards.converter.scan.tree import check_source, split_named

from .exits import BadData
from .info import balance
from .options import ByteSize, SectionedCommand, format_bytes, plural, workers_option
from .storage import PathOrURL, join, storage_option

__all__ = ["SECTIONS", "dry_run_json", "pack", "print_dry_run", "print_summary", "summary_json"]


# The options of `pack --help`, in sections: what most runs set first, then the rest by topic.
SECTIONS = (
    (
        "Common options",
        (
            "split",
            "val_fraction",
            "shard_size",
            "max_samples",
            "workers",
            "dry_run",
            "quiet",
            "as_json",
            "help",
        ),
    ),
    ("Splits", ("val_split", "split_file")),
    ("Images", ("check", "max_pixels", "resize", "quality", "keep_formats")),
    ("A source that looks wrong", ("allow_split_names", "strict")),
    ("Runs and resume", ("seed", "overwrite", "read_order", "progress")),
    ("Cluster and URL destinations", ("engine", "ray_address", "staging", "storage_options")),
)


@click.command(cls=SectionedCommand, sections=SECTIONS)
@click.argument("src", type=click.Path(path_type=Path, file_okay=False))
@click.argument("dst", type=PathOrURL())
@click.option(
    "--split",
    default=None,
    help="Split name; the shards' prefix [default: SRC's folder name when it names a split (train, val, "
    "test...), else train].",
)
@click.option(
    "--shard-size",
    type=ByteSize(),
    default=DEFAULT_SHARD_SIZE,
    show_default="256MB",
    help="Close a shard before its samples pass this size (256MB, 1GiB...). The tar's end adds up to "
    f"{END_AT_MOST:,} bytes to the file (two end blocks, padding to a {RECORD:,}-byte record); an "
    "image larger than this gets a shard of its own.",
)
@click.option(
    "--max-samples",
    "--maxcount",
    "max_samples",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="Also close a shard once it holds N samples (tarp's --maxcount, ShardWriter(maxcount=)) "
    "[default: no cap, the size decides].",
)
@click.option(
    "--seed",
    type=click.IntRange(0, MAX_SEED),
    default=0,
    show_default=True,
    help="Seed of the global shuffle.",
)
@click.option(
    "--check",
    type=click.Choice([c.value for c in Check]),
    default=Check.HEADER.value,
    show_default=True,
    help="header: cheap checks; full: decode every image; none: trust the files.",
)
@click.option(
    "--max-pixels",
    type=click.IntRange(min=1),
    default=None,
    help="Reject an image whose header declares more pixels than N, before decoding it (a decompression "
    "bomb) [default: Pillow's Image.MAX_IMAGE_PIXELS, about 89 million].",
)
@click.option(
    "--resize",
    type=click.IntRange(min=1),
    default=None,
    help="Re-encode as RGB JPEG with the shorter side at most N pixels (never upscaled).",
)
@click.option(
    "--quality",
    type=click.IntRange(1, 100),
    default=90,
    show_default=True,
    help="JPEG quality with --resize.",
)
@click.option(
    "--keep-formats",
    is_flag=True,
    help="Store every image's own bytes under its format's extension, instead of one format per split "
    "(some readers then miss samples; the summary says which).",
)
@click.option(
    "--val-fraction",
    type=click.FloatRange(0, 1, min_open=True, max_open=True),
    default=None,
    help="Also write a held-out split of this share of each class (stratified, seeded by --seed).",
)
@click.option(
    "--val-split", default="val", show_default=True, help="Name of the held-out split of --val-fraction."
)
@click.option(
    "--split-file",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    default=None,
    help='JSON {"train": [paths...], "val": [...]} of paths relative to SRC: pack these splits.',
)
@workers_option("Worker processes [default: all cores].")
@click.option(
    "--read-order",
    type=click.Choice([r.value for r in ReadOrder]),
    default=ReadOrder.AUTO.value,
    show_default=True,
    help="disk: gather the tree in inode order first (cold trees); plan: read each shard's files "
    "straight from the tree (warm trees, SSDs); auto: plan when the tree is in the page cache.",
)
@click.option(
    "--engine",
    type=click.Choice(ENGINES),
    default="pool",
    show_default=True,
    help="pool: worker processes on this machine; ray: Ray tasks across the machines of a Ray cluster "
    "(every node sees SRC and DST at the same paths). Same output either way; either resumes the other.",
)
@click.option(
    "--ray-address",
    default=None,
    help="--engine ray: the cluster to join (auto, HOST:6379, ray://HOST:10001) "
    "[default: RAY_ADDRESS, or a new local cluster].",
)
@click.option("--overwrite", is_flag=True, help="Replace a split packed into DST with other arguments.")
@click.option(
    "--allow-split-names",
    is_flag=True,
    help="Pack a SRC whose class folders are all named like splits (train, val, test...) as classes; "
    "refused otherwise, naming the commands that pack each split from its own tree.",
)
@click.option(
    "--strict",
    is_flag=True,
    help="Refuse a SRC that looks like the wrong folder (some class folders named like splits, or "
    "every one holding only folders) instead of warning.",
)
@click.option(
    "--progress/--no-progress",
    default=None,
    help="Progress bars on stderr [default: when stderr is a terminal and not -q].",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Print what would be packed (classes, samples, shards, the rejects a scan finds, an estimated "
    "size) and write nothing: DST is not even created.",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON document on stdout instead of the summary."
)
@click.option("-q", "--quiet", is_flag=True, help="No summary and no progress; warnings still go to stderr.")
@click.option(
    "--staging",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="URL DST: local directory for shards before upload [default: a temporary one].",
)
@storage_option
def pack(
    src: Path,
    dst: Path | str,
    staging: Path | None,
    storage_options: dict[str, object],
    as_json: bool,
    quiet: bool,
    progress: bool | None,
    dry_run: bool,
    **options: Any,
) -> None:
    """Pack the ImageFolder tree SRC (SRC/<class>/<image>) into WebDataset shards in DST.

    DST is a directory or any fsspec URL (s3://bucket/prefix, gs://...): each shard is uploaded as
    soon as it is written, the index last. Every file under SRC is either packed or listed, with its
    reason, in DST/.imgshards/rejects/<split>.jsonl. Run the same command again after a crash to
    finish the job; the output is the same as an uninterrupted run's. A SRC whose class folders are
    all named like splits (photos/ holding train/ and val/) is refused, naming the commands meant;
    one that only looks wrong gets a warning (--strict refuses it). --dry-run says what a pack
    would write, and writes nothing.

    Exit status: 0 done, 1 every file of a split was rejected, 2 cannot run (bad arguments, source
    or destination).
    """
    if options["quality"] != 90 and options["resize"] is None:
        raise click.UsageError("--quality applies to re-encoded images only; add --resize N")
    if isinstance(dst, Path) and (staging is not None or storage_options):
        raise click.UsageError("--staging and --storage-option apply to a URL destination only")
    source = click.get_current_context().get_parameter_source
    if options["split_file"] is not None and source("split") is not click.core.ParameterSource.DEFAULT:
        raise click.UsageError("--split-file names the splits to pack; leave out --split")
    if options["val_split"] != "val" and options["val_fraction"] is None:
        raise click.UsageError("--val-split names the split of --val-fraction; add --val-fraction F")
    if options["split"] is None:  # photos/val packs split val: a script's os.path.join(data, "val")
        named = split_named(src) if options["val_fraction"] is None else None
        options["split"] = named or "train"
    if progress is None:
        progress = not quiet and not dry_run and sys.stderr.isatty()
    try:
        config = PackConfig(progress=progress, **options)
    except ValueError as e:
        raise click.UsageError(str(e)) from e
    # Before the pack, so a wrong SRC is seen at once; --strict is told here, in the flag's own name.
    for warning in check_source(src, dst, replace(config, strict=False)):
        if config.strict:
            raise SourceError(f"refused (--strict): {warning}")
        if not dry_run:  # a dry run prints its warnings in its report
            click.secho(f"warning: {shown(warning, most=None)}", fg="yellow", err=True)
    if dry_run:
        plan = plan_pack(src, dst, config)
        if as_json:
            click.echo(json.dumps(dry_run_json(plan, dst, config), indent=1))
        elif not quiet:
            print_dry_run(plan, dst, config)
        return
    if isinstance(dst, str):
        result = pack_to_url(src, dst, config, storage_options=storage_options, staging=staging)
    else:
        result = pack_tree(src, dst, config)
    if as_json:
        click.echo(json.dumps(summary_json(result), indent=1))
    elif not quiet:
        print_summary(result)
    else:
        for warning in _warnings(result):
            click.secho(f"warning: {shown(warning, most=None)}", fg="yellow", err=True)
    rejected_all = [info.name for info in result.infos if info.samples == 0]
    if rejected_all:
        where = ", ".join(
            shown(redact_url(str(join(result.dst, str(i.rejects_file)))))
            for i in result.infos
            if i.samples == 0
        )
        raise BadData(f"every file of split(s) {', '.join(rejected_all)} was rejected: see {where}")


def dry_run_json(plan: DryRun, dst: Path | str, config: PackConfig) -> dict[str, Any]:
    """What ``pack --dry-run --json`` prints: per split its samples, shards, estimated bytes, rejects."""
    return {
        "dry_run": True,
        "src": str(plan.src),
        "dst": redact_url(str(dst)),
        "classes": list(plan.classes),
        "splits": {
            split.name: {
                "samples": split.samples,
                "shards": split.shards,
                "shard_samples": list(split.shard_samples),
                "bytes_estimate": split.bytes,
                "class_counts": dict(zip(plan.classes, split.class_counts, strict=True)),
                "rejects": {"total": split.rejects_total, "by_reason": dict(split.rejects_by_reason)},
            }
            for split in plan.splits
        },
        "shard_size": config.shard_size,
        "max_samples": config.max_samples,
        "warnings": list(plan.warnings),
    }


def print_dry_run(plan: DryRun, dst: Path | str, config: PackConfig) -> None:
    """Print what a pack would write into ``dst``, split by split; then that nothing was written."""
    names = ", ".join(map(shown, plan.classes[:5])) + (", ..." if len(plan.classes) > 5 else "")
    click.echo(f"dry run: {shown(plan.src)} holds {plural(len(plan.classes), 'class', 'classes')} ({names})")
    cap = f", at most {plural(config.max_samples, 'sample')} each" if config.max_samples else ""
    for split in plan.splits:
        low, high = min(split.shard_samples, default=0), max(split.shard_samples, default=0)
        per_shard = f"{low:,}" if low == high else f"{low:,}..{high:,}"
        click.echo(
            f"  split {shown(split.name, quoted=True)}: {plural(split.samples, 'sample')} in "
            f"{plural(split.shards, 'shard')} "
            f"of {per_shard} samples, about {format_bytes(split.bytes)} "
            f"(shards up to {format_bytes(config.shard_size)}{cap})"
        )
        click.echo(f"    per class: {balance(plan.classes, split.class_counts)}")
        if split.rejects_total:
            reasons = ", ".join(f"{reason} {n:,}" for reason, n in split.rejects_by_reason.items())
            click.echo(f"    rejected by the scan: {plural(split.rejects_total, 'file')} ({reasons})")
        else:
            click.echo("    rejected by the scan: none")
    for warning in plan.warnings:
        click.secho(f"  warning: {shown(warning, most=None)}", fg="yellow")
    check = Check(config.check).value
    click.echo(
        f"nothing written to {shown(redact_url(str(dst)))}; without --dry-run, pack also checks each image "
        f"(--check {check}), "
        "which may reject more, and converts formats, which changes the sizes"
    )


def _warnings(result: PackResult) -> list[str]:
    """Warnings about the packed splits (the tree's own, :attr:`PackResult.warnings`, come first)."""
    notes = []
    for info in result.infos:
        prefix = f"split {shown(info.name, quoted=True)}: " if len(result.infos) > 1 else ""
        notes += [prefix + note for note in reader_warnings(info.formats)]
        empty = [name for name, n in zip(result.manifest.classes, info.class_counts, strict=True) if n == 0]
        if empty and info.samples:
            have = "has" if len(empty) == 1 else "have"
            names = ", ".join(map(shown, empty[:5]))
            notes.append(f"{prefix}{plural(len(empty), 'class', 'classes')} {have} no sample: {names}")
    return notes


def summary_json(result: PackResult) -> dict[str, Any]:
    """What ``pack --json`` prints: the run, and per split its samples, formats and rejects."""
    classes = result.manifest.classes
    return {
        "dst": redact_url(str(result.dst)),
        "classes": len(classes),
        "splits": {
            info.name: {
                "samples": info.samples,
                "shards": len(info.shards),
                "bytes": info.bytes,
                "formats": dict(info.formats),
                "converted": dict(info.converted),
                "image_sizes": None if info.image_sizes is None else info.image_sizes.to_json(),
                "resize_hint": _hint_json(result, info.name),
                "rejects": {
                    "total": info.rejects_total,
                    "by_reason": dict(info.rejects_by_reason),
                    "file": redact_url(str(join(result.dst, str(info.rejects_file)))),
                },
                "empty_classes": [c for c, n in zip(classes, info.class_counts, strict=True) if n == 0],
            }
            for info in result.infos
        },
        "shards_written": result.shards_written,
        "shards_reused": result.shards_reused,
        "seconds": round(result.seconds, 3),
        "read_order": result.read_order,
        "engine": result.engine,
        "nodes": dict(result.nodes),
        "retried": list(result.retried),
        "warnings": [*result.warnings, *_warnings(result)],
    }


def _hint_json(result: PackResult, split: str) -> dict[str, Any] | None:
    hint = result.hints.get(split)
    return None if hint is None else {**hint.to_json(), "line": hint.line()}


def print_summary(result: PackResult, *, rejects: Mapping[str, Sequence[str]] | None = None) -> None:
    """Print what a pack did per split (formats, conversions, rejects), then the run, then warnings.

    ``rejects`` maps a split to its rejected files, listed instead of the rejects file's path (the
    demo's, whose file is gone when the command ends).
    """
    for info in result.infos:
        classes = plural(len(result.manifest.classes), "class", "classes")
        click.echo(
            f"packed split {shown(info.name, quoted=True)} into {shown(redact_url(str(result.dst)))}: "
            f"{plural(info.samples, 'sample')} of "
            f"{classes} in {plural(len(info.shards), 'shard')} ({format_bytes(info.bytes)})"
        )
        if len(info.formats) == 1:
            (ext,) = info.formats
            converted = ""
            if info.converted:
                reasons = ", ".join(f"{reason} {n:,}" for reason, n in info.converted.items())
                converted = f" ({reasons})"
            click.echo(f"  every image stored as .{ext}{converted}")
        if info.image_sizes is not None:
            click.echo(f"  image sizes: {info.image_sizes.describe()}")
        if (hint := result.hints.get(info.name)) is not None:
            click.echo(f"  {hint.line()}")
        if info.rejects_total:
            reasons = ", ".join(f"{reason} {n:,}" for reason, n in info.rejects_by_reason.items())
            if rejects is not None and info.name in rejects:
                click.echo(f"  rejected {plural(info.rejects_total, 'file')} ({reasons}):")
                for line in rejects[info.name]:
                    click.echo(f"    {shown(line)}")
            else:
                where = shown(redact_url(str(join(result.dst, str(info.rejects_file)))))
                click.echo(f"  rejected {plural(info.rejects_total, 'file')} ({reasons}): see {where}")
        else:
            click.echo("  no file rejected")
    samples = sum(info.samples for info in result.infos)
    rate = samples / result.seconds if result.seconds else 0.0
    click.echo(
        f"  {plural(result.shards_written, 'shard')} written, {result.shards_reused:,} reused from an "
        f"earlier run, in {result.seconds:.1f} s ({rate:,.0f} samples/s overall)"
    )
    if result.engine != "pool":
        per_node = ", ".join(f"{shown(node)} {n}" for node, n in result.nodes.items()) or "none"
        click.echo(f"  shards written per node ({len(result.nodes)} nodes): {per_node}")
    if result.retried:
        click.echo(f"  written again after an attempt was cut off: {', '.join(result.retried)}")
    for warning in [*result.warnings, *_warnings(result)]:
        click.secho(f"  warning: {shown(warning, most=None)}", fg="yellow")
