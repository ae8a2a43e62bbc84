"""Count the device operations one batch of augmentation launches: per-image presets against batched.

Runs on ``meta`` tensors, so it needs no GPU and takes a second: every aten operation on a device
tensor is one kernel launch (or close to it) on a GPU, and the meta device takes the same code path
as CUDA in the presets (``device.type != "cpu"``). The views are drawn on the host as the
training process draws them.

    python bench/augment_launches.py --batch 256
"""

from __future__ import annotations

import argparse
import random
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from imgshards.loader.device.augment import augment_batch
from imgshards.loader.image.presets import preset

# Operations that make a view (no kernel), or copy a host scalar: not launches.
VIEWS = {
    "slice",
    "select",
    "view",
    "permute",
    "unsqueeze",
    "squeeze",
    "expand",
    "as_strided",
    "alias",
    "t",
    "transpose",
    "_unsafe_view",
    "detach",
    "lift_fresh",
    "_to_copy_host",
    "unbind",
    "split",
}


class Count(TorchDispatchMode):
    """Counts the aten operations on tensors off the CPU that are not views."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tensors = [a for a in (*args, out) if isinstance(a, torch.Tensor)]
        name = str(func.overloadpacket.__name__)
        if name not in VIEWS and any(t.device.type != "cpu" for t in tensors):
            self.ops[name] += 1
        return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=256)
    args = p.parse_args()
    rng = random.Random(0)
    shapes = [(rng.choice([333, 375, 400, 500]), rng.choice([375, 500, 333])) for _ in range(args.batch)]
    print(f"{'preset':8} {'per image':>10} {'batched':>8}   (device ops for a batch of {args.batch})")
    for name in ("train", "resnet", "eval"):
        t = preset(name, size=224)
        g = torch.Generator().manual_seed(0)
        images = [
            torch.empty((h, w, 3), dtype=torch.uint8, device="meta").permute(2, 0, 1) for h, w in shapes
        ]
        views = [t.draw(h, w, g) for h, w in shapes]
        with Count() as per_image:
            for img, view in zip(images, views, strict=True):
                t.apply(img, view)
        with Count() as batched:
            augment_batch(images, views, t)
        print(
            f"{name:8} {sum(per_image.ops.values()):>10} {sum(batched.ops.values()):>8}   {dict(batched.ops)}"
        )


if __name__ == "__main__":
    main()
