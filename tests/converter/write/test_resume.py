"""Kill `imgshards pack` with SIGKILL mid-run, run it again, and compare bytes with an uninterrupted run."""

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

PACK = [
    sys.executable,
    "-c",
    "from imgshards.cli.main import main; main()",
    "pack",
    "--no-progress",
    "--workers",
    "2",
    "--shard-size",
    "40kB",
    "--check",
    "full",
]


def _files(root: Path) -> dict[str, bytes]:
    """Every output file and the rejects files, the pack's private state aside."""
    outputs = [*root.iterdir(), *root.glob(".imgshards/rejects/*")]
    return {str(p.relative_to(root)): p.read_bytes() for p in outputs if p.is_file()}


@pytest.fixture(scope="module")
def reference(tree_factory, tmp_path_factory):
    src = tree_factory(classes=6, per_class=80)
    out = tmp_path_factory.mktemp("reference")
    subprocess.run([*PACK, "--read-order", "disk", str(src), str(out)], check=True, capture_output=True)
    return src, _files(out)


def _kill_when(cmd: list[str], ready) -> None:
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not ready() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    os.killpg(proc.pid, signal.SIGKILL)  # the whole job, workers included, as the OOM killer would
    proc.wait()


@pytest.mark.parametrize(
    ("order", "moment"),
    [
        ("disk", "gathering"),
        ("disk", "first-partial"),
        ("disk", "first-shard"),
        ("disk", "half-done"),
        ("plan", "first-partial"),
        ("plan", "half-done"),
    ],
)
def test_rerun_after_sigkill_gives_identical_output(reference, tmp_path, order, moment):
    """Killed and resumed in either read order, the output is the disk-order reference's, byte for byte."""
    src, expected = reference
    out = tmp_path / "out"
    shards = len([n for n in expected if n.endswith(".tar")])
    ready = {
        "gathering": lambda: any(out.glob(".imgshards/train/buckets/*.bin")),
        "first-partial": lambda: any(out.glob(".train-*.partial")),
        "first-shard": lambda: any(out.glob("train-*.tar")),
        "half-done": lambda: len(list(out.glob("train-*.tar"))) >= shards // 2,
    }[moment]
    cmd = [*PACK, "--read-order", order, str(src), str(out)]
    _kill_when(cmd, ready)
    assert not (out / "index.json").exists(), "killed too late to test anything"
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert _files(out) == expected
    assert not (out / ".imgshards" / "train" / "buckets").exists(), "buckets left behind"
    if moment == "half-done":  # the shards written before the kill are reused ("20 reused" holds "0 reused")
        reused = re.search(r"(\d+) reused from an earlier run", done.stdout)
        assert reused is not None and int(reused.group(1)) > 0, done.stdout


def _pack(src: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*PACK, "--read-order", "disk", *extra, str(src), str(out)], capture_output=True, text=True
    )


@pytest.mark.parametrize("damage", [b'{"args": ', b"[1, 2]", b"\xff\xfe", b'{"args": 3}'])
def test_a_damaged_plan_is_one_line_naming_it_and_overwrite_packs_anew(reference, tmp_path, damage):
    # The destination is someone else's to write too: a plan.json that is not the one pack wrote.
    src, expected = reference
    out = tmp_path / "out"
    assert _pack(src, out).returncode == 0
    plan = out / ".imgshards" / "train" / "plan.json"
    plan.write_bytes(damage)
    done = _pack(src, out)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert str(plan) in line and "is damaged" in line and "--overwrite" in line
    assert _pack(src, out, "--overwrite").returncode == 0
    assert _files(out) == expected


def test_a_damaged_shard_record_is_no_record_and_that_shard_is_packed_again(reference, tmp_path):
    src, expected = reference
    out = tmp_path / "out"
    assert _pack(src, out).returncode == 0
    state = out / ".imgshards" / "train"
    records = sorted(state.glob("train-*.tar.json"))
    assert len(records) >= 3
    records[0].write_bytes(b'{"name": "train-000000.tar", "samples": ')  # cut short
    # A record naming a file outside the destination, with that file's digest: pack would hash it,
    # find it as recorded and keep it as the shard.
    elsewhere = tmp_path / "elsewhere.tar"
    elsewhere.write_bytes(b"not a shard")
    forged = json.loads(records[1].read_text())
    forged |= {"name": "../elsewhere.tar", "sha256": hashlib.sha256(b"not a shard").hexdigest()}
    records[1].write_text(json.dumps(forged))
    (out / records[0].name.removesuffix(".json")).write_bytes(b"damaged")
    done = _pack(src, out)
    assert done.returncode == 0, done.stderr
    assert _files(out) == expected
    assert elsewhere.read_bytes() == b"not a shard"
