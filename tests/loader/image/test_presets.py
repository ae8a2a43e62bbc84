"""Augmentation presets: same results as the torchvision steps they stand for, uint8 out, seeded."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torchvision.transforms.v2 as v2
import torchvision.transforms.v2.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.functional import conv2d

from imgshards.loader import PRESETS, ConfigError, RandomResizedCropFlip, ScaleCropFlipColor, preset
from imgshards.loader.image.presets import _color_matrix, _resize_region


def photo(height: int, width: int, seed: int = 0) -> torch.Tensor:
    """A smooth RGB test image with channels-last strides, as decode() returns."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 200 / width, y * 200 / height, (x + y) * 100 / (width + height)], axis=-1)
    img = (base + rng.integers(0, 50, base.shape)).clip(0, 255).astype(np.uint8)
    return torch.from_numpy(img).permute(2, 0, 1)


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("shape", [(375, 500), (500, 333), (64, 48), (1, 1), (900, 40)])
def test_presets_give_uint8_squares_of_the_asked_size(name, shape):
    for size in (224, 32):
        out = preset(name, size=size)(photo(*shape))
        assert out.dtype == torch.uint8
        assert out.shape == (3, size, size)
        # Channels innermost, as decode() gives them: a batch row takes the image in one plain copy.
        assert (out.stride(0), out.stride(2)) == (1, 3)


def test_unknown_preset_names_the_choices():
    with pytest.raises(ConfigError, match=r"'trian'.*\['train', 'resnet', 'eval'\]"):
        preset("trian")


@pytest.mark.parametrize("size", [224, 32, 7])
def test_eval_is_torchvisions_resize_and_centre_crop_exactly(size):
    resize = round(size * 256 / 224)
    reference = v2.Compose([v2.Resize(resize, antialias=True), v2.CenterCrop(size)])
    # Down and up, either way longer, odd margins for the crop, already the resize's size (no resize).
    shapes = [(375, 500), (500, 333), (300, 300), (64, 48), (1, 1), (900, 40), (341, 256), (256, 341)]
    for shape in [*shapes, (resize, resize + 7)]:
        img = photo(*shape)
        for layout in (img, img.contiguous()):  # channels-last as decoded, and planar
            assert torch.equal(preset("eval", size=size)(layout), reference(layout)), (shape, layout.stride())


def test_train_crop_is_the_torchvision_resized_crop_of_its_box():
    t = RandomResizedCropFlip(224)
    img = photo(375, 500)
    for seed in range(10):
        torch.manual_seed(seed)
        draws = torch.rand(23).tolist()
        box = t.crop_box(375, 500, draws)
        torch.manual_seed(seed)
        ours = t(img)
        expected = F.resized_crop(img, *box, [224, 224], antialias=True)
        if draws[22] < 0.5:
            expected = F.horizontal_flip(expected)
        assert torch.equal(ours, expected)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 2000), st.integers(1, 2000), st.lists(st.floats(0, 0.999), min_size=23, max_size=23))
def test_train_crop_box_follows_random_resized_crop_rules(height, width, draws):
    top, left, h, w = RandomResizedCropFlip(224).crop_box(height, width, draws)
    assert 0 <= top <= height - h and 0 <= left <= width - w and h > 0 and w > 0
    # A box drawn by the rules, up to rounding each side to whole pixels (which matters on small images).
    area = height * width
    tried = (
        (w - 0.5) * (h - 0.5) <= area
        and (w + 0.5) * (h + 0.5) >= 0.08 * area
        and (w - 0.5) / (h + 0.5) <= 4 / 3
        and (w + 0.5) / max(h - 0.5, 1e-9) >= 3 / 4
    )
    fallback = (top, left) == ((height - h) // 2, (width - w) // 2)
    assert tried or fallback


def test_resnet_colour_matches_torchvisions_steps_where_nothing_clips():
    # Mid-range pixels and mild factors: no step clips, so one affine pass equals torchvision's three.
    t = ScaleCropFlipColor(224, jitter=0.2, lighting=0.0)
    img = photo(224, 224) // 4 + 90
    draws = [0.3, 0.8, 0.6, 0.9, 0.1, 0.5]  # brightness 0.92, contrast 1.12, saturation 1.04; order c, s, b
    ours = t._color(img, draws).int()
    x = F.adjust_contrast(img, 1.12)
    x = F.adjust_saturation(x, 1.04)
    x = F.adjust_brightness(x, 0.92)
    assert (ours - x.int()).abs().max() <= 2


def test_resnet_scale_range_shows_in_crop_sizes():
    # A 1000-pixel square: the source side of the crop is 224 * 1000 / S, S in [256, 480].
    t = ScaleCropFlipColor(224, jitter=0.0, lighting=0.0)
    img = photo(1000, 1000)
    sides = []
    for seed in range(200):
        torch.manual_seed(seed)
        target = 256 + int(torch.rand(10)[0].item() * 225)
        sides.append(round(1000 * 224 / target))
        torch.manual_seed(seed)
        assert t(img).shape == (3, 224, 224)
    assert min(sides) >= 466 and max(sides) <= 875
    assert min(sides) < 500 and max(sides) > 800


@pytest.mark.parametrize("name", PRESETS)
def test_randomness_comes_from_torchs_generator(name):
    t = preset(name, size=64)
    img = photo(300, 400)
    torch.manual_seed(5)
    a = t(img)
    torch.manual_seed(5)
    assert torch.equal(a, t(img))
    if name != "eval":
        outs = {t(img).numpy().tobytes() for _ in range(5)}
        assert len(outs) > 1


def _resnet_as_before(t: ScaleCropFlipColor, img: torch.Tensor) -> torch.Tensor:
    """The resnet preset's ``__call__`` as it was before the draw/apply split (and its draws)."""
    height, width = img.shape[-2:]
    draws = torch.rand(10).tolist()
    target = t.shorter[0] + int(draws[0] * (t.shorter[1] - t.shorter[0] + 1))
    side = min(max(round(min(height, width) * t.size / target), 1), height, width)
    top, left = int(draws[1] * (height - side + 1)), int(draws[2] * (width - side + 1))
    out = _resize_region(img, top, left, side, side, t.size)
    factors = [1 + t.jitter * (2 * d - 1) for d in draws[4:7]]
    order = sorted(range(3), key=lambda i: draws[7 + i])
    mean = out[:, ::2, ::2].float().mean(dim=(1, 2))
    lighting = torch.randn(3).numpy() * t.lighting
    weight, bias = _color_matrix(mean.numpy().astype(np.float64), factors, order, lighting)
    out = conv2d(out[None].float(), weight, bias).clamp_(0, 255).to(torch.uint8)[0]
    return out.flip(-1) if draws[3] < 0.5 else out


def test_the_workers_presets_are_unchanged_bit_for_bit_by_the_draw_apply_split():
    t = ScaleCropFlipColor(64)
    for seed, shape in enumerate([(300, 400), (64, 48), (500, 333)]):
        img = photo(*shape, seed=seed)
        torch.manual_seed(seed)
        expected = _resnet_as_before(t, img)
        torch.manual_seed(seed)
        assert torch.equal(t(img), expected)
        # The same draws from a generator of one's own, as the training process makes them.
        assert torch.equal(t.apply(img, t.draw(*shape, torch.Generator().manual_seed(seed))), expected)
