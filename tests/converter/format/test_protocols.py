"""The table of storage protocols (converter/format/protocols.py) and what reads it in the converter.

Adding a backend is one entry in the table: these tests hold the table together (each scheme once,
each extra one that pyproject.toml installs) and check what each entry's fields do where the
converter reads them (timeouts, the URL-typo check, atomic uploads).
"""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from imgshards.converter.format import protocols
from imgshards.converter.format.locate import is_url, local_path, url_typo
from imgshards.converter.format.remotefs import Remote, with_timeouts

ROOT = Path(__file__).resolve().parents[3]


def test_each_scheme_is_in_one_entry():
    seen: dict[str, str] = {}
    for p in protocols.PROTOCOLS:
        assert p.schemes, p.name
        for s in p.schemes:
            assert s == s.lower() and "://" not in s, (p.name, s)
            assert s not in seen, f"{s!r} in both {seen[s]} and {p.name}"
            seen[s] = p.name
    assert set(seen) == protocols.SCHEMES


def test_each_extra_is_one_pyproject_installs():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for p in protocols.PROTOCOLS:
        assert p.extra is None or p.extra in extras, f"{p.name}: no extra {p.extra!r} in pyproject.toml"


@pytest.mark.parametrize(
    ("url", "name"),
    [
        ("s3://bucket/x", "S3"),
        ("S3A://bucket/x", "S3"),
        ("gs://bucket/x", "Google Cloud Storage"),
        ("https://host/x", "HTTP(S)"),
        ("abfs://c/x", "Azure"),
        ("file:///tmp/x", "local files"),
        ("nosuch://x", None),
        ("/tmp/s3", None),
    ],
)
def test_for_url(url, name):
    p = protocols.for_url(url)
    assert (p.name if p else None) == name


def test_for_fs_reads_the_file_systems_protocol_names():
    import fsspec

    assert protocols.for_fs(fsspec.filesystem("memory")).name == "memory"
    assert protocols.for_fs(fsspec.filesystem("https")).version is protocols.Version.ANSWER_HEADERS
    assert protocols.for_fs(fsspec.filesystem("s3", anon=True)).version is protocols.Version.IF_MATCH
    assert protocols.for_names(["zip", "nosuch"]) is None


def test_with_timeouts_per_protocol():
    http = with_timeouts("https://host/ds", None, 7.0)["client_kwargs"]["timeout"]
    assert http == aiohttp.ClientTimeout(total=None, sock_connect=7.0, sock_read=7.0)
    for url in ("s3://b/ds", "s3a://b/ds"):
        assert with_timeouts(url, {"anon": True}, 7.0) == {
            "anon": True,
            "config_kwargs": {"connect_timeout": 7.0, "read_timeout": 7.0},
        }
    # A timeout the options set wins; other options under the same key stay.
    mine = {"config_kwargs": {"read_timeout": 1.0, "region_name": "x"}}
    assert with_timeouts("s3://b", mine, 7.0)["config_kwargs"] == {
        "read_timeout": 1.0,
        "region_name": "x",
        "connect_timeout": 7.0,
    }
    assert mine == {"config_kwargs": {"read_timeout": 1.0, "region_name": "x"}}  # not changed in place
    # No timeout option for a file system that takes none (the loader bounds its waits itself).
    assert with_timeouts("gs://b/ds", {"token": "anon"}, 7.0) == {"token": "anon"}
    assert with_timeouts("/local/ds", None, 7.0) == {}
    with pytest.raises(ValueError, match="positive"):
        with_timeouts("s3://b", None, 0)


@pytest.mark.parametrize("scheme", sorted(protocols.SCHEMES))
def test_a_url_with_a_slash_missing_is_caught_for_each_scheme(scheme):
    assert url_typo(f"{scheme}:/bucket/x") == f"{scheme}://bucket/x"
    assert url_typo(f"{scheme.upper()}:bucket") == f"{scheme.upper()}://bucket"


def test_a_file_url_is_a_local_path():
    assert not is_url("file:///tmp/ds")
    assert local_path("file:///tmp/ds") == Path("/tmp/ds")
    assert is_url("memory://ds")
    assert url_typo("notascheme:/x") is None


def test_uploads_are_atomic_on_object_stores_only(tmp_path):
    assert not Remote(f"file://{tmp_path}", {}).atomic_put  # written beside, then renamed
    assert not Remote("memory://protocols-test", {}).atomic_put
    assert Remote("s3://bucket/ds", {"anon": True}).atomic_put  # made, not contacted
