"""An image kept in its own format decodes as the converted one does (issue 37, points 9-11).

The same tree is packed three ways: ``keep_formats`` (every file's own bytes), the default for a
tree of mostly lossy names (one JPEG split: everything else converted by ``pack``) and the default
for a tree of lossless names (one PNG split). Each special image sits alone in its class, so a
batch of one says which it is; every way must give the converted JPEG's pixels (within JPEG's
error). On 1bc048c a kept 16-bit gray PNG came out 255 everywhere (``convert("RGB")`` clips I;16),
a kept PNG or WebP with EXIF orientation 6 came out sideways, a 32-bit integer TIFF was
rejected from a PNG split as "undecodable: cannot write mode I as PNG", and a kept RGBA, LA or
palette-with-tRNS image lost its transparency (what lay under it showed) where the JPEG split has it
composited onto white.
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

from imgshards.converter.format.formats import convert_image
from imgshards.converter.format.manifest import read_manifest
from imgshards.loader import ImageFolder, ShardDataset, make_loader
from imgshards.loader.image.decode import decode

IDENTITY = torch.nn.Identity()


def eight_bit(im: Image.Image) -> Image.Image:
    """:func:`imgshards.converter.format.formats.eight_bit`, imported late.

    This file also runs on older code.
    """
    from imgshards.converter.format import formats

    return formats.eight_bit(im)


def on_white(im: Image.Image) -> Image.Image:
    """:func:`imgshards.converter.format.formats.on_white`, imported late.

    This file also runs on older code.
    """
    from imgshards.converter.format import formats

    return formats.on_white(im)


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


# A transparent image, 32x24: its left half BLUE, opaque on top (rows :16) and half transparent
# (alpha 128) below; its right half fully transparent over GREEN, which shows where alpha is dropped.
BLUE, GREEN, HALF = (30, 120, 200), (10, 200, 10), 128


def alpha_of() -> np.ndarray:
    alpha = np.zeros((24, 32), dtype=np.uint8)
    alpha[:16, :16], alpha[16:, :16] = 255, HALF
    return alpha


def on_white_by_hand(color: tuple[int, ...], alpha: np.ndarray) -> np.ndarray:
    """``[3, H, W]``: ``color`` over white with ``alpha`` (0..255), the compositing formula itself."""
    a = alpha.astype(float)[None] / 255
    return np.array(color, dtype=float)[:, None, None] * a + 255 * (1 - a)


def rgba() -> Image.Image:
    pixels = np.zeros((24, 32, 4), dtype=np.uint8)
    pixels[:, :16, :3], pixels[:, 16:, :3] = BLUE, GREEN
    pixels[..., 3] = alpha_of()
    return Image.fromarray(pixels)


def la() -> Image.Image:
    """Gray with alpha: 60 on the left (alpha as :func:`alpha_of`), 0 under the transparent right."""
    gray = np.zeros((24, 32), dtype=np.uint8)
    gray[:, :16] = 60
    return Image.fromarray(np.stack([gray, alpha_of()], axis=-1), mode="LA")


def p_trns() -> Image.Image:
    """Palette with tRNS: index 1 BLUE opaque, 2 BLUE at alpha 128, 0 (GREEN) fully transparent."""
    index = np.zeros((24, 32), dtype=np.uint8)
    index[:16, :16], index[16:, :16] = 1, 2
    im = Image.fromarray(index, mode="P")
    im.putpalette([*GREEN, *BLUE, *BLUE])
    im.info["transparency"] = bytes([0, 255, HALF])
    return im


def expected_on_white(cls: str) -> np.ndarray:
    """What pack's JPEG conversion holds (before JPEG's error) for transparent class ``cls``."""
    gray = cls.startswith("la")
    color = (60, 60, 60) if gray else BLUE
    return on_white_by_hand(color, alpha_of())


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
    "rgba_png": ("e.png", lambda p: rgba().save(p, format="PNG")),
    "la_png": ("f.png", lambda p: la().save(p, format="PNG")),
    "p_trns_png": ("g.png", lambda p: p_trns().save(p, format="PNG", transparency=bytes([0, 255, HALF]))),
    "rgba_webp": ("h.webp", lambda p: rgba().save(p, format="WEBP", lossless=True)),
}
TRANSPARENT = ["rgba_png", "la_png", "p_trns_png", "rgba_webp"]


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
    tree = make_tree(tmp_path_factory.mktemp("kept") / "src", photos=5)  # 6 lossless names, 7 lossy
    lossless = tmp_path_factory.mktemp("lossless") / "src"
    shutil.copytree(tree, lossless, ignore=shutil.ignore_patterns("zz_photo", "*_webp"))
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
    assert read_manifest(roots["kept"]).split("train").samples == 13
    assert read_manifest(roots["jpeg"]).split("train").samples == 13
    assert read_manifest(roots["png"]).split("train").samples == 6  # the 32-bit TIFF is not rejected
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


@pytest.mark.parametrize(
    ("way", "cls"),
    [("kept", c) for c in TRANSPARENT] + [("png", c) for c in TRANSPARENT if c.endswith("_png")],
)
def test_a_transparent_kept_image_arrives_on_white_as_in_the_jpeg_split(three_ways, way, cls):
    _, roots = three_ways
    image = images(roots[way], transform=IDENTITY)[cls]
    assert image.shape == (3, 24, 32)
    # Stored losslessly: exactly the compositing onto white (was GREEN, or 0 for LA, on the right).
    assert torch.all(image[:, :, 16:] == 255), image[:, 0, 16:].unique()
    assert np.abs(image.numpy() - expected_on_white(cls)).max() <= 1
    converted = images(roots["jpeg"], transform=IDENTITY)[cls]
    assert (image - converted).abs().mean() < 1 and (image - converted).abs().max() <= 8  # JPEG's error


# Transparent images of every mode that carries it, as a file keeps it: alpha bands (TIFF holds LA
# and PA, which PNG does not) and tRNS entries of palette, gray and color PNGs.
def transparent_file(mode: str) -> tuple[bytes, str]:
    buf = io.BytesIO()
    if mode in ("RGBA", "LA"):
        (rgba() if mode == "RGBA" else la()).save(buf, format="TIFF")
        return buf.getvalue(), "tiff"
    if mode == "PA":
        index = np.asarray(p_trns())
        pa = Image.fromarray(np.stack([index, alpha_of()], axis=-1), mode="LA")  # PA's bytes, LA's name
        pa = Image.frombytes("PA", pa.size, pa.tobytes())
        pa.putpalette([*GREEN, *BLUE, *BLUE])
        pa.save(buf, format="TIFF")
        return buf.getvalue(), "tiff"
    if mode == "P":
        p_trns().save(buf, format="PNG", transparency=bytes([0, 255, HALF]))
    elif mode == "L":  # a gray color key: 0 is transparent
        Image.fromarray(np.asarray(la())[..., 0]).save(buf, format="PNG", transparency=0)
    else:  # RGB with a color key: GREEN is transparent
        Image.fromarray(np.asarray(rgba())[..., :3]).save(buf, format="PNG", transparency=GREEN)
    return buf.getvalue(), "png"


@pytest.mark.parametrize("mode", ["RGBA", "LA", "PA", "P", "L", "RGB"])
def test_every_transparent_mode_decodes_kept_as_pack_converts_it(mode):
    data, ext = transparent_file(mode)
    with Image.open(io.BytesIO(data)) as im:
        assert im.mode == mode
    kept = decode(data, ext).float()
    converted = decode(convert_image(data, ext, "jpg").data, "jpg").float()
    assert kept.shape == converted.shape == (3, 24, 32)
    assert torch.all(kept[:, :, 16:] == 255), mode  # the transparent half: white, not what lay under
    assert (kept - converted).abs().mean() < 1 and (kept - converted).abs().max() <= 8, mode


@pytest.mark.parametrize("mode", ["1", "L", "P", "RGB", "CMYK", "I;16"])
def test_an_opaque_image_is_not_touched_by_the_flattening(mode):
    """The common path pays one mode test: an image with no transparency comes back as it is."""
    im = quadrants().convert(mode) if mode != "I;16" else deep16()
    assert on_white(im) is im


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


@pytest.mark.parametrize("way", ["kept", "png", "jpeg"])
def test_the_map_style_image_folder_gives_the_pixels_a_pass_gives(three_ways, way):
    """ImageFolder's PIL images follow decode's rules: 16-bit scaled, upright, transparency on white."""
    _, roots = three_ways
    streamed = images(roots[way], transform=IDENTITY)
    folder = ImageFolder(roots[way])
    seen = set()
    for i in range(len(folder)):
        image, label = folder[i]
        name = folder.classes[label]
        if name in streamed:
            got = torch.from_numpy(np.asarray(image)).permute(2, 0, 1).float()
            assert torch.equal(got, streamed[name]), name
            seen.add(name)
    assert seen == set(streamed)
