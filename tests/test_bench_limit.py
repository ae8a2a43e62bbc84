"""The limit row of ``bench/loader.py`` decodes the very images imgshards' timed batches hold (issue 22).

The ratio imgshards / limit compares the same work only if both fall on the same images: a window of
a few shards (a few classes) can be larger in bytes and pixels than a random draw of the split.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from imgshards.loader import ShardDataset, make_loader
from imgshards.loader.image.decode import decode

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_loader", ROOT / "bench" / "loader.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def corner(img: torch.Tensor) -> torch.Tensor:
    """An image's corner: enough to tell the tree's images apart (module level: workers pickle it)."""
    return img[:, :6, :6].contiguous()


def test_the_limits_images_are_those_of_the_batches_the_benchmark_times(tiny_packed):
    bench = _bench()
    args = argparse.Namespace(batch_size=3, workers=2, images=14)

    timed: list[torch.Tensor] = []

    def batches():  # the loader as the benchmark runs it, every batch it hands over recorded
        ds = ShardDataset(tiny_packed, batch_size=args.batch_size, transform=corner)
        for images, labels in make_loader(ds, num_workers=args.workers, persistent_workers=False):
            timed.append(images)
            yield images, labels

    bench.timed(batches, args.images)
    window = bench.window_images(tiny_packed, args)

    counted = [img for batch in timed[1:] for img in batch]  # timed counts from the second batch
    assert len(window) == len(counted) >= args.images - args.batch_size
    for data, img in zip(window, counted, strict=True):
        assert torch.equal(corner(decode(data, "jpg")), img)


def test_the_cpu_over_the_timed_batches_counts_live_child_processes():
    bench = _bench()

    def others() -> float:  # live descendants' CPU seconds: all of it but this process's own
        live = bench.live_cpu_seconds()
        assert live is not None
        return live - sum(os.times()[:2])

    before = others()
    burn = "import sys, time\nt = time.process_time()\nwhile time.process_time() - t < 0.5:\n    pass\n"
    child = subprocess.Popen([sys.executable, "-c", burn + "sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while others() - before < 0.45 and time.monotonic() < deadline:  # until it burnt its 0.5 s
            time.sleep(0.1)
        assert others() - before >= 0.45
    finally:
        child.communicate(b"")
