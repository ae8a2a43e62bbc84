"""Ctrl-C to a training loop, again and again: does a ``/dev/shm/torch_*`` segment outlive it? Run by hand.

Each run starts a loop over ``make_loader(ShardDataset(PACKED), num_workers=2)`` in a fresh process,
sends it SIGINT after a random 3 to 7 s (seeded: the same delays every time), waits for it to end,
and lists the ``torch_*`` segments left in ``/dev/shm`` (then removes them, so each run counts its
own). ``--at REF`` runs the loop on git ref REF instead (``bench/loader.py``'s ``install_ref``).
Before ``new_shared`` (``loader/state/buffers.py``) made the batch buffers as memfds, which have no
name to leave, 1 run in 25 left one::

    python bench/shm_on_exit.py /tmp/inet5k-shards --runs 100
    python bench/shm_on_exit.py /tmp/inet5k-shards --runs 100 --at bc91b27
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LOOP = """
import sys
from imgshards.loader import ShardDataset, make_loader
loader = make_loader(ShardDataset(sys.argv[1], batch_size=64, transform="resnet"), num_workers=2)
for epoch in range(1000):
    for images, labels in loader:
        pass
"""


def install_ref(ref: str, where: Path) -> Path:
    """``bench/loader.py``'s ``install_ref``: REF's three folders on a PYTHONPATH, and a python for them."""
    spec = importlib.util.spec_from_file_location("bench_loader", Path(__file__).with_name("loader.py"))
    assert spec and spec.loader
    bench_loader = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_loader)
    return bench_loader.install_ref(ref, where)


def interrupted(python: str, packed: str, after: float) -> tuple[int, list[str]]:
    """One loop, interrupted after ``after`` s: its exit status and the segments it left."""
    loop = subprocess.Popen(
        [python, "-c", LOOP, packed],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        # A shell's background job starts with SIGINT ignored: give the loop Python's own Ctrl-C.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    time.sleep(after)
    loop.send_signal(signal.SIGINT)
    try:
        code = loop.wait(timeout=120)
    except subprocess.TimeoutExpired:
        loop.kill()
        code = loop.wait()
    left = sorted(str(p) for p in Path("/dev/shm").glob("torch_*"))
    for path in left:
        os.unlink(path)
    return code, left


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("packed", help="a packed dataset")
    p.add_argument("--runs", type=int, default=50)
    p.add_argument("--at", metavar="REF", help="run the loop on git ref REF instead of this checkout")
    args = p.parse_args()
    if list(Path("/dev/shm").glob("torch_*")):
        sys.exit("/dev/shm holds torch_* segments already: another torch job runs here; run this alone")
    rng = random.Random(0)
    with tempfile.TemporaryDirectory(prefix="imgshards-shm-") as tmp:
        python = str(install_ref(args.at, Path(tmp))) if args.at else sys.executable
        runs_left = 0
        for i in range(args.runs):
            code, left = interrupted(python, args.packed, rng.uniform(3, 7))
            runs_left += bool(left)
            print(f"run {i}: exit {code}, left {len(left)} {' '.join(left)}", flush=True)
    print(f"{runs_left} of {args.runs} runs left a segment in /dev/shm ({args.at or 'this checkout'})")


if __name__ == "__main__":
    main()
