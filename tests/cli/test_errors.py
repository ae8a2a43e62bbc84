"""A newcomer's mistakes: each gets one line that names the next command, and the project's exit code.

Exit codes (cli/exits.py): 0 done, 1 the data is bad, 2 cannot run, 130 interrupted.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from imgshards.cli.main import cli
from imgshards.converter import (
    DestinationError,
    ManifestError,
    PackConfig,
    SourceError,
    make_synthetic_tree,
    pack,
    read_manifest,
    tree_warnings,
)

from .conftest import one_line_error, run

# ---- errors that name the next command ----------------------------------------------------------


def test_packing_the_next_split_without_split_suggests_split_not_overwrite(tiny_tree, tmp_path):
    photos = tmp_path / "photos"
    shutil.copytree(tiny_tree, photos / "train")
    shutil.copytree(tiny_tree, photos / "extra")
    dst = tmp_path / "shards"
    assert run("pack", photos / "train", dst, "--workers", "1").exit_code == 0
    index = (dst / "index.json").read_bytes()
    result = run("pack", photos / "extra", dst, "--workers", "1")  # a folder not named like a split: train
    assert result.exit_code == 2
    message = one_line_error(result)
    assert "already holds split 'train'" in message and "pass --split extra" in message
    assert message.index("--split extra") < message.index("--overwrite")  # the suggestion comes first
    assert (dst / "index.json").read_bytes() == index  # nothing replaced
    assert run("pack", photos / "extra", dst, "--workers", "1", "--split", "extra").exit_code == 0
    assert set(read_manifest(dst).splits) == {"train", "extra"}


def test_the_page_of_errors_says_what_packing_a_second_tree_does(tiny_tree, tmp_path, monkeypatch):
    # Issue 50, point 18: docs/cli-errors.md said `pack photos/val shards` beside train is refused; it
    # packs split val (the README's way). The page's row is run here as it reads, in its own words.
    page = Path(__file__).resolve().parents[2] / "docs" / "cli-errors.md"
    (row,) = [line for line in page.read_text().splitlines() if "into a `shards` that holds `train`" in line]
    command, said = row.split("`")[1], row.rstrip(" |").split("`")[-2]
    program, verb, src, dst = command.split()
    assert (program, verb, dst) == ("imgshards", "pack", "shards")
    monkeypatch.chdir(tmp_path)
    for folder in {"photos/train", "photos/val", src}:
        shutil.copytree(tiny_tree, folder)
    assert run("pack", "photos/train", "shards", "--workers", "1").exit_code == 0
    result = run("pack", src, "shards", "--workers", "1")
    assert result.exit_code == 2, result.output
    assert one_line_error(result).replace(f"{Path.cwd()}/", "") == f"Error: {said}"
    assert run("pack", "photos/val", "shards", "--workers", "1").exit_code == 0  # as the row says
    assert set(read_manifest("shards").splits) == {"train", "val"}


def test_a_tree_named_like_a_split_packs_as_that_split(tiny_tree, tmp_path):
    photos = tmp_path / "photos"
    shutil.copytree(tiny_tree, photos / "train")
    shutil.copytree(tiny_tree, photos / "Val")
    dst = tmp_path / "shards"
    assert run("pack", photos / "train", dst, "--workers", "1").exit_code == 0
    assert run("pack", photos / "Val", dst, "--workers", "1").exit_code == 0  # os.path.join(data, "Val")
    assert set(read_manifest(dst).splits) == {"train", "val"}
    assert run("pack", photos / "train", tmp_path / "held", "--val-fraction", "0.25").exit_code == 0
    assert set(read_manifest(tmp_path / "held").splits) == {"train", "val"}


def test_shards_without_an_index_point_to_imgshards_index(tiny_packed, tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    for shard in tiny_packed.glob("train-*.tar"):
        shutil.copy(shard, theirs)
    for command in ("info", "verify"):
        result = run(command, theirs)
        assert result.exit_code == 2
        assert f"run `imgshards index {theirs}`" in one_line_error(result)
    indexed = run("index", theirs, "-q")
    assert indexed.exit_code == 0 and indexed.stdout == ""
    assert run("info", theirs).exit_code == 0


def test_a_shard_given_for_a_dataset_asks_for_its_directory(tiny_packed):
    shard = tiny_packed / "train-000000.tar"
    result = run("info", shard)
    assert result.exit_code == 2
    message = one_line_error(result)
    assert "is a shard, not a packed dataset: give the dataset's directory" in message
    assert str(tiny_packed) in message and "UTF-8" not in message
    with pytest.raises(ManifestError, match="is a shard, not a packed dataset"):
        read_manifest(shard)
    assert run("verify", shard).exit_code == 2
    benched = run("bench", shard, "--batches", "1")
    assert benched.exit_code == 2 and "is a shard, not a packed dataset" in benched.stderr
    by_index = run("verify", tiny_packed / "index.json")  # the index stands for its directory
    assert by_index.exit_code == 0 and by_index.stdout.startswith("ok: ")


def test_shard_dataset_on_a_shard_asks_for_the_directory(tiny_packed):
    from imgshards.loader import ShardDataset

    with pytest.raises(
        ManifestError, match=r"is a shard, not a packed dataset: give the dataset's directory"
    ):
        ShardDataset(tiny_packed / "train-000000.tar")


def test_a_typo_in_the_path_says_it_does_not_exist(tiny_packed, tmp_path):
    typo = tmp_path / "shardz"
    for command in ("info", "verify"):
        result = run(command, typo)
        assert result.exit_code == 2
        message = one_line_error(result)
        assert f"{typo} does not exist" in message and "index.json" not in message
    empty = run("info", tmp_path)  # exists, holds no dataset: says how to make one
    assert empty.exit_code == 2 and f"imgshards pack SRC {tmp_path}" in one_line_error(empty)


def test_an_image_tree_given_for_a_dataset_says_to_pack_it_not_into_it(tiny_tree, tmp_path):
    photos = tmp_path / "photos"
    train = shutil.copytree(tiny_tree, photos / "train")
    for command, target in (("info", train), ("verify", train), ("bench", train), ("info", photos)):
        result = run(command, target, *(["--batches", "1"] if command == "bench" else []))
        assert result.exit_code == 2
        message = one_line_error(result)
        assert f"pack it into a new directory with `imgshards pack {train} DST`" in message, message
        assert f"pack SRC {target}" not in message  # never: write the shards into the image tree
    assert sorted(p.name for p in photos.iterdir()) == ["train"]


def test_a_source_that_does_not_exist_names_the_closest_folder_or_where_to_look(
    tiny_tree, tmp_path, monkeypatch
):
    shutil.copytree(tiny_tree, tmp_path / "photos" / "train")
    monkeypatch.chdir(tmp_path)
    for typo, hint in (
        ("photos/trian", "did you mean photos/train?"),
        ("fotos/train", "did you mean photos/train?"),
        ("photos/xyzzy", "check the path: `ls photos` shows what is there"),
    ):
        result = run("pack", typo, "out")
        assert result.exit_code == 2
        assert one_line_error(result) == f"Error: source directory {typo} does not exist: {hint}"
    assert not (tmp_path / "out").exists()
    info = run("info", "photos/trian")
    assert "photos/trian does not exist: did you mean photos/train?" in one_line_error(info)


def test_reading_a_url_without_credentials_says_what_to_set_as_pack_does(tiny_tree, tmp_path, monkeypatch):
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance metadata service here
    with socket.socket() as s:  # a loopback port nothing listens on: nothing leaves this machine
        s.bind(("127.0.0.1", 0))
        endpoint = f"--storage-option=endpoint_url=http://127.0.0.1:{s.getsockname()[1]}"
    url = "s3://bucket/x"
    packed = run("pack", tiny_tree, url, endpoint, "--no-progress")
    said = one_line_error(packed)
    assert packed.exit_code == 2 and said.startswith(f"Error: no credentials for {url}: set them")
    for command in ("info", "verify", "index"):
        result = run(command, url, endpoint)
        assert result.exit_code == 2 and one_line_error(result) == said, command


def test_a_ctrl_c_during_pack_says_that_running_it_again_resumes(tmp_path):
    src = make_synthetic_tree(tmp_path / "src", classes=6, per_class=150)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "imgshards.cli", "pack", src, out, "--shard-size", "40kB"]
    cmd += ["--workers", "2", "--no-progress", "--read-order", "plan"]
    proc = subprocess.Popen(
        [str(c) for c in cmd],
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    recorded = out / ".imgshards" / "train"  # a shard's record, written after the shard: it is done
    while not any(recorded.glob("train-*.tar.json")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole foreground job
    _, stderr = proc.communicate(timeout=120)
    if (out / "index.json").exists():
        pytest.skip("the pack finished before the interrupt")
    assert proc.returncode == 130
    assert stderr.strip() == (
        "interrupted; run the same command again to resume: the shards already written are kept"
    )
    unfinished = run("info", out)  # the state is there, the index not yet
    assert unfinished.exit_code == 2
    assert "`imgshards pack` has not finished there; run the same pack command again" in one_line_error(
        unfinished
    )
    again = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert " 0 reused" not in again.stdout  # what the first run wrote was kept


def test_a_shard_size_without_a_unit_shows_the_accepted_forms(tiny_tree, tmp_path):
    result = run("pack", tiny_tree, tmp_path / "out", "--shard-size", "10")
    assert result.exit_code == 2
    assert "'10' has no unit; write it like 256MB, 1GiB, 500kB or 30000B" in result.stderr
    assert not (tmp_path / "out").exists()
    assert run("pack", tiny_tree, tmp_path / "out", "--shard-size", "30000B", "-q").exit_code == 0


def test_a_url_with_a_slash_missing_is_refused_not_made_a_local_folder(tiny_tree, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for typo, meant in (("s3:/bucket/x", "s3://bucket/x"), ("gs:bucket/x", "gs://bucket/x")):
        result = run("pack", tiny_tree, typo)
        assert result.exit_code == 2 and f"a URL with a slash missing; write {meant}" in result.stderr
        with pytest.raises(DestinationError, match=f"write {meant}"):
            pack(tiny_tree, typo)
    assert list(tmp_path.iterdir()) == []


# ---- a suspicious tree: warned about, refused with --strict ----------------------------------------


@pytest.fixture
def photos(tiny_tree, tmp_path) -> Path:
    """The folder above two ImageFolder trees: photos/train/<class>/... and photos/val/<class>/..."""
    root = tmp_path / "photos"
    shutil.copytree(tiny_tree, root / "train")
    shutil.copytree(tiny_tree, root / "val")
    return root


def test_class_folders_that_are_all_split_names_are_refused_naming_the_commands(photos, tmp_path):
    dst = tmp_path / "shards"
    result = run("pack", photos, dst, "--workers", "1", "--no-progress")
    assert result.exit_code == 2  # before: packed two classes, train and val, and exited 0
    error = one_line_error(result)
    assert error.startswith("Error: refused: the class folders of")
    assert "all split names (train, val)" in error
    assert f"imgshards pack {photos / 'train'} {dst} --split train" in error
    assert f"imgshards pack {photos / 'val'} {dst} --split val" in error
    assert "--allow-split-names" in error and "Traceback" not in result.output
    assert not dst.exists()
    with pytest.raises(SourceError, match=r"^refused: the class folders .* all split names"):
        pack(photos, dst, PackConfig(workers=1))
    assert not dst.exists()


def test_allow_split_names_packs_them_as_classes_with_the_warning(photos, tmp_path):
    dst = tmp_path / "shards"
    result = run("pack", photos, dst, "--workers", "1", "--no-progress", "--allow-split-names")
    assert result.exit_code == 0  # packed, as asked, with a warning saying what was probably meant
    warning = result.stderr.strip()
    assert warning.startswith("warning: the class folders of") and "named like splits (train, val)" in warning
    assert f"imgshards pack {photos / 'train'} {dst} --split train" in warning
    assert "warning: the class folders" in result.stdout  # repeated after the summary
    assert read_manifest(dst).classes == ("train", "val")


def test_some_class_folders_named_like_splits_are_warned_about(photos, tmp_path):
    shutil.copytree(photos / "val", photos / "extra")  # not a split name: a dataset could mean it
    dst = tmp_path / "shards"
    result = run("pack", photos, dst, "--workers", "1", "--no-progress")
    assert result.exit_code == 0
    assert "named like splits (train, val)" in result.stderr


def test_strict_refuses_a_suspicious_tree_and_leaves_nothing(photos, tmp_path):
    shutil.copytree(photos / "val", photos / "extra")
    dst = tmp_path / "shards"
    result = run("pack", photos, dst, "--strict")
    assert result.exit_code == 2
    assert one_line_error(result).startswith("Error: refused (--strict): the class folders of")
    assert not dst.exists()
    with pytest.raises(SourceError, match=r"refused \(strict\): the class folders .* named like splits"):
        pack(photos, dst, PackConfig(strict=True))
    assert not dst.exists()


def test_a_tree_nested_one_level_too_deep_is_warned_about(tiny_tree, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(tiny_tree, root / "animals")
    dst = tmp_path / "shards"
    result = run("pack", root, dst, "--workers", "1", "-q")
    assert result.exit_code == 0
    assert "the one class folder, animals, holds only folders" in result.stderr
    assert f"imgshards pack {root / 'animals'} {dst}" in result.stderr
    api = pack(root, tmp_path / "api", PackConfig(workers=1))
    assert len(api.warnings) == 1 and "holds only folders" in api.warnings[0]
    strict = run("pack", root, tmp_path / "strict", "--strict")
    assert strict.exit_code == 2 and "refused (--strict)" in strict.stderr


def test_an_ordinary_tree_gives_no_warning(tiny_tree, tmp_path):
    assert tree_warnings(tiny_tree) == ()
    result = run("pack", tiny_tree, tmp_path / "out", "--workers", "1", "--strict")
    assert result.exit_code == 0 and result.stderr == "" and "warning" not in result.stdout
    nested_images = tmp_path / "nested"  # images in subfolders beside images: still ImageFolder's tree
    shutil.copytree(tiny_tree, nested_images)
    first = sorted(nested_images.iterdir())[0]
    (first / "more").mkdir()
    shutil.move(str(sorted(first.glob("*.JPEG"))[0]), first / "more")
    assert tree_warnings(nested_images) == ()


# ---- loose ends -----------------------------------------------------------------------------------


def test_a_refused_pack_leaves_no_lock_file(tiny_tree, tiny_packed, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(tiny_tree, bad)
    (bad / "zzz_empty").mkdir()  # a class folder with no image: the scan refuses the tree
    fresh = tmp_path / "fresh"
    result = run("pack", bad, fresh)
    assert result.exit_code == 2 and "no image" in result.stderr
    assert not fresh.exists()  # nothing made: no folder, no lock
    theirs = tmp_path / "theirs"  # someone else's shards, no index: pack refuses to touch them
    theirs.mkdir()
    shutil.copy(tiny_packed / "train-000000.tar", theirs)
    refused = run("pack", tiny_tree, theirs)
    assert refused.exit_code == 2 and "1 shard of split 'train' not made by" in refused.stderr
    assert f"run `imgshards index {theirs.resolve()}`" in refused.stderr
    assert sorted(p.name for p in theirs.iterdir()) == ["train-000000.tar"]
    dst = tmp_path / "ours"  # a conflict in a destination of our own: its state stays as it was
    assert run("pack", tiny_tree, dst, "--workers", "1").exit_code == 0
    before = sorted(str(p.relative_to(dst)) for p in dst.rglob("*"))
    assert run("pack", tiny_tree, dst, "--seed", "3").exit_code == 2
    assert sorted(str(p.relative_to(dst)) for p in dst.rglob("*")) == before


def test_counts_of_one_are_singular(tmp_path):
    src = tmp_path / "src"
    make_synthetic_tree(src, classes=1, per_class=1)
    (only,) = src.iterdir()
    (only / "broken.jpg").write_bytes(b"not an image")
    result = run("pack", src, tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert "1 sample of 1 class in 1 shard (" in result.stdout
    assert "rejected 1 file (" in result.stdout and "  1 shard written" in result.stdout
    info = run("info", tmp_path / "out")
    assert f": 1 class ({only.name})" in info.stdout and "1 sample in 1 shard (" in info.stdout
    verified = run("verify", tmp_path / "out")
    assert verified.stdout.startswith("ok: 1 shard, 1 sample match")


def test_info_shows_formats_and_the_smallest_and_largest_class_by_name(mixed_tree, tiny_packed, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(mixed_tree, src)
    classes = sorted(p for p in src.iterdir())
    for victim in sorted(classes[2].glob("*.JPEG"))[:4]:
        victim.unlink()  # class 2: 6 images; the others 10
    assert run("pack", src, tmp_path / "out", "--keep-formats", "-q").exit_code == 0
    info = run("info", tmp_path / "out")
    assert info.exit_code == 0
    assert "formats: .bmp 2, .jpg 29, .png 3, .tiff 1, .webp 1" in info.stdout
    assert (
        f"per class: smallest 6 ({classes[2].name}), largest 10 ({classes[0].name} and 2 more)" in info.stdout
    )
    balanced = run("info", tiny_packed)
    assert "per class: 10 each" in balanced.stdout and ".jpg 40" in balanced.stdout


def test_index_and_demo_take_quiet_and_json(tiny_packed, tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    for shard in tiny_packed.glob("train-*.tar"):
        shutil.copy(shard, theirs)
    doc = json.loads(run("index", theirs, "--json").stdout)
    assert doc["samples"] == 40 and doc["classes"] == 4 and doc["split"] == "train"
    demo = run("demo", "--workers", "1", "--json")
    assert demo.exit_code == 0
    report = json.loads(demo.stdout)
    assert report["verify"]["ok"] and report["pack"]["splits"]["train"]["samples"] == 320
    quiet = run("demo", "--workers", "1", "-q")
    assert quiet.exit_code == 0 and quiet.stdout == ""


def test_the_top_level_help_lists_the_workflow_with_an_example_each():
    result = run("--help")
    assert result.exit_code == 0
    text = result.stdout
    names = ["pack", "verify", "info", "index", "bench", "demo"]
    positions = [text.index(f"\n  {name}  ") for name in names]
    assert positions == sorted(positions)  # workflow order, not alphabetical
    for name in names:
        assert f"e.g. imgshards {name}" in text
    commands = text[text.index("Commands") :]
    assert "..." not in commands  # no description cut mid-word
    assert "Pack an ImageFolder tree into shards in a directory or at a URL." in commands
    assert "Describe a packed dataset: classes, splits, balance, rejects." in commands


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["pack", "photos/train"], "Error: Missing argument 'DST'; see `imgshards pack --help`."),
        (["verify", "--bogus", "x"], "Error: No such option '--bogus'; see `imgshards verify --help`."),
        (["pakc"], "Error: No such command 'pakc'. Did you mean 'pack'? See `imgshards --help`."),
        (["--bogus"], "Error: No such option '--bogus'; see `imgshards --help`."),
    ],
)
def test_a_command_line_mistake_is_one_line_naming_the_help_to_read(args, expected):
    result = CliRunner().invoke(cli, args, prog_name="imgshards")
    assert result.exit_code == 2
    assert result.output.strip() == expected
