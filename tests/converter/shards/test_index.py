"""``imgshards index``: an index for shards that webdataset's ShardWriter wrote, read, never written.

Through the library and the command (cli/index.py); at a URL, the index is written by
converter/write/indexurl.py.
"""

import hashlib
import json
import shutil
import subprocess
import sys

import fsspec
import pytest
import webdataset as wds
from click.testing import CliRunner

from imgshards.cli.main import cli
from imgshards.converter import (
    DestinationError,
    IndexConfig,
    ManifestError,
    SourceError,
    index,
    read_classes,
    read_manifest,
    verify,
    verify_url,
)
from imgshards.converter.format.manifest import INDEX_NAME, TIMM_INFO_NAME

# `bench` decodes through torchvision, whose codecs 0.29 deprecates (as in tests/loader).
pytestmark = pytest.mark.filterwarnings("ignore:The image decoding and encoding:DeprecationWarning")


def snapshot(root):
    return {
        p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
        for p in root.iterdir()
        if p.is_file()
    }


def written(root):
    """What ``index`` writes beside the shards: the index, timm's, the split's table files."""
    split = read_manifest(root).split("train")
    return {INDEX_NAME, TIMM_INFO_NAME, *split.table_names}


@pytest.fixture
def foreign(foreign_factory, tiny_tree):
    """4 class-sorted ShardWriter shards of 10 samples (one class each) and their samples."""
    return foreign_factory(tiny_tree)


def test_index_reads_shards_never_writes_them_and_verify_passes(foreign):
    root, samples = foreign
    before = snapshot(root)
    result = index(root, IndexConfig(workers=2))
    after = snapshot(root)
    assert {k: v for k, v in after.items() if k not in written(root)} == before
    assert [p.name for p in root.iterdir() if p.is_dir()] == [".imgshards"]  # the index lock, as pack's
    split = read_manifest(root).split("train")
    assert sorted(split.tables) == ["keys", "labels", "sources", "starts"]
    assert [s.name for s in split.shards] == sorted(before)
    assert [s.samples for s in split.shards] == [10, 10, 10, 10] and split.samples == len(samples)
    assert [s.bytes for s in split.shards] == [(root / s.name).stat().st_size for s in split.shards]
    assert split.shards[0].sha256 == hashlib.sha256((root / split.shards[0].name).read_bytes()).hexdigest()
    assert result.manifest.classes == ("0", "1", "2", "3") and result.classes_from == "derived"
    assert split.class_counts == (10, 10, 10, 10)
    info = json.loads((root / TIMM_INFO_NAME).read_text())
    assert info["splits"]["train"]["shard_lengths"] == [10, 10, 10, 10]
    report = verify(root, workers=2)  # keys with dots in their folder, a pax header: 40 samples
    assert report.ok, report.problems


def test_labels_from_a_json_field_by_name_or_id(foreign, tiny_tree):
    root, _ = foreign
    names = tuple(sorted(d.name for d in tiny_tree.iterdir()))
    by_name = index(root, IndexConfig(label_field="label", workers=1))
    assert by_name.manifest.classes == names and by_name.info.labels.names
    assert by_name.info.labels.member == "json" and by_name.info.labels.key == "label"
    assert verify(root, workers=1).ok
    by_id = index(root, IndexConfig(label_field="id", classes=names, workers=1))
    assert by_id.classes_from == "given" and not by_id.info.labels.names
    assert by_id.info.class_counts == (10, 10, 10, 10) and verify(root, workers=1).ok


def test_class_sorted_shards_are_warned_about_and_shuffled_ones_are_not(foreign_factory, tiny_tree):
    sorted_root, _ = foreign_factory(tiny_tree)
    result = index(sorted_root, IndexConfig(workers=1))
    assert result.classes_per_shard == 1.0 and result.shuffled_classes_per_shard > 3.5
    assert len(result.warnings) == 1 and "class-sorted" in result.warnings[0]
    shuffled_root, _ = foreign_factory(tiny_tree, shuffle=True)
    result = index(shuffled_root, IndexConfig(workers=1))
    assert result.classes_per_shard > 3 and not result.warnings


