"""``imgshards index --upgrade``: a format-1 index rewritten as format 2, no shard read or changed.

The format-1 dataset is the one the last release (39ce913) packed, kept in tests/converter/format1/
(its README says how it was made), with the tree it was packed from. Also here: every other writer
meeting a format-1 index (``pack`` and ``index`` adding a split, ``pack --overwrite``) writes it as
format 2, and an index of a newer format is one line.
"""

import hashlib
import json
import shutil
from pathlib import Path

import fsspec
import pytest
import webdataset as wds
from click.testing import CliRunner

from imgshards.cli.main import cli
from imgshards.converter import (
    IndexConfig,
    PackConfig,
    index,
    pack,
    pack_to_url,
    read_manifest,
    upgrade_index,
    verify,
    verify_url,
)
from imgshards.converter.format.manifest import INDEX_NAME

FORMAT1 = Path(__file__).resolve().parents[1] / "format1"
SHARD_SIZE = 8000  # what the fixture was packed with (--shard-size 8kB)


@pytest.fixture
def old(tmp_path):
    """A copy of the format-1 dataset."""
    return Path(shutil.copytree(FORMAT1 / "dataset", tmp_path / "old"))


def shards_of(root):
    """Each shard's bytes' digest and mtime: what must not change."""
    return {
        p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns) for p in root.glob("*.tar")
    }


def tables_of(root):
    """The table files at ``root``, by name, with their bytes."""
    return {p.name: p.read_bytes() for p in sorted(root.iterdir()) if p.suffix in (".u32", ".zlib")}


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """The fixture's tree packed by this version (format 2)."""
    dst = tmp_path_factory.mktemp("fresh") / "ds"
    pack(FORMAT1 / "tree", dst, PackConfig(shard_size=SHARD_SIZE, workers=1))
    return dst


def test_an_upgrade_writes_the_tables_a_pack_writes_and_touches_no_shard(old, fresh):
    shards = shards_of(old)
    result = upgrade_index(old)
    assert result.changed and result.version == 1 and result.manifest.version == 2
    assert shards_of(old) == shards  # not written, not even touched
    assert read_manifest(old).version == 2 and read_manifest(old) == result.manifest
    assert shards == {n: (d, shards[n][1]) for n, (d, _) in shards_of(fresh).items()}  # the same shards
    assert tables_of(old) == tables_of(fresh) and len(tables_of(old)) == result.table_files == 4
    assert read_manifest(old).split("train").tables == read_manifest(fresh).split("train").tables
    assert verify(old, workers=1).ok
    again = upgrade_index(old)
    assert not again.changed and again.version == 2


def test_the_command_says_what_it_did_in_one_line(old):
    runner = CliRunner()
    before = runner.invoke(cli, ["info", str(old)])
    assert "index format 1" in before.stdout and f"imgshards index --upgrade {old}" in before.stdout
    done = runner.invoke(cli, ["index", "--upgrade", str(old)])
    assert done.exit_code == 0, done.output
    assert done.stdout == (
        f"upgraded {old}/index.json from format 1 to 2: 4 table files (157 B) for 1 split; "
        "the shards are unchanged\n"
    )
    index_bytes = (old / INDEX_NAME).read_bytes()
    again = runner.invoke(cli, ["index", "--upgrade", str(old), "--json"])
    assert again.exit_code == 0 and json.loads(again.stdout)["upgraded"] is False
    assert (old / INDEX_NAME).read_bytes() == index_bytes
    said = runner.invoke(cli, ["index", "--upgrade", str(old)])
    assert said.stdout == f"{old}/index.json is already format 2: nothing to upgrade, nothing changed\n"
    assert "index format 2" in runner.invoke(cli, ["info", str(old)]).stdout
    refused = runner.invoke(cli, ["index", "--upgrade", str(old), "--split", "val"])
    assert refused.exit_code == 2 and "--upgrade reads no shard: --split does not apply" in refused.output


def test_info_json_of_a_format_1_index_says_its_version_and_leaves_its_tables_out(old):
    done = CliRunner().invoke(cli, ["info", str(old), "--json"])
    doc = json.loads(done.stdout)
    assert doc["version"] == 1 and doc["splits"]["train"]["samples"] == 6
    assert set(doc["splits"]["train"]["shards"][0]) == {"name", "samples", "bytes", "sha256"}


