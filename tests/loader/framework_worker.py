"""One rank of test_frameworks.py, started by torchrun: trains a tiny model through a real framework.

``python -m torch.distributed.run --nproc_per_node 2 framework_worker.py MODE CONFIG_JSON``, MODE one
of ``lightning`` (``Trainer.fit``; with ``kill_at`` the run saves a checkpoint mid-epoch and exits
there, with ``ckpt`` it resumes from one) or ``accelerate`` (``Accelerator.prepare`` and a plain
loop). Each rank writes the pixel hashes of the batches it trained on, by epoch, to ``out.RANK``.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

import torch

from imgshards.loader import Batch, ShardDataset, make_loader


def hashes(batch: Batch) -> list[str]:
    return [hashlib.sha1(img.contiguous().numpy().tobytes()).hexdigest() for img in batch.images]


def features(images: torch.Tensor) -> torch.Tensor:
    return images.float().mean(dim=(2, 3)) / 255


def loader(cfg: dict):
    ds = ShardDataset(cfg["root"], batch_size=cfg["batch_size"], transform=torch.nn.Identity())
    return make_loader(ds, num_workers=cfg["num_workers"])


def run_lightning(cfg: dict, rank: int) -> dict:
    import lightning as L
    from lightning.pytorch.strategies import DDPStrategy

    seen: dict[str, list] = {}

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(3, 5)

        def training_step(self, batch, batch_idx):
            images, labels = batch
            seen.setdefault(str(self.current_epoch), []).append(hashes(batch))
            if cfg.get("kill_at") == [self.current_epoch, batch_idx]:
                self.trainer.save_checkpoint(cfg["ckpt_out"])
                with open(f"{cfg['out']}.{rank}", "w") as f:
                    json.dump({"seen": seen, "len": len(self.trainer.train_dataloader)}, f)
                os._exit(0)  # killed: no teardown, no end of epoch
            return torch.nn.functional.cross_entropy(self.layer(features(images)), labels)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=DDPStrategy(process_group_backend="gloo"),
        max_epochs=cfg["epochs"],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        use_distributed_sampler=False,
    )
    ld = loader(cfg)
    trainer.fit(Tiny(), ld, ckpt_path=cfg.get("ckpt"))
    return {"seen": seen, "len": len(ld)}


def run_accelerate(cfg: dict, rank: int) -> dict:
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(3, 5)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ld = loader(cfg)
    model, optimizer, prepared = accelerator.prepare(model, optimizer, ld)
    seen: dict[str, list] = {}
    for epoch in range(cfg["epochs"]):
        for images, labels in prepared:
            seen.setdefault(str(epoch), []).append(hashes(Batch(images, labels)))
            loss = torch.nn.functional.cross_entropy(model(features(images)), labels)
            accelerator.backward(loss)  # DDP's gradient all-reduce: unequal batch counts would hang
            optimizer.step()
            optimizer.zero_grad()
    return {"seen": seen, "len": len(ld), "same_loader": prepared is ld, "world": accelerator.num_processes}


def main() -> None:
    mode, cfg = sys.argv[1], json.loads(sys.argv[2])
    rank = int(os.environ["RANK"])
    result = {"lightning": run_lightning, "accelerate": run_accelerate}[mode](cfg, rank)
    with open(f"{cfg['out']}.{rank}", "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
