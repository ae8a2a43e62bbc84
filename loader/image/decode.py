"""Decode image bytes into an RGB ``uint8`` tensor ``[3, H, W]``: one function, :func:`decode`.

JPEG, nearly all of an ImageNet-like dataset, goes through libjpeg-turbo straight into a tensor
(grayscale and CMYK come out RGB): ``torchcodec.decoders.decode_jpeg``, the supported decoder
(torchvision 0.29 deprecates its own image decoders in its favour and warns on every call). Where
torchcodec is not installed, torchvision's ``decode_jpeg`` serves while torchvision still has it
(its deprecation warning silenced: one per image would bury the user's own); without either, Pillow
decodes JPEG too. A decoder that is installed but does not load here (a torchcodec built for another
torch: ``OSError: Could not load this library``) is passed over the same way, with one warning
naming it and the fix, so the loader imports and decodes on a broken install. Other formats go
through Pillow, converted to RGB (palette, alpha, grayscale, CMYK) as ``pack`` would have converted
them: upright (their EXIF orientation applied, as libjpeg-turbo
applies a JPEG's), transparency composited onto white
(:func:`~imgshards.converter.format.formats.on_white`) and gray of more than 8 bits scaled to 8
(:func:`~imgshards.converter.format.formats.eight_bit`), so an image kept in its own format
(``pack --keep-formats``, or a PNG split) arrives as the converted one would.
The JPEG decoders return channels-last strides (``[3, H, W]`` over ``H x W x 3`` memory): the tensor
resizes of the presets read that layout fastest, so it is kept, not copied to planar.

A large JPEG can also be decoded smaller (:func:`open_jpeg`): libjpeg-turbo's DCT scaling, through
Pillow's ``draft``, decodes it at 1/2, 1/4 or 1/8 of its size, skipping most of the inverse DCT and
all of the colour conversion and upsampling of the pixels it leaves out. :mod:`.scaled` uses it when
a preset's view of the image needs no more.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NamedTuple

import numpy as np
import torch
from PIL import Image

# EXIF orientation, flattening on white and the scaling of deep gray, as pack's conversion applies them
from imgshards.converter.format.errors import shown
from imgshards.converter.format.formats import eight_bit, on_white, orientation, upright
from imgshards.converter.format.headers import (
    JpegHeader,
    jpeg_header,
    oversized,
    pixel_excess,
    too_many_scans,
)  # one JPEG header walker, the converter's
from imgshards.converter.format.imageformats import FORMATS, JPEG

from ..errors import CorruptImageError

__all__ = [
    "JPEG_DECODER",
    "JpegHeader",
    "OpenJpeg",
    "Reduced",
    "decode",
    "jpeg_header",
    "open_jpeg",
    "pil_image",
]

# The formats (shard member names) that take libjpeg-turbo's path when this install has it; the rest
# go through Pillow. Read from the format table, as the device decoder's are (device/backends.py).
_LIBJPEG_FORMATS = frozenset(f.name for f in FORMATS if f.cpu == "libjpeg")

# Exceptions Pillow and the JPEG decoders raise for bytes that are not a readable image.
_DECODE_ERRORS = (OSError, ValueError, SyntaxError, RuntimeError, Image.DecompressionBombError)


JpegDecode = Callable[[bytes | bytearray | memoryview], torch.Tensor]
"""One JPEG's bytes to an RGB ``uint8 [3, H, W]`` tensor; raises ``RuntimeError`` or ``ValueError``."""

# What a decoder raises when it is installed but does not load here: a native library built for
# another torch (torch.ops.load_library's OSError "Could not load this library"), an extension module
# that does not link (ImportError: undefined symbol), the library's own loader giving up
# (RuntimeError), or a first decode that fails.
_LOAD_ERRORS = (ImportError, OSError, RuntimeError, ValueError)


def _by_torchcodec() -> JpegDecode:
    from torchcodec.decoders import decode_jpeg as codec_decode_jpeg

    def by_torchcodec(data: bytes | bytearray | memoryview) -> torch.Tensor:
        # bytes as they are: torchcodec reads them through a read-only tensor, no copy.
        source = data if isinstance(data, bytes) else _tensor_of(data)
        out = codec_decode_jpeg(source, mode="RGB")
        assert isinstance(out, torch.Tensor)  # one source in, one image out
        return out

    return by_torchcodec


