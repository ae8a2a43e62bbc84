"""Pack an ImageFolder tree into WebDataset tar shards with a label index; verify and describe them.

``converter`` needs no torch: it imports numpy, Pillow and tqdm only (and fsspec, for a URL only).
"""

from .check import Check, Reason
from .config import DEFAULT_SHARD_SIZE, PackConfig, PackHooks, PackResult
from .errors import DestinationError, ImgshardsError, ManifestError, SourceError, SplitFileError
from .formats import reader_warnings
from .manifest import INDEX_NAME, Manifest, ShardInfo, SplitInfo, read_manifest
from .pack import pack
from .readorder import ReadOrder
from .remote import pack_to_url, verify_url
from .scan import IMG_EXTENSIONS, ScanResult, scan_tree
from .synthetic import make_synthetic_tree
from .verify import ShardProblem, VerifyReport, verify

__all__ = [
    "DEFAULT_SHARD_SIZE",
    "IMG_EXTENSIONS",
    "INDEX_NAME",
    "Check",
    "DestinationError",
    "ImgshardsError",
    "Manifest",
    "ManifestError",
    "PackConfig",
    "PackHooks",
    "PackResult",
    "ReadOrder",
    "Reason",
    "ScanResult",
    "ShardInfo",
    "ShardProblem",
    "SourceError",
    "SplitFileError",
    "SplitInfo",
    "VerifyReport",
    "make_synthetic_tree",
    "pack",
    "pack_to_url",
    "read_manifest",
    "reader_warnings",
    "scan_tree",
    "verify",
    "verify_url",
]
