"""``imgshards bench`` through click's CliRunner on small packed trees: real runs, exit codes asserted."""

import json
import sys

import pytest
from click.testing import CliRunner

from imgshards.cli.bench import DECODE_ON, PRESETS
from imgshards.cli.main import cli

pytestmark = pytest.mark.filterwarnings(
    # torchvision 0.29 deprecates its codecs; the loader still uses decode_jpeg (see loader/image/decode.py)
    "ignore:The image decoding and encoding capabilities:DeprecationWarning"
)

# Short runs: 4-image batches of the 40-image tiny tree, so a run is a few batches of one pass.
SHORT = ["--batch-size", "4", "--no-progress"]


@pytest.fixture
def run():
    def invoke(*args: str):
        result = CliRunner().invoke(cli, ["bench", *map(str, args)])
        assert result.exception is None or isinstance(result.exception, SystemExit), result.output
        return result

    return invoke


def as_json(result) -> dict:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_table_shows_every_figure(run, tiny_packed):
    result = run(tiny_packed, "--workers", "2", "--batches", "6", "--progress", *SHORT[:2])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "split 'train', 40 images" in out and "preset 'train', batch 4, prefetch 2" in out
    for label in [
        "2 workers",
        "images/s",
        "startup (to the first batch)",
        "per worker images/s",
        "workers busy",
        "workers had a core",
        "one worker flat out",
        "time in workers: read",
        "decode",
        "augment",
        "collate",
        "batches ready ahead (mean/max)",
        "loop waited for data",
        "main process CPU",
        "peak RSS main / per worker",
    ]:
        assert label in out, label
    assert "verdict" not in out  # no model simulated


def test_json_holds_the_measurements(run, tiny_packed):
    report = as_json(
        run(
            tiny_packed,
            "--workers",
            "2",
            "--batches",
            "5",
            "--model-images-per-s",
            "100000",
            "--json",
            *SHORT,
        )
    )
    assert report["samples"] == 40 and report["config"]["workers"] == [2]
    assert report["config"]["step_seconds"] == pytest.approx(4 / 100_000)
    (point,) = report["points"]
    r = point["imgshards"]
    assert r["batches"] == 5 and r["images"] == 20 and r["images_per_s"] > 0
    # Both workers made batches, timed their stages, and wrote their rows (pid and memory).
    assert len(r["worker_images"]) == 2 and all(n > 0 for n in r["worker_images"])
    assert r["seconds_by_step"]["decode"] > 0 and r["seconds_by_step"]["augment"] > 0
    assert r["cpu_seconds_by_step"]["decode"] > 0 and r["cpu_share"] > 0
    assert r["ready_capacity"] == 4 and 0 <= r["ready_max"] <= 4
    assert r["peak_rss_main"] > 0 and len(r["peak_rss_workers"]) == 2 and r["pss_total"] > 0
    assert point["verdict"]["bound"] in ("loader", "compute") and point["imagefolder"] is None


def test_verdict_flips_with_the_model_cost(run, tiny_packed):
    # One worker makes a batch of 4 tiny images in a few ms: a 0.01 ms step always waits for it, a
    # 250 ms step never does (2 batches are prefetched; 6 batches stay inside one pass of 10).
    args = ("--workers", "1", "--batches", "6", *SHORT)
    fast = run(*args, tiny_packed, "--model-ms", "0.01")
    slow = run(*args, tiny_packed, "--model-ms", "250")
    assert fast.exit_code == 0 and slow.exit_code == 0, fast.output + slow.output
    assert "verdict: loader-bound" in fast.stdout and "x short" in fast.stdout
    assert "verdict: compute-bound" in slow.stdout and "room for a model up to" in slow.stdout


def test_sweep_with_plot(run, tiny_packed, tmp_path):
    png = tmp_path / "sweep.png"
    result = run(tiny_packed, "--sweep-workers", "0,1,2", "--batches", "4", "--plot", png, *SHORT)
    assert result.exit_code == 0, result.output
    assert "scaling: workers" in result.stdout and f"plot: {png}" in result.stdout
    for head in ("0 workers", "1 worker ", "2 workers"):
        assert head in result.stdout
    data = png.read_bytes()
    assert data.startswith(b"\x89PNG") and len(data) < 100_000


