"""A resume reads no byte of what it skips: the order up to the saved point is replayed from the index.

A loader with DataLoader workers stops after 97% of an epoch's batches; its ``state_dict`` is loaded
into a loader that reads the same shards over HTTP (a real local server, which logs every byte range
it sends). The resumed loader's batches are the uninterrupted run's (keys, labels and pixels), and
it is sent under 5% of the shards' bytes: the samples still to come, their tar headers, and the
look-ahead of each ranged reader it opens. Before (issue 37, point 15), a resume read every sample
up to the saved point and dropped it: the whole epoch's bytes again.
"""

from __future__ import annotations

import json
import math
import tarfile
from itertools import islice

import numpy as np
import pytest
import torch
from PIL import Image

from imgshards.converter import read_manifest
from imgshards.loader import ShardDataset, ShardSource, make_loader, preset

from .conftest import pixel_hash

BATCH = 4
TRANSFORM = preset("eval", size=64)  # no randomness: an image's pixels name it


@pytest.fixture(scope="module")
def packed_epoch(tmp_path_factory, packed_factory):
    """400 JPEGs of ImageNet's file size (about 100 KB each: noise compresses little), 40 a shard.

    Made here, not cut from ../shared's photos: the smooth fallback JPEGs of a clone without them
    are a few KB, where the ranged reader's 16 KiB pieces, not the samples, would be what is counted.
    """
    rng = np.random.default_rng(7)
    src = tmp_path_factory.mktemp("noise") / "src"
    for c in range(8):
        (src / f"n{c:08d}").mkdir(parents=True)
        for i in range(50):
            pixels = rng.integers(0, 256, (300, 400, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(src / f"n{c:08d}" / f"{i:04d}.JPEG", quality=85)
    root = packed_factory(src, max_samples=40)
    assert len(read_manifest(root).split("train").shards) == 10
    return root


def loader(source, **kw):
    ds = ShardDataset(source, batch_size=BATCH, transform=TRANSFORM, shuffle_buffer=16, seed=3, **kw)
    out = make_loader(ds, num_workers=2)
    out.set_epoch(1)
    return out


def key_of(root) -> dict[str, str]:
    """Pixel hash (as the loader decodes and transforms it) -> sample key, for every sample of ``root``.

    An eval pass without shuffling gives the samples in the shards' order, as ``tarfile`` lists them.
    """
    listed = []
    for shard in read_manifest(root).split("train").shards:
        with tarfile.open(root / shard.name) as tar:
            for member in tar:
                key, ext = member.name.split(".", 1)
                if ext == "cls":
                    listed.append((key, int(tar.extractfile(member).read())))  # type: ignore[union-attr]
    ds = ShardDataset(root, batch_size=BATCH, transform=TRANSFORM, mode="eval", shuffle=False)
    images = [
        (pixel_hash(i), label)
        for b in make_loader(ds, num_workers=0)
        for i, label in zip(b.images, b.labels.tolist(), strict=True)
    ]
    assert [label for _, label in images] == [label for _, label in listed]
    return {h: key for (h, _), (key, _) in zip(images, listed, strict=True)}


def seen(batches, keys: dict[str, str]) -> list[list[tuple[str, int]]]:
    """Each batch as (key, label) pairs: its images named by their pixels."""
    return [
        list(zip((keys[pixel_hash(i)] for i in images), labels.tolist(), strict=True))
        for images, labels in batches
    ]


def shard_bytes_sent(state) -> int:
    """Bytes of ``.tar`` files the server sent, from its log of ranges (a whole file without one)."""
    sizes = {p.name: p.stat().st_size for p in state.root.glob("*.tar")}
    total = 0
    for r in state.gets(".tar"):
        size = sizes[r.path.rsplit("/", 1)[-1]]
        lo = r.start or 0
        hi = size if r.end is None else min(r.end, size)
        total += max(0, hi - lo)
    return total


def test_a_resume_at_the_end_of_an_epoch_reads_only_what_is_left(packed_epoch, http_serve):
    keys = key_of(packed_epoch)
    full = loader(packed_epoch)
    every = [(b.images.clone(), b.labels.clone()) for b in full]
    assert len(every) == len(full)
    stop = len(every) - math.ceil(len(every) * 0.03)  # 97% delivered

    first = loader(packed_epoch)
    head = seen(islice(first, stop), keys)
    state = json.loads(json.dumps(first.state_dict()))
    assert state["batches"] == stop

    url, server = http_serve(packed_epoch)
    source = ShardSource(url, chunk_size=16 << 10, readahead=1)
    resumed = loader(source)
    resumed.load_state_dict(state)
    tail = [(b.images.clone(), b.labels.clone()) for b in resumed]

    assert len(set(keys.values())) == 400 and len(tail) == len(every) - stop > 0
    assert head + seen(tail, keys) == seen(every, keys)
    assert torch.equal(tail[-1][0], every[-1][0]) and torch.equal(tail[-1][1], every[-1][1])  # pixels

    epoch_bytes = sum(s.bytes for s in read_manifest(packed_epoch).split("train").shards)
    sent = shard_bytes_sent(server)
    print(f"resume read {sent} of the epoch's {epoch_bytes} shard bytes ({sent / epoch_bytes:.1%})")
    assert 0 < sent < 0.05 * epoch_bytes, f"resume read {sent} of the epoch's {epoch_bytes} bytes"
