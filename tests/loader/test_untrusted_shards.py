"""Hostile or damaged shards in training (issues 12 and 21): skip and count, or raise; never hang.

Each case rewrites a shard of a private copy of a real packed dataset, then trains a pass through real
DataLoader workers. A case that used to hang runs in a subprocess with a timeout.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import struct
import subprocess
import sys
import tarfile
import time
import warnings
from pathlib import Path

import pytest
import torch
from PIL import Image

from imgshards.converter import ManifestError, read_manifest
from imgshards.converter.format.headers import jpeg_scans
from imgshards.loader import (
    ConfigError,
    CorruptImageError,
    DecodeOn,
    ImageShapeError,
    ResizeCenterCrop,
    ShardDataset,
    ShardReadError,
    make_loader,
)
from imgshards.loader.pipeline.tar import read_run


@pytest.fixture
def ds(tiny_packed, tmp_path) -> Path:
    copy = tmp_path / "ds"
    shutil.copytree(tiny_packed, copy)
    return copy


def rewrite_shard(ds: Path, index: int, edit) -> tuple[str, int]:
    """Rewrite shard ``index`` member by member through ``edit(name, data) -> (name, data)``.

    The index is updated to the new size and hash (a shard as its packer meant it); returns the
    shard's name and sample count.
    """
    manifest = json.loads((ds / "index.json").read_text())
    entry = manifest["splits"]["train"]["shards"][index]
    path = ds / entry["name"]
    out = io.BytesIO()
    with tarfile.open(path) as src, tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as dst:
        for member in src:
            data = src.extractfile(member).read()  # type: ignore[union-attr]
            name, data = edit(member.name, data)
            info = tarfile.TarInfo(name)
            info.size = len(data)
            dst.addfile(info, io.BytesIO(data))
    data = out.getvalue()
    path.write_bytes(data)
    entry.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    train = manifest["splits"]["train"]
    train["bytes"] = sum(s["bytes"] for s in train["shards"])
    (ds / "index.json").write_text(json.dumps(manifest))
    return entry["name"], entry["samples"]


def one_pass(ds: Path, workers: int, mode: str = "train", **kwargs) -> tuple[ShardDataset, list, list[str]]:
    # Train mode keeps len() batches on every rank whatever is lost; eval yields what there is, once.
    # A damaged shard here is an eighth of the split: more than the default max_lost (issue 31).
    kwargs.setdefault("max_lost", 1)
    dataset = ShardDataset(ds, mode=mode, batch_size=4, image_size=32, **kwargs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batches = list(make_loader(dataset, num_workers=workers))
    return dataset, batches, [str(w.message) for w in caught]


BAD_LABELS = [b"99999999999999999999999", b"-3", b"4", b"x", b"1" * 5000, b"999"]


@pytest.mark.parametrize("workers", [0, 2])
def test_labels_outside_the_classes_are_corrupt_samples_skipped_and_counted(ds, workers):
    bad = iter(BAD_LABELS)
    keys: list[str] = []

    def edit(name: str, data: bytes) -> tuple[str, bytes]:
        if name.endswith(".cls") and len(keys) < len(BAD_LABELS):
            keys.append(name.split(".")[0])
            return name, next(bad)
        return name, data

    # Every bad label goes in, over as many shards as it takes: how many samples a shard holds
    # depends on the images the tree generator made.
    shards = len(read_manifest(ds).split("train").shards)
    for index in range(shards):
        if len(keys) == len(BAD_LABELS):
            break
        rewrite_shard(ds, index, edit)
    assert len(keys) == len(BAD_LABELS), f"{shards} shards hold fewer than {len(BAD_LABELS)} samples"
    dataset, batches, messages = one_pass(ds, workers)
    assert len(batches) == len(dataset), "the batch count holds"
    assert all(0 <= label < 4 for b in batches for label in b.labels.tolist())
    assert dataset.corrupt_skipped == len(keys)
    evaluated, batches, _ = one_pass(ds, workers, mode="eval")
    assert sum(len(b.labels) for b in batches) == evaluated.num_samples - len(keys)
    if workers == 0:
        assert any("label 4, outside the index's classes 0..3" in m for m in messages)
        assert any("a .cls that is not a label: b'-3'" in m for m in messages)
    # Train mode shuffles: the first bad label met is any of them.
    with pytest.raises(
        CorruptImageError, match=f"sample '({'|'.join(keys)})' in shard .* (has a .cls|has label)"
    ):
        one_pass(ds, workers, on_error="raise")


def test_a_member_name_that_is_not_utf8_is_read(ds):
    def edit(name: str, data: bytes) -> tuple[str, bytes]:
        return ("caf\udce9-" + name if name.startswith(key) else name), data

    shard = read_manifest(ds).split("train").shards[0]
    with tarfile.open(ds / shard.name) as tar:
        key = tar.getnames()[0].split(".")[0]
    rewrite_shard(ds, 0, edit)  # tarfile writes the surrogate back as the byte 0xe9
    assert b"caf\xe9-" in (ds / shard.name).read_bytes()
    samples = list(read_run(ds / shard.name, 0, shard.samples))
    assert len(samples) == shard.samples and samples[0].key == f"caf\udce9-{key}"
    dataset, batches, _ = one_pass(ds, 2)
    assert len(batches) == len(dataset) and dataset.corrupt_skipped == dataset.truncated_shards == 0


def test_a_member_declaring_8_gib_is_refused_before_it_is_allocated(ds, tmp_path):
    shard = read_manifest(ds).split("train").shards[0]
    data = bytearray((ds / shard.name).read_bytes())
    with tarfile.open(ds / shard.name) as tar:
        at = tar.getmembers()[3].offset  # the second sample's image
    header = data[at : at + 512]
    header[124:136] = b"%011o\0" % (8 << 30)
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    data[at : at + 512] = header
    (ds / shard.name).write_bytes(bytes(data))
    reports: list[str] = []
    samples = list(read_run(ds / shard.name, 0, shard.samples, on_truncated=reports.append))
    assert len(samples) == 1
    assert "declares 8589934592 bytes, more than the shard has left" in reports[0]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_shard_that_became_a_directory_is_skipped_and_counted(ds, workers):
    dataset = ShardDataset(ds, mode="train", batch_size=4, image_size=32, max_lost=1)
    raising = ShardDataset(ds, mode="train", batch_size=4, image_size=32, on_error="raise")
    name = dataset.part.split.shards[1].name
    (ds / name).unlink()
    (ds / name).mkdir()  # after construction: the worker finds it
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        batches = list(make_loader(dataset, num_workers=workers))
    # Counted per read of it: blocks of one shard go to several workers (block-cyclic partition).
    assert len(batches) == len(dataset) and dataset.unreadable_shards >= 1
    with pytest.raises(ShardReadError, match=f"cannot read shard .*{name}: .* is a directory"):
        list(make_loader(raising, num_workers=workers))


def test_a_directory_or_fifo_shard_fails_at_construction_naming_it(ds):
    import os

    name = read_manifest(ds).split("train").shards[1].name
    (ds / name).unlink()
    os.mkfifo(ds / name)
    with pytest.raises(
        ManifestError, match=rf"shard {name} of split 'train': .* is a FIFO, not a regular file"
    ):
        ShardDataset(ds)
    (ds / name).unlink()
    (ds / name).mkdir()
    with pytest.raises(ManifestError, match="is a directory, not a regular file"):
        ShardDataset(ds)


_FIFO_IN_TRAINING = """
import os, sys, warnings
from imgshards.loader import ShardDataset, ShardReadError, make_loader
kwargs = dict(mode="train", batch_size=4, image_size=32, max_lost=1)
skipping, raising = ShardDataset(sys.argv[1], **kwargs), ShardDataset(sys.argv[1], on_error="raise", **kwargs)
name = skipping.part.split.shards[1].name
os.unlink(os.path.join(sys.argv[1], name))
os.mkfifo(os.path.join(sys.argv[1], name))  # nobody ever writes to it
warnings.simplefilter("ignore")
batches = list(make_loader(skipping, num_workers=2))
print("batches", len(batches), len(skipping), "unreadable", skipping.unreadable_shards)
try:
    list(make_loader(raising, num_workers=2))
