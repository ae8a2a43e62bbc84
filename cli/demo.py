"""``imgshards demo``: make a small synthetic tree, pack it, verify it, load it, print the summary.

The load is the smoke test of an install: one batch through ``ShardDataset`` and one sample through
``ImageFolder``, from ``imgshards.loader`` (imported only here: the other commands never pay for
torch). A loader that does not import or decode here (torch and its image libraries that do not
match) fails the command with one line saying what to reinstall.

``--keep DIR`` keeps the tree (``DIR/photos``) and its shards (``DIR/shards``), a tree of one's own to
try the other commands on; without it, both are in a temporary directory removed as the command
ends, so the summary lists the rejected files themselves rather than a rejects file that will be gone.
"""

from __future__ import annotations

import json
import tempfile
import warnings
from pathlib import Path
from typing import Any

import click

from imgshards.converter import ImgshardsError, PackConfig, SplitInfo, make_synthetic_tree, pack, verify
from imgshards.converter.format.errors import shown

from .exits import BadData, CantRun
from .options import plural, workers_option
from .pack import print_summary, summary_json

__all__ = ["demo"]

_SHOWN_REJECTS = 10  # the demo's tree has 4 bad files; a kept DIR may have gained more
_BATCH = 8  # images in the batch the demo loads
# What torch and its image libraries raise when they do not load together: a native library built
# for another torch (OSError), an extension module that does not link (ImportError), a missing
# package (ModuleNotFoundError), a kernel that is not there (RuntimeError).
_BROKEN = (ImportError, OSError, RuntimeError)
# From one index: the one torch came from, or PyPI's where PyTorch's CPU index cannot be reached (pip
# would mix a torch+cpu with a CUDA torchvision from PyPI again). The README's quick start says it too.
_REINSTALL = (
    "reinstall torch and its image libraries together, from one index: pip install --force-reinstall "
    "torch torchvision torchcodec --index-url URL, URL the index torch came from "
    "(https://download.pytorch.org/whl/cpu for a CPU-only torch), or https://pypi.org/simple where "
    "that one cannot be reached; then run imgshards demo again"
)


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
        doc = {
            "source": str(src) if keep else None,
            "pack": summary_json(result),
            "verify": {"ok": report.ok, "shards": report.shards, "samples": report.samples},
            "load": None,
            "kept": str(root) if keep else None,
        }
        if not report.ok:
            if as_json:
                click.echo(json.dumps(doc, indent=1))
            raise BadData("; ".join(map(str, report.problems)))
        say(f"verified: {plural(report.shards, 'shard')}, {plural(report.samples, 'sample')} match the index")
        try:
            loaded = _load(root / "shards")
        except _LoaderBroken as e:
            doc["load"] = {"ok": False, "error": str(e)}
            if as_json:
                click.echo(json.dumps(doc, indent=1))
            raise CantRun(str(e)) from None
        doc["load"] = loaded
        if not quiet:
            for warning in loaded["warnings"]:
                click.secho(f"warning: {warning}", fg="yellow", err=True)
        if as_json:
            click.echo(json.dumps(doc, indent=1))
        batch, sample = loaded["batch"], loaded["imagefolder"]
        say(
            f"loaded: a batch of {batch[0]} images {batch} through ShardDataset, and sample 0 through "
            f"ImageFolder (a {sample['width']}x{sample['height']} {sample['mode']} image of class "
            f"{sample['class']}); JPEG decoder: {loaded['jpeg_decoder']}"
        )
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


class _LoaderBroken(Exception):
    """The loader does not import, or does not load a batch, on this install (the message says why)."""


def _load(shards: Path) -> dict[str, Any]:
    """Load one batch through ``ShardDataset`` and sample 0 through ``ImageFolder``; say what came out.

    Returns the ``"load"`` entry of ``--json``: the batch's shape, the sample's size, mode and class,
    which library decodes JPEG, and the warnings importing the loader gave (a decoder passed over).

    Raises:
        _LoaderBroken: the loader does not import or load here; the message names the error and the fix.

    """
    try:
        with warnings.catch_warnings(record=True) as caught:
            from imgshards.loader import ImageFolder, ShardDataset, make_loader
            from imgshards.loader.image.decode import JPEG_DECODER
        dataset = ShardDataset(shards, split="train", batch_size=_BATCH)
        batch = next(iter(make_loader(dataset, num_workers=0)))
        image, target = ImageFolder(str(shards))[0]
    except ImgshardsError:
        raise  # the loader's own one-line errors (a ShardReadError is an OSError): the group says them
    except _BROKEN as e:
        raise _LoaderBroken(
            f"imgshards.loader does not work on this install ({type(e).__name__}: {_first_line(e)}): "
            f"{_REINSTALL}"
        ) from e
    return {
        "ok": True,
        "batch": list(batch.images.shape),
        "imagefolder": {"width": image.width, "height": image.height, "mode": image.mode, "class": target},
        "jpeg_decoder": JPEG_DECODER,
        "warnings": [_first_line(w.message) for w in caught],
    }


def _first_line(said: object) -> str:
    """The first line of an error or a warning, safe to print."""
    line: str = shown((str(said).strip().splitlines() or [""])[0])
    return line


def _rejects(dst: Path | str, infos: list[SplitInfo]) -> dict[str, list[str]]:
    """Each split's rejected files, ``path: reason``, read from its rejects file before it is removed."""
    listed = {}
    for info in infos:
        lines = Path(dst, str(info.rejects_file)).read_text().splitlines()
        rows = [json.loads(line) for line in lines]
        files = [f"{shown(row['path'])}: {shown(row['reason'])}" for row in rows[:_SHOWN_REJECTS]]
        if len(rows) > _SHOWN_REJECTS:
            files.append(f"... and {len(rows) - _SHOWN_REJECTS:,} more")
        listed[info.name] = files
    return listed
