"""Decoding in the training process (``decode_on``): the CPU path against the workers' batches.

``decode_on="cpu"`` runs the code path ``decode_on="cuda"`` runs (raw batches from the workers, one
batched ``decode_jpeg`` call per chunk, the presets, normalization), so these tests hold the logic
to the worker path on any machine: the same batches, bit for bit, as ``to_device`` of the workers'
batches. The CUDA tests are in ``test_device_cuda.py``.
"""

from __future__ import annotations

import io
import json
import warnings
from itertools import islice

import numpy as np
import pytest
import torch
from PIL import Image

from imgshards.loader import ConfigError, CorruptImageError, DecodeOn, ShardDataset, make_loader, to_device
from imgshards.loader.image.decode import jpeg_header
from imgshards.loader.image.presets import _color_matrix, _color_matrix_on_device

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")


def worker_batches(root, num_workers=2, **kw):
    """What the training loop gets from the worker path: ``to_device`` of each batch, on the CPU."""
    ds = ShardDataset(root, **kw)
    return [to_device(b, "cpu") for b in make_loader(ds, num_workers=num_workers)]


def device_batches(root, num_workers=2, decode_on="cpu", **kw):
    ds = ShardDataset(root, decode_on=decode_on, **kw)
    return list(make_loader(ds, num_workers=num_workers))


def assert_same(a, b):
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        assert torch.equal(x.labels, y.labels), f"batch {i}: labels differ"
        assert torch.equal(x.images, y.images), f"batch {i}: images differ"


@pytest.mark.parametrize("transform", ["train", "resnet", "eval"])
def test_cpu_path_gives_the_workers_batches_bit_for_bit(packed_many, transform):
    mode = "eval" if transform == "eval" else "train"
    kw = dict(batch_size=8, transform=transform, image_size=32, mode=mode, seed=7)
    expected = worker_batches(packed_many, **kw)
    got = device_batches(packed_many, **kw)
    assert_same(got, expected)
    assert got[0].images.dtype == torch.float32 and got[0].images.shape == (8, 3, 32, 32)


def test_equal_batches_per_rank_and_the_same_order_as_the_workers(packed_few):
    # At 32 px the 64x48 images need their full resolution: the workers decode them whole (at 16 they
    # decode them at half scale, scaled.py, which the device path does not).
    kw = dict(batch_size=8, transform="train", image_size=32, world_size=3, num_workers=2)
    ranks = [device_batches(packed_few, rank=r, **kw) for r in range(3)]
    assert len({len(r) for r in ranks}) == 1
    assert len(ranks[0]) == len(ShardDataset(packed_few, batch_size=8, world_size=3, rank=0))
    assert_same(ranks[1], worker_batches(packed_few, rank=1, **kw))


def test_resume_mid_epoch_gives_the_same_batches(packed_many):
    def loader():
        ds = ShardDataset(packed_many, batch_size=8, image_size=16, decode_on="cpu")
        return make_loader(ds, num_workers=2)

    full = list(loader())
    first = loader()
    head = list(islice(first, 5))
    state = json.loads(json.dumps(first.state_dict()))
    second = loader()
    second.load_state_dict(state)
    assert_same(head + list(second), full)


def test_the_callers_random_state_is_left_alone(packed_many):
    torch.manual_seed(0)
    before = torch.rand(3)
    torch.manual_seed(0)
    batches = device_batches(packed_many, num_workers=0, batch_size=16, image_size=16)
    assert torch.equal(torch.rand(3), before)
    assert_same(batches, device_batches(packed_many, num_workers=0, batch_size=16, image_size=16))


# ---- bad and unusual data ------------------------------------------------------------------------


def _jpeg(image: Image.Image, **kw) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "JPEG", **kw)
    return buf.getvalue()


@pytest.fixture(scope="module")
def packed_odd(tree_factory, packed_factory):
    """A tiny tree with a JPEG cut short, a PNG, a CMYK JPEG and a progressive JPEG, packed unchecked."""
    src = tree_factory(classes=2, per_class=10, seed=11)
    files = sorted(src.rglob("*.JPEG"))
    files[3].write_bytes(files[3].read_bytes()[:300])
    with Image.open(files[5]) as im:
        rgb = im.convert("RGB")
    files[6].write_bytes(_jpeg(rgb.convert("CMYK")))
    files[7].write_bytes(_jpeg(rgb, progressive=True))
    rgb.save(files[8].with_suffix(".png"))
    files[8].unlink()
    return packed_factory(src, shard_size=20_000, check="none", keep_formats=True)  # the PNG stays PNG


