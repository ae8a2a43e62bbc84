"""Image sizes in the summary and the index, and the measured ``--resize`` estimate (issue 33).

The camera-like tree is made here, not cut from ``../shared``'s photos: 20 JPEGs of 4000x3000 and
3000x4000, smooth fields under a fine grain at quality 90, which cost about what a phone's photo
costs to decode (~70 ms whole, ~3 MB), made by bench/resize_hint.py, which also times the estimate
against what the loader itself measures on the same tree, packed as it is and with ``--resize 512``.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import types
from pathlib import Path

import pytest
from click.testing import CliRunner
from PIL import Image

from imgshards.cli.main import cli
from imgshards.converter import ManifestError, PackConfig, pack, read_manifest
from imgshards.converter.format.imagesizes import SizeStats, size_stats
from imgshards.converter.plan.resizehint import HALF_FROM_PIXELS, SAMPLED

ROOT = Path(__file__).resolve().parents[3]


def _bench() -> types.ModuleType:
    """bench/resize_hint.py, which makes the photos and times the estimate against the loader."""
    spec = importlib.util.spec_from_file_location("bench_resize_hint", ROOT / "bench" / "resize_hint.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def camera_tree(tmp_path_factory) -> Path:
    """Two classes of 10 camera-size photos: 14 landscape 4000x3000, 6 portrait 3000x4000."""
    return _bench().camera_tree(tmp_path_factory.mktemp("camera"))


def cli_run(*args: str) -> str:
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == 0, result.output
    return result.output


HINT = re.compile(
    r"median 4000x3000 \(~12 MP\) for 224 px training views: --resize 512 would store <= 512 px and "
    rf"load ~(\d+)x faster \(timed on {SAMPLED} of these images\)"
)


def test_pack_prints_sizes_and_an_estimate(camera_tree, tmp_path):
    # How close the estimate comes to the loader's own figure is a bench's: bench/resize_hint.py.
    out = cli_run("pack", str(camera_tree), str(tmp_path / "as-is"), "--workers", "2")
    assert "  image sizes: median 4000x3000, 95th percentile 4000x3000 (20 images)\n" in out
    (line,) = [line for line in out.splitlines() if HINT.fullmatch(line.strip())]
    assert int(HINT.fullmatch(line.strip()).group(1)) > 3
    resized = cli_run("pack", str(camera_tree), str(tmp_path / "r512"), "--workers", "2", "--resize", "512")
    assert "image sizes: median 683x512, 95th percentile 683x512 (20 images)" in resized
    assert "--resize" not in resized  # given: nothing to suggest


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
