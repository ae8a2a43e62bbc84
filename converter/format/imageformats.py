"""The image formats imgshards reads and writes: one table, :data:`FORMATS`, for converter/ and loader/.

Each :class:`ImageFormat` says everything the code knows of a format: the name of its member in a
shard (``jpg``, ``png``...), the file name extensions that mean it (every spelling, lower case), how
its bytes are recognised (magic bytes: :meth:`ImageFormat.sniff`), Pillow's name for it, which CPU
decoder the loader gives it, whether the batched device decoder (nvjpeg) can, whether ``pack`` stores
it as it is or always converts it, whether it counts as lossless in :func:`~.formats.main_format`,
and whether timm's wds reader reads it. Every other module reads this table (the names it derives:
:data:`IMG_EXTENSIONS`, :data:`ALWAYS_CONVERTED`...), so adding a format is one entry here plus its
tests (docs/layout.md).

The table's order is torchvision's ``IMG_EXTENSIONS`` order, then the phone photo formats: the order
in which names are listed in messages, and the first image member a sample dict is searched for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "ALWAYS_CONVERTED",
    "AVIF",
    "BMP",
    "FORMATS",
    "HEIC",
    "IMAGE_EXTENSIONS",
    "IMG_EXTENSIONS",
    "JPEG",
    "PGM",
    "PHOTO_EXTENSIONS",
    "PNG",
    "PPM",
    "TIFF",
    "WEBP",
    "CpuDecoder",
    "ImageFormat",
    "format_named",
    "member_name",
    "sniff",
    "unbounded_format",
    "unsupported_format",
]

CpuDecoder = Literal["libjpeg", "pillow", "pillow-heif"]
"""How the loader decodes a format on the CPU: libjpeg-turbo's fast path (JPEG), Pillow, or Pillow
with the pillow-heif plugin (the ``heic`` extra; pack converts such images, so shards hold none)."""


@dataclass(frozen=True, kw_only=True)
class ImageFormat:
    """One image format: its names, its magic bytes, and who decodes and converts it.

    Attributes:
        name: The extension of its member in a shard (``"jpg"``), the name pack and the loader use.
        suffixes: The file name extensions that mean it, lower case with the dot (``".jpg", ".jpeg"``).
        pillow: Pillow's name for it (``Image.format``, ``save(format=...)``).
        magic: Whether a file's first bytes (at least 12, or all of a shorter file) are this format's.
        cpu: The loader's CPU decoder for it.
        device: The batched device decoder (nvjpeg, ``decode_on``) decodes it; the rest go to the CPU.
        kept: ``pack`` stores it as it is (under ``keep_formats``, or as the split's format); ``False``:
            always converted, since no common shard reader decodes it.
        lossless: Its files count for PNG when :func:`~.formats.main_format` picks a split's format.
        image_folder: torchvision's ``ImageFolder`` lists it (``IMG_EXTENSIONS``).
        timm: timm's wds reader reads it (``ReaderWds``'s ``input_key``); samples of the rest it drops.

    """

    name: str
    suffixes: tuple[str, ...]
    pillow: str
    magic: Callable[[bytes], bool]
    cpu: CpuDecoder = "pillow"
    device: bool = False
    kept: bool = True
    lossless: bool = False
    image_folder: bool = True
    timm: bool = False

    def sniff(self, data: bytes) -> bool:
        """Whether ``data`` (a file's bytes, or its first few hundred) holds this format."""
        return self.magic(data)


# ISO base media file brands (the ``ftyp`` box) of AVIF and of HEIC/HEIF stills.
_AVIF_BRANDS = frozenset({b"avif", b"avis"})
_HEIC_BRANDS = frozenset({b"heic", b"heix", b"hevc", b"hevx", b"heim", b"heis", b"mif1", b"msf1"})


def _brands(data: bytes) -> set[bytes]:
    """An ISO media file's major and compatible brands (empty for what is not one)."""
    if data[4:8] != b"ftyp":
        return set()
    size = int.from_bytes(data[:4], "big")
    return {data[at : at + 4] for at in range(8, min(size, len(data), 256) - 3, 4)} - {b"\0\0\0\0"}


def _is_avif(data: bytes) -> bool:
    return bool(_brands(data) & _AVIF_BRANDS)


def _is_heic(data: bytes) -> bool:
    # An AVIF lists mif1 too (a HEIF brand): AVIF's own brands decide first.
    brands = _brands(data)
    return not brands & _AVIF_BRANDS and bool(brands & _HEIC_BRANDS)


JPEG = ImageFormat(
    name="jpg",
    suffixes=(".jpg", ".jpeg"),
    pillow="JPEG",
    magic=lambda d: d.startswith(b"\xff\xd8\xff"),
    cpu="libjpeg",
    device=True,
    timm=True,
)
PNG = ImageFormat(
    name="png",
    suffixes=(".png",),
    pillow="PNG",
    magic=lambda d: d.startswith(b"\x89PNG\r\n\x1a\n"),
    lossless=True,
    timm=True,
)
PPM = ImageFormat(
    name="ppm", suffixes=(".ppm",), pillow="PPM", magic=lambda d: d[:2] in (b"P3", b"P6"), lossless=True
)
BMP = ImageFormat(
    name="bmp", suffixes=(".bmp",), pillow="BMP", magic=lambda d: d.startswith(b"BM"), lossless=True
)
PGM = ImageFormat(  # PBM too (P1, P4): Pillow reads both as its PPM format
    name="pgm",
    suffixes=(".pgm",),
    pillow="PPM",
    magic=lambda d: d[:2] in (b"P1", b"P2", b"P4", b"P5"),
    lossless=True,
)
TIFF = ImageFormat(
    name="tiff",
    suffixes=(".tif", ".tiff"),
    pillow="TIFF",
    magic=lambda d: d[:4] in (b"II*\x00", b"MM\x00*"),
    lossless=True,
)
WEBP = ImageFormat(
    name="webp",
    suffixes=(".webp",),
    pillow="WEBP",
    magic=lambda d: d.startswith(b"RIFF") and d[8:12] == b"WEBP",
    timm=True,
)
HEIC = ImageFormat(
    name="heic",
    suffixes=(".heic", ".heif"),
    pillow="HEIF",
    magic=_is_heic,
    cpu="pillow-heif",
    kept=False,
    image_folder=False,
)
AVIF = ImageFormat(
    name="avif", suffixes=(".avif",), pillow="AVIF", magic=_is_avif, kept=False, image_folder=False
)

FORMATS: tuple[ImageFormat, ...] = (JPEG, PNG, PPM, BMP, PGM, TIFF, WEBP, HEIC, AVIF)
"""Every image format pack takes in: the table."""

_BY_NAME = {f.name: f for f in FORMATS}
_BY_SUFFIX = {s: f for f in FORMATS for s in f.suffixes}

IMG_EXTENSIONS = tuple(s for f in FORMATS if f.image_folder for s in f.suffixes)
"""torchvision.datasets.folder.IMG_EXTENSIONS, from the table: the converter needs no torch."""
PHOTO_EXTENSIONS = tuple(s for f in FORMATS if not f.image_folder for s in f.suffixes)
"""Phone photos, packed converted (:data:`ALWAYS_CONVERTED`): ImageFolder does not list them."""
IMAGE_EXTENSIONS = tuple(f.name for f in FORMATS if f.kept)
"""Extensions of the image member in a sample, named by the format detected in the bytes: the names
webdataset's, timm's and DALI's readers look for."""
ALWAYS_CONVERTED = frozenset(f.name for f in FORMATS if not f.kept)
"""Formats stored converted whatever the split's format is: no common shard reader decodes them."""

# Formats recognised by their magic bytes only to say what they are: pack takes none of them.
_UNSUPPORTED_MAGIC = ((b"GIF8", "GIF"), (b"\x00\x00\x01\x00", "ICO"), (b"%PDF", "PDF"))


# Formats Pillow opens whose pixels it makes before their size is known to anyone: it decodes an ICO's
# largest icon while opening it, and loads an ICNS's embedded PNG or JPEG 2000 at the size that image
# declares, not at the one ``Image.open`` reports. No pixel bound can hold before their decode, so no
# read path opens them (issue 50; ``headers.oversized`` refuses them).
_UNBOUNDED_MAGIC = ((b"\x00\x00\x01\x00", "ICO"), (b"icns", "ICNS"))


def unbounded_format(data: bytes | bytearray | memoryview) -> str | None:
    """The format (ICO, ICNS) of ``data`` if Pillow learns its size only by decoding it; else ``None``."""
    head = bytes(data[:4])
    return next((name for magic, name in _UNBOUNDED_MAGIC if head == magic), None)


def format_named(name: str) -> ImageFormat | None:
    """The format whose shard member is named ``name`` (``"jpg"``, ``"png"``...); ``None`` for another."""
    return _BY_NAME.get(name)


def sniff(data: bytes) -> ImageFormat | None:
    """The format ``data``'s magic bytes say (its first 12 are enough but for HEIC/AVIF's brands)."""
    return next((f for f in FORMATS if f.magic(data)), None)


def member_name(suffix: str) -> str:
    """The shard member name of a file name extension (``".jpeg"`` or ``"jpeg"`` -> ``"jpg"``).

    An extension of no format in the table is returned as it is, without its dot.
    """
    dotted = suffix if suffix.startswith(".") else f".{suffix}"
    found = _BY_SUFFIX.get(dotted)
    return found.name if found is not None else suffix.lstrip(".")


def unsupported_format(data: bytes) -> str | None:
    """The format pack does not take (GIF, ICO, PDF) that ``data``'s magic bytes say; else ``None``."""
    return next((name for magic, name in _UNSUPPORTED_MAGIC if data.startswith(magic)), None)
