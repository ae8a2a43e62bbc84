"""One rank of test_distributed.py: joins a real gloo process group, runs the loader, pickles what it saw.

Run as ``python ddp_worker.py CONFIG_JSON RANK``. Images are identified by a hash of their pixels
(the loader runs with an identity transform); the test maps the hashes back to sample keys.
"""

from __future__ import annotations

import hashlib
from itertools import islice

import torch
import torch.distributed as dist
from gloo_rank import join_group, leave_group

from imgshards.loader import Batch, ShardDataset, ShardLoader, make_loader


def hashes(batch: Batch) -> list[str]:
    return [hashlib.sha1(img.contiguous().numpy().tobytes()).hexdigest() for img in batch.images]


def main() -> None:
    cfg, rank = join_group()
    out = {}
    for name, root in cfg["datasets"].items():

        def loader(mode: str = "train", root: str = root) -> ShardLoader:
            ds = ShardDataset(root, batch_size=cfg["batch_size"], mode=mode, transform=torch.nn.Identity())
            return make_loader(ds, num_workers=cfg["num_workers"])

        def train_pass(ld: ShardLoader, limit: int | None = None) -> list[list[str]]:
            seen = []
            for batch in islice(ld, limit):
                seen.append(hashes(batch))
                # As DDP's gradient all-reduce: a rank with more batches than another would hang here.
                dist.all_reduce(torch.ones(1))
            return seen

        ld = loader()
        result = {"rank": ld.dataset.rank, "world_size": ld.dataset.world_size, "len": len(ld)}
        result["epoch0"] = train_pass(ld)
        result["epoch1"] = train_pass(ld)  # the loader moved on to epoch 1 by itself
        result["repeat0"] = train_pass(loader())

        first = loader()
        first.set_epoch(1)
        head = train_pass(first, cfg["stop"])
        second = loader()
        second.load_state_dict(first.state_dict())
        result["resumed1"] = head + train_pass(second)

        ev = loader("eval")
        result["eval_len"] = len(ev)
        result["eval"] = [hashes(b) for b in ev]
        out[name] = result
    leave_group(cfg, rank, out)


if __name__ == "__main__":
    main()
