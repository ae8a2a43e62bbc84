"""Trees that mix image formats, as real photo folders do, cut from the shared tiny tree's real JPEGs."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

# (class index, file, format, mode): what `mixed_tree` replaces some of tiny_tree's JPEGs with.
MIXED = [
    (0, "a.png", "PNG", "RGB"),
    (0, "b.png", "PNG", "RGBA"),  # left half transparent
    (1, "c.webp", "WEBP", "RGB"),
    (1, "d.bmp", "BMP", "RGB"),
    (2, "e.tiff", "TIFF", "RGB"),
    (2, "f.png", "PNG", "P"),
    (3, "g.bmp", "BMP", "L"),
]


def encode(im: Image.Image, fmt: str) -> bytes:
    buf = io.BytesIO()
    im.save(buf, format=fmt, **({"lossless": True} if fmt == "WEBP" else {}))
    return buf.getvalue()


def as_mode(im: Image.Image, mode: str) -> Image.Image:
    if mode == "RGBA":
        rgba = im.convert("RGBA")
        alpha = np.full((im.height, im.width), 255, dtype=np.uint8)
        alpha[:, : im.width // 2] = 0
        rgba.putalpha(Image.fromarray(alpha))
        return rgba
    if mode == "P":
        return im.convert("P", palette=Image.Palette.ADAPTIVE, colors=64)
    return im.convert(mode)


@pytest.fixture(scope="session")
def mixed_tree(tmp_path_factory, tiny_tree) -> Path:
    """tiny_tree (4 classes x 10 JPEGs) with 7 of its JPEGs replaced by PNG, WebP, BMP and TIFF files.

    One PNG is RGBA (its left half transparent), one a palette image, one BMP grayscale. Do not
    modify it.
    """
    root = tmp_path_factory.mktemp("mixed") / "src"
    shutil.copytree(tiny_tree, root)
    classes = sorted(p for p in root.iterdir())
    for cls, name, fmt, mode in MIXED:
        victim = sorted(classes[cls].glob("*.JPEG"))[0]
        with Image.open(victim) as im:
            data = encode(as_mode(im.convert("RGB"), mode), fmt)
        victim.unlink()
        (classes[cls] / name).write_bytes(data)
    return root


@pytest.fixture(scope="session")
def mixed_packed(mixed_tree, packed_factory) -> Path:
    """``mixed_tree`` packed with the defaults (one format: JPEG) and a held-out val split."""
    return packed_factory(mixed_tree, shard_size=30_000, val_fraction=0.2)
