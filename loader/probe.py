"""Which decoder takes a sample, read from its header before anything is decoded.

The training process's decoder (:mod:`.device`) sends to the batched GPU decoder only what it
decodes exactly as the DataLoader workers' CPU decoder would, and everything else to the CPU
decoder, so both paths keep and skip the same samples:

- **Not a JPEG** (PNG, WebP... kept by ``pack --keep-formats``): the CPU decoder (Pillow).
- **CMYK/YCCK** (4 components): nvjpeg's RGB output does not convert them.
- **Progressive**: nvjpeg decodes them on its hybrid path, whose Huffman stage runs on the calling
  thread, one image at a time: no faster than the CPU decoder, and it would hold up the batch.
- **Truncated** (no end-of-image marker ``FF D9`` at the end of the bytes): nvjpeg fills the missing
  rows with gray and returns an image, where the CPU decoder refuses it and the workers skip it. A
  JPEG with bytes after its end marker goes to the CPU decoder too (it reads them as the workers do).
- **A header that does not parse**: the CPU decoder says why.
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from typing import NamedTuple

from PIL import Image

from .decode import jpeg_header

__all__ = ["Probe", "chunks", "probe"]

_EOI = b"\xff\xd9"


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
    if ext == "jpg" and (header := jpeg_header(data)) is not None:
        h, w = header.height, header.width
        if header.components not in (1, 3):
            return Probe(False, h, w, "CMYK")
        if header.progressive:
            return Probe(False, h, w, "progressive")
        if bytes(data[-2:]) != _EOI:
            return Probe(False, h, w, "truncated")
        return Probe(True, h, w)
    try:  # another format, or a JPEG whose header does not parse: Pillow reads only the header here
        with Image.open(io.BytesIO(data)) as im:
            return Probe(False, im.height, im.width, "not a JPEG" if ext != "jpg" else "unparsed header")
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
