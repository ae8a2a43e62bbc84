r"""``imgshards info DST``: what the index says (O(shards): no table file and no shard is read).

``--json`` prints the index as strict JSON (UTF-8, no lone surrogate): a name that is not UTF-8 (a
folder named by other bytes, which Python reads as surrogate escapes) shows each such byte as the
four characters ``\xNN`` (:func:`as_text`). Format 1's per-sample tables (base64 inside its index)
are left out, as format 2's files are: the document is of the shards, not the samples.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from imgshards.converter import Manifest, read_manifest
from imgshards.converter.format.errors import shown
from imgshards.converter.format.locate import redact_url
from imgshards.converter.format.manifest import FORMAT_VERSION
from imgshards.converter.format.remotefs import with_timeouts

from .exits import CantRun
from .options import format_bytes, plural
from .storage import PathOrURL, storage_option, timeout_option

__all__ = ["as_text", "info"]


@click.command()
@click.argument("dst", type=PathOrURL(file_okay=True))
@click.option("--split", "splits", multiple=True, help="Describe only this split (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print the whole index (or its --split) as JSON.")
@storage_option
@timeout_option
def info(
    dst: Path | str,
    splits: tuple[str, ...],
    as_json: bool,
    storage_options: dict[str, object],
    timeout: float,
) -> None:
    """Describe the packed dataset in DST (directory or URL): classes, splits, formats, balance, rejects."""
    if isinstance(dst, str):  # a URL: a server that stalls ends the command after --timeout
        storage_options = with_timeouts(dst, storage_options, timeout)
    manifest = read_manifest(dst, storage_options=storage_options)
    unknown = [name for name in splits if name not in manifest.splits]
    if unknown:
        have = ", ".join(map(shown, sorted(manifest.splits))) or "none"
        raise CantRun(
            f"{shown(redact_url(str(dst)))} has no split {shown(unknown[0], quoted=True)}; its splits: {have}"
        )
    chosen = sorted(set(splits) or manifest.splits)
    if as_json:
        doc = _document(manifest)
        doc["splits"] = {name: split for name, split in doc["splits"].items() if name in chosen}
        # Strict JSON (no NaN: the index check refuses it; no lone surrogate); a source's password hidden.
        click.echo(redact_url(json.dumps(as_text(doc), indent=1, allow_nan=False)))
        return
    names = ", ".join(map(shown, manifest.classes[:5])) + (", ..." if len(manifest.classes) > 5 else "")
    where = shown(redact_url(str(dst)))
    click.echo(
        f"{where}: {plural(len(manifest.classes), 'class', 'classes')} ({names}); "
        f"index format {manifest.version}"
    )
    if manifest.version < FORMAT_VERSION:
        click.echo(
            f"  format {manifest.version} holds every sample's tables inside index.json, which each "
            f"process reads whole: `imgshards index --upgrade {where}` rewrites it as format "
            f"{FORMAT_VERSION}, reading and changing no shard"
        )
    for name in chosen:
        split = manifest.splits[name]
        sizes = [s.bytes for s in split.shards]
        click.echo(
            f"  {shown(name)}: {plural(split.samples, 'sample')} in {plural(len(split.shards), 'shard')} "
            f"({format_bytes(split.bytes)}; "
            f"shard {format_bytes(min(sizes, default=0))}..{format_bytes(max(sizes, default=0))})"
        )
        if split.formats:
            formats = ", ".join(f".{shown(ext)} {n:,}" for ext, n in split.formats.items())
            converted = ", ".join(f"{shown(reason)} {n:,}" for reason, n in split.converted.items())
            click.echo(f"    formats: {formats}" + (f" (converted: {converted})" if converted else ""))
        if split.image_sizes is not None:
            click.echo(f"    image sizes: {split.image_sizes.describe()}")
        if split.class_counts:
            click.echo(f"    per class: {balance(manifest.classes, split.class_counts)}")
        reasons = ", ".join(f"{shown(r)} {n:,}" for r, n in split.rejects_by_reason.items()) or "none"
        click.echo(f"    rejected: {split.rejects_total:,} ({reasons})")


def _document(manifest: Manifest) -> dict[str, Any]:
    """The index as JSON, of the version read; format 1's inline tables left out (O(samples))."""
    bare = Manifest(
        manifest.classes,
        {
            name: replace(split, shards=tuple(s.without_tables() for s in split.shards))
            for name, split in manifest.splits.items()
        },
    )
    return {**bare.to_json(), "version": manifest.version}


def as_text(value: Any) -> Any:
    r"""``value`` (JSON: dicts, lists, strings...) with every string valid Unicode, as strict JSON wants.

    A name read from bytes that are not UTF-8 holds lone surrogates (``\udcff``, Python's escape of
    the byte 0xFF), which ``json.dumps`` writes as ``"\udcff"`` and strict parsers refuse; here each
    such byte is the text ``\xff`` instead (a backslash, ``x`` and two hex digits).
    """
    if isinstance(value, str):
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:
            try:
                raw = value.encode("utf-8", "surrogateescape")
            except UnicodeEncodeError:  # a surrogate no byte gives (a hostile index's \ud800)
                raw = value.encode("utf-8", "surrogatepass")
            return raw.decode("utf-8", "backslashreplace")
    if isinstance(value, dict):
        return {as_text(k): as_text(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_text(v) for v in value]
    return value


def balance(classes: Sequence[str], counts: Sequence[int]) -> str:
    """The smallest and the largest class by name, or that every class holds the same number."""
    low, high = min(counts), max(counts)
    if low == high:
        return f"{low:,} each"

    def named(n: int) -> str:
        names = [shown(c) for c, k in zip(classes, counts, strict=True) if k == n]
        more = f" and {len(names) - 1:,} more" if len(names) > 1 else ""
        return f"{n:,} ({names[0]}{more})"

    return f"smallest {named(low)}, largest {named(high)}"
