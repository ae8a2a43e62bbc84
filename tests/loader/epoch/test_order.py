"""The worker-level shuffle stages on plain lists: permutations, deterministic, fast start."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from imgshards.loader.epoch import order as order_module
from imgshards.loader.epoch.order import (
    Order,
    buffer_shuffle,
    interleave,
    resumed_order,
    worker_order,
    worker_rng,
)


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


def _resumed_matches(sizes: list[int], order: Order, skip: int, *, worker: int = 0) -> None:
    """``resumed_order`` from ``skip`` is ``worker_order``'s rest, item by item; no run opens before it."""
    runs = [[(k, j) for j in range(n)] for k, n in enumerate(sizes)]
    where = dict(epoch=3, rank=1, worker=worker, leg=0)
    whole = list(worker_order(runs, sizes, order, **where))
    opened: list[tuple[int, int]] = []

    def open_run(k: int, j: int) -> list[tuple[str, int, int]]:
        opened.append((k, j))
        return [("read", *item) for item in runs[k][j:]]

    rest = list(resumed_order(open_run, sizes, order, skip=skip, **where))
    # A run's item comes as read from its run, or as (k, j), a pending item the caller reads alone.
    assert [item[1:] if item[0] == "read" else item for item in rest] == whole[skip:]
    delivered = set(whole[:skip])
    for k, j in opened:  # no run opens at an item it would only skip
        assert all((k, i) not in delivered for i in range(j, sizes[k]))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 40), min_size=1, max_size=70),
    st.integers(0, 2**32),
    st.booleans(),
    st.sampled_from([0, 1, 2, 3, 7, 64, 2000]),
    st.integers(0, 120),
    st.floats(0, 1.05),
)
def test_a_resumed_order_is_the_rest_of_the_order(sizes, seed, shuffle, buffer, initial, at):
    order = Order(seed=seed, shuffle=shuffle, buffer=buffer, initial=initial)
    _resumed_matches(sizes, order, int(at * sum(sizes)))


def test_a_resumed_order_is_the_rest_of_a_long_order():
    # Past 4,096 items each stage draws new blocks of random numbers from the one generator: the
    # replay must draw them in the order the generators do.
    sizes = [700] * 37 + [0, 13]
    order = Order(seed=5, shuffle=True, buffer=2000, initial=100)
    for skip in (0, 1, 4095, 4096, 4097, 9000, 20_000, 25_000, sum(sizes) - 1, sum(sizes), sum(sizes) + 3):
        _resumed_matches(sizes, order, skip, worker=1)
    # A full buffer of 4,097 holds 4,096: the merge's and the shuffle's blocks then run out at the
    # same step, and the merge draws first.
    _resumed_matches(sizes, Order(seed=5, shuffle=True, buffer=4097, initial=100), 25_000)


@pytest.mark.parametrize("buffers", [1, 3, 30])
def test_a_resumed_order_keeps_few_steps_and_still_matches(monkeypatch, buffers):
    # The replay keeps the items of its last full-buffer steps only; with a tail of 1 or 3 buffers
    # some slot was last written before it (the replay starts over keeping all), with 30 none was.
    monkeypatch.setattr(order_module, "_KEPT_STEPS", 0)
    monkeypatch.setattr(order_module, "_KEPT_BUFFERS", buffers)
    sizes = [300] * 40
    order = Order(seed=11, shuffle=True, buffer=64, initial=10)
    for skip in (0, 5000, 11_000, sum(sizes) - 30, sum(sizes)):
        _resumed_matches(sizes, order, skip)


def test_a_resume_draws_the_order_of_few_blocks_whatever_the_skip(monkeypatch):
    # Where the interleave stands after n items is a small draw a block of picks; the picks' order is
    # drawn only for the blocks the buffer's last steps took items from: O(skip / block), no step an item.
    ordered = []
    next_block = order_module._Picks.next_block

    def counting(self, at, *, order=True):
        ordered.append(order)
        return next_block(self, at, order=order)

    monkeypatch.setattr(order_module._Picks, "next_block", counting)
    sizes = [5000] * 400  # 2 M items
    order = Order(seed=3, shuffle=True, buffer=1000, initial=100)
    taken, buffer = order_module.replayed(sizes, order, skip=1_999_000, epoch=0, rank=0, worker=0, leg=0)
    assert sum(taken) - len(buffer) == 1_999_000
    blocks = 2_000_000 // order_module._BLOCK
    assert len(ordered) <= 2 * blocks
    assert ordered.count(True) <= 2 + (1 << 18) // order_module._BLOCK + 2
