"""Shared fixtures: small real ImageFolder trees and packed datasets built through the real writer."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from imgshards.converter import PackConfig, make_synthetic_tree, pack

# ../shared/tools/make_imagefolder.py cuts real photos into ImageFolder trees; CI has shared/ beside
# the checkout. Without it the tests fall back to the package's own synthetic images.
MAKE_IMAGEFOLDER = Path(__file__).resolve().parents[2] / "shared" / "tools" / "make_imagefolder.py"


def make_tree(
    root: Path, *, classes: int = 4, per_class: int = 10, profile: str = "tiny", seed: int = 0
) -> Path:
    """Write an ImageFolder tree of real JPEGs at ``root`` and return it."""
    if MAKE_IMAGEFOLDER.exists():
        cmd = [
            sys.executable,
            str(MAKE_IMAGEFOLDER),
            "--out",
            str(root),
            "--classes",
            str(classes),
            "--per-class",
            str(per_class),
            "--profile",
            profile,
            "--seed",
            str(seed),
            "--jobs",
            "2",
        ]
        subprocess.run(cmd, check=True, capture_output=True)
    else:
        make_synthetic_tree(root, classes=min(classes, 8), per_class=per_class, seed=seed)
    return root


@pytest.fixture(scope="session")
def tree_factory(tmp_path_factory):
    """``tree_factory(classes=, per_class=, profile=, seed=)``: a fresh tree in its own directory."""

    def factory(**kwargs) -> Path:
        return make_tree(tmp_path_factory.mktemp("tree") / "src", **kwargs)

    return factory


@pytest.fixture(scope="session")
def tiny_tree(tree_factory) -> Path:
    """A session-wide tree of 4 classes x 10 tiny real JPEGs (do not modify it)."""
    return tree_factory(classes=4, per_class=10)


@pytest.fixture(scope="session")
def packed_factory(tmp_path_factory):
    """``packed_factory(src, **PackConfig fields)``: pack ``src`` into a fresh directory, return it."""

    def factory(src: Path, **config) -> Path:
        config.setdefault("workers", 2)
        dst = tmp_path_factory.mktemp("packed")
        pack(src, dst, PackConfig(**config))
        return dst

    return factory


@pytest.fixture(scope="session")
def tiny_packed(tiny_tree, packed_factory) -> Path:
    """``tiny_tree`` packed into several small shards (do not modify it)."""
    return packed_factory(tiny_tree, shard_size=20_000)
