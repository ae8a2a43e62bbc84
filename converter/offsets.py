"""Where each sample of a shard starts: the table ``pack`` writes into the index beside each shard.

A worker of the loader reads runs of samples that often start in the middle of a shard (the
partition deals blocks of shards to every worker). Without the table it finds sample ``i`` by
stepping over the tar headers of the ``i`` samples before it (about 15 us each here: 0.8 per image
delivered with 2 workers, 3 with 8); with it, one ``seek``.

In ``index.json`` the table is a shard's ``"offsets"``: base64 of little-endian 32-bit unsigned
integers, one per sample, each the 512-byte block where the sample's first tar header is (shards up to
2 TiB). A shard without it (``imgshards index`` of another tool's shards, an index written before the
table) is read by stepping, as before. The table is untrusted like the rest of the index:
:func:`offsets_problem` checks it before any of it is used (one entry per sample, the first 0,
strictly increasing, every one inside the shard), and the tar parser still checks the header found
there (checksum, name), so a wrong table costs a damaged-shard warning, never a wrong read.

Standard library only, as :mod:`.manifest`, which holds it.
"""

from __future__ import annotations

import base64
import binascii
import sys
from array import array
from collections.abc import Sequence

__all__ = ["BLOCK", "decode_offsets", "encode_offsets", "offsets_problem"]

BLOCK = 512
_ITEM = "I" if array("I").itemsize == 4 else "L"  # 32 bits: "I" on every platform CPython runs on


def encode_offsets(blocks: Sequence[int]) -> str:
    """The index form of a table of sample starts, in 512-byte blocks."""
    table = array(_ITEM, blocks)
    if sys.byteorder == "big":
        table.byteswap()
    return base64.b64encode(table.tobytes()).decode("ascii")


def decode_offsets(text: str) -> array[int]:
    """The table of sample starts (in 512-byte blocks) that :func:`encode_offsets` wrote.

    Raises:
        ValueError: ``text`` is not base64 of whole 32-bit entries.

    """
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as e:
        raise ValueError(f"not base64: {e}") from None
    if len(raw) % 4:
        raise ValueError(f"{len(raw)} bytes, not whole 4-byte entries")
    table = array(_ITEM)
    table.frombytes(raw)
    if sys.byteorder == "big":
        table.byteswap()
    return table


def offsets_problem(text: object, samples: int, size: int) -> str | None:
    """What is wrong with a shard's ``"offsets"`` for ``samples`` samples of ``size`` bytes; None: nothing."""
    if not isinstance(text, str):
        return "a base64 string"
    if len(text) > 8 * samples + 8:  # checked before decoding: base64 of 4 bytes a sample is ~5.3
        return f"base64 of {samples} 4-byte entries (one per sample)"
    try:
        table = decode_offsets(text)
    except ValueError as e:
        return f"base64 of 4-byte entries ({e})"
    if len(table) != samples:
        return f"one entry per sample ({samples}), not {len(table)}"
    if samples and table[0] != 0:
        return "a table whose first sample starts at block 0"
    blocks = size // BLOCK
    previous = -1
    for start in table:
        if start <= previous or start >= blocks:
            return f"strictly increasing block numbers below the shard's {blocks} blocks"
        previous = start
    return None
