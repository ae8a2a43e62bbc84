"""The README's training block, saved as ``train.py``, is right under ``torchrun`` and as ``python train.py``.

Before (issue 38): the model was not wrapped in ``DistributedDataParallel``, so each rank trained a
model of its own, and the val accuracy divided one rank's correct count by the whole split's size
(rank 0 printed ``0.80``, rank 1 ``0.20`` for a perfect model). Here the block runs as users run it,
under real ``torchrun --nproc_per_node 2`` (gloo on CPU): both ranks end with the same weights and
print the same accuracy, counted over every val image once.
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from imgshards.converter import PackConfig, pack, read_manifest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("readme_blocks", ROOT / "tests" / "test_docs.py")
assert _spec is not None and _spec.loader is not None
docs = sys.modules.setdefault("readme_blocks", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(docs)  # the docs runner's block parser and photos, not its tests

LINE = re.compile(
    r"^(?:\[default(?P<rank>\d)\]:)?epoch (?P<epoch>\d+): "
    r".*val accuracy (?P<acc>[\d.]+)(?: of (?P<seen>\d+) images)?$"
)
# Appended to the block: what each rank's model ended as (DDP keeps the ranks' weights equal).
WEIGHTS = """
print("weights", repr(sum(float(p.double().sum()) for p in getattr(model, "module", model).parameters())))
"""


@pytest.fixture(scope="module")
def train_py(tmp_path_factory) -> Path:
    """The README's training block as ``train.py``, beside ``shards`` packed from the docs' photos."""
    work = tmp_path_factory.mktemp("readme-train")
    photos = docs.make_photos(work)
    for split in ("train", "val"):
        pack(photos / split, work / "shards", PackConfig(split=split, workers=1))
    blocks = docs.extract_blocks(ROOT / "README.md")
    loop = next(b for b in blocks if b.lang == "python" and "for batch in loader:" in b.code)
    script = work / "train.py"
    script.write_text(loop.code + WEIGHTS)
    return script


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(cmd: list[str], cwd: Path, timeout: float = 240) -> str:
    """Run ``cmd`` in ``cwd`` in a session of its own (killed whole on a timeout); return its stdout."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK")}
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} did not end in {timeout:g} s; stderr ended: {err[-3000:]}")
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    return out


def _parse(out: str) -> tuple[dict[int, list[tuple[int, str, int | None]]], dict[int, str]]:
    """Per rank, the (epoch, accuracy, images seen) lines, and the weights printed at the end."""
    epochs: dict[int, list[tuple[int, str, int | None]]] = {}
    weights: dict[int, str] = {}
    for line in out.splitlines():
        if (m := LINE.match(line)) is not None:
            rank = int(m["rank"] or 0)
            seen = int(m["seen"]) if m["seen"] else None
            epochs.setdefault(rank, []).append((int(m["epoch"]), m["acc"], seen))
        elif (w := re.match(r"^(?:\[default(\d)\]:)?weights (.*)$", line)) is not None:
            weights[int(w[1] or 0)] = w[2]
    return epochs, weights


def test_under_torchrun_the_ranks_train_one_model_and_print_the_same_accuracy(train_py):
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
        "--master_port", str(_free_port()), "--tee", "3", train_py.name,
    ]  # fmt: skip
    epochs, weights = _parse(_run(cmd, train_py.parent))
    val_images = read_manifest(train_py.parent / "shards").split("val").samples
    assert sorted(epochs) == [0, 1], epochs
    assert [e for e, _, _ in epochs[0]] == [0, 1]
    assert sorted(weights) == [0, 1] and weights[0] == weights[1], f"two models trained: {weights}"
    assert epochs[0] == epochs[1], "the ranks printed different accuracies"
    assert all(seen == val_images for _, _, seen in epochs[0]), "each val image counted once over the ranks"


def test_as_python_train_py_it_runs_on_one_cpu_process(train_py):
    epochs, weights = _parse(_run([sys.executable, train_py.name], train_py.parent))
    val_images = read_manifest(train_py.parent / "shards").split("val").samples
    assert [(e, seen) for e, _, seen in epochs[0]] == [(0, val_images), (1, val_images)]
    assert list(weights) == [0]
