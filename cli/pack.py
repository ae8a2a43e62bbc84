"""``imgshards pack SRC DST``."""

from __future__ import annotations

from pathlib import Path

import click

from imgshards.converter import DEFAULT_SHARD_SIZE, Check, PackConfig, PackResult, pack_to_url
from imgshards.converter import pack as pack_tree

from .options import ByteSize, format_bytes, shown
from .storage import PathOrURL, join, storage_option

__all__ = ["pack", "print_summary"]


@click.command()
@click.argument("src", type=click.Path(path_type=Path, file_okay=False))
@click.argument("dst", type=PathOrURL())
@click.option("--split", default="train", show_default=True, help="Split name; the shards' prefix.")
@click.option(
    "--shard-size",
    type=ByteSize(),
    default=DEFAULT_SHARD_SIZE,
    show_default="256MB",
    help="Close a shard before it passes this size (256MB, 1GiB...).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the global shuffle.")
@click.option(
    "--check",
    type=click.Choice([c.value for c in Check]),
    default=Check.HEADER.value,
    show_default=True,
    help="header: cheap checks; full: decode every image; none: trust the files.",
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
    "--workers", type=click.IntRange(min=1), default=None, help="Worker processes [default: all cores]."
)
@click.option("--overwrite", is_flag=True, help="Replace a split packed into DST with other arguments.")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Progress bars on stderr.")
@click.option(
    "--staging",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="URL DST: local directory for shards before upload [default: a temporary one].",
)
@storage_option
def pack(
    src: Path, dst: Path | str, staging: Path | None, storage_options: dict[str, object], **options: object
) -> None:
    """Pack the ImageFolder tree SRC (SRC/<class>/<image>) into WebDataset shards in DST.

    DST is a directory or any fsspec URL (s3://bucket/prefix, gs://...): each shard is uploaded as
    soon as it is written, the index last. Every file under SRC is either packed or listed, with its
    reason, in DST/<split>-rejects.jsonl. Run the same command again after a crash to finish the
    job; the output is the same as an uninterrupted run's.
    """
    if options["quality"] != 90 and options["resize"] is None:
        raise click.UsageError("--quality applies to re-encoded images only; add --resize N")
    if isinstance(dst, Path) and (staging is not None or storage_options):
        raise click.UsageError("--staging and --storage-option apply to a URL destination only")
    try:
        config = PackConfig(**options)
    except ValueError as e:
        raise click.UsageError(str(e)) from e
    if isinstance(dst, str):
        result = pack_to_url(src, dst, config, storage_options=storage_options, staging=staging)
    else:
        result = pack_tree(src, dst, config)
    print_summary(result)


def print_summary(result: PackResult) -> None:
    """Print what a pack did, rejects included."""
    info = result.info
    rate = sum(s.samples for s in info.shards) / result.seconds if result.seconds else 0.0
    click.echo(
        f"packed split {result.split!r} into {result.dst}: {info.samples:,} samples of "
        f"{len(result.manifest.classes):,} classes in {len(info.shards):,} shards "
        f"({format_bytes(info.bytes)})"
    )
    click.echo(
        f"  {result.shards_written} shards written, {result.shards_reused} reused from an earlier run, "
        f"in {result.seconds:.1f} s ({rate:,.0f} samples/s overall)"
    )
    if info.rejects_total:
        reasons = ", ".join(f"{reason} {n:,}" for reason, n in info.rejects_by_reason.items())
        where = join(result.dst, str(info.rejects_file))
        click.echo(f"  rejected {info.rejects_total:,} files ({reasons}): see {where}")
    else:
        click.echo("  no file rejected")
    empty = [name for name, n in zip(result.manifest.classes, info.class_counts, strict=True) if n == 0]
    if empty:
        click.secho(
            f"  warning: {len(empty)} classes have no sample left: {', '.join(map(shown, empty[:5]))}",
            fg="yellow",
        )
