"""A hostile remote index (issue 12, case 1): served over HTTP on 127.0.0.1 by a server with no directory
listing (so the shard-presence check cannot run), it must not make the cache write outside its directory.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from imgshards.converter import ManifestError, verify_url
from imgshards.loader import ShardDataset, make_loader
from imgshards.loader.remote.cache import ShardCache


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


@pytest.fixture
def served(remote_packed, tmp_path) -> tuple[Path, Path]:
    """``tmp/www/ds``: a copy of ``remote_packed`` to serve; ``tmp/site``: where an attacker aims."""
    ds = tmp_path / "www" / "ds"
    shutil.copytree(remote_packed, ds)
    site = tmp_path / "site"
    site.mkdir()
    return ds, site


def _hostile(ds: Path, edit) -> None:
    index = json.loads((ds / "index.json").read_text())
    edit(index["splits"]["train"])
    (ds / "index.json").write_text(json.dumps(index))


def test_a_shard_name_aimed_at_site_packages_writes_nothing_anywhere(http_serve, served, tmp_path):
    ds, site = served
    payload = b"import os; os.system('touch PWNED')\n"
    (ds / "evil.pth").write_bytes(payload)  # served, sha256 and size matching the index
    depth = len(tmp_path.parts) + 3
    name = "../" * depth + str(site / "evil.pth").lstrip("/")

    def evil(split: dict) -> None:
        split["shards"][0].update(name=name, bytes=len(payload), sha256=hashlib.sha256(payload).hexdigest())

    _hostile(ds, evil)
    base, state = http_serve(tmp_path / "www", listing=False)
    cache = tmp_path / "cache"
    with pytest.raises(ManifestError, match=r"splits\.train\.shards\[0\]\.name is '\.\./.*plain file name"):
        ShardDataset(f"{base}/ds", cache_dir=cache, cache_limit=10**7)
    with pytest.raises(ManifestError, match=r"shards\[0\]\.name"):
        verify_url(f"{base}/ds")
    assert _files(site) == [] and not (tmp_path / "PWNED").exists()
    assert [p for p in _files(cache) if p.name != ".lock"] == []
    assert not [r for r in state.gets() if "evil" in r.path], "nothing was fetched for the hostile name"


def test_the_cache_refuses_a_name_with_a_path_in_it(tmp_path):
    cache = ShardCache(tmp_path / "cache", 10**6)
    for name in ("../x.pth", "/etc/passwd", "a/b.tar", "pipe:cat x.tar"):
        with pytest.raises(ManifestError, match="plain file name"):
            cache.reserve(name, "0" * 64, 10)
    assert _files(tmp_path) == []


@pytest.mark.parametrize("size", [-1, 2**50, 25.7, True])
def test_a_shard_size_out_of_bounds_is_refused_before_any_file_is_made(http_serve, served, tmp_path, size):
    ds, _ = served
    _hostile(ds, lambda split: split["shards"][1].update(bytes=size))
    base, _ = http_serve(tmp_path / "www", listing=False)
    cache = tmp_path / "cache"
    with pytest.raises(
        ManifestError, match=r"splits\.train\.shards\[1\]\.bytes is .*expected an integer in 0\.\."
    ):
        ShardDataset(f"{base}/ds", cache_dir=cache, cache_limit=10**7)
    assert not cache.exists() or [p for p in _files(cache) if p.name != ".lock"] == []


def test_an_honest_dataset_on_a_server_without_listing_streams_through_the_cache(
    http_serve, served, tmp_path
):
    del served  # the copy under www/ds is what is served
    base, _ = http_serve(tmp_path / "www", listing=False)
    cache = tmp_path / "cache"
    dataset = ShardDataset(
        f"{base}/ds", mode="eval", batch_size=8, image_size=32, cache_dir=cache, cache_limit=10**7
    )
    batches = list(make_loader(dataset, num_workers=0))
    assert sum(len(b.labels) for b in batches) == dataset.num_samples
    cached = [p.name for p in _files(cache) if p.suffix == ".tar"]
    assert len(cached) == len(dataset.part.split.shards)
    assert all(p.parent == cache for p in _files(cache))
