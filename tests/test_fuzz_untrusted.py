"""Bounded fuzzing of what a dataset says (issues 12 and 21): 300 mutated index.json documents, 300
mutated shards, and 200 mutated or cut image headers.

Fixed seed, in-process, each test under a timeout. A mutated index either loads (and then every
name in it is plain and every count in bounds) or raises ManifestError; a mutated shard is read by
the loader's reader and by verify's checker without any exception escaping, and never hangs. A
mutated image is either decoded or refused in one line, by pack's header check and by the loader.
"""

from __future__ import annotations

import io
import json
import random
import shutil
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from imgshards.converter import ManifestError, read_manifest
from imgshards.converter.format.headers import image_size, jpeg_header, jpeg_scans, oversized, too_many_scans
from imgshards.converter.format.validate import MAX_SHARD_BYTES, check_name
from imgshards.converter.scan.check import Check, Inspection, inspect_image
from imgshards.converter.shards.verify import check_shard_stream
from imgshards.loader import CorruptImageError, ShardDataset
from imgshards.loader.image.decode import decode
from imgshards.loader.pipeline.tar import read_run

SEED = 12
CASES = 300
HOSTILE = [
    -1, 0, 2**31, 2**50, 2**80, 10**12, 25.7, True, None, "", "../x.tar", "/etc/passwd", "pipe:id",
    "a\x00b", "\x1b[2J", "é\udcff", [], {}, [1, 2], {"train": [1]}, [[[[[]]]]], "0" * 64,
]  # fmt: skip


def _paths(node: Any, at: tuple = ()) -> Iterator[tuple]:
    yield at
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in children:
        yield from _paths(child, (*at, key))


def _mutate_document(doc: Any, rng: random.Random) -> Any:
    for _ in range(rng.randint(1, 3)):
        paths = [p for p in _paths(doc) if p]
        path = rng.choice(paths)
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        if rng.random() < 0.2 and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = rng.choice(HOSTILE)
    return doc


