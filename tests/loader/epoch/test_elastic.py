"""Tests of loader/epoch/elastic.py: what a leg delivered, replayed on numbers alone."""

from __future__ import annotations

from itertools import islice

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from imgshards.loader.epoch import elastic

layouts = st.builds(
    elastic.Layout,
    shard_samples=st.lists(st.integers(0, 120), min_size=1, max_size=12).map(tuple),
    seed=st.integers(0, 50),
    batch_size=st.integers(1, 8),
    drop_last=st.booleans(),
    shuffle=st.booleans(),
    shuffle_buffer=st.integers(1, 64),
    shuffle_initial=st.integers(1, 64),
)


@settings(max_examples=60, deadline=None)
@given(layouts, st.integers(1, 3), st.integers(1, 3), st.integers(1, 3), st.integers(1, 3), st.data())
def test_forget_delivered_forgets_the_first_samples_the_pass_yields(layout, w1, n1, w2, n2, data):
    """What the pass (stream_positions) yields first, in a fresh leg and a resumed one."""
    base = elastic.shard_bases(layout, 0)
    batches = elastic.rank_batches(layout, epoch=0, legs=(), world_size=w1)
    legs: tuple[elastic.Leg, ...] = ((w1, n1, data.draw(st.integers(0, batches))),)
    for leg, (w, n) in enumerate(((w1, n1), (w2, n2))):
        before = legs[:leg]
        left = elastic.remaining(layout, 0, before) if before else np.empty(0, dtype=np.int64)
        for r in range(w):
            for worker in range(n):
                p = (
                    elastic._leg_plan(
                        layout, 0, left, rank=r, world_size=w, worker=worker, num_workers=n, leg=leg
                    )
                    if before
                    else elastic.plan(
                        layout, epoch=0, legs=(), rank=r, world_size=w, worker=worker, num_workers=n
                    )
                )
                total = sum(len(seg) for seg in p.segments)
                skip = data.draw(st.integers(0, total))
                order = elastic.stream_positions(layout, 0, p, base, rank=r, worker=worker, leg=leg)
                expected = sorted(islice(order, skip))
                keep = np.ones(sum(layout.shard_samples), dtype=bool)
                elastic.forget_delivered(keep, layout, 0, p, base, skip=skip, rank=r, worker=worker, leg=leg)
                assert np.flatnonzero(~keep).tolist() == expected
