"""One rank of test_ranks.py, started by torchrun: loaders built before any process group exists.

``python -m torch.distributed.run --nproc_per_node 2 ranks_worker.py CONFIG_JSON``. Each rank runs
an eval pass with no process group at all (the README's loop as pasted), then joins a gloo group
(``env://``, from torchrun's variables) and runs an eval and a train pass of loaders built before it
joined. It writes the pixel hashes of what each pass delivered, and ``len()``, to ``out.RANK``.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import sys

import torch
import torch.distributed as dist

from imgshards.loader import Batch, ShardDataset, ShardLoader, make_loader


def hashes(batch: Batch) -> list[str]:
    return [hashlib.sha1(img.contiguous().numpy().tobytes()).hexdigest() for img in batch.images]


def main() -> None:
    cfg = json.loads(sys.argv[1])

    def loader(mode: str) -> ShardLoader:
        ds = ShardDataset(cfg["root"], batch_size=cfg["batch_size"], mode=mode, transform=torch.nn.Identity())
        return make_loader(ds, num_workers=cfg["num_workers"])

    alone = loader("eval")
    ev, train = loader("eval"), loader("train")  # built before the group, as a trainer's fit() would
    out = {"alone": {"len": len(alone), "seen": [hashes(b) for b in alone]}}

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    out["eval"] = {"len": len(ev), "seen": [hashes(b) for b in ev]}
    seen = []
    for batch in train:
        seen.append(hashes(batch))
        dist.all_reduce(torch.ones(1))  # as DDP's gradients: unequal batch counts would hang here
    out["train"] = {"len": len(train), "seen": seen}
    out["ranks"] = [train.dataset.rank, train.dataset.world_size]
    dist.barrier()
    with open(f"{cfg['out']}.{os.environ['RANK']}", "w") as f:
        json.dump(out, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
