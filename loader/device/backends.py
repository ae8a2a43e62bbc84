"""The batched JPEG decoders behind ``decode_on`` (nvjpeg on a GPU, the workers' on the CPU), and the probe.

Why torchcodec first: torchvision's ``decode_jpeg(device="cuda")`` is deprecated (it warns on every
call) and ``torchcodec.decoders.decode_jpeg`` is its successor, with the same contract (a list of
CPU byte tensors in, one nvjpeg call, a list of ``uint8 [3, H, W]`` CUDA tensors out). torchvision's
stays the fallback where torchcodec is not installed or does not load here. NVIDIA DALI or
nvImageCodec could sit behind the same :data:`Backend` type; neither is installed with torch, and
neither can be tested here.

Which decoder takes a sample is read from its header before anything is decoded (:func:`probe`).
The training process's decoder (:mod:`.decoding`) sends to the batched GPU decoder only what it
decodes exactly as the DataLoader workers' CPU decoder would, and everything else to the CPU
decoder, so both paths keep and skip the same samples:

- **Not a JPEG** (PNG, WebP... kept by ``pack --keep-formats``): the CPU decoder (Pillow).
- **CMYK/YCCK** (4 components): nvjpeg's RGB output does not convert them.
- **Progressive**: nvjpeg decodes them on its hybrid path, whose Huffman stage runs on the calling
  thread, one image at a time: no faster than the CPU decoder, and it would hold up the batch.
- **Truncated** (no end-of-image marker ``FF D9`` at the end of the bytes): nvjpeg fills the missing
  rows with gray and returns an image, where the CPU decoder refuses it and the workers skip it. A
  JPEG with bytes after its end marker goes to the CPU decoder too (it reads them as the workers do).
- **A header that does not parse** (a second frame header included): the CPU decoder says why.
- **Too costly** (more pixels than the bound, of any frame; too many scans; a format whose size is
  known only by decoding it): the CPU decoder refuses it before any decode, as the workers' does.
  Nothing here opens such bytes: Pillow decodes an ICO to open it.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

import torch
from PIL import Image

from imgshards.converter.format.headers import JpegError, oversized, too_many_scans, walk_jpeg
from imgshards.converter.format.imageformats import FORMATS, JPEG

from ..errors import CorruptImageError
from ..image.decode import JPEG_DECODER, decode, jpeg_header
from ..pipeline.offload import RawBatch

__all__ = ["Backend", "Probe", "chunks", "decode_sample", "default_backend", "probe"]

# A batched JPEG decoder: the bytes of each image (CPU uint8 tensors) to RGB uint8 [3, H, W] tensors on
# the device. It raises for a batch it refuses (one bad image is enough).
Backend = Callable[[list[torch.Tensor], torch.device], list[torch.Tensor]]


def default_backend(device: torch.device) -> Backend:
    """The batched decoder for ``device``.

    On a GPU: ``torchcodec.decoders.decode_jpeg`` (nvjpeg, one call a batch), torchvision's
    ``decode_jpeg(device="cuda")`` where torchcodec is not installed or does not load (deprecated
    there; :mod:`..image.decode` tried torchcodec once, and warned if it is installed but does not
    load). On the CPU: the DataLoader workers' own decoder, image by image, so both paths decode alike.
    """
    if torch.device(device).type == "cuda":
        return _cuda_decode
    return _host_decode


def _cuda_decode(datas: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    # torchcodec where it loaded and decoded here (image/decode.py chose it, or said once why not).
    if JPEG_DECODER == "torchcodec":
        from torchcodec.decoders import decode_jpeg as codec_decode_jpeg

        return list(codec_decode_jpeg(datas, mode="RGB", device=device))
    from torchvision.io import ImageReadMode, decode_jpeg

    return list(decode_jpeg(datas, mode=ImageReadMode.RGB, device=device))


def _host_decode(datas: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    return [decode(d.numpy().tobytes(), JPEG.name).to(device) for d in datas]


def decode_sample(raw: RawBatch, i: int) -> torch.Tensor | CorruptImageError:
    """Sample ``i`` of ``raw`` through the workers' own CPU decoder, or why it does not decode."""
    try:
        return decode(raw.sample(i).numpy().tobytes(), raw.exts[i], key=raw.keys[i], shard=raw.shards[i])
    except CorruptImageError as e:
        return e


# ---- which decoder takes a sample (see the module docstring) -------------------------------------

_EOI = b"\xff\xd9"
# The formats (shard member names) the batched device decoder takes, from the format table.
_DEVICE_FORMATS = frozenset(f.name for f in FORMATS if f.device)


class Probe(NamedTuple):
    """What a sample's header says: which decoder takes it, its size, and why not the batched one.

    Attributes:
        batched: The batched GPU decoder takes it.
        height: Rows (0 where no header could be read).
        width: Columns.
        reason: Why it goes to the CPU decoder (``""`` when ``batched``).

    """

    batched: bool
    height: int
    width: int
    reason: str = ""

    @property
    def nbytes(self) -> int:
        """Bytes of the decoded RGB ``uint8`` image."""
        return 3 * self.height * self.width


def probe(data: bytes | bytearray | memoryview, ext: str) -> Probe:
    """Read the header of one sample (``ext``: its format as named in the shard) without decoding it."""
    if oversized(data) is not None or too_many_scans(data) is not None:
        return Probe(False, 0, 0, "too costly")  # the CPU decoder refuses it, saying why
    if ext in _DEVICE_FORMATS and (header := jpeg_header(data)) is not None:
        h, w = header.height, header.width
        try:  # to the first scan: a second frame header (Pillow and libjpeg differ on it) is refused
            walk_jpeg(data, to_scan=True)
        except JpegError as e:
            if not e.truncated:
                return Probe(False, h, w, "unparsed header")
        if header.components not in (1, 3):
            return Probe(False, h, w, "CMYK")
        if header.progressive:
            return Probe(False, h, w, "progressive")
        if bytes(data[-2:]) != _EOI:
            return Probe(False, h, w, "truncated")
        return Probe(True, h, w)
    try:  # another format, or a JPEG whose header does not parse: Pillow reads only the header here
        with Image.open(io.BytesIO(data)) as im:
            return Probe(
                False, im.height, im.width, "not a JPEG" if ext not in _DEVICE_FORMATS else "unparsed header"
            )
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError):  # the CPU decoder says why
        return Probe(False, 0, 0, "unreadable")


def chunks(probes: Sequence[Probe], max_bytes: int) -> Iterator[list[int]]:
    """Consecutive runs of samples that decode to at most ``max_bytes`` together (a larger one alone)."""
    chunk: list[int] = []
    size = 0
    for i, p in enumerate(probes):
        if chunk and size + p.nbytes > max_bytes:
            yield chunk
            chunk, size = [], 0
        chunk.append(i)
        size += p.nbytes
    if chunk:
        yield chunk
