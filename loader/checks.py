"""Checks of the loader's arguments, made when a dataset is built: a typo fails there, naming the choices."""

from __future__ import annotations

import torch

from .errors import ConfigError

__all__ = ["check_choice", "resolve_rank"]


def check_choice(name: str, value: object, allowed: tuple[str, ...]) -> None:
    """Raise ConfigError naming ``name``, ``value`` and the allowed values unless ``value`` is one."""
    if value not in allowed:
        raise ConfigError(f"unknown {name} {value!r}; expected one of {list(allowed)}")


def resolve_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``(rank, world_size)``: the ones given, else ``torch.distributed``'s, else ``(0, 1)``; checked."""
    dist = torch.distributed
    initialized = dist.is_available() and dist.is_initialized()
    if world_size is None:
        world_size = dist.get_world_size() if initialized else 1
    if rank is None:
        rank = dist.get_rank() if initialized else 0
    if world_size < 1 or not 0 <= rank < world_size:
        raise ConfigError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    return rank, world_size
