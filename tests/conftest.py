"""Shared fixtures: small real ImageFolder trees and packed datasets built through the real writer."""

from __future__ import annotations

import io
import os
import random
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from imgshards.converter import PackConfig, pack

try:
    import fcntl
except ImportError:  # Windows: no file locks of this kind, and no -n in its CI
    fcntl = None  # type: ignore[assignment]

# The remote tests' servers and the dataset they serve, one of each a session for both sides
# (tests/loader/remote/, tests/converter/remote/, tests/test_remote_secrets.py).
from .remote_servers import http_serve, remote_packed, remote_tree, s3, s3_endpoint  # noqa: F401

# ../shared/tools/make_imagefolder.py cuts real photos into ImageFolder trees; CI has shared/ beside
# the checkout. Without it (a clone elsewhere) the tests fall back to `_make_tree_without_photos`,
# which keeps the same contract.
MAKE_IMAGEFOLDER = Path(__file__).resolve().parents[2] / "shared" / "tools" / "make_imagefolder.py"
PROFILE_SIZES = {"tiny": (64, 48), "imagenet": (500, 375)}


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
        _make_tree_without_photos(root, classes, per_class, PROFILE_SIZES[profile], seed)
    return root


def _make_tree_without_photos(
    root: Path, classes: int, per_class: int, size: tuple[int, int], seed: int
) -> None:
    """What ``make_imagefolder.py`` makes, from smooth random images instead of photo crops.

    Same names (``n<class:08d>/n<class:08d>_<i>.JPEG``), one fixed size per profile, every image
    distinct, the same tree for the same arguments: the properties the tests rely on.
    """
    for cls in range(classes):
        rng = random.Random(f"{seed}/{cls}")
        folder = root / f"n{cls:08d}"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            # An 8x6 grid of random colours, upscaled: smooth like a photo crop, and ~2 KB at 64x48.
            im = Image.frombytes("RGB", (8, 6), rng.randbytes(8 * 6 * 3)).resize(size, Image.BICUBIC)
            buf = io.BytesIO()
            im.save(buf, format="JPEG", quality=75)
            (folder / f"n{cls:08d}_{i}.JPEG").write_bytes(buf.getvalue())


# The fixtures that call make_tree: a test that uses one (in its fixture closure) reads trees cut
# from ../shared's photos when they are there, and is marked `photos` for .ci/run's second run.
# tests/test_ci.py checks that every call of make_tree is in one of them.
PHOTO_FIXTURES = frozenset({"tree_factory", "three_ways"})


# The integration tier: what runs whole processes for long (workers across epochs, torchrun and gloo
# groups, servers, a Ray cluster, trainers, Jupyter kernels, every docs block, the wheel, the demo).
# `python -m pytest -n 2` leaves it out (pyproject's addopts: -m "not integration"), in under 5
# minutes on 2 cores; `python -m pytest -n 2 -m integration` runs it, and .ci/run runs both (the
# README's set-up). A path is a file or a folder under tests/; a test elsewhere is marked on its own.
INTEGRATION = {
    "test_docs.py": "every code block of the README and docs/, each a script of its own",
    "test_readme_torchrun.py": "the README's loop under torchrun, two ranks",
    "test_packaging.py": "builds the wheel and installs it",
    "test_typing.py": "mypy --strict over a user's script",
    "test_remote_secrets.py": "S3 and HTTP servers",
    "notebooks/": "Jupyter kernels running the notebooks",
    "cli/test_demo.py": "the demo, as a user runs it after installing",
    "converter/remote/": "packs to an S3 server",
    "converter/engines/test_rayengine.py": "a local Ray cluster",
    "loader/remote/": "S3 and HTTP servers, hostile ones included",
    "loader/test_distributed.py": "gloo process groups",
    "loader/test_stages_distributed.py": "gloo process groups",
    "loader/test_elastic.py": "torchrun groups resumed onto other topologies",
    "loader/state/test_ranks.py": "gloo process groups",
    "loader/test_frameworks.py": "Lightning, Accelerate and torchdata trainers",
    "loader/test_imagenet_example.py": "pytorch/examples' ImageNet script, both ways",
    "loader/test_workers.py": "workers started, killed and hung, across epochs",
    "loader/image/test_decoder_fallback.py": "processes without torchcodec, or a broken one",
}
_TESTS = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    for item in items:
        if PHOTO_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.photos)
        where = Path(item.fspath).resolve().relative_to(_TESTS).as_posix()
        if any(where == path or (path.endswith("/") and where.startswith(path)) for path in INTEGRATION):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(autouse=True)
