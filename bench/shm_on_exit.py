"""Ctrl-C to a training loop, again and again: does a ``/dev/shm/torch_*`` segment outlive it? Run by hand.

Each run starts a loop over a ``ShardDataset`` with 2 workers in a fresh process, sends it SIGINT
after a random 3 to 7 s (seeded: the same delays every time), waits for it to end, and lists the
``torch_*`` segments left in ``/dev/shm`` (then removes them, so each run counts its own).
``--loader dataloader`` (the default) loops over a plain ``DataLoader``, whose workers make a new
buffer for every batch (a ``ShardLoader`` recycles them, so its workers make few);
``--loader make_loader`` over ``make_loader``'s. ``--against REF`` runs the same loop on git ref
REF (``bench/loader.py``'s ``install_ref``) after each run of this checkout, with the same delay.
Before ``new_shared`` (``loader/state/buffers.py``) made the shared buffers as memfds, which have no
name to leave, 1 run in 25 left one under load::

    python bench/shm_on_exit.py /tmp/inet5k-shards --runs 40 --against bc91b27
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LOOPS = {
    "dataloader": """
import sys
from torch.utils.data import DataLoader
from imgshards.loader import ShardDataset
dataset = ShardDataset(sys.argv[1], batch_size=256, transform="resnet")
loader = DataLoader(dataset, batch_size=None, num_workers=2)
for epoch in range(1000):
    for images, labels in loader:
        pass
""",
    "make_loader": """
import sys
from imgshards.loader import ShardDataset, make_loader
loader = make_loader(ShardDataset(sys.argv[1], batch_size=64, transform="resnet"), num_workers=2)
for epoch in range(1000):
    for images, labels in loader:
        pass
""",
}


def interrupted(python: str, loop_code: str, packed: str, after: float) -> tuple[int, list[str]]:
    """One loop, interrupted after ``after`` s: its exit status and the segments it left."""
    loop = subprocess.Popen(
        [python, "-c", loop_code, packed],
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
    p.add_argument("--loader", choices=sorted(LOOPS), default="dataloader")
    p.add_argument("--against", metavar="REF", help="also run the loop on git ref REF, alternating")
    args = p.parse_args()
    if list(Path("/dev/shm").glob("torch_*")):
        sys.exit("/dev/shm holds torch_* segments already: another torch job runs here; run this alone")
    rng = random.Random(0)
    with tempfile.TemporaryDirectory(prefix="imgshards-shm-") as tmp:
        pythons = {"this checkout": sys.executable}
        if args.against:
            from loader import install_ref  # bench/loader.py's: git archive of REF, on PYTHONPATH

            pythons[args.against] = str(install_ref(args.against, Path(tmp)))
        runs_left = dict.fromkeys(pythons, 0)
        for i in range(args.runs):
            after = rng.uniform(3, 7)
            for name, python in pythons.items():
                code, left = interrupted(python, LOOPS[args.loader], args.packed, after)
                runs_left[name] += bool(left)
                print(f"run {i} ({name}): exit {code}, left {len(left)} {' '.join(left)}", flush=True)
    for name, n in runs_left.items():
        print(f"{name}: {n} of {args.runs} runs left a segment in /dev/shm (--loader {args.loader})")


if __name__ == "__main__":
    main()
