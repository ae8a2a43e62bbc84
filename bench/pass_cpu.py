"""CPU time an image of one worker's pass, this checkout against git ref REF, alternated. Run by hand.

``bench/loader.py --against`` times the whole loader (two DataLoader workers) and takes medians of
images/s; on a shared 2-core VM its rounds spread by +-15%, which hides a change of a few percent.
This one times what the loader's changes touch, one worker's pass in one process with one torch
thread (as a DataLoader worker runs), in CPU seconds: each round is a fresh process on each side
in turn, on the same shards, and it prints every round, the minimum (the least disturbed) and the
median of each side::

    python bench/pass_cpu.py /tmp/inet5k-shards --against bc91b27 --preset resnet --rounds 8
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def one(packed: str, preset: str, images: int) -> float:
    """CPU ms an image of ``images`` images of worker 0's pass (1 of 1), after its first batch."""
    import torch

    from imgshards.loader import ShardDataset
    from imgshards.loader.epoch.position import PassPosition

    torch.set_num_threads(1)  # as in a DataLoader worker
    mode = "eval" if preset == "eval" else "train"
    ds = ShardDataset(packed, batch_size=64, transform=preset, mode=mode)
    batches = ds.worker_batches(PassPosition(0, (), 0, 0, 1))
    next(batches)  # the first batch opens the shards and fills the shuffle buffer
    start, made = time.process_time(), 0
    for batch in itertools.islice(batches, images // 64):
        made += len(batch.labels)
    return (time.process_time() - start) / made * 1000


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("packed", help="a packed dataset (bench/loader.py packs one)")
    p.add_argument("--against", metavar="REF", required=True, help="the git ref to alternate with")
    p.add_argument("--preset", default="resnet", choices=["train", "resnet", "eval"])
    p.add_argument("--images", type=int, default=1280, help="images timed a round")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument(
        "--packed-against", help="REF's copy of PACKED: the same shards under an index REF reads (format 1)"
    )
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a round, in this process
    args = p.parse_args()
    if args.one:
        print(one(args.packed, args.preset, args.images))
        return
    with tempfile.TemporaryDirectory(prefix="imgshards-pass-cpu-") as tmp:
        from loader import install_ref  # bench/loader.py's: git archive of REF, on PYTHONPATH

        ref = install_ref(args.against, Path(tmp))
        sides = {"this": Path(sys.executable), args.against: ref}
        packed = {"this": args.packed, args.against: args.packed_against or args.packed}
        got: dict[str, list[float]] = {name: [] for name in sides}
        for _ in range(args.rounds):
            for name, python in sides.items():
                cmd = [__file__, packed[name], "--against", args.against, "--preset", args.preset]
                cmd += ["--images", str(args.images), "--one"]
                out = subprocess.run([str(python), *cmd], check=True, capture_output=True, text=True, cwd=tmp)
                got[name].append(float(out.stdout.split()[-1]))
    print(
        f"{args.preset}: CPU ms an image of one worker's pass, {args.images} images a round, 1 torch thread"
    )
    for name, ms in got.items():
        rounds = " ".join(f"{x:.3f}" for x in ms)
        print(f"  {name:>10}: min {min(ms):.3f}  median {statistics.median(ms):.3f}  rounds {rounds}")
    this, ref = got["this"], got[args.against]
    print(
        f"{args.against} / this: min {min(ref) / min(this):.3f}, median "
        f"{statistics.median(ref) / statistics.median(this):.3f} (above 1: this checkout spends less)"
    )


if __name__ == "__main__":
    main()
