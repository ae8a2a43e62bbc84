"""A resume at the end of a big epoch: time to its first batch (issue 37, point 15). Run by hand.

    python bench/resume_scale.py --work /tmp/resume-scale --samples 1000000 --shards 250

Builds (once, kept in ``--work``) a split of ``--samples`` tiny JPEGs in ``--shards`` shards, written
straight as tar files and indexed by ``imgshards index`` (the real index, with its table of sample
offsets), then times, with DataLoader workers:

- ``fresh``: a loader's first batch at the start of the epoch;
- ``resumed``: a loader's first batch after ``load_state_dict`` of a state saved ``--left`` batches
  before the end of the epoch (the state is built as the loader writes it: no pass is run to save it).

A resume replays the order up to the saved point on the index alone and reads only the samples
still to come, so its first batch should come within seconds at 10M samples (it took 90 s before,
at 2.3 ms a skipped batch). The 10M-sample split of the issue is ``--samples 10000000 --shards
2500`` (about 10 GB of tar and some minutes to write).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import tarfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from imgshards.converter import read_manifest
from imgshards.converter.format.tables import encode_table
from imgshards.converter.shards.index import IndexConfig, index


def tiny_jpegs(n: int, size: int) -> list[bytes]:
    """``n`` distinct tiny JPEGs (random colour blocks), reused round-robin by the samples."""
    rng = np.random.default_rng(0)
    out = []
    for _ in range(n):
        im = Image.fromarray(rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)).resize((size, size))
        buf = io.BytesIO()
        im.save(buf, format="JPEG", quality=80)
        out.append(buf.getvalue())
    return out


def member(name: str, data: bytes) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), 0, 0o644
    pad = -len(data) % tarfile.BLOCKSIZE
    return info.tobuf(format=tarfile.USTAR_FORMAT) + data + b"\0" * pad


def build(work: Path, samples: int, shards: int, classes: int) -> Path:
    """Write the split's shards (tar: ``key.jpg`` + ``key.cls``) and index them; reuse a built one."""
    root = work / f"split-{samples}-{shards}"
    if (root / "index.json").exists():
        return root
    root.mkdir(parents=True, exist_ok=True)
    images = tiny_jpegs(64, 16)
    per = -(-samples // shards)
    starts: dict[str, list[int]] = {}  # each sample's first block, as pack's index table has it
    start = time.perf_counter()
    for s in range(shards):
        name = f"train-{s:06d}.tar"
        part = root / f".{name}.part"
        blocks = starts[name] = []
        with open(part, "wb") as f:
            for i in range(s * per, min(samples, (s + 1) * per)):
                blocks.append(f.tell() // tarfile.BLOCKSIZE)
                key = f"{i:09d}"
                f.write(member(f"{key}.jpg", images[i % len(images)]))
                f.write(member(f"{key}.cls", str(i % classes).encode()))
            f.write(b"\0" * (2 * tarfile.BLOCKSIZE))
        os.replace(part, root / name)
    print(f"wrote {shards} shards of {samples:,} samples in {time.perf_counter() - start:.0f} s")
    start = time.perf_counter()
    index(root, IndexConfig(classes=tuple(f"c{c}" for c in range(classes))))
    # `imgshards index` (of another tool's shards) writes no table of sample offsets; `pack` does.
    # Add it, as pack would have: without it a run that starts mid-shard steps over tar headers.
    path = root / "index.json"
    data = json.loads(path.read_text())
    for shard in data["splits"]["train"]["shards"]:
        shard["offsets"] = encode_table(starts[shard["name"]])
    path.write_text(json.dumps(data))
    print(f"indexed them in {time.perf_counter() - start:.0f} s")
    return root


def first_batch(root: Path, *, workers: int, batch: int, left: int | None) -> tuple[float, int]:
    """Seconds from building a loader to its first batch; with ``left``, resumed ``left`` batches early."""
    from imgshards.loader import ShardDataset, make_loader

    start = time.perf_counter()
    ds = ShardDataset(root, batch_size=batch, image_size=16, transform="eval")
    loader = make_loader(ds, num_workers=workers)
    total = len(loader)
    if left is not None:
        state = loader.state_dict()
        state["batches"] = total - left  # as the loader saves it after total - left batches
        loader.load_state_dict(json.loads(json.dumps(state)))
    next(iter(loader))
    return time.perf_counter() - start, total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, required=True, help="where the split is built (and kept)")
    p.add_argument("--samples", type=int, default=1_000_000, help="samples in the split (issue: 10M)")
    p.add_argument("--shards", type=int, default=250, help="shards of the split (issue: 2,500)")
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--left", type=int, default=10, help="batches left in the epoch at the resume")
    args = p.parse_args()
    root = build(args.work, args.samples, args.shards, args.classes)
    samples = read_manifest(root).split("train").samples
    fresh, total = first_batch(root, workers=args.workers, batch=args.batch_size, left=None)
    resumed, _ = first_batch(root, workers=args.workers, batch=args.batch_size, left=args.left)
    print(
        f"{samples:,} samples, {args.shards} shards, {args.workers} workers, batch {args.batch_size}: "
        f"{total:,} batches an epoch"
    )
    print(f"fresh pass, first batch:                      {fresh:6.2f} s")
    print(f"resumed {args.left} batches before the end, first batch: {resumed:6.2f} s")


if __name__ == "__main__":
    main()