def test_a_second_split_keeps_the_classes_and_may_not_share_shards(foreign, tiny_tree):
    root, _ = foreign
    names = tuple(sorted(d.name for d in tiny_tree.iterdir()))
    train = IndexConfig(shards="shard-00000[01].tar", label_field="label", workers=1)
    index(root, train)  # classes derived from its labels: the first two
    with pytest.raises(DestinationError, match=r"not among the classes of split\(s\) \['train'\]"):
        index(root, IndexConfig(split="val", shards="shard-00000[23].tar", label_field="label", workers=1))
    index(root, IndexConfig(shards="shard-00000[01].tar", label_field="label", classes=names, workers=1))
    val = index(root, IndexConfig(split="val", shards="shard-00000[23].tar", label_field="label", workers=1))
    assert val.classes_from == "index" and val.info.class_counts == (0, 0, 10, 10)
    assert sorted(read_manifest(root).splits) == ["train", "val"] and verify(root, workers=1).ok
    with pytest.raises(
        DestinationError, match=r"2 of these shards are already in split 'train' \(shard-000000\.tar"
    ):
        index(root, IndexConfig(split="test", workers=1))


def test_a_split_that_pack_made_is_replaced_only_with_overwrite(tiny_packed, tmp_path):
    root = shutil.copytree(tiny_packed, tmp_path / "packed")
    with pytest.raises(DestinationError, match="made by `imgshards pack`"):
        index(root, IndexConfig(shards="train-*.tar", workers=1))
    result = index(root, IndexConfig(shards="train-*.tar", overwrite=True, workers=1))
    assert result.info.samples == 40 and verify(root, workers=1).ok


def test_another_tools_index_json_is_left_alone(foreign):
    root, _ = foreign
    theirs = '{"version": 2, "shards": []}'  # MosaicML streaming's index.json, say
    (root / INDEX_NAME).write_text(theirs)
    with pytest.raises(DestinationError, match="move it away first"):
        index(root, IndexConfig(workers=1))
    assert (root / INDEX_NAME).read_text() == theirs