def _by_torchvision() -> JpegDecode:
    from torchvision.io import ImageReadMode
    from torchvision.io import decode_jpeg as vision_decode_jpeg

    def by_torchvision(data: bytes | bytearray | memoryview) -> torch.Tensor:
        buffer = data if isinstance(data, bytearray) else bytearray(data)  # it wants a writable buffer
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            image: torch.Tensor = vision_decode_jpeg(
                torch.frombuffer(buffer, dtype=torch.uint8), mode=ImageReadMode.RGB
            )
            return image

    return by_torchvision


class _Candidate(NamedTuple):
    """A JPEG decoder to try: its name, how to load it, the modules it is imported from, the fix."""

    name: str
    load: Callable[[], JpegDecode]
    modules: frozenset[str]  # an import that fails naming one of these: the decoder is not there
    fix: str


# In the order tried: the first that loads and decodes a JPEG decodes them all; Pillow after the last.
_CANDIDATES = (
    _Candidate(
        "torchcodec",
        _by_torchcodec,
        frozenset({"torchcodec", "torchcodec.decoders"}),
        "install the torchcodec release made for torch {torch} (torchcodec's README lists the pairs), "
        "or reinstall the two together: pip install --force-reinstall torch torchvision torchcodec",
    ),
    _Candidate(
        "torchvision",
        _by_torchvision,
        frozenset({"torchvision", "torchvision.io"}),
        "reinstall torch and torchvision together: pip install --force-reinstall torch torchvision",
    ),
)


def _jpeg_decoder() -> tuple[str, JpegDecode | None]:
    """The JPEG decoder of this install: torchcodec's, else torchvision's while it has one, else none.

    One that is not installed (or a torchvision without ``decode_jpeg``) is passed over in silence.
    One that is installed but does not load or decode here (a native library built for another torch)
    is passed over with one ``RuntimeWarning`` naming it, the decoder taken instead and the fix.
    """
    failed: list[tuple[_Candidate, BaseException]] = []
    chosen: tuple[str, JpegDecode | None] = ("pillow", None)
    for candidate in _CANDIDATES:
        try:
            decode_jpeg = candidate.load()
            _check(decode_jpeg)
        except _LOAD_ERRORS as e:
            if isinstance(e, ImportError) and e.name in candidate.modules:
                continue  # not installed, or no JPEG decoder in this version: nothing to say
            failed.append((candidate, e))
        else:
            chosen = (candidate.name, decode_jpeg)
            break
    # Said once, by the process that imports the loader first: a spawned DataLoader worker imports it
    # again, finds the same, and stays silent (its parent said it). It imports it while multiprocessing
    # prepares it, before parent_process() is set: its command line says what it is then.
    if multiprocessing.parent_process() is None and "--multiprocessing-fork" not in sys.orig_argv:
        for candidate, error in failed:
            warnings.warn(_cannot_load(candidate, error, chosen[0]), RuntimeWarning, stacklevel=2)
    return chosen


def _check(decode_jpeg: JpegDecode) -> None:
    """Decode a small JPEG made here, or raise: a library can import and still fail at its first call."""
    buffer = io.BytesIO()
    Image.new("RGB", (16, 8), (200, 30, 60)).save(buffer, "JPEG")
    out = decode_jpeg(buffer.getvalue())
    if tuple(out.shape) != (3, 8, 16) or out.dtype != torch.uint8:
        raise RuntimeError(f"decoded a 16x8 RGB JPEG as {out.dtype} {list(out.shape)}")


def _cannot_load(candidate: _Candidate, error: BaseException, instead: str) -> str:
    """The one line saying that ``candidate`` does not load here, what decodes instead, and the fix."""
    said = (str(error).strip().splitlines() or [""])[0]
    if len(said) > 200:
        said = f"{said[:200]}... ({len(said):,} characters)"
    fix = candidate.fix.format(torch=torch.__version__)
    taken = "Pillow (slower)" if instead == "pillow" else instead
    return (
        f"{candidate.name} cannot load here ({type(error).__name__}: {shown(said)}): JPEGs decode "
        f"with {taken} instead; {fix}"
    )