def _alone_when_marked_exclusive(request, tmp_path_factory) -> Iterator[None]:
    """Under ``pytest -n 2``, a test marked ``exclusive`` (it times something) runs with no other test.

    Every test holds a shared lock while it runs, an exclusive one the lock alone; a gate taken on
    the way in stops new tests while an exclusive one waits, so it is never starved. The lock files
    sit in the run's temporary directory, which the two worker processes share. POSIX record locks
    (``lockf``), not ``flock``: a process forked during a test (a persistent DataLoader worker that
    outlives it) would inherit an ``flock`` and hold it for ever. Without ``-n`` (or without
    ``fcntl``) nothing is locked: tests run one at a time anyway.
    """
    if "PYTEST_XDIST_WORKER" not in os.environ or fcntl is None:
        yield
        return
    shared = tmp_path_factory.getbasetemp().parent  # .../pytest-N: the workers' basetemps are below it
    mode = fcntl.LOCK_EX if request.node.get_closest_marker("exclusive") else fcntl.LOCK_SH
    with (shared / "imgshards-gate").open("a+") as gate, (shared / "imgshards-lock").open("a+") as lock:
        fcntl.lockf(gate, fcntl.LOCK_EX)
        try:
            fcntl.lockf(lock, mode)
        finally:
            fcntl.lockf(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.lockf(lock, fcntl.LOCK_UN)


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


# ---- trees that mix image formats, as real photo folders do, cut from tiny_tree's real JPEGs ----

# (class index, file, format, mode): what `mixed_tree` replaces some of tiny_tree's JPEGs with.
MIXED = [
    (0, "a.png", "PNG", "RGB"),
    (0, "b.png", "PNG", "RGBA"),  # left half transparent
    (1, "c.webp", "WEBP", "RGB"),
    (1, "d.bmp", "BMP", "RGB"),
    (2, "e.tiff", "TIFF", "RGB"),
    (2, "f.png", "PNG", "P"),
    (3, "g.bmp", "BMP", "L"),
]


def encode(im: Image.Image, fmt: str) -> bytes:
    buf = io.BytesIO()
    im.save(buf, format=fmt, **({"lossless": True} if fmt == "WEBP" else {}))
    return buf.getvalue()


def as_mode(im: Image.Image, mode: str) -> Image.Image:
    if mode == "RGBA":
        rgba = im.convert("RGBA")
        alpha = np.full((im.height, im.width), 255, dtype=np.uint8)
        alpha[:, : im.width // 2] = 0
        rgba.putalpha(Image.fromarray(alpha))
        return rgba
    if mode == "P":
        return im.convert("P", palette=Image.Palette.ADAPTIVE, colors=64)
    return im.convert(mode)


@pytest.fixture(scope="session")
def mixed_tree(tmp_path_factory, tiny_tree) -> Path:
    """tiny_tree (4 classes x 10 JPEGs) with 7 of its JPEGs replaced by PNG, WebP, BMP and TIFF files.

    One PNG is RGBA (its left half transparent), one a palette image, one BMP grayscale. Do not
    modify it.
    """
    root = tmp_path_factory.mktemp("mixed") / "src"
    shutil.copytree(tiny_tree, root)
    classes = sorted(p for p in root.iterdir())
    for cls, name, fmt, mode in MIXED:
        victim = sorted(classes[cls].glob("*.JPEG"))[0]
        with Image.open(victim) as im:
            data = encode(as_mode(im.convert("RGB"), mode), fmt)
        victim.unlink()
        (classes[cls] / name).write_bytes(data)
    return root


@pytest.fixture(scope="session")
def mixed_packed(mixed_tree, packed_factory) -> Path:
    """``mixed_tree`` packed with the defaults (one format: JPEG) and a held-out val split."""
    return packed_factory(mixed_tree, shard_size=30_000, val_fraction=0.2)


# ---- shards written by another tool (webdataset's ShardWriter), for `imgshards index` -------------


def write_foreign_shards(tree: Path, dst: Path, *, per_shard: int = 10, shuffle: bool = False) -> list[dict]:
    """Write ImageFolder ``tree`` as ``webdataset.ShardWriter`` shards into ``dst``; return the samples.

    Each sample: ``jpg`` (the file's bytes), ``cls`` (the class id), ``json`` (``{"label": name,
    "id": id}``). Keys have dots in their directory (``n00000000.v1/n00000000_3``); the first
    sample's key is not ASCII, so its shard holds a pax header (``format="PAX_FORMAT"``). Samples
    go in class order (one or two classes a shard), or shuffled with a fixed seed.
    """
    import webdataset as wds

    classes = sorted(d.name for d in tree.iterdir())
    samples = [
        {"class": name, "id": i, "path": path}
        for i, name in enumerate(classes)
        for path in sorted((tree / name).iterdir())
    ]
    if shuffle:
        random.Random(0).shuffle(samples)
    dst.mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(
        str(dst / "shard-%06d.tar"), maxcount=per_shard, format="PAX_FORMAT", verbose=0
    ) as sink:
        for n, s in enumerate(samples):
            stem = s["path"].stem if n else f"é-{s['path'].stem}"
            s["key"] = f"{s['class']}.v1/{stem}"
            s["jpg"] = s["path"].read_bytes()
            sink.write(
                {
                    "__key__": s["key"],
                    "jpg": s["jpg"],
                    "cls": s["id"],
                    "json": {"label": s["class"], "id": s["id"]},
                }
            )
    return samples


@pytest.fixture
def foreign_factory(tmp_path):
    """``foreign_factory(tree, **kw)``: :func:`write_foreign_shards` into a fresh directory."""
    count = iter(range(1000))

    def factory(tree: Path, **kwargs) -> tuple[Path, list[dict]]:
        dst = tmp_path / f"foreign{next(count)}"
        return dst, write_foreign_shards(tree, dst, **kwargs)

    return factory