@pytest.mark.parametrize("transform", ["eval", "resnet"])
def test_fallbacks_and_a_corrupt_image_as_in_the_workers(packed_odd, transform):
    kw = dict(batch_size=4, mode="eval", transform=transform, image_size=24)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        expected = worker_batches(packed_odd, **kw)
        ds = ShardDataset(packed_odd, decode_on="cpu", **kw)
        loader = make_loader(ds, num_workers=2)
        got = list(loader)
    assert_same(got, expected)
    assert len(got) == 5 and sum(len(b.labels) for b in got) == 19
    assert ds.corrupt_skipped == 1
    assert any("skipped 1 image(s) that do not decode" in str(w.message) for w in caught)
    # The PNG, the CMYK, progressive and cut JPEGs went to the CPU decoder; the rest in batched calls.
    assert loader.decoder is not None and loader.decoder.stats.cpu_fallback == 4
    assert loader.decoder.stats.fallbacks == {"not a JPEG": 1, "CMYK": 1, "progressive": 1, "truncated": 1}


def test_a_corrupt_image_raises_when_asked(packed_odd):
    ds = ShardDataset(packed_odd, batch_size=4, mode="eval", on_error="raise", decode_on="cpu")
    with pytest.raises(CorruptImageError, match="does not decode"):
        list(make_loader(ds, num_workers=2))


def test_jpeg_header_reads_size_components_and_progressive():
    rgb = Image.fromarray(np.random.default_rng(0).integers(0, 255, (30, 40, 3), dtype=np.uint8))
    assert jpeg_header(_jpeg(rgb)) == (30, 40, 3, False)
    assert jpeg_header(_jpeg(rgb, progressive=True)) == (30, 40, 3, True)
    assert jpeg_header(_jpeg(rgb.convert("L"))) == (30, 40, 1, False)
    assert jpeg_header(_jpeg(rgb.convert("CMYK"))) == (30, 40, 4, False)
    data = _jpeg(rgb)
    for bad in (b"", b"\xff\xd8", data[:40], b"PNG" + data, bytes(100)):
        assert jpeg_header(bad) is None


# ---- memory and timing ---------------------------------------------------------------------------


def test_decode_calls_are_cut_to_the_memory_bound(packed_many):
    kw = dict(batch_size=8, image_size=16, num_workers=0)
    one_image = 3 * 64 * 48  # the tiny profile's images
    small = DecodeOn(device="cpu", max_decoded_bytes=2 * one_image)
    ds = ShardDataset(packed_many, decode_on=small, **{k: v for k, v in kw.items() if k != "num_workers"})
    loader = make_loader(ds, num_workers=0)
    got = list(loader)
    assert_same(got, device_batches(packed_many, **kw))  # the cut changes nothing in the output
    stats = loader.decoder.stats  # what the decoder did (loader/device/marks.py)
    assert stats.batches == len(got) == 15 and stats.images == 115
    assert stats.decode_calls == 14 * 4 + 2  # 2 images a call: 4 per batch of 8, 2 for the last 3
    assert 0 < stats.peak_bytes <= stats.bound_bytes
    assert all(stats.ms_per_batch(s) > 0 for s in ("decode", "augment", "normalize"))


def test_color_matrix_on_a_device_matches_the_host_math():
    rng = np.random.default_rng(1)
    for _ in range(20):
        mean = torch.tensor(rng.uniform(0, 255, 3), dtype=torch.float32)
        factors = rng.uniform(0.6, 1.4, 3).tolist()
        order = rng.permutation(3).tolist()
        lighting = rng.normal(0, 0.1, 3)
        w1, b1 = _color_matrix(mean.numpy().astype(np.float64), factors, order, lighting)
        w2, b2 = _color_matrix_on_device(mean, factors, order, lighting)
        assert torch.allclose(w1, w2, atol=1e-6) and torch.allclose(b1, b2, atol=1e-4)


def test_decode_on_is_checked_when_the_dataset_is_built(packed_many):
    with pytest.raises(ConfigError, match="unknown device 'tpu'"):
        ShardDataset(packed_many, decode_on="tpu")
    with pytest.raises(ConfigError, match="floating dtype"):
        DecodeOn(device="cpu", dtype=torch.uint8)
    with pytest.raises(ConfigError, match="ahead >= 0"):
        DecodeOn(device="cpu", ahead=-1)
    with pytest.raises(ConfigError, match="unknown augment 'fast'; expected 'batched', 'per_image' or None"):
        DecodeOn(device="cpu", augment="fast")
    if not CUDA:
        with pytest.raises(ConfigError, match="torch sees no CUDA device; use decode_on='cpu'"):
            ShardDataset(packed_many, decode_on="cuda")


# The CUDA tests are in test_device_cuda.py.


def test_the_device_decoder_seeds_with_the_rank_of_the_pass(packed_many, monkeypatch):
    # Built before the launcher's rank is known (a dataset made before init_process_group): the decoder
    # made with the loader must draw its views with the rank the pass settles, as the workers do.
    ds = ShardDataset(packed_many, batch_size=8, image_size=16, decode_on="cpu")
    loader = make_loader(ds, num_workers=0)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    next(iter(loader))
    assert ds.rank == loader.decoder.rank == 1