def _tensor_of(data: bytearray | memoryview) -> torch.Tensor:
    """A uint8 tensor over ``data``'s memory, no copy.

    A view of a mapped shard is read-only: torch warns so, and the tensor is only read.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.frombuffer(data, dtype=torch.uint8)


JPEG_DECODER, _decode_jpeg = _jpeg_decoder()
"""Which library decodes JPEG here: ``"torchcodec"``, ``"torchvision"`` (fallback) or ``"pillow"``."""


def _too_costly(data: bytes | bytearray | memoryview) -> str | None:
    """Why ``data`` is refused before any decode (too many pixels or scans); ``None`` if it is not.

    Pixels as the header declares them, every frame of a GIF and every page of a TIFF included, or
    a format whose size is known only by decoding it (:func:`~imgshards.converter.format.headers.oversized`).
    """
    why: str | None = oversized(data) or too_many_scans(data)
    return why


class _Refused(Exception):
    """Pillow opened an image whose size is past the pixel bound: refused before ``load()`` made a pixel."""


class _Stderr:
    """libjpeg's warnings, which it writes to file descriptor 2 itself, caught around one decode.

    libjpeg-turbo decodes a JPEG whose data ends early or holds stray bytes, and writes
    ``Corrupt JPEG data: premature end of data segment`` to the process's stderr, naming no file.
    Around a decode in the main thread, fd 2 points at an in-memory file of this process (five
    system calls, a few microseconds); what libjpeg wrote there goes to :func:`decode`'s ``on_damage``,
    which names the sample, and anything else (another thread's output in that moment) back to stderr.
    """

    def __init__(self) -> None:
        self.pid = self.file = -1

    def open(self) -> int:
        """The in-memory file of this process (a forked worker makes its own: the parent's is shared)."""
        if self.pid != os.getpid():
            memfd = getattr(os, "memfd_create", None)
            if memfd is not None:
                self.file = memfd("imgshards-libjpeg", 0)
            else:  # not Linux: an unlinked temporary file
                import tempfile

                with tempfile.TemporaryFile() as f:
                    self.file = os.dup(f.fileno())
            self.pid = os.getpid()
        return self.file

    @contextmanager
    def caught(self) -> Iterator[bool]:
        """Point fd 2 at this process's in-memory file for the block; yields whether it did.

        Only the main thread catches: fd 2 is the process's, and two threads swapping it (the device
        decoder's pool) could leave stderr pointing here for good. Another thread's decode, or a
        process without a usable fd 2 or out of descriptors, decodes as before, libjpeg's line on stderr.
        """
        if threading.current_thread() is not threading.main_thread():
            yield False
            return
        try:
            stderr = os.dup(2)  # whatever stderr is now (pytest's capture, a redirection...)
        except OSError:
            yield False
            return
        try:
            os.dup2(self.open(), 2)
        except OSError:
            os.close(stderr)
            yield False
            return
        try:
            yield True
        finally:
            os.dup2(stderr, 2)
            os.close(stderr)

    def said(self) -> list[str]:
        """What was written since the last call: libjpeg's lines (the rest goes back to stderr)."""
        if not os.lseek(self.file, 0, os.SEEK_CUR):
            return []
        text = os.pread(self.file, 1 << 16, 0).decode(errors="replace")
        os.ftruncate(self.file, 0)
        os.lseek(self.file, 0, os.SEEK_SET)
        lines = text.splitlines()
        ours = [line for line in lines if line.startswith(_LIBJPEG_SAYS)]
        other = "".join(f"{line}\n" for line in lines if not line.startswith(_LIBJPEG_SAYS))
        if other:
            os.write(2, other.encode(errors="replace"))
        return ours


_LIBJPEG_SAYS = ("Corrupt JPEG data", "Premature end of JPEG file", "Invalid SOS parameters", "Warning: ")
_STDERR = _Stderr()


def decode(
    data: bytes | bytearray | memoryview,
    ext: str,
    *,
    key: str = "?",
    shard: str = "?",
    on_damage: Callable[[str], None] | None = None,
) -> torch.Tensor:
    """Decode one image (``ext`` is its format, as named in the shard) to RGB ``uint8 [3, H, W]``.

    The image's header is read first: one that declares more pixels than Pillow's
    ``Image.MAX_IMAGE_PIXELS`` (a decompression bomb: a few hundred bytes asking for gigabytes; of a
    GIF or TIFF, any frame or page), or a JPEG with more scans than
    :data:`~imgshards.converter.format.headers.MAX_SCANS` (each scan a pass over the whole image:
    thousands of them take minutes), is refused before any decode. So is an image of any format
    Pillow opens (it opens by content, whatever the member's name) whose size, read by Pillow from
    its header, is past the bound: before ``load()`` makes its pixels.

    A JPEG that libjpeg decodes while warning that its data is damaged (``Corrupt JPEG data: premature
    end of data segment``: the rest of the image is grey) is returned; what libjpeg said goes to
    ``on_damage`` (a ``RuntimeWarning`` naming ``key`` and ``shard`` without it), not to stderr.

    Raises:
        CorruptImageError: the bytes do not decode, declare too many pixels or hold too many scans;
            ``key`` and ``shard`` name the sample in it.

    """
    if (too_costly := _too_costly(data)) is not None:
        raise CorruptImageError.for_sample(key, shard, too_costly)
    if ext in _LIBJPEG_FORMATS and _decode_jpeg is not None:
        with _STDERR.caught() as caught:
            try:
                image = _decode_jpeg(data)
            except (RuntimeError, ValueError):
                image = None  # refused by libjpeg (rare: truncated, empty, exotic); Pillow has the last word
        said = _STDERR.said() if caught else []  # of bytes it refused too: Pillow's error then says why
        if image is not None:
            if said:
                _damaged(key, shard, "; ".join(said), on_damage)
            return image
    try:
        array = np.array(_pillow(data, ext))
    except _Refused as e:
        raise CorruptImageError.for_sample(key, shard, str(e)) from None
    except _DECODE_ERRORS as e:
        raise CorruptImageError.for_sample(key, shard, f"{type(e).__name__}: {e}") from None
    return torch.from_numpy(array).permute(2, 0, 1)


def _pillow(data: bytes | bytearray | memoryview, ext: str) -> Image.Image:
    """Decode ``data`` with Pillow, as RGB the way pack would have stored it (:func:`_as_packed`), upright.

    The one Pillow decode of :func:`decode` (every format but a JPEG libjpeg-turbo took) and
    :func:`pil_image`; it raises what Pillow raises (``_DECODE_ERRORS``), or :class:`_Refused` for
    an image past the pixel bound, and the callers say it their way.
    """
    with Image.open(io.BytesIO(data)) as im:
        # Pillow opens any format it knows (by content, not by name) reading its header only: the size
        # of what load() decodes is known now, before a pixel is made (headers.py walks the rest).
        if (excess := pixel_excess(*im.size)) is not None:
            raise _Refused(excess)
        im.load()  # the pixels, read before the file closes
        # A JPEG without an Exif segment has no orientation: getexif() would cost 0.2 ms to say so.
        turn = 1 if ext in _LIBJPEG_FORMATS and "exif" not in im.info else orientation(im)
        return _as_packed(im, turn)


def _as_packed(im: Image.Image, turn: int) -> Image.Image:
    """``im`` (loaded) as RGB the way pack's conversion would have stored it, turned upright by ``turn``.

    Transparency on white (in pack's order: before deep gray is scaled), deep gray scaled (not
    clipped). An opaque 8-bit image passes on_white and eight_bit as it is: a mode test each, no copy.
    """
    image: Image.Image = upright(eight_bit(on_white(im)), turn)
    return image.convert("RGB") if image.mode != "RGB" else image


def _damaged(key: str, shard: str, said: str, on_damage: Callable[[str], None] | None) -> None:
    if on_damage is not None:
        on_damage(said)
        return
    warnings.warn(
        f"image {key!r} in shard {shard} is damaged, decoded as far as its data goes (libjpeg: {said})",
        RuntimeWarning,
        stacklevel=3,
    )


def pil_image(data: bytes | bytearray | memoryview, ext: str) -> Image.Image:
    """Decode one image to an RGB Pillow image: what ``torchvision.datasets.ImageFolder`` hands a transform.

    :func:`decode`'s rules, in Pillow: the same refusal before any decode (too many pixels or
    scans), RGB out of every mode (as torchvision's ``pil_loader``, but as pack converts: transparency
    on white, deep gray scaled to 8 bits), and the EXIF orientation applied to its pixels, as
    :func:`decode` applies it (``pack`` applied it to every image it re-encoded): images arrive upright.

    Raises:
        ValueError: the bytes do not decode, declare too many pixels or hold too many scans; the
            message says which (the caller names the sample).

    """
    if (too_costly := _too_costly(data)) is not None:
        raise ValueError(too_costly)
    try:
        return _pillow(data, ext)
    except _Refused as e:
        raise ValueError(str(e)) from None
    except _DECODE_ERRORS as e:
        raise ValueError(f"{type(e).__name__}: {e}") from None


# EXIF orientation -> which of the upright image's axes (x, y) run backwards through the stored one:
# those whose far edge the stored image's padding to whole reduced pixels lands on.
_BACKWARDS = {
    1: (False, False),
    2: (True, False),
    3: (True, True),
    4: (False, True),
    5: (False, False),
    6: (True, False),
    7: (True, True),
    8: (False, True),
}


class Reduced(NamedTuple):
    """A JPEG decoded at ``1 / scale`` of its size, RGB and upright.

    Attributes:
        image: The reduced image (a Pillow image, RGB).
        scale: 2, 4 or 8: one of its pixels spans ``scale`` x ``scale`` pixels of the full image.
        left: Where its first column starts, in the full upright image's pixels: 0, or less where the
            full image runs backwards through the stored one (EXIF orientation) and its width is not
            a multiple of ``scale`` (the last stored reduced pixel is only partly covered).
        top: The same for its first row.

    """

    image: Image.Image
    scale: int
    left: int
    top: int

    def box(self, top: float, left: float, height: float, width: float) -> tuple[float, float, float, float]:
        """The full image's region ``(top, left, height, width)`` in this image's pixels, ``(l, t, r, b)``."""
        x, y = (left - self.left) / self.scale, (top - self.top) / self.scale
        return x, y, x + width / self.scale, y + height / self.scale


class OpenJpeg:
    """A JPEG whose headers are read, not yet decoded: its upright size, then :meth:`decode` at a scale.

    Upright as :func:`decode` gives it: libjpeg-turbo's decoders (torchcodec's, torchvision's)
    apply the EXIF orientation, so this does too (Pillow, which does not on its own, is told to).
    """

    def __init__(self, image: Image.Image) -> None:
        self._image = image
        self._turn = orientation(image)
        width, height = image.size
        self.height, self.width = (width, height) if self._turn in (5, 6, 7, 8) else (height, width)

    def decode(self, scale: int) -> Reduced | None:
        """Decode at ``1 / scale`` (2, 4 or 8) by DCT scaling, RGB (grayscale too), upright.

        ``None`` where Pillow cannot (corrupt data, a layout ``draft`` declines): :func:`decode`'s
        case, which says why or decodes it otherwise.
        """
        stored_w, stored_h = self._image.size
        try:
            self._image.draft("RGB", (stored_w // scale, stored_h // scale))
            if self._image.size != (-(-stored_w // scale), -(-stored_h // scale)):
                return None  # Pillow took another scale (or none)
            image = self._image.convert("RGB") if self._image.mode != "RGB" else self._image
            image.load()
        except _DECODE_ERRORS:
            return None
        image = upright(image, self._turn)
        x_backwards, y_backwards = _BACKWARDS[self._turn]
        left = self.width - image.size[0] * scale if x_backwards else 0
        top = self.height - image.size[1] * scale if y_backwards else 0
        return Reduced(image, scale, left, top)


@contextmanager
def open_jpeg(data: bytes | bytearray | memoryview) -> Iterator[OpenJpeg | None]:
    """The JPEG ``data`` opened for a reduced decode; ``None`` where :func:`decode` must take it.

    ``None``: refused before decode (too many pixels or scans, in the bytes or in the size Pillow
    read; :func:`decode` says why), or not a JPEG Pillow opens. Only the headers are read here
    (Pillow opens lazily).
    """
    if _too_costly(data) is not None:
        yield None
        return
    try:
        image = Image.open(io.BytesIO(data), formats=[JPEG.pillow])
    except _DECODE_ERRORS:
        yield None
        return
    if pixel_excess(*image.size) is not None:  # a size Pillow read past the first frame header
        image.close()
        yield None
        return
    with image:
        try:
            jpeg = OpenJpeg(image)
        except _DECODE_ERRORS:  # its EXIF does not parse
            jpeg = None
        yield jpeg
