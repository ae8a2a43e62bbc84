"""Why a source file was not packed: one closed set for the scan, the reads, the checks and the splits.

A leaf: the scan, the source reads and the image checks all name their rejects with it.
"""

from __future__ import annotations

import enum

__all__ = ["Reason"]


class Reason(str, enum.Enum):
    """Why an input file was not packed; the values appear in the rejects file and the summary."""

    UNSUPPORTED_EXTENSION = "unsupported_extension"
    OUTSIDE_CLASS_DIR = "outside_class_dir"
    SYMLINK_LOOP = "symlink_loop"
    BROKEN_SYMLINK = "broken_symlink"
    SPECIAL_FILE = "special_file"
    UNREADABLE = "unreadable"
    EMPTY = "empty"
    NOT_IMAGE = "not_image"
    UNSUPPORTED_FORMAT = "unsupported_format"
    TRUNCATED = "truncated"
    TOO_MANY_PIXELS = "too_many_pixels"
    TOO_MANY_SCANS = "too_many_scans"
    TOO_LARGE = "too_large"
    GREW = "grew_while_packed"
    UNDECODABLE = "undecodable"
    NOT_IN_SPLIT_FILE = "not_in_split_file"
