"""Property tests of the epoch layout: exact coverage, equal ranks, resume arithmetic."""

from __future__ import annotations

import math
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from imgshards.loader.epoch import partition

layouts = st.fixed_dictionaries(
    {
        "shard_samples": st.lists(st.integers(0, 40), min_size=1, max_size=12),
        "world_size": st.integers(1, 5),
        "num_workers": st.integers(1, 4),
        "batch_size": st.integers(1, 16),
        "train": st.booleans(),
        "drop_last": st.booleans(),
        "shuffle": st.booleans(),
        "seed": st.integers(0, 2**32),
        "epoch": st.integers(0, 1000),
    }
)


def all_plans(shard_samples, *, world_size, num_workers, drop_last, train, **kw):
    drop_last = drop_last and train
    return {
        (r, w): partition.worker_plan(
            shard_samples,
            rank=r,
            world_size=world_size,
            worker=w,
            num_workers=num_workers,
            train=train,
            drop_last=drop_last,
            **kw,
        )
        for r in range(world_size)
        for w in range(num_workers)
    }


def samples_of(plan):
    return [(seg.shard, i) for seg in plan.segments for i in range(seg.start, seg.stop)]


@settings(max_examples=300, deadline=None)
@given(layouts)
def test_every_sample_at_most_once_and_exactly_the_documented_remainder_dropped(layout):
    plans = all_plans(**layout)
    seen = Counter(s for plan in plans.values() for s in samples_of(plan))
    assert all(c == 1 for c in seen.values()), "a sample is read twice"
    shard_samples = layout["shard_samples"]
    assert all(0 <= i < shard_samples[shard] for shard, i in seen)
    total = sum(shard_samples)
    ws, bs = layout["world_size"], layout["batch_size"]
    drop_last = layout["drop_last"] and layout["train"]
    if layout["train"]:
        per_rank = total // ws
        if drop_last:
            per_rank -= per_rank % bs
        assert len(seen) == ws * per_rank
        assert total - len(seen) < ws * (bs if drop_last else 1)
    else:
        assert len(seen) == total, "eval must cover every sample"
    dropped = partition.dropped_samples(
        total, world_size=ws, batch_size=bs, train=layout["train"], drop_last=drop_last
    )
    assert dropped == total - len(seen)


@settings(max_examples=300, deadline=None)
@given(layouts)
def test_batch_counts_match_samples_and_ranks(layout):
    plans = all_plans(**layout)
    total, ws, nw, bs = (
        sum(layout["shard_samples"]),
        layout["world_size"],
        layout["num_workers"],
        layout["batch_size"],
    )
    drop_last = layout["drop_last"] and layout["train"]
    counts = partition.rank_batches(
        total, world_size=ws, batch_size=bs, train=layout["train"], drop_last=drop_last
    )
    for r in range(ws):
        workers = [plans[r, w] for w in range(nw)]
        assert sum(p.batches for p in workers) == counts[r]
        short = 0
        for p in workers:
            assert sum(len(s) for s in p.segments) == p.samples
            assert p.samples <= p.batches * bs
            assert p.samples > (p.batches - 1) * bs or p.batches == 0
            short += p.batches * bs - p.samples
        assert short < bs, "at most one batch of a rank is smaller than batch_size"
        if counts[r]:
            last_worker = (counts[r] - 1) % nw
            assert all(p.samples == p.batches * bs for w, p in enumerate(workers) if w != last_worker)
    if layout["train"]:
        assert len(set(counts)) == 1, "train ranks must yield the same number of batches"
    else:
        assert max(counts) - min(counts) <= 1
        assert sum(counts) == math.ceil(total / bs)


@settings(max_examples=100, deadline=None)
@given(layouts)
def test_layout_is_a_pure_function_and_epochs_differ_in_shard_order(layout):
    assert all_plans(**layout) == all_plans(**layout)
    n = len(layout["shard_samples"])
    a = partition.shard_order(n, seed=layout["seed"], epoch=0, shuffle=True)
    assert sorted(a.tolist()) == list(range(n))


def test_shard_order_changes_with_epoch_and_seed():
    orders = {
        tuple(partition.shard_order(20, seed=s, epoch=e, shuffle=True)) for s in (0, 1) for e in range(5)
    }
    assert len(orders) == 10
    assert list(partition.shard_order(5, seed=0, epoch=3, shuffle=False)) == [0, 1, 2, 3, 4]


def test_dropped_samples_move_between_epochs():
    # One shard, so only the position of the dropped run can move the remainder around.
    dropped = set()
    for epoch in range(20):
        plans = all_plans(
            [101], world_size=4, num_workers=1, batch_size=5, train=True, drop_last=False,
            shuffle=True, seed=0, epoch=epoch,
        )  # fmt: skip
        seen = {s for p in plans.values() for s in samples_of(p)}
        dropped |= {i for i in range(101) if (0, i) not in seen}
    assert len(dropped) > 10


def round_robin(batch_counts):
    """The worker of each batch, in the order DataLoader yields them (cycle, skipping exhausted workers)."""
    left, order = list(batch_counts), []
    while any(left):
        for w, n in enumerate(left):
            if n:
                order.append(w)
                left[w] -= 1
    return order


@given(st.integers(0, 200), st.integers(1, 8))
def test_delivered_by_worker_follows_dataloader_round_robin(batches, num_workers):
    order = round_robin(partition.worker_batches(batches, num_workers))
    assert order == [j % num_workers for j in range(batches)]
    for delivered in range(batches + 1):
        expected = Counter(order[:delivered])
        assert partition.delivered_by_worker(delivered, num_workers) == [
            expected[w] for w in range(num_workers)
        ]


def test_fewer_shards_than_workers_still_gives_every_worker_work():
    plans = all_plans(
        [50, 50], world_size=3, num_workers=4, batch_size=4, train=True, drop_last=False, shuffle=True,
        seed=0, epoch=0,
    )  # fmt: skip
    assert all(p.batches >= 2 for p in plans.values())
    # workers share shards, each from its own offset
    starts = {(seg.shard, seg.start) for p in plans.values() for seg in p.segments}
    assert len(starts) == len([seg for p in plans.values() for seg in p.segments])


def test_segments_cut_a_virtual_range():
    runs = partition.segments([2, 0, 1], [5, 3, 4], 3, 10)
    assert runs == [partition.Segment(2, 3, 4), partition.Segment(0, 0, 5), partition.Segment(1, 0, 1)]


@given(st.integers(0, 100), st.integers(1, 6), st.data())
def test_rotated_workers_resume_the_dataloader_order(batches, num_workers, data):
    """After ``delivered`` batches a new pass asks process 0 first; rotated roles continue the order."""
    delivered = data.draw(st.integers(0, batches))
    counts = partition.worker_batches(batches, num_workers)
    done = partition.delivered_by_worker(delivered, num_workers)
    roles = [partition.resumed_worker(p, delivered, num_workers) for p in range(num_workers)]
    left = [counts[roles[p]] - done[roles[p]] for p in range(num_workers)]
    next_batch = [done[roles[p]] for p in range(num_workers)]
    got = []
    for p in round_robin(left):
        got.append((roles[p], next_batch[p]))
        next_batch[p] += 1
    assert got == [(j % num_workers, j // num_workers) for j in range(delivered, batches)]
