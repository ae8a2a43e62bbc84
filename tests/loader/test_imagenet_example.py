"""A script written as pytorch/examples' ``imagenet/main.py`` switches to imgshards by its import alone.

``imagenet_main.py`` (beside this file) runs as it is on the tree (``data/train``, ``data/val``),
then with ``import torchvision.datasets as datasets`` changed to the README's line (``import
imgshards.loader.torchvision_datasets as datasets``) on the same tree packed (``imgshards pack
data/train packed``, ``imgshards pack data/val packed``, the split named by each folder): a DDP
spawn of 2 CPU processes over gloo, with ``DistributedSampler``, to completion, and the same
samples trained on and validated.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("imagenet_main.py")
TORCHVISION = "import torchvision.datasets as datasets\n"
OURS = "import imgshards.loader.torchvision_datasets as datasets\n"  # the README's switch (issue 50)
README = Path(__file__).resolve().parents[2] / "README.md"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(script: Path, data: Path, *more: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, str(script), str(data), "--multiprocessing-distributed", "--world-size", "1",
         "--rank", "0", "--dist-url", f"tcp://127.0.0.1:{free_port()}", "--dist-backend", "gloo", *more],
        capture_output=True, text=True, timeout=240, cwd=script.parent,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()


@pytest.fixture(scope="module")
def data(tiny_tree, tmp_path_factory) -> Path:
    """``data/train`` (40 images) and ``data/val`` (39: the samplers leave one to main.py's aux loader)."""
    root = tmp_path_factory.mktemp("imagenet")
    shutil.copytree(tiny_tree, root / "train")
    shutil.copytree(tiny_tree, root / "val")
    os.remove(min((root / "val").rglob("*.*")))
    return root


def test_the_imagenet_example_switches_by_its_import(data, tmp_path):
    packed = tmp_path / "packed"
    for split in ("train", "val"):
        subprocess.run(
            [sys.executable, "-m", "imgshards.cli", "pack", str(data / split), str(packed), "-q"], check=True
        )
    source = SCRIPT.read_text()
    assert source.count(TORCHVISION) == 1
    ours = tmp_path / "main.py"
    assert " ".join(OURS.split()[:4]) in " ".join(README.read_text().split())
    ours.write_text(source.replace(TORCHVISION, OURS))
    # torchvision's run is the reference of which samples each epoch trains on and validates: its
    # DistributedSampler decides them, whatever the workers, so it runs without (the DDP processes
    # are spawned, and so are their workers: each imports torch, a minute of CI for nothing here).
    # The switched script runs with main.py's 2 workers a loader, spawned, as a user's would.
    theirs = run(SCRIPT, data, "--workers", "0")
    assert theirs == [
        "epoch 0: trained on 20 samples; val 39 samples, acc@1 " + theirs[0].rsplit(" ", 1)[1],
        "epoch 1: trained on 20 samples; val 39 samples, acc@1 " + theirs[1].rsplit(" ", 1)[1],
    ]
    switched = run(ours, packed)
    assert [line.rsplit(" acc@1", 1)[0] for line in switched] == [
        line.rsplit(" acc@1", 1)[0] for line in theirs
    ]
