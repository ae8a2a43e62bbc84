#!/usr/bin/env python3
"""Soak the resumed Lightning DDP phase under load: N runs in a row, no retry.

Run by hand (not in CI):

    python bench/resume_soak.py --runs 30 --hogs 2

Packs a small synthetic tree, runs tests/loader/framework_worker.py's Lightning mode under torchrun
(2 gloo ranks x 2 DataLoader workers) once killed mid-epoch to get a checkpoint, then resumes from it
``--runs`` times while ``--hogs`` busy-loop processes load the CPUs. Each resumed run must finish
within ``--timeout`` seconds and deliver exactly the batches of an uninterrupted run; a run that hangs
is killed with its whole process group and counted as a failure. Prints one line a run and a summary.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from PIL import Image

from imgshards.converter import PackConfig, pack
from imgshards.converter.synthetic import make_synthetic_tree

WORKER = Path(__file__).resolve().parents[1] / "tests" / "loader" / "framework_worker.py"


def hog() -> None:
    while True:
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(cfg: dict, timeout: float) -> tuple[bool, float, str]:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
        "--master_port", str(free_port()), str(WORKER), "lightning", json.dumps(cfg),
    ]  # fmt: skip
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        return False, time.monotonic() - start, "hung: " + err[-500:]
    return proc.returncode == 0, time.monotonic() - start, err[-500:] if proc.returncode else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--hogs", type=int, default=2, help="busy-loop processes loading the CPUs")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds before a run counts as hung")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="imgshards-soak-"))
    tree = make_synthetic_tree(work / "tree", classes=4, per_class=40, size=(64, 48))
    for path in (
        p for p in tree.rglob("*") if p.is_file()
    ):  # one size, as framework_worker.py's identity transform needs
        Image.open(path).convert("RGB").resize((64, 48)).save(path)
    root = work / "packed"
    pack(tree, root, PackConfig(shard_size=20_000, workers=2))
    base = {"root": str(root), "batch_size": 8, "num_workers": 2, "epochs": 3}

    ok, secs, err = torchrun({**base, "out": str(work / "full")}, args.timeout)
    assert ok, err
    full = [json.loads((work / f"full.{r}").read_text()) for r in range(2)]
    ckpt = str(work / "mid.ckpt")
    ok, secs, err = torchrun(
        {**base, "kill_at": [1, 3], "ckpt_out": ckpt, "out": str(work / "killed")}, args.timeout
    )
    assert ok, err
    killed = [json.loads((work / f"killed.{r}").read_text()) for r in range(2)]

    hogs = [multiprocessing.Process(target=hog, daemon=True) for _ in range(args.hogs)]
    for h in hogs:
        h.start()
    passed, times = 0, []
    try:
        for i in range(args.runs):
            out = work / f"resumed{i}"
            ok, secs, err = torchrun({**base, "ckpt": ckpt, "out": str(out)}, args.timeout)
            exact = ok and all(
                killed[r]["seen"]["1"][:4] + json.loads(Path(f"{out}.{r}").read_text())["seen"]["1"]
                == full[r]["seen"]["1"]
                for r in range(2)
            )
            passed += exact
            times.append(secs)
            print(f"run {i + 1:2d}: {'ok   ' if exact else 'FAIL '} {secs:6.1f} s {err}", flush=True)
    finally:
        for h in hogs:
            h.kill()
    print(f"resumed Lightning phase: {passed}/{args.runs} exact, no retry, {args.hogs} CPU hog(s); "
          f"{min(times):.1f}-{max(times):.1f} s a run")  # fmt: skip
    sys.exit(0 if passed == args.runs else 1)


if __name__ == "__main__":
    main()
