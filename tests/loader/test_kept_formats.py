"""An image kept in its own format decodes as the converted one does (issue 37, points 9-11).

The same tree is packed three ways: ``keep_formats`` (every file's own bytes), the default for a
tree of mostly lossy names (one JPEG split: everything else converted by ``pack``) and the default
for a tree of lossless names (one PNG split). Each special image sits alone in its class, so a
batch of one says which it is; every way must give the converted JPEG's pixels (within JPEG's
error). On 1bc048c a kept 16-bit gray PNG came out 255 everywhere (``convert("RGB")`` clips I;16),
a kept PNG or WebP with EXIF orientation 6 came out sideways, and a 32-bit integer TIFF was
rejected from a PNG split as "undecodable: cannot write mode I as PNG".
"""

from __future__ import annotations

import io
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

from imgshards.converter.formats import convert_image
from imgshards.converter.manifest import read_manifest
from imgshards.loader import ShardDataset, make_loader
from imgshards.loader.image.decode import decode

IDENTITY = torch.nn.Identity()


def eight_bit(im: Image.Image) -> Image.Image:
    """:func:`imgshards.converter.formats.eight_bit`, imported late: this file also runs on older code."""
    from imgshards.converter import formats

    return formats.eight_bit(im)


ROTATED = 6  # EXIF orientation: the stored image is shown turned 90 degrees clockwise


def deep16() -> Image.Image:
    """16-bit gray, 32x24: 0x80C0 on the left half, 0x40FF on the right (128 and 64 in 8 bits)."""
    pixels = np.full((24, 32), 0x80C0, dtype=np.uint16)
    pixels[:, 16:] = 0x40FF
    return Image.fromarray(pixels)


def int32() -> Image.Image:
    """32-bit integer gray, 24x16: 100000 (past 16 bits), 40000 and 1000, in three 8-pixel columns."""
    pixels = np.zeros((16, 24), dtype=np.int32)
    pixels[:, :8], pixels[:, 8:16], pixels[:, 16:] = 100_000, 40_000, 1_000
    return Image.fromarray(pixels)


def quadrants() -> Image.Image:
    """RGB 48x32, its top-left quadrant red, the rest blue: which way it arrives shows."""
    pixels = np.zeros((32, 48, 3), dtype=np.uint8)
    pixels[..., 2] = 200
    pixels[:16, :24] = (220, 20, 20)
    return Image.fromarray(pixels)


def rotated() -> Image.Exif:
    exif = Image.Exif()
    exif[0x0112] = ROTATED
    return exif


# class folder -> (file name, how it is saved). One image a class: a label names the image.
SPECIAL = {
    "deep16_png": ("a.png", lambda p: deep16().save(p, format="PNG")),
    "int32_tiff": ("b.tiff", lambda p: int32().save(p, format="TIFF")),
    "rot_png": ("c.png", lambda p: quadrants().save(p, format="PNG", exif=rotated())),
    "rot_webp": ("d.webp", lambda p: quadrants().save(p, format="WEBP", lossless=True, exif=rotated())),
}


def make_tree(root: Path, *, photos: int) -> Path:
    for cls, (name, save) in SPECIAL.items():
        (root / cls).mkdir(parents=True)
        save(root / cls / name)
    if photos:
        (root / "zz_photo").mkdir()
        for i in range(photos):
            quadrants().save(root / "zz_photo" / f"p{i}.jpg", quality=90)
    return root


@pytest.fixture(scope="module")
def three_ways(tmp_path_factory, packed_factory):
    """The tree packed with keep_formats, as a JPEG split, and (its lossless files only) as a PNG split."""
    tree = make_tree(tmp_path_factory.mktemp("kept") / "src", photos=3)  # 3 lossless names, 4 lossy
    lossless = tmp_path_factory.mktemp("lossless") / "src"
    shutil.copytree(tree, lossless, ignore=shutil.ignore_patterns("zz_photo", "rot_webp"))
    roots = {
        "kept": packed_factory(tree, keep_formats=True, shard_size=100_000),
        "jpeg": packed_factory(tree, shard_size=100_000),
        "png": packed_factory(lossless, shard_size=100_000),
    }
    return tree, roots


def images(root, **kw) -> dict[str, torch.Tensor]:
    """Each special class's image, as a pass of batches of one gives it."""
    ds = ShardDataset(root, batch_size=1, mode="eval", **kw)
    out = {}
    for batch in make_loader(ds, num_workers=0):
        name = ds.classes[int(batch.labels[0])]
        if name in SPECIAL:
            out[name] = batch.images[0].float()
    return out


def stored_exts(root) -> set[str]:
    exts = set()
    for shard in read_manifest(root).split("train").shards:
        with tarfile.open(root / shard.name) as tar:
            exts |= {m.name.split(".", 1)[1] for m in tar if not m.name.endswith((".cls", ".json"))}
    return exts