def test_a_split_added_to_a_format_1_dataset_upgrades_the_others(old, fresh, tmp_path):
    # pack: the other split's tables written from the old index, as the upgrade writes them.
    pack(FORMAT1 / "tree", old, PackConfig(split="val", shard_size=SHARD_SIZE, workers=1))
    manifest = read_manifest(old)
    assert manifest.version == 2 and sorted(manifest.splits) == ["train", "val"]
    assert manifest.split("train").tables == read_manifest(fresh).split("train").tables
    assert verify(old, workers=1).ok
    # index: the same, for another tool's shards beside a format-1 index.
    other = Path(shutil.copytree(FORMAT1 / "dataset", tmp_path / "other"))
    with wds.TarWriter(str(other / "extra-000000.tar")) as sink:
        for i, path in enumerate(sorted((FORMAT1 / "tree").rglob("*.jpg"))):
            sink.write({"__key__": f"k{i}", "jpg": path.read_bytes(), "cls": int(path.parent.name == "dog")})
    index(other, IndexConfig(split="extra", shards="extra-*.tar", workers=1))
    manifest = read_manifest(other)
    assert manifest.version == 2 and manifest.classes == ("cat", "dog")  # kept from the index
    assert manifest.split("train").tables == read_manifest(fresh).split("train").tables
    assert verify(other, workers=1).ok


def test_overwriting_the_split_of_a_format_1_dataset(old):
    before = {p.name for p in old.glob("*.tar")}
    result = pack(FORMAT1 / "tree", old, PackConfig(shard_size=4000, overwrite=True, workers=1))
    manifest = read_manifest(old)
    assert manifest.version == 2 and manifest == result.manifest
    assert {p.name for p in old.glob("*.tar")} == {s.name for s in manifest.split("train").shards} != before
    assert set(tables_of(old)) == set(manifest.split("train").table_names)
    assert verify(old, workers=1).ok


def test_an_upgrade_at_a_url(old):
    url = "memory://imgshards-upgrade/ds"
    fs = fsspec.filesystem("memory")
    for path in old.rglob("*"):
        if path.is_file():
            fs.pipe_file(f"{url}/{path.relative_to(old).as_posix()}", path.read_bytes())
    try:
        shards = {p.name: fs.cat_file(f"{url}/{p.name}") for p in old.glob("*.tar")}
        result = upgrade_index(url)
        assert result.changed and read_manifest(url).version == 2
        assert {n: fs.cat_file(f"{url}/{n}") for n in shards} == shards
        upgrade_index(old)
        assert {n: fs.cat_file(f"{url}/{n}") for n in tables_of(old)} == tables_of(old)
        assert verify_url(url).ok and not upgrade_index(url).changed
    finally:
        fs.rm("/imgshards-upgrade", recursive=True)


def test_an_index_of_a_newer_format_is_one_line(old):
    document = json.loads((old / INDEX_NAME).read_text())
    document["version"] = 3
    (old / INDEX_NAME).write_text(json.dumps(document))
    for command in (["info"], ["verify"], ["index", "--upgrade"]):
        done = CliRunner().invoke(cli, [*command, str(old)])
        assert done.exit_code == 2 and "Traceback" not in done.output, done.output
        assert done.stderr == (
            f"Error: {old}/index.json has format version 3; this imgshards reads versions 1, 2: "
            "upgrade imgshards (pip install -U imgshards)\n"
        )


def put_in_memory(root, url):
    fs = fsspec.filesystem("memory")
    for path in root.rglob("*"):
        if path.is_file():
            fs.pipe_file(f"{url}/{path.relative_to(root).as_posix()}", path.read_bytes())
    return fs


def names_at(fs, url):
    return sorted(p.rsplit("/", 1)[-1] for p in fs.ls(url, detail=False))


def test_a_pack_to_a_url_holding_a_format_1_index_upgrades_it(old, fresh):
    url = "memory://imgshards-upgrade-pack/ds"
    fs = put_in_memory(old, url)
    try:
        pack_to_url(FORMAT1 / "tree", url, PackConfig(split="val", shard_size=SHARD_SIZE, workers=1))
        manifest = read_manifest(url)
        assert manifest.version == 2 and sorted(manifest.splits) == ["train", "val"]
        assert manifest.split("train").tables == read_manifest(fresh).split("train").tables
        assert verify_url(url).ok
    finally:
        fs.rm("/imgshards-upgrade-pack", recursive=True)


def test_overwriting_the_split_of_a_format_1_index_at_a_url(old):
    url = "memory://imgshards-upgrade-overwrite/ds"
    fs = put_in_memory(old, url)
    try:
        result = pack_to_url(FORMAT1 / "tree", url, PackConfig(shard_size=4000, overwrite=True, workers=1))
        manifest = read_manifest(url)
        assert manifest.version == 2 and manifest == result.manifest
        tables = {n for n in names_at(fs, url) if n.endswith((".u32", ".zlib"))}
        assert tables == set(manifest.split("train").table_names)
        assert {n for n in names_at(fs, url) if n.endswith(".tar")} == {
            s.name for s in manifest.split("train").shards
        }
        assert verify_url(url).ok
    finally:
        fs.rm("/imgshards-upgrade-overwrite", recursive=True)
