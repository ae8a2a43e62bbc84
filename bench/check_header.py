"""`--check header` per image against PIL's header parse (`Image.open`), on ~100 KB real JPEGs.

    python bench/check_header.py [--images 200] [--photos ../shared/photos]

Each variant runs over the same in-memory JPEGs, best of 5 passes. Also shows the end-marker search
as it was before (a forward `find` through the image data), and checks that a truncated copy of
each image is still caught.
"""

from __future__ import annotations

import argparse
import io
import re
import time
from pathlib import Path

from PIL import Image

from imgshards.converter import Check
from imgshards.converter.scan import check as check_module
from imgshards.converter.scan.check import inspect_image

PHOTOS = Path(__file__).resolve().parents[2] / "shared" / "photos"


def jpegs(photos: Path, count: int, target: int = 100_000) -> list[bytes]:
    sources = sorted(photos.glob("*.jpg"))
    out: list[bytes] = []
    while len(out) < count:
        with Image.open(sources[len(out) % len(sources)]) as im:
            rgb = im.convert("RGB")
        k = len(out) // len(sources)
        box = (k * 7 % 50, k * 11 % 50, rgb.width - k * 13 % 50, rgb.height - k * 5 % 50)
        side = 1100
        crop = rgb.crop(box)
        crop.thumbnail((side, side))
        for quality in (90, 80, 70, 60, 50):
            buf = io.BytesIO()
            crop.save(buf, format="JPEG", quality=quality)
            if buf.tell() <= target * 1.3:
                break
        out.append(buf.getvalue())
    return out


def per_image_us(fn, images: list[bytes]) -> float:
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for data in images:
            fn(data)
        best = min(best, time.perf_counter() - start)
    return best / len(images) * 1e6


def pil_open(data: bytes) -> None:
    with Image.open(io.BytesIO(data)) as im:
        im.size  # noqa: B018  (the header parse, no decode)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=200)
    p.add_argument("--photos", type=Path, default=PHOTOS)
    a = p.parse_args()
    images = jpegs(a.photos, a.images)
    mean_kb = sum(map(len, images)) / len(images) / 1e3
    old = _old_jpeg_header()
    rows = {
        "imgshards --check header (rfind)": lambda d: inspect_image(d, ".jpg", Check.HEADER),
        "same walk, forward find (before)": old,
        "PIL Image.open (header parse)": pil_open,
    }
    print(f"{len(images)} JPEGs from {a.photos}, mean {mean_kb:.0f} kB; best of 5 passes")
    times = {name: per_image_us(fn, images) for name, fn in rows.items()}
    for name, us in times.items():
        print(f"  {name:<36} {us:8.2f} us/image")
    pil = times["PIL Image.open (header parse)"]
    ratio = times["imgshards --check header (rfind)"] / pil
    print(f"  header / PIL open                    {ratio:.2f}x  (target <= 1x)")
    print(f"  before / PIL open                    {times['same walk, forward find (before)'] / pil:.2f}x")
    caught = sum(inspect_image(d[: len(d) // 2], ".jpg", Check.HEADER).reason is not None for d in images)
    print(f"  truncated halves caught: {caught} of {len(images)}")


def _old_jpeg_header():
    """check._jpeg_header with its end-marker search as it was before (a forward find)."""
    import inspect

    source = inspect.getsource(check_module._jpeg_header)
    source, n = re.subn(r"data\.rfind\(", "data.find(", source)
    assert n == 1, "check._jpeg_header changed: update this benchmark"
    namespace = dict(vars(check_module))
    exec(source, namespace)
    return namespace["_jpeg_header"]


if __name__ == "__main__":
    main()
