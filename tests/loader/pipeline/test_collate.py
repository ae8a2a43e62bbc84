"""Collation into channels-last uint8 batches, and to_device's normalization (on CPU here)."""

from __future__ import annotations

import pytest
import torch

from imgshards.loader import IMAGENET_MEAN, IMAGENET_STD, Batch, ConfigError, to_device
from imgshards.loader.pipeline.collate import BatchRows, collate
from imgshards.loader.state.buffers import BufferPool, pool_token


def images(n: int, size: int = 8) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, 256, (3, size, size), dtype=torch.uint8, generator=g) for _ in range(n)]


def test_collate_stacks_into_channels_last_uint8():
    imgs = images(4)
    batch = collate(imgs, [3, 1, 0, 2])
    assert isinstance(batch, Batch)
    assert batch.images.shape == (4, 3, 8, 8) and batch.images.dtype == torch.uint8
    assert batch.images.is_contiguous(memory_format=torch.channels_last)
    assert all(torch.equal(batch.images[i], imgs[i]) for i in range(4))
    assert batch.labels.dtype == torch.int64 and batch.labels.tolist() == [3, 1, 0, 2]
    images_, labels = batch  # unpacks like a tuple
    assert images_ is batch.images and labels is batch.labels


def test_pool_reuses_a_buffer_only_once_it_is_given_back():
    flags = torch.zeros(10, dtype=torch.int64)
    pool = BufferPool(flags[4:6], first_token=4)
    a = collate(images(2), [0, 1], pool=pool)
    assert a.images.is_shared() and pool_token(a.images) == 4
    b = collate(images(2), [0, 1], pool=pool)
    assert pool_token(b.images) == 5
    c = collate(images(2), [0, 1], pool=pool)  # both taken: a one-off buffer, no token
    assert c.images.is_shared() and pool_token(c.images) is None
    flags[4] = 1  # the main process gave buffer 4 back
    d = collate(images(3), [0, 1, 2], pool=pool)  # a bigger batch gets a bigger buffer in slot 4
    assert pool_token(d.images) == 4 and flags[4] == 0
    assert d.images.untyped_storage().data_ptr() != a.images.untyped_storage().data_ptr()
    flags[4] = 1
    e = collate(images(1), [0], pool=pool)
    assert e.images.untyped_storage().data_ptr() == d.images.untyped_storage().data_ptr()
    assert pool_token(collate(images(1), [0]).images) is None


def test_collate_refuses_images_of_different_sizes():
    with pytest.raises(ConfigError, match="fixed size"):
        collate([*images(1, 8), *images(1, 9)], [0, 0])


def test_rows_written_as_made_are_the_batch_without_a_copy():
    imgs = images(5)
    flags = torch.zeros(2, dtype=torch.int64)
    pool = BufferPool(flags, first_token=0)
    rows = BatchRows(5, pool=pool)
    made = [rows.put(img) for img in imgs[:4]]  # the fifth was corrupt: skipped
    assert all(torch.equal(r, img) for r, img in zip(made, imgs, strict=False))
    batch = collate(made, [0, 1, 2, 3], pool=pool, rows=rows)
    assert batch.images.shape == (4, 3, 8, 8) and batch.images.is_shared()
    assert batch.images.data_ptr() == made[0].data_ptr() and pool_token(batch.images) == 0
    assert batch.images.is_contiguous(memory_format=torch.channels_last)
    assert all(torch.equal(batch.images[i], imgs[i]) for i in range(4))


def test_rows_not_handed_back_in_order_are_copied():
    imgs = images(3)
    rows = BatchRows(3)
    made = [rows.put(img) for img in imgs]
    swapped = [made[1], made[0], made[2]]  # a stage reordered them
    batch = collate(swapped, [1, 0, 2], rows=rows)
    assert batch.images.data_ptr() != made[0].data_ptr()
    assert all(torch.equal(batch.images[i], imgs[j]) for i, j in enumerate([1, 0, 2]))


def test_rows_leave_an_image_of_another_size_to_collate_to_refuse():
    rows = BatchRows(2)
    first = rows.put(images(1)[0])
    other = images(1, size=9)[0]
    assert rows.put(other) is other
    with pytest.raises(ConfigError, match="one size"):
        collate([first, other], [0, 1], rows=rows)


@pytest.mark.parametrize("channels_last", [False, True])
def test_to_device_normalizes_on_the_device(channels_last):
    batch = collate(images(3), [0, 1, 2])
    out = to_device(batch, "cpu", channels_last=channels_last)
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    expected = (batch.images.float() / 255 - mean) / std
    assert out.images.dtype == torch.float32
    torch.testing.assert_close(out.images, expected)
    assert out.images.is_contiguous(
        memory_format=torch.channels_last if channels_last else torch.contiguous_format
    )
    assert torch.equal(out.labels, batch.labels)
    assert batch.images.dtype == torch.uint8, "the input batch is left alone"


def test_to_device_custom_stats_and_dtype():
    batch = collate(images(2), [0, 1])
    out = to_device(
        batch, torch.device("cpu"), mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), dtype=torch.float64
    )
    assert out.images.dtype == torch.float64
    torch.testing.assert_close(out.images, batch.images.double() / 127.5 - 1)
    with pytest.raises(ConfigError, match="3 values"):
        to_device(batch, "cpu", mean=(0.5,), std=(0.5,))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_to_device_cuda_matches_cpu():
    batch = collate(images(3), [0, 1, 2])
    batch = Batch(batch.images.pin_memory(), batch.labels.pin_memory())
    gpu = to_device(batch, "cuda", channels_last=True)
    torch.cuda.synchronize()
    torch.testing.assert_close(gpu.images.cpu(), to_device(batch, "cpu").images)


def test_a_pooled_batch_travels_whole_once_then_by_name():
    """Pickled as a worker sends it: the buffer's file descriptor the first time, its name after."""
    from multiprocessing.reduction import ForkingPickler

    from imgshards.loader.state.buffers import forget_buffers, keep_buffer

    flags = torch.zeros(4, dtype=torch.int64)
    pool = BufferPool(flags[2:4], first_token=2, name="test-pool")
    try:
        first = pool.sendable(collate(images(2), [3, 1], pool=pool))
        got = ForkingPickler.loads(ForkingPickler.dumps(first))
        assert type(got) is Batch and got.labels.tolist() == [3, 1]
        assert torch.equal(got.images, first.images)
        keep_buffer("test-pool", 2, got.images.untyped_storage())  # what ShardLoader does, then:
        flags[2] = 1
        again = pool.sendable(collate(images(2), [0, 4], pool=pool))
        data = ForkingPickler.dumps(again)
        assert len(data) < 1000, "by name: no storage in the message"
        second = ForkingPickler.loads(data)
        assert second.images.untyped_storage().data_ptr() == got.images.untyped_storage().data_ptr()
        assert torch.equal(second.images, again.images) and second.labels.tolist() == [0, 4]
        assert second.images.stride() == again.images.stride()
        # Every image of the next batch was corrupt: no buffer taken, so not sent by the last one's name.
        empty = pool.sendable(collate([], [], pool=pool))
        assert empty.kept is None
        assert ForkingPickler.loads(ForkingPickler.dumps(empty)).images.shape == (0, 3, 0, 0)
    finally:
        forget_buffers("test-pool")
