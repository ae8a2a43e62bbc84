"""Small synthetic ImageFolder trees, for the demo, the notebooks and tests that need no photos.

Each class is a shape drawn over a random gradient, so a grid of samples shows which class is which.
The same arguments give the same tree, byte for byte, on the same Pillow build.
"""

from __future__ import annotations

import io
import random
from pathlib import Path

from PIL import Image, ImageDraw

from .format.imageformats import JPEG, PNG

__all__ = ["BAD_FILES", "make_synthetic_tree"]

_SHAPES = ("circle", "square", "triangle", "cross", "ring", "stripes", "diamond", "dots")

# What `bad=True` adds, and the reason `pack` gives for each (see converter.scan.reasons.Reason).
BAD_FILES = {
    "circle/notes.txt": "unsupported_extension",
    "square/empty.jpg": "empty",
    "triangle/not-an-image.jpg": "not_image",
    "cross/truncated.jpg": "truncated",
}


def _draw(rng: random.Random, shape: str, size: tuple[int, int]) -> Image.Image:
    w, h = size
    c0 = tuple(rng.randrange(256) for _ in range(3))
    c1 = tuple(rng.randrange(256) for _ in range(3))
    # A vertical gradient between two random colours: cheap, and not flat.
    gradient = Image.linear_gradient("L").resize((w, h))
    im = Image.composite(Image.new("RGB", size, c1), Image.new("RGB", size, c0), gradient)
    d = ImageDraw.Draw(im)
    fg = tuple(255 - v for v in c0)
    s = min(w, h) * rng.uniform(0.3, 0.45)
    cx, cy = w / 2 + rng.uniform(-0.1, 0.1) * w, h / 2 + rng.uniform(-0.1, 0.1) * h
    box = (cx - s, cy - s, cx + s, cy + s)
    if shape == "circle":
        d.ellipse(box, fill=fg)
    elif shape == "square":
        d.rectangle(box, fill=fg)
    elif shape == "triangle":
        d.polygon([(cx, cy - s), (cx - s, cy + s), (cx + s, cy + s)], fill=fg)
    elif shape == "cross":
        d.rectangle((cx - s, cy - s / 4, cx + s, cy + s / 4), fill=fg)
        d.rectangle((cx - s / 4, cy - s, cx + s / 4, cy + s), fill=fg)
    elif shape == "ring":
        d.ellipse(box, outline=fg, width=max(2, int(s / 4)))
    elif shape == "stripes":
        for x in range(0, w, max(4, w // 8)):
            d.rectangle((x, 0, x + max(2, w // 16), h), fill=fg)
    elif shape == "diamond":
        d.polygon([(cx, cy - s), (cx + s, cy), (cx, cy + s), (cx - s, cy)], fill=fg)
    else:
        for _ in range(12):
            dx, dy = rng.uniform(0, w), rng.uniform(0, h)
            d.ellipse((dx - s / 6, dy - s / 6, dx + s / 6, dy + s / 6), fill=fg)
    return im


def make_synthetic_tree(
    root: str | Path,
    *,
    classes: int = 4,
    per_class: int = 25,
    size: tuple[int, int] = (160, 120),
    seed: int = 0,
    bad: bool = False,
) -> Path:
    """Write an ImageFolder tree ``root/<shape>/<shape>_<i>.jpg`` and return ``root``.

    Args:
        root: Directory to create (parents too); existing files with the same names are replaced.
        classes: Number of classes, at most 8 (one per shape).
        per_class: Images per class. Every fifth image is a PNG, to exercise both decoders.
        size: Width and height of the images; odd images are transposed (portrait).
        seed: Seed of everything drawn.
        bad: Also write one file of each kind in :data:`BAD_FILES`, which ``pack`` must reject.

    """
    if not 1 <= classes <= len(_SHAPES):
        raise ValueError(f"classes must be between 1 and {len(_SHAPES)}, got {classes}")
    root = Path(root)
    for shape in _SHAPES[:classes]:
        rng = random.Random(f"{seed}/{shape}")
        folder = root / shape
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            im = _draw(rng, shape, size if i % 2 == 0 else (size[1], size[0]))
            fmt = PNG if i % 5 == 4 else JPEG
            buf = io.BytesIO()
            im.save(buf, format=fmt.pillow, quality=90)
            (folder / f"{shape}_{i:04d}.{fmt.name}").write_bytes(buf.getvalue())
    if bad:
        _write_bad_files(root, seed)
    return root


def _write_bad_files(root: Path, seed: int) -> None:
    good = io.BytesIO()
    _draw(random.Random(seed), "circle", (64, 48)).save(good, format=JPEG.pillow, quality=90)
    content = {
        "unsupported_extension": b"not a picture, and not named like one\n",
        "empty": b"",
        "not_image": b"<html>a web page saved with an image's name</html>\n",
        "truncated": good.getvalue()[: len(good.getvalue()) // 2],
    }
    for rel, reason in BAD_FILES.items():
        path = root / rel
        if path.parent.is_dir():
            path.write_bytes(content[reason])
