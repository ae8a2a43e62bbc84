"""The presets' exact pixels for fixed seeds, on each path: full resolution, reduced, device (CPU).

Digests recorded from the code before the presets were defined once (issue 39): each path's output
for each preset is pinned bit for bit, so a change to how a preset is written that changes a pixel
fails here. The pixels depend on the torch, Pillow and libjpeg builds (their resize kernels, the
JPEG codec), so the digests are checked only on the versions they were recorded with.
"""

from __future__ import annotations

import hashlib
import io

import numpy as np
import PIL
import pytest
import torch
from PIL import Image

from imgshards.loader import PRESETS, preset
from imgshards.loader.device.augment import augment_batch
from imgshards.loader.image.decode import decode
from imgshards.loader.image.scaled import scaled_decoder

RECORDED_WITH = ("2.14.1+cu130", "13.0.0")  # torch, Pillow
SIZE = 32
SHAPES = [(300, 400), (500, 333), (64, 48), (1200, 1600)]
# Large enough for every preset's reduced decode (1/2 and 1/4): the scaled path's images.
JPEG_SHAPES = [(1200, 1600), (1600, 1100)]
SEEDS = range(4)

pytestmark = pytest.mark.skipif(
    (torch.__version__, PIL.__version__) != RECORDED_WITH,
    reason=f"digests recorded with torch, Pillow {RECORDED_WITH}",
)


def photo(height: int, width: int, seed: int = 0) -> torch.Tensor:
    """A smooth RGB image with noise and an edge, channels-last strides as decode() returns."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 200 / width, y * 200 / height, ((x // 7 + y // 5) % 2) * 120.0], axis=-1)
    img = (base + rng.integers(0, 60, base.shape)).clip(0, 255).astype(np.uint8)
    return torch.from_numpy(img).permute(2, 0, 1)


def jpeg(height: int, width: int, seed: int) -> bytes:
    out = io.BytesIO()
    Image.fromarray(photo(height, width, seed).permute(1, 2, 0).numpy()).save(out, "JPEG", quality=90)
    return out.getvalue()


def digest(tensors: list[torch.Tensor]) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(np.ascontiguousarray(t.numpy()).tobytes())
    return h.hexdigest()[:16]


def full_resolution(name: str) -> str:
    t = preset(name, size=SIZE)
    outs = []
    for seed in SEEDS:
        for k, shape in enumerate(SHAPES):
            img = photo(*shape, seed=k)
            torch.manual_seed(seed)
            outs.append(t(img))
            # The draw/apply split with a generator of its own, as the training process draws.
            outs.append(t.apply(img, t.draw(*shape, torch.Generator().manual_seed(seed))))
    return digest(outs)


def reduced(name: str) -> str:
    t = preset(name, size=SIZE)
    scaled = scaled_decoder(t)
    assert scaled is not None
    outs = []
    for k, shape in enumerate(JPEG_SHAPES):
        data = jpeg(*shape, seed=k)
        for seed in SEEDS:
            torch.manual_seed(seed)
            out = scaled(data, "jpg")
            assert out is not None  # every one of these views is decoded smaller
            outs.append(out)
    return digest(outs)


def device_cpu(name: str) -> str:
    t = preset(name, size=SIZE)
    images = [photo(*shape, seed=k) for k, shape in enumerate(SHAPES)]
    outs = []
    for seed in SEEDS:
        g = torch.Generator().manual_seed(seed)
        views = [t.draw(*shape, g) for shape in SHAPES]
        outs.append(augment_batch(images, views, t))
    return digest(outs)


def decoded_full(name: str) -> str:
    """A JPEG too small to be decoded smaller: decode, then the preset (the usual path)."""
    t = preset(name, size=SIZE)
    data = jpeg(300, 400, seed=7)
    outs = []
    for seed in SEEDS:
        torch.manual_seed(seed)
        outs.append(t(decode(data, "jpg")))
    return digest(outs)


PINNED = {
    "train": {
        "full": "55a16155ef928269",
        "reduced": "cb24ea83ed67f02a",
        "device": "8b585df2e2c47749",
        "decoded": "d734d029c0895323",
    },
    "resnet": {
        "full": "e717b5535068e2f2",
        "reduced": "14e6d494f5f42443",
        "device": "25f610226634d3bf",
        "decoded": "46cd53d1e014c7d1",
    },
    "eval": {
        "full": "3a69ebb795d7625a",
        "reduced": "f3a8273eb30095c4",
        "device": "513ec250f4fbf55e",
        "decoded": "55304d71c6acedef",
    },
}
PATHS = {"full": full_resolution, "reduced": reduced, "device": device_cpu, "decoded": decoded_full}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", PRESETS)
def test_a_presets_pixels_for_fixed_seeds_are_pinned(name, path):
    assert PATHS[path](name) == PINNED[name][path]


if __name__ == "__main__":
    print({name: {path: f(name) for path, f in PATHS.items()} for name in PRESETS})
