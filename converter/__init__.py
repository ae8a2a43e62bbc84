"""Pack an ImageFolder tree into WebDataset tar shards with a label index, verify and describe them."""

from .errors import DestinationError, ImgshardsError, ManifestError, SourceError
from .manifest import INDEX_NAME, Manifest, ShardInfo, SplitInfo, read_manifest

__all__ = [
    "INDEX_NAME",
    "DestinationError",
    "ImgshardsError",
    "Manifest",
    "ManifestError",
    "ShardInfo",
    "SourceError",
    "SplitInfo",
    "read_manifest",
]
