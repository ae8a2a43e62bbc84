"""How every rank script of the multi-rank tests starts and ends: config and rank, a gloo group, results.

The scripts (``ddp_worker.py``, ``elastic_worker.py``, ``stages_worker.py``) run as
``python SCRIPT CONFIG_JSON RANK``; this module sits beside them, so they import it by name.
"""

from __future__ import annotations

import datetime
import json
import pickle
import sys
from typing import Any

import torch.distributed as dist


def join_group() -> tuple[dict[str, Any], int]:
    """Read ``CONFIG_JSON RANK`` from the command line and join the gloo group on 127.0.0.1."""
    cfg, rank = json.loads(sys.argv[1]), int(sys.argv[2])
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{cfg['port']}",
        rank=rank,
        world_size=cfg["world_size"],
        timeout=datetime.timedelta(seconds=60),
    )
    return cfg, rank


def leave_group(cfg: dict[str, Any], rank: int, out: Any) -> None:
    """Pickle what this rank saw to ``{cfg['out']}.{rank}`` once every rank is done, then leave."""
    dist.barrier()
    with open(f"{cfg['out']}.{rank}", "wb") as f:
        pickle.dump(out, f)
    dist.destroy_process_group()
