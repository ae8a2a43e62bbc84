"""Every random stream of the loader, derived from ``(seed, epoch, ...)`` in one place.

Randomness is a pure function of the dataset's seed, the epoch, the rank, the worker and the batch:
no time, no pid. Each use draws from its own stream, told apart by a tag, so adding a draw to one
use never moves another's numbers. The tags, and the arguments each stream is drawn from:

========================  ===  ==============================================================
stream                    tag  drawn from
========================  ===  ==============================================================
shard order               0    ``(seed, epoch)``: the same on every rank and worker
dropped run               1    ``(seed, epoch)``: where the ``N mod W`` samples left out sit
worker order              2    ``(seed, epoch, rank, worker[, leg])``: interleave and buffer shuffle
augmentation              3    ``(seed, epoch, rank, worker, batch)``: torch's generator per batch
user raw stages           4    the augmentation seed of the batch, plus 4
mix within a batch        5    ``(seed, epoch, rank, worker, batch)``: a mix's batch permutation
========================  ===  ==============================================================
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "AUGMENT",
    "DROPPED",
    "MIX",
    "SHARD_ORDER",
    "USER",
    "WORKER",
    "augment_seed",
    "epoch_rng",
    "mix_rng",
    "user_seed",
    "worker_rng",
    "worker_rngs",
]

SHARD_ORDER, DROPPED, WORKER, AUGMENT, USER, MIX = 0, 1, 2, 3, 4, 5


def epoch_rng(seed: int, epoch: int, tag: int) -> np.random.Generator:
    """Return an RNG of the epoch's layout, identical on every rank and worker; ``tag`` names its use."""
    return np.random.default_rng([seed, epoch, tag])


def worker_rng(seed: int, epoch: int, rank: int, worker: int, leg: int = 0) -> np.random.Generator:
    """Return the RNG of one worker's sample order in one epoch (``leg``: after so many elastic resumes)."""
    return np.random.default_rng([seed, epoch, WORKER, rank, worker] + ([leg] if leg else []))


def worker_rngs(
    seed: int, epoch: int, rank: int, worker: int, leg: int = 0
) -> tuple[np.random.Generator, np.random.Generator]:
    """The two RNGs of one worker's sample order: its interleave's, its shuffle buffer's.

    Children of :func:`worker_rng`'s seed, so each stage draws from a stream of its own and either
    can be advanced to any of its numbers without the other's.
    """
    parent = np.random.SeedSequence([seed, epoch, WORKER, rank, worker] + ([leg] if leg else []))
    merge, shuffle = parent.spawn(2)
    return np.random.default_rng(merge), np.random.default_rng(shuffle)


def augment_seed(seed: int, epoch: int, rank: int, worker: int, batch: int) -> int:
    """Seed of torch's generator while batch ``batch`` of a worker is transformed."""
    return int(np.random.SeedSequence([seed, epoch, AUGMENT, rank, worker, batch]).generate_state(1)[0])


def user_seed(seed: int, epoch: int, rank: int, worker: int, batch: int) -> int:
    """Seed of torch's generator while the user's raw stages run on batch ``batch`` (a random filter)."""
    return augment_seed(seed, epoch, rank, worker, batch) + USER


def mix_rng(seed: int, epoch: int, rank: int, worker: int, batch: int) -> np.random.Generator:
    """Return the RNG that shuffles batch ``batch`` of a mix across its sources."""
    return np.random.default_rng([seed, epoch, MIX, rank, worker, batch])
