"""One rank of test_elastic.py: a phase of an epoch at one world size, under a real gloo process group.

``python elastic_worker.py CONFIG_JSON RANK``: builds the loader at ``world_size`` x ``num_workers``,
loads ``state_in`` if given, trains ``stop`` batches (all of the rest if ``stop`` is null) with an
all-reduce per batch as DDP does, and writes the pixel hashes it delivered and, on rank 0, the
loader state to ``out.RANK``.
"""

from __future__ import annotations

import hashlib
import json
from itertools import islice

import torch
import torch.distributed as dist
from gloo_rank import join_group

from imgshards.loader import ShardDataset, make_loader


def main() -> None:
    cfg, rank = join_group()
    ds = ShardDataset(cfg["root"], batch_size=cfg["batch_size"], transform=torch.nn.Identity())
    loader = make_loader(ds, num_workers=cfg["num_workers"])
    if cfg.get("state_in"):
        loader.load_state_dict(cfg["state_in"])
    seen = []
    for batch in islice(loader, cfg["stop"]):
        seen.append([hashlib.sha1(i.contiguous().numpy().tobytes()).hexdigest() for i in batch.images])
        dist.all_reduce(torch.ones(1))  # as DDP's gradient sync: unequal batch counts would hang here
    out = {"seen": seen, "state": loader.state_dict(), "len": len(loader), "epoch": loader.epoch}
    with open(f"{cfg['out']}.{rank}", "w") as f:
        json.dump(out, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