def _mutate_text(text: bytes, rng: random.Random) -> bytes:
    data = bytearray(text)
    for _ in range(rng.randint(1, 8)):
        data[rng.randrange(len(data))] = rng.randrange(256)
    return bytes(data[: rng.randint(len(data) // 2, len(data))]) if rng.random() < 0.3 else bytes(data)


@pytest.mark.timeout(60)
def test_mutated_indexes_load_within_bounds_or_raise_manifest_error(tiny_packed, tmp_path):
    ds = tmp_path / "ds"
    shutil.copytree(tiny_packed, ds)
    original = (ds / "index.json").read_bytes()
    rng = random.Random(SEED)
    loaded = refused = 0
    for _ in range(CASES):
        if rng.random() < 0.75:
            data = json.dumps(_mutate_document(json.loads(original), rng)).encode()
        else:
            data = _mutate_text(original, rng)
        (ds / "index.json").write_bytes(data)
        try:
            manifest = read_manifest(ds)
            ShardDataset(ds, split=next(iter(manifest.splits), "train"))
        except ManifestError:
            refused += 1
            continue
        loaded += 1
        assert manifest.classes
        for split in manifest.splits.values():
            assert len(split.class_counts) == len(manifest.classes)
            for shard in split.shards:
                assert check_name(shard.name, "name", "fuzz") == shard.name
                assert 0 <= shard.samples <= shard.bytes <= MAX_SHARD_BYTES
    assert refused > CASES // 2 and loaded > 0  # both ways were exercised


def _mutate_shard(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        if len(out) < 512:
            break
        header = 512 * rng.randrange(len(out) // 512)
        kind = rng.random()
        if kind < 0.35:  # a size field: octal, base-256 (huge or negative), garbage
            out[header + 124 : header + 136] = rng.choice(
                [
                    b"\x80" + rng.randbytes(11),
                    b"\xff" * 12,
                    b"%011o\0" % rng.randrange(8**11),
                    rng.randbytes(12),
                ]
            )
            out[header + 148 : header + 156] = b" " * 8
            out[header + 148 : header + 156] = b"%06o\0 " % sum(out[header : header + 512])  # keep it valid
        elif kind < 0.55:  # a name, type flag or .cls payload
            out[header + rng.randrange(160)] = rng.randrange(256)
            out[header + 148 : header + 156] = b" " * 8
            out[header + 148 : header + 156] = b"%06o\0 " % sum(out[header : header + 512])
        elif kind < 0.8:
            out[rng.randrange(len(out))] = rng.randrange(256)
        else:
            del out[rng.randrange(len(out)) :]
    return bytes(out)


@pytest.mark.timeout(60)
def test_mutated_shards_are_read_and_verified_without_escaping_errors(tiny_packed, tmp_path):
    manifest = read_manifest(tiny_packed)
    shards = manifest.split("train").shards
    rng = random.Random(SEED)
    path = tmp_path / "shard.tar"
    damaged = 0
    for i in range(CASES):
        shard = shards[i % len(shards)]
        path.write_bytes(_mutate_shard((tiny_packed / shard.name).read_bytes(), rng))
        reports: list[str] = []
        corrupt: list[Exception] = []
        samples = list(
            read_run(
                path, 0, shard.samples, on_truncated=reports.append, num_classes=4, on_corrupt=corrupt.append
            )
        )
        assert all(0 <= s.label < 4 and len(s.data) <= path.stat().st_size for s in samples)
        damaged += bool(reports or corrupt)
        problems, _ = check_shard_stream(lambda: path.open("rb"), shard, 4)
        assert problems, "a mutated shard never matches its index's hash"
    assert damaged > CASES // 3


def _encoded(fmt: str, **params: object) -> bytes:
    pixels = np.random.default_rng(SEED).integers(0, 255, (12, 16, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=fmt, **params)
    return out.getvalue()


# Small images: every byte is near a header (a JPEG's tables are most of its 700 bytes).
SEEDS = {
    "baseline": (_encoded("JPEG"), "jpg"),
    "progressive": (_encoded("JPEG", progressive=True), "jpg"),
    "restarts": (_encoded("JPEG", progressive=True, restart_marker_blocks=1), "jpg"),
    "png": (_encoded("PNG"), "png"),
    # Issue 50: the walkers of every GIF frame and every TIFF page, on bytes a shard holds as .png.
    "gif": (_encoded("GIF"), "png"),
    "tiff": (_encoded("TIFF"), "png"),
}
PIXEL_BOUND = 1_000_000  # a mutated size decodes in milliseconds, not seconds


@st.composite
def mutated_images(draw: st.DrawFn) -> tuple[bytes, str]:
    data, ext = SEEDS[draw(st.sampled_from(sorted(SEEDS)))]
    out = bytearray(data)
    for at, value in draw(st.lists(st.tuples(st.integers(0, len(out) - 1), st.integers(0, 255)), max_size=6)):
        out[at] = value
    if draw(st.booleans()):
        del out[draw(st.integers(0, len(out))) :]
    return bytes(out), ext


@pytest.mark.timeout(60)
@settings(max_examples=300, deadline=None, derandomize=True)  # 50 a seed
@given(mutated_images())
def test_mutated_image_headers_decode_or_are_refused_in_one_line(image):
    data, ext = image
    # The header readers never raise, whatever the bytes.
    image_size(data), jpeg_header(data), jpeg_scans(data), too_many_scans(data)
    limit, Image.MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS, PIXEL_BOUND
    try:
        assert oversized(data) is None or "more than the limit of 1,000,000" in str(oversized(data))
        verdict = inspect_image(data, f".{ext}", Check.FULL)
        assert isinstance(verdict, Inspection) and "\n" not in verdict.detail
        assert (verdict.reason is None) == (verdict.ext is not None)
        try:
            decoded = decode(data, ext, key="k", shard="s")
        except CorruptImageError as e:
            assert "\n" not in str(e) and "image 'k' in shard s does not decode (" in str(e)
        else:
            assert decoded.dtype == torch.uint8 and decoded.dim() == 3 and decoded.shape[0] == 3
            assert decoded.shape[1] * decoded.shape[2] <= PIXEL_BOUND
    finally:
        Image.MAX_IMAGE_PIXELS = limit
