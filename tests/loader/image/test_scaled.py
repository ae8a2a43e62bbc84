"""Large JPEGs decoded at the scale a preset's view needs: the same views, the same images within
PSNR 30 dB of the full decode, the same draws; everything else the usual way (loader/image/scaled.py)."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from imgshards.loader import ShardDataset
from imgshards.loader.image.decode import decode
from imgshards.loader.image.presets import preset, reduction
from imgshards.loader.image.scaled import HALF_FROM_PIXELS, scaled_decoder

# Small presets keep the images small: eval at 56 resizes to 64, so it decodes at 1/2 from a
# shorter side of 128, at 1/4 from 256, at 1/8 from 512.
SIZE = 56


def photo(width: int, height: int, seed: int = 0) -> Image.Image:
    """A photo-like RGB image: a coarse random grid of colours upscaled, plus a little grain."""
    rng = np.random.default_rng(seed)
    grid = Image.fromarray(rng.integers(0, 256, (12, 16, 3), dtype=np.uint8))
    smooth = np.asarray(grid.resize((width, height), Image.Resampling.BICUBIC), dtype=np.int16)
    return Image.fromarray((smooth + rng.integers(-6, 7, smooth.shape)).clip(0, 255).astype(np.uint8))


def jpeg(image: Image.Image, *, orientation: int = 1, progressive: bool = False) -> bytes:
    exif = Image.Exif()
    if orientation != 1:
        exif[0x0112] = orientation
    buf = io.BytesIO()
    image.save(buf, "JPEG", quality=90, exif=exif, progressive=progressive)
    return buf.getvalue()


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = ((a.float() - b.float()) ** 2).mean().item()
    return float("inf") if mse == 0 else 10 * np.log10(255**2 / mse)


def both_ways(name: str, data: bytes, seed: int = 0) -> tuple[torch.Tensor | None, torch.Tensor, bool]:
    """The scaled path's image (``None``: it declined), the usual path's, and whether the generator
    is left as the loader's usual path leaves it: as the usual path's draws do, or untouched when
    declined (the usual path then draws)."""
    transform = preset(name, size=SIZE)
    torch.manual_seed(seed)
    untouched = torch.rand(4)
    torch.manual_seed(seed)
    scaled = scaled_decoder(transform, half_from=0)(data, "jpg")  # small images halved too, to test it
    after_scaled = torch.rand(4)
    torch.manual_seed(seed)
    usual = transform(decode(data, "jpg"))
    after_usual = torch.rand(4)
    return scaled, usual, torch.equal(after_scaled, untouched if scaled is None else after_usual)


@pytest.mark.parametrize(
    ("shorter", "scale"), [(127, 1), (128, 2), (129, 2), (255, 2), (256, 4), (257, 4), (511, 4), (512, 8)]
)
def test_eval_decodes_at_the_largest_scale_its_view_allows(shorter, scale):
    transform = preset("eval", size=SIZE)
    for width, height in [(shorter + 37, shorter), (shorter, shorter + 37)]:
        assert reduction(transform.draw(height, width), SIZE) == scale
        scaled, usual, same_draws = both_ways("eval", jpeg(photo(width, height)))
        assert same_draws
        if scale == 1:
            assert scaled is None  # the usual path, untouched
            continue
        assert scaled is not None and scaled.shape == usual.shape == (3, SIZE, SIZE)
        assert psnr(scaled, usual) >= 30


@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize(("width", "height"), [(517, 263), (263, 517), (301, 203)])
def test_exif_rotated_odd_sizes_come_out_as_the_full_decode_does(orientation, width, height):
    data = jpeg(photo(width, height, seed=orientation), orientation=orientation)
    for name in ("eval", "train"):
        scaled, usual, same_draws = both_ways(name, data, seed=orientation)
        assert same_draws
        if scaled is not None:
            assert psnr(scaled, usual) >= 30, (name, orientation)


@pytest.mark.parametrize("name", ["train", "resnet"])
def test_random_crops_match_with_the_draws_fixed(name):
    data = jpeg(photo(1203, 901, seed=3))
    reduced = 0
    for seed in range(24):
        scaled, usual, same_draws = both_ways(name, data, seed)
        assert same_draws
        if scaled is not None:
            reduced += 1
            assert scaled.shape == usual.shape and psnr(scaled, usual) >= 30, seed
    assert reduced >= 12  # most of these views need at most half the resolution


@pytest.mark.parametrize("mode", ["L", "RGB"])
@pytest.mark.parametrize("progressive", [False, True])
def test_grayscale_and_progressive_jpegs(mode, progressive):
    data = jpeg(photo(700, 530, seed=5).convert(mode), progressive=progressive)
    for name in ("eval", "train", "resnet"):
        scaled, usual, same_draws = both_ways(name, data, seed=1)
        assert same_draws and scaled is not None
        assert psnr(scaled, usual) >= 30


def test_cmyk_takes_the_usual_path():
    data = jpeg(photo(700, 530).convert("CMYK"))
    for name in ("eval", "train"):
        scaled, _, same_draws = both_ways(name, data)
        assert scaled is None and same_draws


def test_images_too_small_to_reduce_take_the_usual_path():
    data = jpeg(photo(2 * SIZE - 1, 900))  # a shorter side below train's reducible_from: never reduced
    scaled, _, same_draws = both_ways("train", data)
    assert scaled is None and same_draws
    assert scaled_decoder(preset("train", size=SIZE))(jpeg(photo(900, 700)), "png") is None  # not a .jpg
    assert scaled_decoder(lambda image: image) is None  # a transform of the user's: never


def test_a_half_scale_decode_only_where_it_pays():
    """Under HALF_FROM_PIXELS a view that allows 1/2 takes the usual path (slower reduced: measured)."""
    transform = preset("train")  # reducible from a shorter side of 448
    small, large = jpeg(photo(683, 512)), jpeg(photo(1400, 1050))  # 0.35 and 1.47 MP
    assert 683 * 512 < HALF_FROM_PIXELS <= 1400 * 1050
    for data, height, width, halved in [(small, 512, 683, False), (large, 1050, 1400, True)]:
        reduced = 0
        for seed in range(40):
            torch.manual_seed(seed)
            scale = reduction(transform.draw(height, width), 224)
            torch.manual_seed(seed)
            out = scaled_decoder(transform)(data, "jpg")
            assert (out is not None) == (scale >= (2 if halved else 4)), (seed, scale)
            reduced += out is not None
        assert reduced >= 1 if halved else reduced == 0


def test_a_truncated_large_jpeg_draws_nothing():
    data = jpeg(photo(900, 700))[:20_000]  # the header whole, the scan cut: Pillow's decode fails
    torch.manual_seed(0)
    untouched = torch.rand(4)
    torch.manual_seed(0)
    assert scaled_decoder(preset("train", size=SIZE))(data, "jpg") is None
    assert torch.equal(torch.rand(4), untouched)  # the usual path draws as it always did


class Unscaled:
    """A preset behind a callable of the user's: the loader decodes at full size for it."""

    def __init__(self, name: str) -> None:
        self.transform = preset(name, size=SIZE)

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        return self.transform(image)


@pytest.fixture(scope="module")
def large_packed(tmp_path_factory, packed_factory):
    root = tmp_path_factory.mktemp("large") / "src"
    for cls in range(2):
        (root / f"c{cls}").mkdir(parents=True)
        for i in range(6):
            size = (640 + 16 * i, 480 - 8 * i) if i % 2 else (480 - 8 * i, 640 + 16 * i)
            (root / f"c{cls}" / f"{i}.jpg").write_bytes(jpeg(photo(*size, seed=10 * cls + i)))
    return packed_factory(root, shard_size=1_000_000)


@pytest.mark.parametrize("name", ["train", "eval"])
def test_loader_batches_match_the_full_decode(large_packed, name):
    def batches(transform):
        return list(ShardDataset(large_packed, batch_size=4, mode=name, transform=transform, seed=7))

    fast, full = batches(preset(name, size=SIZE)), batches(Unscaled(name))
    assert [b.labels.tolist() for b in fast] == [b.labels.tolist() for b in full]
    assert sum(len(b.labels) for b in fast) == 12
    for a, b in zip(fast, full, strict=True):
        for image_a, image_b in zip(a.images, b.images, strict=True):
            assert psnr(image_a, image_b) >= 30