except ShardReadError as e:
    print("raised", "cannot read shard" in str(e) and "is a FIFO" in str(e))
"""


def test_a_shard_that_became_a_fifo_never_blocks_a_worker(ds):
    done = subprocess.run(
        [sys.executable, "-c", _FIFO_IN_TRAINING, str(ds)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    _, got, expected, _, unreadable, _, named = done.stdout.split()
    assert got == expected and int(unreadable) >= 1 and named == "True"


def jpeg_declaring(jpeg: bytes, width: int, height: int) -> bytes:
    """``jpeg`` with its frame header rewritten to declare ``width x height``: a decompression bomb."""
    data = bytearray(jpeg)
    sof = data.index(b"\xff\xc0")
    struct.pack_into(">HH", data, sof + 5, height, width)
    return bytes(data)


@pytest.mark.parametrize("workers", [0, 2])
def test_decompression_bombs_in_someone_elses_shard_are_skipped_and_counted_unread(ds, workers):
    """Shards packed elsewhere may hold bombs pack would refuse: the header is checked before decode."""
    bombs: list[str] = []

    def edit(name: str, data: bytes) -> tuple[str, bytes]:
        if name.endswith(".jpg") and len(bombs) < 2:
            bombs.append(name)
            return name, jpeg_declaring(data, *((16000, 16000), (65500, 65500))[len(bombs) - 1])
        return name, data

    rewrite_shard(ds, 0, edit)
    assert len(bombs) == 2
    dataset, batches, messages = one_pass(ds, workers)
    assert len(batches) == len(dataset), "the batch count holds"
    assert dataset.corrupt_skipped == 2
    assert any("skipped 2 image(s) that do not decode" in m for m in messages), messages
    with pytest.raises(
        CorruptImageError, match=r"declares (16000x16000|65500x65500) = [\d,]+ pixels, more than the limit"
    ):
        one_pass(ds, workers, on_error="raise")


def flat_jpeg(width: int, height: int, **params: object) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (120, 130, 140)).save(out, format="JPEG", **params)
    return out.getvalue()


def progressive_bomb(repeats: int = 4000) -> bytes:
    """A valid 4096x4096 progressive JPEG whose last scan is repeated ``repeats`` times (~230 KB).

    Each repeat refines the whole image again: libjpeg-turbo spends ~13 ms on every one.
    """
    data = flat_jpeg(4096, 4096, progressive=True, quality=90)
    last, end = data.rindex(b"\xff\xda"), data.rindex(b"\xff\xd9")
    return data[:end] + data[last:end] * repeats + data[end:]


def three_bombs() -> dict[str, bytes]:
    """The three bombs of issue 21, each under 300 KB: pixels, an eval resize, decode time."""
    return {
        "pixels": jpeg_declaring(flat_jpeg(8, 8), 16000, 16000),  # 768 MB decoded, from ~630 bytes
        "resize": flat_jpeg(65500, 1),  # 17 KB; the eval preset's whole-image resize: 12.9 GB
        "scans": progressive_bomb(),  # 4,010 scans: 23-51 s of decoding
    }


def plant(ds: Path, bombs: list[bytes]) -> list[str]:
    """The first ``len(bombs)`` images of shard 0 replaced by ``bombs``; their member names."""
    planted: list[str] = []

    def edit(name: str, data: bytes) -> tuple[str, bytes]:
        if name.endswith(".jpg") and len(planted) < len(bombs):
            planted.append(name)
            return name, bombs[len(planted) - 1]
        return name, data

    rewrite_shard(ds, 0, edit)
    assert len(planted) == len(bombs)
    return planted


def test_the_three_bombs_are_what_the_issue_says():
    bombs = three_bombs()
    assert len(bombs["pixels"]) < 1000 and len(bombs["resize"]) < 20_000 and len(bombs["scans"]) < 300_000
    with Image.open(io.BytesIO(bombs["resize"])) as im:
        assert im.size == (65500, 1)
    assert jpeg_scans(bombs["scans"]) == 4010


@pytest.mark.parametrize("workers", [0, 2])
def test_an_eval_resize_bomb_is_skipped_and_counted_not_resized(ds, workers):
    """A valid 65500x1 JPEG: the eval preset would resize it to 16,768,000x256 (12.9 GB) first."""
    plant(ds, [flat_jpeg(65500, 1), flat_jpeg(1, 30000)])
    dataset, batches, messages = one_pass(ds, workers, mode="eval")
    assert sum(len(b.labels) for b in batches) == dataset.num_samples - 2
    assert dataset.corrupt_skipped == 2
    assert any("skipped 2 image(s)" in m for m in messages), messages
    trained, batches, _ = one_pass(ds, workers)  # a random crop of it is bounded: train mode takes it
    assert len(batches) == len(trained) and trained.corrupt_skipped == 0
    with pytest.raises(
        CorruptImageError,
        match=r"is refused by the transform \(a (65500x1|1x30000) image would be resized to "
        r"(2,423,500x37|37x1,110,000) = [\d,]+ pixels before its centre crop: its aspect ratio "
        r"(65,500|30,000):1 is more than the eval preset's limit of 100:1\)",
    ):
        one_pass(ds, workers, mode="eval", on_error="raise")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [0, 2])
def test_a_progressive_jpeg_of_4000_scans_is_skipped_unread(ds, workers):
    """4,000 repeats of the last scan take 23-51 s to decode, every epoch: refused from the header."""
    plant(ds, [progressive_bomb()])
    start = time.monotonic()
    dataset, batches, _ = one_pass(ds, workers)
    assert time.monotonic() - start < 20, "the bomb was decoded"
    assert len(batches) == len(dataset) and dataset.corrupt_skipped == 1
    with pytest.raises(
        CorruptImageError, match=r"progressive JPEG with 4010 scans, more than the limit of 100"
    ):
        one_pass(ds, workers, on_error="raise")


_PEAK_RSS = """
import resource, sys, time, warnings
from imgshards.loader import ShardDataset, make_loader
warnings.simplefilter("ignore")
dataset = ShardDataset(sys.argv[1], mode="eval", batch_size=4, image_size=224)
start = time.monotonic()
loader = make_loader(dataset, num_workers=2, persistent_workers=False, multiprocessing_context="fork")
images = sum(len(batch.labels) for batch in loader)  # the workers are joined at the end of the pass
seconds = time.monotonic() - start
peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # the largest worker's peak
print(images, dataset.corrupt_skipped, peak_kib, round(seconds, 2))
"""


def _eval_pass(ds: Path) -> tuple[int, int, float, float]:
    done = subprocess.run(
        [sys.executable, "-c", _PEAK_RSS, str(ds)], capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr
    images, skipped, peak_kib, seconds = done.stdout.split()
    return int(images), int(skipped), int(peak_kib) / 1024, float(seconds)


@pytest.mark.exclusive  # times it
@pytest.mark.timeout(300)
def test_a_pass_over_the_three_bombs_costs_no_more_memory_and_skips_each(tiny_packed, tmp_path):
    """Issue 21's acceptance: the bombs in a shard packed elsewhere, an eval pass in 2 DataLoader
    workers; each worker's peak RSS within 200 MB of the same pass without them, each bomb skipped.
    """
    clean, bombed = tmp_path / "clean", tmp_path / "bombed"
    shutil.copytree(tiny_packed, clean)
    shutil.copytree(tiny_packed, bombed)
    plant(bombed, list(three_bombs().values()))
    images, skipped, clean_mib, clean_s = _eval_pass(clean)
    assert skipped == 0
    got, skipped, bombed_mib, bombed_s = _eval_pass(bombed)
    print(f"peak worker RSS: {clean_mib:.0f} MiB clean, {bombed_mib:.0f} MiB with the bombs")
    assert (got, skipped) == (images - 3, 3)
    assert bombed_mib - clean_mib < 200, (clean_mib, bombed_mib)
    assert bombed_s < clean_s + 10, "a bomb was decoded"


@pytest.mark.parametrize("augment", ["per_image", "batched"])
def test_decode_on_skips_the_same_bombs_as_the_workers(ds, augment):
    """With decode_on the eval preset's check runs as the views are drawn, in the training process."""
    plant(ds, [flat_jpeg(65500, 1), progressive_bomb()])
    decode_on = DecodeOn(device="cpu", augment=augment)
    dataset, batches, _ = one_pass(ds, 2, mode="eval", decode_on=decode_on)
    assert sum(len(b.labels) for b in batches) == dataset.num_samples - 2
    assert dataset.corrupt_skipped == 2
    with pytest.raises(CorruptImageError, match=r"(a 65500x1 image would be resized|4010 scans)"):
        one_pass(ds, 0, mode="eval", decode_on=decode_on, on_error="raise")


def test_the_eval_preset_takes_up_to_100_to_1_and_refuses_past_it_before_resizing():
    eval_ = ResizeCenterCrop(32)
    assert tuple(eval_(torch.zeros(3, 2, 200, dtype=torch.uint8)).shape) == (3, 32, 32)
    assert eval_.draw(200, 2).height > 0
    for shape in ((3, 2, 201), (3, 201, 2), (3, 0, 5)):
        with pytest.raises(ImageShapeError, match=r"a \d+x\d+ image (would be resized|is empty)"):
            eval_(torch.zeros(shape, dtype=torch.uint8))
        with pytest.raises(ImageShapeError):
            eval_.draw(shape[1], shape[2])
    assert ResizeCenterCrop(32, max_aspect=1000)(torch.zeros(3, 2, 201, dtype=torch.uint8)).shape[-1] == 32
    with pytest.raises(ConfigError, match="max_aspect"):
        ResizeCenterCrop(32, max_aspect=0.5)
