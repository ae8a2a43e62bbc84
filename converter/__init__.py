"""Pack an ImageFolder tree into WebDataset shards with a label index, or index shards made elsewhere.

Then verify and describe them.

``converter`` needs no torch: it imports numpy, Pillow and tqdm only (and fsspec, for a URL only).
One sub-package a stage of the pack, each a short stack of imports (8 modules at most,
tests/test_layout.py)::

    pack, config  the entry point (scan -> plan -> write -> index.json) and its settings
    scan/         1. scan the tree: the images, the rejects and why, the source reads
    plan/         2. plan the splits, the shards and the engines' tasks; the dry run
    write/        3. write the shards: atomically, resumably, into the destination
    shards/       4. shards already written: index them, verify them, upgrade their index
    engines/      where the shard tasks run: the local pool or Ray
    remote/       a pack, a verify and an index at a URL
    format/       the packed format, the one contract with the loader
    synthetic     a synthetic ImageFolder tree, for tests and demos
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .config import DEFAULT_SHARD_SIZE, ENGINES, Check, PackConfig, ReadOrder
    from .format.errors import (
        DestinationError,
        EngineError,
        ImgshardsError,
        ManifestError,
        SourceError,
        SplitFileError,
    )
    from .format.formats import reader_warnings
    from .format.manifest import INDEX_NAME, LabelSource, Manifest, ShardInfo, SplitInfo, read_manifest
    from .pack import PackHooks, PackResult, pack
    from .plan.dryrun import DryRun, SplitPlan, dry_run
    from .remote.upload import pack_to_url, verify_url
    from .scan.reasons import Reason
    from .scan.tree import IMG_EXTENSIONS, ScanResult, scan_tree, split_tree_error, tree_warnings
    from .shards.index import IndexConfig, IndexResult, index, read_classes
    from .shards.upgrade import UpgradeResult, upgrade_index
    from .shards.verify import ShardProblem, VerifyReport, verify
    from .synthetic import make_synthetic_tree

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
    "UpgradeResult",
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
    "upgrade_index",
    "verify",
    "verify_url",
]

# Each public name -> the module (under this package) that defines it. The names are resolved on
# first use (PEP 562), so importing one module of the package, the format's contract
# (``imgshards.converter.format``) above all, runs none of the packer: the loader imports the format
# without loading pack, scan, the engines or the upload (tests/test_layout.py checks this).
_WHERE = {
    "Check": "config",
    "DEFAULT_SHARD_SIZE": "config",
    "DestinationError": "format.errors",
    "DryRun": "plan.dryrun",
    "ENGINES": "config",
    "EngineError": "format.errors",
    "IMG_EXTENSIONS": "scan.tree",
    "INDEX_NAME": "format.manifest",
    "ImgshardsError": "format.errors",
    "IndexConfig": "shards.index",
    "IndexResult": "shards.index",
    "LabelSource": "format.manifest",
    "Manifest": "format.manifest",
    "ManifestError": "format.errors",
    "PackConfig": "config",
    "PackHooks": "pack",
    "PackResult": "pack",
    "ReadOrder": "config",
    "Reason": "scan.reasons",
    "ScanResult": "scan.tree",
    "ShardInfo": "format.manifest",
    "ShardProblem": "shards.verify",
    "SourceError": "format.errors",
    "SplitFileError": "format.errors",
    "SplitInfo": "format.manifest",
    "SplitPlan": "plan.dryrun",
    "UpgradeResult": "shards.upgrade",
    "VerifyReport": "shards.verify",
    "dry_run": "plan.dryrun",
    "index": "shards.index",
    "make_synthetic_tree": "synthetic",
    "pack": "pack",
    "pack_to_url": "remote.upload",
    "read_classes": "shards.index",
    "read_manifest": "format.manifest",
    "reader_warnings": "format.formats",
    "scan_tree": "scan.tree",
    "split_tree_error": "scan.tree",
    "tree_warnings": "scan.tree",
    "upgrade_index": "shards.upgrade",
    "verify": "shards.verify",
    "verify_url": "remote.upload",
}


# A name that is also the module defining it (``pack``) is the function, as when this file imported
# them all (importing ``imgshards.converter.pack`` binds the module under its name here: _Package
# keeps the function there instead). ``index`` and ``verify`` live in shards/, so shadow nothing.
_SHADOWED = frozenset(name for name, module in _WHERE.items() if name == module)


class _Package(types.ModuleType):
    def __setattr__(self, name: str, value: Any) -> None:
        if (
            name in _SHADOWED
            and isinstance(value, types.ModuleType)
            and value.__name__ == f"{__name__}.{name}"
        ):
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # once found, an ordinary attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
