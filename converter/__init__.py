"""Pack an ImageFolder tree into WebDataset shards with a label index, or index shards made elsewhere.

Then verify and describe them.

``converter`` needs no torch: it imports numpy, Pillow and tqdm only (and fsspec, for a URL only).
"""

from .check import Check, Reason
from .config import DEFAULT_SHARD_SIZE, ENGINES, PackConfig, PackHooks, PackResult
from .dryrun import DryRun, SplitPlan, dry_run
from .errors import DestinationError, EngineError, ImgshardsError, ManifestError, SourceError, SplitFileError
from .formats import reader_warnings
from .index import IndexConfig, IndexResult, index, read_classes
from .manifest import INDEX_NAME, LabelSource, Manifest, ShardInfo, SplitInfo, read_manifest
from .pack import pack
from .readorder import ReadOrder
from .remote import pack_to_url, verify_url
from .scan import IMG_EXTENSIONS, ScanResult, scan_tree, split_tree_error, tree_warnings
from .synthetic import make_synthetic_tree
from .verify import ShardProblem, VerifyReport, verify

__all__ = [
    "DEFAULT_SHARD_SIZE",
    "ENGINES",
    "IMG_EXTENSIONS",
    "INDEX_NAME",
    "Check",
    "DestinationError",
    "DryRun",
    "EngineError",
    "ImgshardsError",
    "IndexConfig",
    "IndexResult",
    "LabelSource",
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
    "SplitPlan",
    "VerifyReport",
    "dry_run",
    "index",
    "make_synthetic_tree",
    "pack",
    "pack_to_url",
    "read_classes",
    "read_manifest",
    "reader_warnings",
    "scan_tree",
    "split_tree_error",
    "tree_warnings",
    "verify",
    "verify_url",
]
