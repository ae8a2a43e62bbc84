r"""What a label member holds: the one reading of ``.cls`` and ``.json`` labels (index, verify, loader).

A class id is ASCII digits only (``"7"``, or ``"7\\n"``): never ``"+7"``, ``" 7"``, ``"7_0"`` or
another script's digits, which ``int()`` would take. Anything else in a ``.cls`` is a class name.
A label member is at most :data:`MAX_LABEL_BYTES`; a ``.json`` nested deeper than Python's
recursion limit is no label (a one-line reason, never a ``RecursionError``). Standard library
only: :mod:`.manifest` builds on it.
"""

from __future__ import annotations

import json

__all__ = ["MAX_LABEL_BYTES", "label_value"]

MAX_LABEL_BYTES = 1 << 16  # a .cls or .json label member larger than this holds no label
_MAX_ID_DIGITS = 20


def label_value(data: bytes, member: str, field: str | None = None) -> int | str:
    r"""The label a sample's label member holds: a class id (``int``) or a class name (``str``).

    A ``.cls`` holds a class id as ASCII digits (``"7"``, ``"7\\n"``), or else a class name (its
    UTF-8 text without a final line end). A ``.json`` holds an object whose ``field`` is a class id
    (a non-negative integer, not a boolean) or a non-empty class name.

    Raises:
        ValueError: the member holds no label; the message says what it holds.

    """
    if len(data) > MAX_LABEL_BYTES:
        raise ValueError(f"a .{member} of {len(data)} bytes, larger than a label ({MAX_LABEL_BYTES} bytes)")
    if member == "cls":
        if data.isdigit() and len(data) <= _MAX_ID_DIGITS:  # bytes.isdigit(): ASCII digits only
            return int(data)
        text = data[:-2] if data.endswith(b"\r\n") else data[:-1] if data.endswith(b"\n") else data
        if text.isdigit():
            if len(text) > _MAX_ID_DIGITS:
                raise ValueError(f"a .cls that is not a label: {data[:24]!r} (a class id of over 20 digits)")
            return int(text)
        try:
            name = text.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"a .cls that is not a label: {data[:24]!r} (not UTF-8)") from None
        if not name:
            raise ValueError(f"a .cls that is not a label: {data[:24]!r}")
        return name
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):  # not UTF-8, not JSON, nested too deep
        raise ValueError(f"a .json that is not JSON: {data[:24]!r}") from None
    if not isinstance(doc, dict) or field not in doc:
        held = sorted(doc)[:8] if isinstance(doc, dict) else type(doc).__name__
        raise ValueError(f"no field {field!r} in its .json (it holds {held})")
    value = doc[field]
    if isinstance(value, str) and value != "":
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise ValueError(f"a .json field {field!r} of {str(value)[:80]!r}, not a class id or name")
