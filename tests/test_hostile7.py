"""Hostile inputs, round 7 (issue 50): pixels past the bound, and ``~`` in a dataset's path.

Points 4-6: the pixel bound (Pillow's ``Image.MAX_IMAGE_PIXELS``) holds for what is decoded, every
frame and every format Pillow opens (it opens by content, whatever the member's name), in both read
paths (``ShardDataset``'s workers and ``ImageFolder`` share loader/image/decode.py), in the device
path's probe and CPU fallback, and at pack time, before a pixel buffer is made. The bombs are real
and a few kilobytes on disk (tests/bombs.py); on 39ce913 each decoded to 690 MB-2.2 GB, or, where
only a later frame was large, was taken whole. Point 10: ``~`` names the home folder.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import tarfile
import tracemalloc
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from PIL import Image

from imgshards.converter import PackConfig, Reason, pack, read_manifest
from imgshards.converter.format.headers import image_size
from imgshards.converter.format.locate import local_path
from imgshards.converter.scan.check import Check, inspect_image
from imgshards.converter.write.shard import stored_image
from imgshards.loader import CorruptImageError, ImageFolder, ShardDataset, make_loader
from imgshards.loader.device.backends import probe
from imgshards.loader.image.decode import decode, pil_image
from imgshards.loader.imagefolder import default_loader

from .bombs import BIG, issue_50

# Pillow warns past its bound, under twice it, when it opens one of them (the JPEG's second frame
# header, the tests' own opens): the warning is Pillow's, the refusal the read path's.
pytestmark = pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")

BOMBS = issue_50()
PIXELS = f"declares {BIG[0]}x{BIG[1]} = {BIG[0] * BIG[1]:,} pixels, more than the limit of "
# What each read path says of each bomb: the pixels it would make, or why no bound can hold.
SAID = {name: PIXELS for name in BOMBS} | {"ico": "ICO data, whose size Pillow learns only by decoding it"}


@contextmanager
def no_pixels() -> Iterator[None]:
    """The block makes no Pillow image (Pillow's own count of them) and allocates under 20 MB in Python."""
    made = Image.core.get_stats()["new_count"]
    tracemalloc.start()
    try:
        yield
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert Image.core.get_stats()["new_count"] == made, "Pillow made an image"
    assert peak < 20 << 20, f"{peak:,} bytes allocated"


def test_the_bombs_are_what_the_issue_says():
    sizes = {name: len(data) for name, (data, _) in BOMBS.items()}
    assert max(sizes.values()) < 60_000, sizes  # 55 KB for the GIFs, 2 KB for a TIFF, 18 KB the ICO
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # under twice the bound: a warning
        for name in ("gif-frame-past-its-screen", "tiff", "tiff-as-png", "jpeg-second-frame-header"):
            with Image.open(io.BytesIO(BOMBS[name][0])) as im:
                assert im.size == BIG, name  # what Pillow would decode, whatever the header check read
        assert BOMBS["gif-frame-past-its-screen"][0][6:10] == b"\x01\x00\x01\x00"  # a 1x1 screen
        for name in ("gif-second-frame", "tiff-second-page"):
            with Image.open(io.BytesIO(BOMBS[name][0])) as im:
                assert im.size != BIG and im.n_frames == 2, name  # the first frame is small
    with Image.open(io.BytesIO(BOMBS["tiff-second-page"][0])) as im:
        im.seek(1)  # a TIFF's pages are read lazily: no pixel yet
        assert im.size == BIG
    assert image_size(BOMBS["ico"][0][22:]) == BIG  # the icon the ICO's directory calls 256x256


@pytest.mark.parametrize("name", sorted(BOMBS))
def test_the_loader_refuses_every_bomb_before_making_a_pixel(name):
    data, ext = BOMBS[name]
    with no_pixels(), pytest.raises(CorruptImageError) as e:  # ShardDataset's workers, the device's CPU
        decode(data, ext, key="000042", shard="train-000003.tar")
    assert f"image '000042' in shard train-000003.tar does not decode ({SAID[name]}" in str(e.value)
    with no_pixels(), pytest.raises(ValueError, match=SAID[name]):  # ImageFolder's sample
        pil_image(data, ext)
    with no_pixels(), pytest.raises(ValueError, match=SAID[name]):  # ImageFolder's default loader
        default_loader(io.BytesIO(data))
    with no_pixels():  # decode_on: the probe sends it to the CPU decoder, which refuses it (above)
        found = probe(data, ext)
    assert not found.batched, found
    if name == "jpeg-second-frame-header":  # its first frame header is 8x8: nvjpeg would read which?
        assert found.reason == "unparsed header"
    else:
        assert found.nbytes == 0 and found.reason == "too costly"


def test_the_bound_holds_on_what_pillow_reads_of_a_format_no_walker_reads(monkeypatch):
    # Any format Pillow opens (here PCX, by content, in a member named .png): the size Pillow read
    # from its header is checked before load(). A tiny bound makes a tiny image a bomb.
    out = io.BytesIO()
    Image.new("RGB", (40, 30), (10, 20, 30)).save(out, format="PCX")
    assert image_size(out.getvalue()) is None  # no walker reads PCX
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    said = "declares 40x30 = 1,200 pixels, more than the limit of 1,000"
    with no_pixels(), pytest.raises(CorruptImageError, match=said):
        decode(out.getvalue(), "png")
    with no_pixels(), pytest.raises(ValueError, match=said):
        pil_image(out.getvalue(), "png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1200)
    assert tuple(decode(out.getvalue(), "png").shape) == (3, 30, 40)  # within the bound: decoded


PACKED_BOMBS = ("tiff", "tiff-as-png", "tiff-second-page", "jpeg-second-frame-header")


@pytest.mark.parametrize("name", PACKED_BOMBS)
def test_pack_refuses_every_bomb_before_making_a_pixel(name):
    data, ext = BOMBS[name]
    reason = Reason.UNDECODABLE if name == "jpeg-second-frame-header" else Reason.TOO_MANY_PIXELS
    for check in (Check.HEADER, Check.FULL):
        with no_pixels():
            verdict = inspect_image(data, f".{ext}", check)
        assert verdict.reason is reason, verdict
    with no_pixels():  # the shard writer's re-encode (--resize) asks the check first
        stored = stored_image(
            f"cat/x.{ext}",
            data,
            check=Check.HEADER,
            max_pixels=None,
            resize=64,
            quality=90,
            image_format=None,
        )
    assert not isinstance(stored, tuple) and stored.reason is reason, stored
    if reason is Reason.TOO_MANY_PIXELS:  # --check none trusts the files, not their pixel counts
        for resize, image_format in ((64, None), (None, "jpg")):
            with no_pixels():
                stored = stored_image(
                    f"cat/x.{ext}",
                    data,
                    check=Check.NONE,
                    max_pixels=None,
                    resize=resize,
                    quality=90,
                    image_format=image_format,
                )
            assert not isinstance(stored, tuple) and stored.reason is reason, stored

        assert verdict.detail.startswith(PIXELS)
    else:
        assert verdict.detail.startswith("a second JPEG frame header (SOF) at byte ")


def test_a_pack_lists_the_bombs_in_its_rejects_and_packs_the_rest(tiny_tree, tmp_path):
    src = tmp_path / "photos"
    shutil.copytree(tiny_tree, src)
    cls = sorted(p for p in src.iterdir() if p.is_dir())[0]
    for name in (*PACKED_BOMBS, "gif-frame-past-its-screen", "ico"):
        data, ext = BOMBS[name]
        (cls / f"{name}.{ext}").write_bytes(data)
    result = pack(src, tmp_path / "shards", PackConfig(workers=1))
    lines = (tmp_path / "shards" / result.info.rejects_file).read_text().splitlines()
    reasons = {Path(json.loads(line)["path"]).stem: json.loads(line)["reason"] for line in lines}
    assert reasons == {
        "tiff": Reason.TOO_MANY_PIXELS.value,
        "tiff-as-png": Reason.TOO_MANY_PIXELS.value,
        "tiff-second-page": Reason.TOO_MANY_PIXELS.value,
        "jpeg-second-frame-header": Reason.UNDECODABLE.value,
        "gif-frame-past-its-screen": Reason.UNSUPPORTED_FORMAT.value,  # pack takes no GIF, nor ICO
        "ico": Reason.UNSUPPORTED_FORMAT.value,
    }
    assert result.info.samples == sum(1 for p in tiny_tree.rglob("*") if p.is_file())  # the rest, packed


def plant(ds: Path, bombs: list[bytes]) -> list[str]:
    """The first images of shard 0 of ``ds`` (a packed copy) replaced by ``bombs``, under their names.

    Read as ShardDataset reads a shard (member by member); the index is given the shard's new size
    and hash, as a packer of such shards would have written it.
    """
    import hashlib

    manifest = json.loads((ds / "index.json").read_text())
    entry = manifest["splits"]["train"]["shards"][0]
    path = ds / entry["name"]
    out, planted = io.BytesIO(), []
    with tarfile.open(path) as src, tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as dst:
        for member in src:
            data = src.extractfile(member).read()  # type: ignore[union-attr]
            if member.name.endswith(".jpg") and len(planted) < len(bombs):
                data = bombs[len(planted)]
                planted.append(member.name)
            info = tarfile.TarInfo(member.name)
            info.size = len(data)
            dst.addfile(info, io.BytesIO(data))
    path.write_bytes(out.getvalue())
    entry.update(bytes=len(out.getvalue()), sha256=hashlib.sha256(out.getvalue()).hexdigest())
    train = manifest["splits"]["train"]
    train["bytes"] = sum(s["bytes"] for s in train["shards"])
    (ds / "index.json").write_text(json.dumps(manifest))
    return planted


def test_a_shard_dataset_skips_or_raises_on_bombs_in_someone_elses_shard(tiny_packed, tmp_path):
    ds = tmp_path / "ds"
    shutil.copytree(tiny_packed, ds)
    names = ["gif-frame-past-its-screen", "gif-second-frame", "tiff-as-png", "ico"]
    assert len(plant(ds, [BOMBS[name][0] for name in names])) == len(names)  # each in a .jpg member
    dataset = ShardDataset(ds, batch_size=4, image_size=32, max_lost=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        batches = list(make_loader(dataset, num_workers=0))
    assert len(batches) == len(dataset) and dataset.corrupt_skipped == len(names)
    with pytest.raises(CorruptImageError, match=r"declares 12000x12000 = |ICO data"):
        list(make_loader(ShardDataset(ds, batch_size=4, image_size=32, on_error="raise"), num_workers=0))


_MEASURE = """
import sys, warnings
warnings.simplefilter("ignore")
from imgshards.loader.image.decode import decode, pil_image
sys.path.insert(0, sys.argv[1])
from bombs import issue_50


def peak():  # this process image's peak RSS in kB (ru_maxrss would count its parent's, kept over exec)
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


bombs = issue_50()
before = peak()
for name, (data, ext) in bombs.items():
    for read in (decode, pil_image):
        try:
            read(data, ext)
        except Exception:
            pass
        print(name, (peak() - before) // 1024)
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the peak RSS in /proc (Linux)")
def test_refusing_the_bombs_grows_no_memory():
    """In a fresh process, the peak RSS after reading every bomb both ways: no growth past 100 MB."""
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(Path(__file__).parent)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    grown = {name: int(mb) for name, mb in (line.split() for line in done.stdout.splitlines())}
    assert set(grown) == set(BOMBS) and max(grown.values()) < 100, grown  # MB; 39ce913: 1,373-1,514


# ---- point 10: ~ is the home folder -------------------------------------------------------------------


def test_a_dataset_under_the_home_folder_is_read_by_a_tilde_path(tiny_packed, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    shutil.copytree(tiny_packed, tmp_path / "ds")
    samples = read_manifest(tiny_packed).splits["train"].samples
    assert len(ImageFolder("~/ds/train")) == samples  # torchvision's ImageFolder expands ~ too
    assert len(ImageFolder(Path("~/ds"))) == samples
    dataset = ShardDataset("~/ds", batch_size=8)
    assert dataset.num_samples == samples and Path(dataset.root) == tmp_path / "ds"
    assert sum(len(b.labels) for b in make_loader(dataset, num_workers=0)) == samples
    assert read_manifest("~/ds").splits["train"].samples == samples
    # One place expands it: where a local path is read (converter/format/locate.py).
    assert local_path("~/ds") == tmp_path / "ds" and local_path("file://~/ds") == tmp_path / "ds"
    assert local_path("ds/~") == Path("ds/~")  # only a leading ~ means the home folder
