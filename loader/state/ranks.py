"""Which rank of how many this process is, settled when a pass starts rather than when a dataset is built.

A dataset is often built before ``init_process_group`` (the README's loop, a trainer that joins the
group inside ``fit``), or with no process group at all under ``torchrun``. Read at construction,
the rank would then be 0 of 1 on every rank, and every rank would read the whole split. So the
dataset's epoch (:class:`~.progress.EpochProgress`) keeps what it was told and asks
:func:`settle_ranks` each time a pass starts (and for ``len()``), in the training process; the
answer is recorded in the state it shares with its DataLoader workers
(:class:`~.cursor.SharedControl`), so the workers of a pass agree with it.

Where the answer comes from, first found first:

1. the default process group of ``torch.distributed``, if one is initialized;
2. the launcher's environment: ``RANK`` and ``WORLD_SIZE`` (torchrun, Slurm through torchrun,
   Accelerate); Lightning's launcher sets ``LOCAL_RANK`` (and ``NODE_RANK``) in their place;
3. the dataset's ``rank=`` / ``world_size=`` arguments, else rank 0 of 1.

Arguments given beside a process group or a launcher must agree with it: a dataset told
``world_size=1`` on a rank of 2 would read the whole split there, so it is refused, naming both.
"""

from __future__ import annotations

import os

import torch

from ..errors import ConfigError

__all__ = ["settle_ranks"]


def settle_ranks(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``(rank, world_size)`` of this process now: the process group's, the launcher's, or the ones given.

    Raises:
        ConfigError: ``rank`` / ``world_size`` disagree with the process group or the launcher's
            environment, the environment holds a malformed value, or the rank is out of range.

    """
    found = _process_group() or _launcher()
    if found is None:
        settled = (0 if rank is None else rank, 1 if world_size is None else world_size)
        if settled[1] < 1 or not 0 <= settled[0] < settled[1]:
            raise ConfigError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
        return settled
    (r, w), where = found
    if (rank is not None and rank != r) or (world_size is not None and world_size != w):
        raise ConfigError(
            f"the dataset was given rank={rank}, world_size={world_size}, but {where} says rank {r} of {w}: "
            "drop rank= and world_size= (this process's rank is settled from there when a pass starts)"
        )
    return r, w


def _process_group() -> tuple[tuple[int, int], str] | None:
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return None
    return (dist.get_rank(), dist.get_world_size()), "torch.distributed's process group"


def _launcher() -> tuple[tuple[int, int], str] | None:
    env = os.environ
    if "WORLD_SIZE" not in env or not ({"RANK", "LOCAL_RANK"} & env.keys()):
        return None
    world = _int("WORLD_SIZE")
    if "RANK" in env:
        rank, where = _int("RANK"), f"the environment (RANK={env['RANK']}, WORLD_SIZE={env['WORLD_SIZE']})"
    else:  # Lightning's launcher: a node's ranks are numbered from NODE_RANK * (ranks a node)
        node, local = _int("NODE_RANK", 0), _int("LOCAL_RANK")
        if node and "LOCAL_WORLD_SIZE" not in env:
            raise ConfigError(
                f"the environment sets LOCAL_RANK={local} on node {node} but neither RANK nor "
                "LOCAL_WORLD_SIZE: build the loader's pass after init_process_group, or set RANK"
            )
        rank = node * _int("LOCAL_WORLD_SIZE", 0) + local
        where = f"the environment (LOCAL_RANK={local}, NODE_RANK={node}, WORLD_SIZE={world})"
    if world < 1 or not 0 <= rank < world:
        raise ConfigError(f"{where}: need 0 <= rank < world size, got rank {rank} of {world}")
    return (rank, world), where


def _int(name: str, default: int | None = None) -> int:
    text = os.environ.get(name)
    if text is None and default is not None:
        return default
    try:
        return int(str(text))
    except ValueError:
        raise ConfigError(f"the environment variable {name}={text!r} is not an integer") from None
