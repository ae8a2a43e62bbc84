"""Image sizes in the summary and the index, and the measured ``--resize`` estimate (issue 33).

The camera-like tree is made here, not cut from ``../shared``'s photos: 20 JPEGs of 4000x3000 and
3000x4000, smooth fields under a fine grain at quality 90, which cost about what a phone's photo
costs to decode (~70 ms whole, ~3 MB). The estimate is checked against what the loader itself
measures on the same tree, packed as it is and with ``--resize 512``.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import statistics
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from PIL import Image

from imgshards.cli.main import cli
from imgshards.converter import ManifestError, PackConfig, pack, read_manifest
from imgshards.converter.format.imagesizes import SizeStats, size_stats
from imgshards.converter.plan.resizehint import HALF_FROM_PIXELS, SAMPLED

LANDSCAPE, PORTRAIT = 14, 6


def photo(seed: int, width: int, height: int) -> bytes:
    """A JPEG that decodes like a photo: low-frequency colour fields, a grain on top, quality 90."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height:8, 0:width:8].astype(np.float32)
    fx, fy, phase = rng.uniform(1, 6, (3, 3))
    field = 128 + 60 * np.sin(x[..., None] / width * fx * 6.28 + phase) * np.cos(
        y[..., None] / height * fy * 6.28
    )
    base = Image.fromarray(field.astype(np.uint8)).resize((width, height), Image.Resampling.BILINEAR)
    tile = rng.integers(-8, 9, (250, 250, 1), dtype=np.int16)
    grain = np.tile(tile, (height // 250 + 1, width // 250 + 1, 1))[:height, :width]
    pixels = (np.asarray(base, dtype=np.int16) + grain).clip(0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=90)
    return out.getvalue()


@pytest.fixture(scope="module")
def camera_tree(tmp_path_factory) -> Path:
    """Two classes of 10 camera-size photos: 14 landscape 4000x3000, 6 portrait 3000x4000."""
    root = tmp_path_factory.mktemp("camera")
    for i in range(LANDSCAPE + PORTRAIT):
        size = (4000, 3000) if i < LANDSCAPE else (3000, 4000)
        folder = root / ("beach" if i % 2 else "city")
        folder.mkdir(exist_ok=True)
        (folder / f"IMG_{i:04d}.jpg").write_bytes(photo(i, *size))
    return root


def cli_run(*args: str) -> str:
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def loader_ms(dst: Path) -> float:
    """CPU ms an image of the ``train`` preset at 224 over the whole split, in this process: the least
    of 5 epochs after one to warm up (a busy machine only adds time; a median of 3 still drifted 20%)."""
    from imgshards.loader import ShardDataset

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in a DataLoader worker
    ds = ShardDataset(dst, mode="train", batch_size=10)
    try:
        runs = []
        for epoch in range(6):  # the first warms up (imports, caches), untimed
            ds.set_epoch(epoch)
            images, started = 0, time.process_time()
            for _, labels in ds:
                images += len(labels)
            runs.append((time.process_time() - started) * 1000 / images)
    finally:
        torch.set_num_threads(threads)
    return min(runs[1:])


HINT = re.compile(
    r"median 4000x3000 \(~12 MP\) for 224 px training views: --resize 512 would store <= 512 px and "
    rf"load ~(\d+)x faster \(timed on {SAMPLED} of these images\)"
)


@pytest.mark.exclusive  # times it
def test_pack_prints_sizes_and_an_estimate_within_30_percent_of_the_loaders_speedup(camera_tree, tmp_path):
    out = cli_run("pack", str(camera_tree), str(tmp_path / "as-is"), "--workers", "2")
    assert "  image sizes: median 4000x3000, 95th percentile 4000x3000 (20 images)\n" in out
    (line,) = [line for line in out.splitlines() if HINT.fullmatch(line.strip())]
    resized = cli_run("pack", str(camera_tree), str(tmp_path / "r512"), "--workers", "2", "--resize", "512")
    assert "image sizes: median 683x512, 95th percentile 683x512 (20 images)" in resized
    assert "--resize" not in resized  # given: nothing to suggest

    # Both sides time a few images on a machine that may be busy (each drifted 15% in a CI run while
    # another process ran): the median of three estimates, against the loader's median epochs.
    estimate = statistics.median(
        json.loads(cli_run("pack", str(camera_tree), str(tmp_path / "as-is"), "--workers", "2", "--json"))[
            "splits"
        ]["train"]["resize_hint"]["speedup"]
        for _ in range(3)
    )
    actual = loader_ms(tmp_path / "as-is") / loader_ms(tmp_path / "r512")
    assert 0.7 <= estimate / actual <= 1.3, f"estimated {estimate:.1f}x, the loader measured {actual:.1f}x"
    assert int(HINT.fullmatch(line.strip()).group(1)) == pytest.approx(actual, rel=0.4)  # the printed one too


def test_json_and_info_show_the_sizes_and_the_estimate(camera_tree, tmp_path):
    dst = tmp_path / "ds"
    summary = json.loads(
        cli_run("pack", str(camera_tree), str(dst), "--workers", "2", "--json", "--seed", "1")
    )
    split = summary["splits"]["train"]
    assert split["image_sizes"] == {"images": 20, "median": [4000, 3000], "p95": [4000, 3000]}
    hint = split["resize_hint"]
    assert set(hint) == {"resize", "speedup", "sampled", "line"}
    assert hint["resize"] == 512 and hint["sampled"] == SAMPLED and hint["speedup"] > 3
    assert HINT.fullmatch(hint["line"])
    assert read_manifest(dst).split("train").image_sizes == SizeStats(20, (4000, 3000), (4000, 3000))
    info = cli_run("info", str(dst))
    assert "    image sizes: median 4000x3000, 95th percentile 4000x3000 (20 images)\n" in info
    assert json.loads(cli_run("info", str(dst), "--json"))["splits"]["train"]["image_sizes"]["images"] == 20


def test_small_images_get_their_sizes_and_no_estimate(tiny_tree, tmp_path):
    with Image.open(next(tiny_tree.glob("*/*"))) as im:
        size = im.size
    result = pack(tiny_tree, tmp_path / "ds", PackConfig(workers=1))
    stats = result.info.image_sizes
    assert stats is not None and stats.images == 40 and result.hints == {}
    assert min(stats.median) < 512 and size[0] * size[1] <= stats.p95[0] * stats.p95[1]
    summary = json.loads(cli_run("pack", str(tiny_tree), str(tmp_path / "ds2"), "--json"))
    assert summary["splits"]["train"]["resize_hint"] is None


def test_the_estimate_models_the_loaders_half_scale_rule():
    from imgshards.loader.image import scaled

    assert HALF_FROM_PIXELS == scaled.HALF_FROM_PIXELS


def test_percentiles_rank_images_by_pixels_and_name_a_size_some_image_has():
    counts = [{"3000x4000": 5, "640x480": 3}, {"4000x3000": 11, "100x100": 1}]
    # 20 images, ranked: 100x100, 3 of 640x480, 5 of 3000x4000, then 11 of 4000x3000 (as many pixels:
    # by size after that). The median is rank 9 of 0..19, the 95th percentile rank 18.
    assert size_stats(counts) == SizeStats(20, (4000, 3000), (4000, 3000))
    assert size_stats([{"3000x4000": 6, "640x480": 14}]) == SizeStats(20, (640, 480), (3000, 4000))
    assert size_stats([{"7x5": 1}]) == SizeStats(1, (7, 5), (7, 5))
    assert size_stats([{}]) is None


def test_an_index_without_sizes_reads_and_bad_sizes_are_refused_naming_the_field(tiny_packed, tmp_path):
    ds = tmp_path / "ds"
    shutil.copytree(tiny_packed, ds)
    index = json.loads((ds / "index.json").read_text())
    assert index["splits"]["train"]["image_sizes"]["images"] == 40
    del index["splits"]["train"]["image_sizes"]  # as an index packed before sizes
    (ds / "index.json").write_text(json.dumps(index))
    assert read_manifest(ds).split("train").image_sizes is None
    assert "image sizes" not in cli_run("info", str(ds))
    for bad, field in [
        (
            {"images": 41, "median": [5, 5], "p95": [5, 5]},
            r"image_sizes\.images is 41, expected an integer in 0\.\.40",
        ),
        ({"images": 4, "median": [0, 5], "p95": [5, 5]}, r"image_sizes\.median is \[0, 5\]"),
        ({"images": 4, "median": [5, 5], "p95": [5, 2**40]}, r"image_sizes\.p95 is \[5, 1099511627776\]"),
        ({"images": 4, "median": [5, 5, 5], "p95": [5, 5]}, r"image_sizes\.median is \[5, 5, 5\]"),
        ({"images": 4, "median": [5.0, 5], "p95": [5, 5]}, r"image_sizes\.median is \[5\.0, 5\]"),
        ({"images": 4, "median": [5, 5]}, r"image_sizes\.p95 is None"),
        ([1, 2], r"image_sizes is \[1, 2\], expected an object"),
    ]:
        index["splits"]["train"]["image_sizes"] = bad
        (ds / "index.json").write_text(json.dumps(index))
        with pytest.raises(ManifestError, match=rf"splits\.train\.{field}"):
            read_manifest(ds)