def test_compare_imagefolder_cold(run, tiny_tree, tiny_packed):
    compare = ("--compare-imagefolder", tiny_tree)
    report = as_json(
        run(tiny_packed, "--workers", "1", "--batches", "4", *compare, "--cold", "--json", *SHORT)
    )
    assert report["imagefolder_src"] == str(tiny_tree) and report["imagefolder_samples"] == 40
    (point,) = report["points"]
    ours, theirs = point["imgshards"], point["imagefolder"]
    assert theirs["pipeline"] == "imagefolder" and theirs["images"] == 16 and theirs["images_per_s"] > 0
    assert theirs["seconds_by_step"]["read"] > 0 and theirs["worker_images"][0] > 0
    assert point["speedup"] == pytest.approx(ours["images_per_s"] / theirs["images_per_s"])
    # --cold dropped the shards and the tree before each of the two runs.
    tree_bytes = sum(p.stat().st_size for p in tiny_tree.rglob("*") if p.is_file())
    shard_bytes = report["shard_bytes"]
    assert ours["evicted_bytes"] == theirs["evicted_bytes"] == tree_bytes + shard_bytes
    table = run(tiny_packed, "--workers", "1", "--batches", "2", *compare, *SHORT)
    assert table.exit_code == 0 and "ImageFolder" in table.stdout and "imgshards " in table.stdout


def test_cli_presets_are_the_loaders():
    from imgshards.loader import PRESETS as LOADER_PRESETS
    from imgshards.loader.profiling.devicerun import DECODE_ON as LOADER_DECODE_ON

    assert PRESETS == LOADER_PRESETS
    assert DECODE_ON == LOADER_DECODE_ON


def test_decode_on_cpu_adds_the_decoders_figures_and_keeps_the_verdict(run, tiny_packed):
    result = run(
        tiny_packed, "--workers", "1", "--batches", "4", "--decode-on", "cpu", "--model-ms", "5", *SHORT
    )
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "decoded in the training process on cpu" in out
    for label in ["images/s", "time in workers: read", "decoded on cpu: decode", "augment", "normalize"]:
        assert label in out, label
    assert "decode calls / CPU fallbacks" in out and "loader memory on the device" in out
    assert "verdict: " in out and "GPU memory" not in out
    data = as_json(
        run(tiny_packed, "--workers", "1", "--batches", "2", "--decode-on", "cpu", "--json", *SHORT)
    )
    device = data["points"][0]["imgshards"]["device"]
    assert device["device"] == "cpu" and device["batches"] >= 3 and device["seconds"]["decode"] > 0
    assert 0 < device["peak_bytes"] <= device["bound_bytes"] and device["cuda_max_allocated"] is None
    assert data["points"][0]["imgshards"]["seconds_by_step"]["decode"] == 0  # the workers only read


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--workers", "2", "--sweep-workers", "1,2"], 2, "give one"),
        (["--model-ms", "5", "--model-images-per-s", "100"], 2, "not both"),
        (["--plot", "{tmp}/p.png"], 2, "add --sweep-workers"),
        (["--sweep-workers", "1,x"], 2, "write it like 1,2,4"),
        (["--sweep-workers", "1,1"], 2, "distinct"),
        (["--sweep-workers", "1", "--plot", "{tmp}/no/p.png"], 2, "no directory"),
        (["--preset", "fast"], 2, "'fast' is not one of 'train', 'resnet', 'eval'"),
        (["--decode-on", "gpu"], 2, "'gpu' is not one of 'workers', 'cpu', 'cuda'"),
        (["--seconds", "0"], 2, "--seconds"),
        (["--batch-size", "0"], 2, "--batch-size"),
        (["--model-ms", "-1"], 2, "--model-ms"),
        (["--split", "val"], 2, "val"),
        (["--compare-imagefolder", "{tmp}/missing"], 2, "does not exist"),
        (["--compare-imagefolder", "{tmp}"], 2, "not an ImageFolder tree"),
    ],
)
def test_bad_options_fail_up_front(run, tiny_packed, tmp_path, args, code, message):
    result = run(tiny_packed, "--batches", "1", *[a.format(tmp=tmp_path) for a in args])
    assert result.exit_code == code, result.output
    assert message in result.output
    assert "Traceback" not in result.output and "images/s" not in result.output


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the message without a GPU")
def test_decode_on_cuda_without_a_gpu_says_so(run, tiny_packed):
    result = run(tiny_packed, "--batches", "1", "--decode-on", "cuda")
    assert result.exit_code == 2 and "needs a CUDA device, and torch sees none; try 'cpu'" in result.output
    assert "Traceback" not in result.output


def test_not_a_packed_dataset(run, tmp_path):
    result = run(tmp_path, "--batches", "1")
    assert result.exit_code == 2 and "no index.json" in result.output


def test_plot_without_matplotlib_says_what_to_install(run, tiny_packed, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what `import matplotlib` sees when it is absent
    result = run(tiny_packed, "--sweep-workers", "1", "--plot", tmp_path / "p.png")
    assert result.exit_code == 2
    assert "pip install 'imgshards[plot]'" in result.output and "Traceback" not in result.output


def test_a_url_is_one_line_naming_it_whole(run):
    # click.Path folded s3://bucket/x into s3:/bucket/x and said it did not exist.
    result = run("s3://bucket/x", *SHORT)
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and "the URL s3://bucket/x" in result.output
    assert "imgshards bench FOLDER" in result.output
