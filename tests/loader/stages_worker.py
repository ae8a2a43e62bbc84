"""One rank of test_stages_distributed.py: user stages and a weighted mix under a real gloo group.

Run as ``python stages_worker.py CONFIG_JSON RANK``. Every training batch is all-reduced, as DDP's
gradients are, so a rank with more batches than another would hang (and time out), not pass.
"""

from __future__ import annotations

import hashlib
import warnings

import torch
import torch.distributed as dist
import webdataset as wds
from gloo_rank import join_group, leave_group

from imgshards.loader import Batch, MixedDataset, ShardDataset, make_loader, stages


def pairs(batch: Batch) -> list[tuple[str, int]]:
    return [
        (hashlib.sha1(img.contiguous().numpy().tobytes()).hexdigest(), int(label))
        for img, label in zip(batch.images, batch.labels, strict=True)
    ]


def dropped(sample: dict) -> bool:
    return int(sample["__key__"].rsplit("_", 1)[-1]) % 3 == 0


def main() -> None:
    cfg, rank = join_group()
    warnings.simplefilter("ignore", RuntimeWarning)  # the epochs' reports of what the filter dropped

    def dataset(source, mode: str, **kw) -> ShardDataset:
        raw = [wds.select(lambda s: not dropped(s)), stages.label_from_json("label", classes=cfg["classes"])]
        return ShardDataset(
            source,
            batch_size=cfg["batch_size"],
            mode=mode,
            transform=torch.nn.Identity(),
            raw_stages=raw,
            **kw,
        )

    out: dict = {}
    train = make_loader(dataset(cfg["root"], "train"), num_workers=cfg["num_workers"])
    out["len"] = len(train)
    for epoch in (0, 1):
        seen = []
        for batch in train:
            seen.append(pairs(batch))
            dist.all_reduce(torch.ones(1))
        out[f"epoch{epoch}"] = seen
    ev = make_loader(dataset(cfg["root"], "eval"), num_workers=cfg["num_workers"])
    out["eval"] = [pairs(b) for b in ev]
    out["eval_filtered"] = ev.dataset.filtered_samples

    mix = MixedDataset(
        [cfg["root"], cfg["other"]],
        weights=cfg["weights"],
        batch_size=cfg["batch_size"],
        transform=torch.nn.Identity(),
        raw_stages=[wds.select(lambda s: not dropped(s))],
    )
    mix = make_loader(mix, num_workers=cfg["num_workers"])
    out["mix_len"] = len(mix)
    out["mix"] = []
    for batch in mix:
        out["mix"].append(pairs(batch))
        dist.all_reduce(torch.ones(1))
    leave_group(cfg, rank, out)


if __name__ == "__main__":
    main()