def test_the_three_packs_store_what_they_say(three_ways):
    _, roots = three_ways
    assert read_manifest(roots["kept"]).split("train").samples == 7
    assert read_manifest(roots["jpeg"]).split("train").samples == 7
    assert read_manifest(roots["png"]).split("train").samples == 3  # the 32-bit TIFF is not rejected
    assert stored_exts(roots["kept"]) == {"png", "tiff", "webp", "jpg"}
    assert stored_exts(roots["jpeg"]) == {"jpg"}
    assert stored_exts(roots["png"]) == {"png"}


@pytest.mark.parametrize("way", ["kept", "png"])
def test_a_16_bit_gray_png_is_scaled_as_the_jpeg_split_scales_it(three_ways, way):
    _, roots = three_ways
    image = images(roots[way], transform=IDENTITY)["deep16_png"]
    assert image.shape == (3, 24, 32)
    assert torch.all(image[:, :, :16] == 128) and torch.all(image[:, :, 16:] == 64)  # was 255 everywhere
    converted = images(roots["jpeg"], transform=IDENTITY)["deep16_png"]
    assert (image - converted).abs().max() <= 1


@pytest.mark.parametrize("way", ["kept", "png"])
def test_a_32_bit_integer_tiff_is_scaled_as_the_jpeg_split_scales_it(three_ways, way):
    tree, roots = three_ways
    image = images(roots[way], transform=IDENTITY)["int32_tiff"]
    # Read as 16-bit (100000 clipped to 65535), top 8 bits kept: 255, 156, 3.
    assert image[0, 0, :].tolist() == [255.0] * 8 + [156.0] * 8 + [3.0] * 8
    with Image.open(tree / "int32_tiff" / "b.tiff") as im:
        assert np.array_equal(np.asarray(eight_bit(im)), image[0].numpy())
    converted = images(roots["jpeg"], transform=IDENTITY)["int32_tiff"]
    assert (image - converted).abs().max() <= 1


@pytest.mark.parametrize(("way", "cls"), [("kept", "rot_png"), ("kept", "rot_webp"), ("png", "rot_png")])
def test_exif_orientation_is_applied_to_a_kept_png_or_webp(three_ways, way, cls):
    tree, roots = three_ways
    image = images(roots[way], transform=IDENTITY)[cls]
    name = SPECIAL[cls][0]
    with Image.open(tree / cls / name) as im:
        upright = torch.from_numpy(np.array(ImageOps.exif_transpose(im).convert("RGB"))).permute(2, 0, 1)
    assert image.shape == upright.shape == (3, 48, 32)  # stored 48 wide, 32 high: shown 32 wide
    assert torch.equal(image, upright.float())  # lossless: exactly Pillow's own exif_transpose
    converted = images(roots["jpeg"], transform=IDENTITY)[cls]
    assert converted.shape == image.shape and (image - converted).abs().mean() < 2


def test_the_device_path_decodes_kept_images_as_the_workers_do(three_ways):
    """``decode_on="cpu"`` decodes a batch's non-JPEG images with the workers' decoder: same pixels."""
    _, roots = three_ways
    kw = {"transform": "eval", "image_size": 16}
    on_device = images(roots["kept"], decode_on="cpu", **kw)
    converted = images(roots["jpeg"], decode_on="cpu", **kw)
    assert set(on_device) == set(SPECIAL)
    for cls in SPECIAL:
        assert on_device[cls].shape == converted[cls].shape == (3, 16, 16), cls
        assert (on_device[cls] - converted[cls]).abs().mean() < 0.05, cls  # normalized: 0.05 ~ 3 levels


# Every mode Pillow writes to a TIFF (as it opens again): the 8-bit image the loader decodes from the
# kept file is the one it decodes from pack's JPEG of it (alpha aside: the JPEG composites it on white).
TIFF_MODES = ["1", "L", "P", "RGB", "CMYK", "YCbCr", "LAB", "I", "I;16", "I;16B", "F"]


@pytest.mark.parametrize("mode", TIFF_MODES)
def test_every_tiff_mode_decodes_kept_as_pack_converts_it(mode):
    rgb = Image.fromarray(np.random.default_rng(1).integers(0, 256, (16, 24, 3), dtype=np.uint8))
    gray = np.asarray(rgb.convert("L"))
    if mode == "I;16B":
        im = Image.frombytes("I;16B", rgb.size, (gray.astype(">u2") * 257).tobytes())
    elif mode == "I":
        im = Image.fromarray(gray.astype(np.int32) * 300)  # up to 76500: past 16 bits
    else:
        im = rgb.convert(mode)
    buf = io.BytesIO()
    im.save(buf, format="TIFF")
    kept = decode(buf.getvalue(), "tiff").float()
    converted = decode(convert_image(buf.getvalue(), "tiff", "jpg").data, "jpg").float()
    assert kept.shape == converted.shape == (3, 16, 24)
    assert (kept - converted).abs().mean() < 4, mode
