"""The order a pass reads is the order the elastic replay computes."""

from __future__ import annotations

import tarfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from imgshards.converter import read_manifest
from imgshards.loader import ShardDataset
from imgshards.loader.epoch import elastic
from imgshards.loader.epoch.position import PassPosition
from imgshards.loader.pipeline import passes

_KEYS: dict[Path, dict[str, tuple[int, int]]] = {}


def _where(root: Path) -> dict[str, tuple[int, int]]:
    """Sample key -> (shard number, index in the shard), read with ``tarfile``."""
    if root not in _KEYS:
        where: dict[str, tuple[int, int]] = {}
        for number, shard in enumerate(read_manifest(root).split("train").shards):
            with tarfile.open(root / shard.name) as tar:
                keys = dict.fromkeys(m.name.split(".", 1)[0] for m in tar)
            where.update({key: (number, i) for i, key in enumerate(keys)})
        _KEYS[root] = where
    return _KEYS[root]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    world=st.integers(1, 3),
    workers=st.integers(1, 3),
    epoch=st.integers(0, 3),
    seed=st.integers(0, 2**16),
    buffer=st.sampled_from([0, 5, 40]),
    initial=st.sampled_from([1, 10]),
    resumed=st.booleans(),
    data=st.data(),
)
def test_the_elastic_replay_yields_the_positions_the_read_yields(
    packed_many, world, workers, epoch, seed, buffer, initial, resumed, data
):
    rank = data.draw(st.integers(0, world - 1))
    worker = data.draw(st.integers(0, workers - 1))
    ds = ShardDataset(
        packed_many, batch_size=4, rank=rank, world_size=world, seed=seed, shuffle_buffer=buffer,
        shuffle_initial=initial, transform=lambda x: x,
    )  # fmt: skip
    shard_samples = tuple(s.samples for s in ds.part.split.shards)
    layout = elastic.Layout(shard_samples, seed, 4, False, True, buffer, initial)
    legs: tuple[tuple[int, int, int], ...] = ()
    if resumed:  # a finished leg at another topology, stopped part way
        w0, n0 = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
        batches = elastic.rank_batches(layout, epoch=epoch, legs=(), world_size=w0)
        legs = ((w0, n0, data.draw(st.integers(1, max(1, batches - 1)))),)
    at = PassPosition(epoch, legs, 0, worker, workers, rank, world)
    where = _where(packed_many)
    base = elastic.shard_bases(layout, epoch)
    read = [
        int(base[where[s.key][0]]) + where[s.key][1]
        for s in passes.raw_samples(ds.spec, ds.part, at, ds.progress.counters(worker))
    ]
    plan = passes.plan(ds.spec, ds.part, at)
    replay = elastic.stream_positions(layout, epoch, plan, base, rank=rank, worker=worker, leg=len(legs))
    assert read == list(replay)
    assert len(read) == plan.samples
