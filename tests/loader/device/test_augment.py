"""The batched augment against the per-image presets, on the CPU, within the stated tolerance.

The views (crop box, flip, colour) are the same by construction: drawn once on the host and given
to both. The pixels differ by the resize filter (``roi_align``'s box average of bilinear samples
against ``interpolate``'s antialiased triangle): the tolerance is the one
:mod:`imgshards.loader.device.augment` states: mean absolute difference under 2 levels of 255,
99% of values within 8 levels.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from imgshards.loader import DecodeOn, ShardDataset, make_loader, preset, to_device
from imgshards.loader.device.augment import augment_batch, augment_groups, by_width, canvas_bytes
from imgshards.loader.image.presets import View

MEAN_TOLERANCE, P99_TOLERANCE = 2.0, 8


def photo(height: int, width: int, seed: int, noise: int = 50) -> torch.Tensor:
    """A smooth RGB image with pixel noise of up to ``noise`` levels, in decode()'s channels-last layout."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 200 / width, y * 200 / height, (x + y) * 100 / (width + height)], axis=-1)
    img = (base + rng.integers(0, noise + 1, base.shape)).clip(0, 255).astype(np.uint8)
    return torch.from_numpy(img).permute(2, 0, 1)


SHAPES = [
    (375, 500),
    (500, 333),
    (64, 48),
    (300, 300),
    (900, 40),
    (1, 1),
    (1000, 1000),
    (224, 224),
    (17, 640),
]


def assert_close(got: torch.Tensor, expected: torch.Tensor) -> None:
    assert got.shape == expected.shape and got.dtype == expected.dtype == torch.uint8
    diff = (got.int() - expected.int()).abs().float()
    assert diff.mean() < MEAN_TOLERANCE, f"mean difference {diff.mean():.2f}"
    assert diff.flatten().quantile(0.99) <= P99_TOLERANCE, f"99th percentile {diff.flatten().quantile(0.99)}"


@pytest.mark.parametrize("name", ["train", "resnet", "eval"])
@pytest.mark.parametrize("size", [224, 32])
def test_batched_augment_matches_the_per_image_preset(name, size):
    t = preset(name, size=size)
    g = torch.Generator().manual_seed(size)
    images = [photo(h, w, seed=i) for i, (h, w) in enumerate(SHAPES)]
    views = [t.draw(h, w, g) for h, w in SHAPES]
    expected = torch.stack([t.apply(img, v) for img, v in zip(images, views, strict=True)])
    assert_close(augment_batch(images, views, t), expected)


def test_upscaling_is_exactly_bilinear_where_no_edge_is_near():
    # A crop far smaller than the output: roi_align samples once per pixel, at interpolate's points.
    t = preset("train", size=64)
    img = photo(200, 200, seed=3)
    view = View(80, 90, 16, 16, flip=False)
    got = augment_batch([img], [view], t)[0].int()
    expected = t.apply(img, view).int()
    inner = (got - expected).abs()[:, 8:-8, 8:-8]
    assert inner.max() <= 1


def test_flip_and_colour_are_per_image():
    t = preset("resnet", size=32)
    g = torch.Generator().manual_seed(0)
    img = photo(120, 160, seed=0, noise=10)  # the filter's difference is the first test's concern
    views = [t.draw(120, 160, g) for _ in range(8)]
    views = [v._replace(flip=k % 2 == 0) for k, v in enumerate(views)]
    got = augment_batch([img] * 8, views, t)
    unflipped = augment_batch([img] * 8, [v._replace(flip=False) for v in views], t)
    for k, v in enumerate(views):
        assert torch.equal(got[k], unflipped[k].flip(-1) if v.flip else unflipped[k])
        assert_close(got[k : k + 1], t.apply(img, v)[None])


def test_groups_bound_the_canvas_and_keep_the_order():
    shapes = [(50, 400), (60, 30), (40, 390), (30, 20), (100, 100)]
    limit = canvas_bytes([(60, 400), (60, 400)])
    groups = by_width(shapes, limit)
    assert sorted(i for g in groups for i in g) == list(range(5))
    assert all(canvas_bytes([shapes[i] for i in g]) <= limit or len(g) == 1 for g in groups)
    t = preset("eval", size=16)
    images = [photo(h, w, seed=i) for i, (h, w) in enumerate(shapes)]
    views = [t.draw(h, w) for h, w in shapes]
    together = augment_batch(images, views, t)
    # The same pixels up to float32's resolution of sampling positions further down a taller canvas.
    grouped = augment_groups(images, views, t, groups)
    assert (grouped.int() - together.int()).abs().max() <= 1


@pytest.mark.parametrize("transform", ["train", "resnet", "eval"])
def test_batched_device_path_keeps_the_workers_samples_and_views(packed_many, transform):
    mode = "eval" if transform == "eval" else "train"
    kw = dict(batch_size=8, transform=transform, image_size=32, mode=mode, seed=7)
    expected = [to_device(b, "cpu") for b in make_loader(ShardDataset(packed_many, **kw), num_workers=2)]
    config = DecodeOn(device="cpu", augment="batched")
    got = list(make_loader(ShardDataset(packed_many, decode_on=config, **kw), num_workers=2))
    assert len(got) == len(expected)
    for x, y in zip(got, expected, strict=True):
        assert torch.equal(x.labels, y.labels)
        # Back to uint8 levels: the normalization divides by 255 * std (std >= 0.224).
        diff = (x.images - y.images).abs() * 0.229 * 255
        assert diff.mean() < MEAN_TOLERANCE and diff.flatten().quantile(0.99) <= P99_TOLERANCE + 0.5
