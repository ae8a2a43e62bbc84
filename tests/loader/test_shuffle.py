"""The worker-level shuffle stages on plain lists: permutations, deterministic, fast start."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from imgshards.loader.epoch.order import buffer_shuffle, interleave, worker_rng


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 30), min_size=1, max_size=20), st.integers(0, 2**32), st.integers(1, 20))
def test_interleave_is_a_merge_that_keeps_each_stream_in_order(sizes, seed, max_open):
    streams = [[(i, j) for j in range(n)] for i, n in enumerate(sizes)]
    out = list(interleave(streams, sizes, np.random.default_rng(seed), max_open=max_open))
    assert sorted(out) == sorted(x for s in streams for x in s)
    for i, s in enumerate(streams):
        assert [x for x in out if x[0] == i] == s
    again = list(interleave(streams, sizes, np.random.default_rng(seed), max_open=max_open))
    assert out == again


def test_interleave_survives_a_stream_that_ends_early():
    streams = [[0, 1], ["a", "b", "c"]]
    out = list(interleave(streams, [5, 3], np.random.default_rng(0)))
    assert sorted(map(str, out)) == ["0", "1", "a", "b", "c"]


def test_interleave_mixes_from_the_start():
    streams = [[i] * 100 for i in range(10)]
    head = list(interleave(streams, [100] * 10, np.random.default_rng(0)))[:30]
    assert len(set(head)) >= 8


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 300), st.integers(0, 64), st.integers(0, 64), st.integers(0, 2**32))
def test_buffer_shuffle_is_a_deterministic_permutation(n, size, initial, seed):
    out = list(buffer_shuffle(range(n), np.random.default_rng(seed), size=size, initial=initial))
    assert sorted(out) == list(range(n))
    assert out == list(buffer_shuffle(range(n), np.random.default_rng(seed), size=size, initial=initial))
    if size <= 1:
        assert out == list(range(n))


def test_buffer_shuffle_starts_before_the_buffer_is_full():
    pulled = []

    def source():
        for i in range(10_000):
            pulled.append(i)
            yield i

    it = buffer_shuffle(source(), np.random.default_rng(0), size=1000, initial=10)
    next(it)
    assert len(pulled) <= 11


def test_worker_rngs_differ_by_every_coordinate():
    draws = {
        tuple(worker_rng(seed, epoch, rank, worker).integers(0, 2**62, 2))
        for seed in (0, 1)
        for epoch in (0, 1)
        for rank in (0, 1)
        for worker in (0, 1)
    }
    assert len(draws) == 16