@pytest.mark.parametrize(
    "scheme", ["", "local://"]
)  # a directory; a URL of a file system without atomic puts
def test_a_full_disk_is_one_line_and_leaves_nothing_behind(foreign, tmpfs, scheme):
    root, _ = foreign
    disk = tmpfs(sum(p.stat().st_size for p in root.iterdir()) + (1 << 20))
    shards = shutil.copytree(root, disk / "shards")
    before = sorted(p.name for p in shards.iterdir())
    tmpfs.fill(disk)  # the first table file, written first, finds the device full
    result = CliRunner().invoke(cli, ["index", f"{scheme}{shards}", "--workers", "1"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.stderr.count("\n") == 1 and "No space left on device" in result.stderr
    written = "upload train=starts." if scheme else f"write the index into {shards}"
    assert f"cannot {written}" in result.stderr
    # No index, no table file, no temporary file; locally, the folder of the index lock (as pack's).
    lock = [] if scheme else [".imgshards"]
    assert sorted(p.name for p in shards.iterdir()) == sorted([*before, *lock])


def test_an_index_that_cannot_be_put_in_place_leaves_no_temporary_file(foreign):
    root, _ = foreign
    (root / TIMM_INFO_NAME).mkdir()  # a directory holds the name, and is not empty: no rename onto it
    (root / TIMM_INFO_NAME / "theirs").write_text("")
    with pytest.raises(DestinationError, match=f"{TIMM_INFO_NAME} is a directory"):
        index(root, IndexConfig(workers=1))
    assert [p.name for p in root.glob(".*")] == [".imgshards"], "a temporary file stayed"
    assert not (root / INDEX_NAME).exists()
    assert not list(root.glob("train=*")), "a table file of no index stayed"


def write(path, samples, **kw):
    with wds.TarWriter(str(path), **kw) as sink:
        for s in samples:
            sink.write(s)


def test_samples_the_loader_cannot_read_are_named(tmp_path, tiny_tree):
    jpg = next(tiny_tree.rglob("*.JPEG")).read_bytes()
    write(
        tmp_path / "a.tar", [{"__key__": "x/ok", "jpg": jpg, "cls": 0}, {"__key__": "x/nolabel", "jpg": jpg}]
    )
    write(tmp_path / "b.tar", [{"__key__": "y/odd", "jpeg": jpg, "cls": 1}])
    with pytest.raises(SourceError) as e:
        index(tmp_path, IndexConfig(workers=1))
    message = str(e.value)
    assert "2 sample(s) in 2 of 2 shards" in message
    assert "a.tar: sample 'x/nolabel' has no .cls member" in message
    assert "b.tar: sample 'y/odd' has members ['cls', 'jpeg']: not one image among jpg" in message
    assert not (tmp_path / INDEX_NAME).exists()
    result = CliRunner().invoke(cli, ["index", str(tmp_path)])
    assert result.exit_code == 1 and "x/nolabel" in result.output  # the data is bad


def test_bad_labels_and_classes_are_refused(tmp_path, tiny_tree):
    jpg = next(tiny_tree.rglob("*.JPEG")).read_bytes()
    write(
        tmp_path / "a.tar",
        [{"__key__": f"k{i}", "jpg": jpg, "cls": i, "json": {"c": c}} for i, c in enumerate([3, "dog"])],
    )
    with pytest.raises(SourceError, match="holds both class ids and names"):
        index(tmp_path, IndexConfig(label_field="c", workers=1))
    with pytest.raises(SourceError, match="class id 1, but there are 1 classes given"):
        index(tmp_path, IndexConfig(classes=("cat",), workers=1))
    with pytest.raises(SourceError, match=r"no shard in .* matches 'val-\*\.tar'"):
        index(tmp_path, IndexConfig(shards="val-*.tar", workers=1))
    with pytest.raises(ValueError, match="glob of file names"):
        IndexConfig(shards="sub/*.tar")


def test_class_names_file_one_a_line_or_json(tmp_path):
    (tmp_path / "c.txt").write_text("cat\ndog\n\n")
    (tmp_path / "c.json").write_text('["cat", "dog"]')
    assert read_classes(tmp_path / "c.txt") == read_classes(tmp_path / "c.json") == ("cat", "dog")
    (tmp_path / "empty.txt").write_text("\n")
    with pytest.raises(SourceError, match="holds no class names"):
        read_classes(tmp_path / "empty.txt")


def test_cli_index_then_verify_info_and_bench(foreign, tmp_path, tiny_tree):
    root, _ = foreign
    classes = tmp_path / "classes.txt"
    classes.write_text("".join(f"{d.name}\n" for d in sorted(tiny_tree.iterdir())))
    runner = CliRunner()
    result = runner.invoke(cli, ["index", str(root), "--classes", str(classes), "--workers", "2"])
    assert result.exit_code == 0, result.output
    assert "indexed split 'train'" in result.stdout and "40 samples of 4 classes in 4 shards" in result.stdout
    assert "warning: shards look class-sorted" in result.stderr
    assert runner.invoke(cli, ["verify", str(root)]).exit_code == 0
    assert "train: 40 samples" in runner.invoke(cli, ["info", str(root)]).stdout
    bench = ["bench", str(root), "--workers", "0", "--batches", "2", "--batch-size", "8", "--no-progress"]
    benched = runner.invoke(cli, bench)
    assert benched.exit_code == 0 and "40 images in 4 shards" in benched.stdout, benched.output
    bad = runner.invoke(cli, ["index", str(root), "--shards", "nothing-*.tar"])
    assert bad.exit_code == 2  # cannot run
    assert bad.output.startswith("Error: no shard in") and "Traceback" not in bad.output


def test_a_url_is_read_and_indexed_through_fsspec(foreign):
    root, _ = foreign
    fs = fsspec.filesystem("memory")
    url = "memory://imgshards-index-test"
    for path in root.iterdir():
        fs.pipe_file(f"{url}/{path.name}", path.read_bytes())
    try:
        result = index(url, IndexConfig(label_field="label", workers=2))
        assert result.info.samples == 40
        assert read_manifest(url).split("train") == result.info
        assert verify_url(url).ok
    finally:
        fs.rm(url, recursive=True)


def test_a_hostile_labels_entry_is_refused_naming_the_field(foreign):
    root, _ = foreign
    index(root, IndexConfig(label_field="label", workers=1))
    document = json.loads((root / INDEX_NAME).read_text())
    for bad in ({"member": "txt"}, {"member": "json", "key": ""}, {"member": "cls", "key": "x"}, [1]):
        document["splits"]["train"]["labels"] = bad
        (root / INDEX_NAME).write_text(json.dumps(document))
        with pytest.raises(ManifestError, match=r"splits\.train\.labels"):
            read_manifest(root)


# A writer of the index stopped after it read its shards, before it writes (issue 50): it prints
# "scanned" and waits for a line on stdin. Every other part of it is the command as users run it.
PAUSED_INDEX = """
import sys
from imgshards.cli.main import cli
from imgshards.converter.shards import index as indexing

read = indexing._raise_problems

def paused(scans, src):
    read(scans, src)
    print("scanned", flush=True)
    sys.stdin.readline()

indexing._raise_problems = paused
cli(sys.argv[1:], prog_name="imgshards")
"""


@pytest.fixture
def classes_file(tiny_tree, tmp_path):
    path = tmp_path / "classes.txt"
    path.write_text("".join(f"{d.name}\n" for d in sorted(tiny_tree.iterdir())))
    return path


def run_beside_a_paused_index(root, classes_file, second):
    """Start ``index`` of split train, stopped once it read its shards; run ``second``; let it go on."""
    args = ["--split", "train", "--shards", "shard-00000[01].tar", "--classes", str(classes_file), "-j", "1"]
    first = subprocess.Popen(
        [sys.executable, "-c", PAUSED_INDEX, "index", str(root), *args, "--no-progress"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert first.stdout.readline() == "scanned\n", first.stderr.read()
        done = subprocess.run(
            [sys.executable, "-m", "imgshards.cli", *second], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        out, err = first.communicate("\n", timeout=120)
    finally:
        first.kill()
    assert first.returncode == 0, err
    assert "indexed split 'train'" in out
    return done


def test_two_index_runs_at_once_both_land(foreign, classes_file):
    # Issue 50.1: the second split used to be lost, the first index writing what it read at its start.
    root, _ = foreign
    second = ["index", str(root), "--split", "val", "--shards", "shard-00000[23].tar"]
    done = run_beside_a_paused_index(root, classes_file, [*second, "--classes", str(classes_file), "-j", "1"])
    assert "indexed split 'val'" in done.stdout
    manifest = read_manifest(root)
    assert sorted(manifest.splits) == ["train", "val"]
    assert [s.samples for s in manifest.splits.values()] == [20, 20]
    assert verify(root, workers=1).ok


def test_a_pack_while_index_runs_both_land(foreign, classes_file, tiny_tree):
    # Issue 50.2: a split packed meanwhile used to be lost from the index, its shards orphaned.
    root, _ = foreign
    pack = ["pack", str(tiny_tree), str(root), "--split", "val", "--shard-size", "20kB", "-j", "1"]
    run_beside_a_paused_index(root, classes_file, [*pack, "--no-progress"])
    manifest = read_manifest(root)
    assert sorted(manifest.splits) == ["train", "val"]
    val = manifest.split("val")
    assert val.samples == 40 and sorted(s.name for s in val.shards) == sorted(
        p.name for p in root.glob("val-*.tar")
    )
    assert manifest.split("train").samples == 20
    assert verify(root, workers=1).ok
