"""The command line's conventions (issue 38): one name for a packed dataset, ``-j``, a samples-per-shard
cap, ``pack --dry-run``, ``info --split``, a sectioned ``pack --help``, a tree of splits refused, and a
demo whose last line points at something that exists.

Exit codes (cli/exits.py): 0 done, 1 the data is bad, 2 cannot run.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from imgshards.cli.pack import SECTIONS
from imgshards.converter import PackConfig, SourceError, dry_run, pack, pack_to_url, read_manifest

from .conftest import one_line_error, run

# ---- one name, one flag ------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["verify", "info", "index", "bench"])
def test_every_command_calls_a_packed_dataset_dst(command):
    usage = run(command, "--help").output.splitlines()[0]
    assert usage == f"Usage: imgshards {command} [OPTIONS] DST"  # index said SRC
    assert run("pack", "--help").output.splitlines()[0] == "Usage: imgshards pack [OPTIONS] SRC DST"


@pytest.mark.parametrize("command", ["pack", "verify", "index", "bench", "demo"])
def test_workers_is_dash_j_everywhere(command):
    assert "-j, --workers" in run(command, "--help").output


def test_dash_j_runs_pack_and_verify(tiny_tree, tmp_path):
    out = tmp_path / "out"
    assert run("pack", tiny_tree, out, "-j", "1", "-q").exit_code == 0
    assert run("verify", out, "-j", "1").exit_code == 0
    bad = run("verify", out, "-j", "0")
    assert bad.exit_code == 2 and "-j" in one_line_error(bad)


# ---- --max-samples ------------------------------------------------------------------------------


def _shard_samples(dst: Path, split: str = "train") -> list[int]:
    return [shard.samples for shard in read_manifest(dst).split(split).shards]


def _files(dst: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(dst.glob("*.tar"))} | {
        "index.json": (dst / "index.json").read_bytes()
    }


def test_max_samples_caps_each_shard_and_is_recorded(tiny_tree, tmp_path):
    out = tmp_path / "out"
    assert run("pack", tiny_tree, out, "--max-samples", "7", "-j", "2", "-q").exit_code == 0
    assert _shard_samples(out) == [7, 7, 7, 7, 7, 5]  # 40 samples; 256MB alone would make one shard
    assert read_manifest(out).split("train").pack_args["max_samples"] == 7
    alias = tmp_path / "alias"  # tarp's name for it
    assert run("pack", tiny_tree, alias, "--maxcount", "7", "-j", "1", "-q").exit_code == 0
    assert {k: v for k, v in _files(alias).items() if k != "index.json"} == {
        k: v for k, v in _files(out).items() if k != "index.json"
    }
    # Without the cap the index records nothing new: packs made before the option still match.
    plain = tmp_path / "plain"
    assert run("pack", tiny_tree, plain, "-j", "1", "-q").exit_code == 0
    assert "max_samples" not in read_manifest(plain).split("train").pack_args


def test_a_capped_pack_resumes_byte_identical_and_refuses_another_cap(tiny_tree, tmp_path):
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    assert run("pack", tiny_tree, whole, "--max-samples", "7", "-j", "2", "-q").exit_code == 0
    assert run("pack", tiny_tree, resumed, "--max-samples", "7", "-j", "2", "-q").exit_code == 0
    # As after a crash: the index not written yet, one shard gone.
    (resumed / "index.json").unlink()
    (resumed / "train-000002.tar").unlink()
    again = run("pack", tiny_tree, resumed, "--max-samples", "7", "-j", "2", "--json")
    assert again.exit_code == 0
    doc = json.loads(again.stdout)
    assert (doc["shards_written"], doc["shards_reused"]) == (1, 5)
    assert _files(resumed) == _files(whole)  # every shard and the index, byte for byte
    other = run("pack", tiny_tree, resumed, "--max-samples", "8", "-q")
    assert other.exit_code == 2 and "--overwrite" in one_line_error(other)


def test_max_samples_must_be_positive(tiny_tree, tmp_path):
    bad = run("pack", tiny_tree, tmp_path / "out", "--max-samples", "0")
    assert bad.exit_code == 2 and "--max-samples" in one_line_error(bad)
    with pytest.raises(ValueError, match="max_samples must be a positive number"):
        PackConfig(max_samples=0)


# ---- --dry-run ----------------------------------------------------------------------------------


def test_dry_run_prints_the_plan_and_creates_nothing(tiny_tree, tmp_path):
    dst = tmp_path / "not" / "made"
    result = run("pack", tiny_tree, dst, "--val-fraction", "0.25", "--max-samples", "8", "--dry-run")
    assert result.exit_code == 0
    assert not dst.exists() and not dst.parent.exists()  # not even the directory
    out = result.stdout
    assert "holds 4 classes" in out
    assert "split 'train': 28 samples in 4 shards" in out and "split 'val': 12 samples in 2 shards" in out
    assert "rejected by the scan: none" in out and re.search(r"about [\d.]+ kB", out)
    assert f"nothing written to {dst}" in out


def test_dry_run_json_is_what_the_pack_then_writes(tiny_tree, tmp_path):
    dst = tmp_path / "out"
    args = [tiny_tree, dst, "--val-fraction", "0.25", "--shard-size", "20kB", "-j", "2"]
    planned = json.loads(run("pack", *args, "--dry-run", "--json").stdout)
    assert planned["dry_run"] is True and not dst.exists()
    packed = json.loads(run("pack", *args, "--json").stdout)
    manifest = read_manifest(dst)
    for name, split in planned["splits"].items():
        assert split["shard_samples"] == _shard_samples(dst, name)
        # JPEGs stored as they are: the estimate is the shards' size to the byte.
        assert split["bytes_estimate"] == packed["splits"][name]["bytes"] == manifest.split(name).bytes
        assert sum(split["class_counts"].values()) == split["samples"] == manifest.split(name).samples


def test_dry_run_counts_the_rejects_the_scan_finds(tiny_tree, tmp_path):
    src = shutil.copytree(tiny_tree, tmp_path / "src")
    (next(p for p in src.iterdir() if p.is_dir()) / "notes.txt").write_text("not an image")
    (src / "README").write_text("outside every class folder")
    plan = dry_run(src, tmp_path / "dst", PackConfig())
    assert plan.splits[0].rejects_by_reason == {"outside_class_dir": 1, "unsupported_extension": 1}
    result = run("pack", src, tmp_path / "dst", "--dry-run")
    assert "rejected by the scan: 2 files (outside_class_dir 1, unsupported_extension 1)" in result.stdout
    assert not (tmp_path / "dst").exists()


def test_dry_run_to_a_url_touches_no_network(tiny_tree):
    result = run("pack", tiny_tree, "s3://no-such-bucket-here/x", "--dry-run", "--json")
    assert result.exit_code == 0
    assert json.loads(result.stdout)["splits"]["train"]["samples"] == 40


def test_dry_run_refuses_what_the_pack_refuses(tiny_tree, tmp_path):
    photos = tmp_path / "photos"
    shutil.copytree(tiny_tree, photos / "train")
    shutil.copytree(tiny_tree, photos / "val")
    result = run("pack", photos, tmp_path / "dst", "--dry-run")
    assert result.exit_code == 2 and "all split names" in one_line_error(result)
    assert not (tmp_path / "dst").exists()


# ---- info --split -------------------------------------------------------------------------------


def test_info_describes_the_split_asked_for(tiny_tree, tmp_path):
    dst = tmp_path / "out"
    assert run("pack", tiny_tree, dst, "--val-fraction", "0.25", "-j", "1", "-q").exit_code == 0
    both = run("info", dst).stdout
    assert "  train: " in both and "  val: " in both
    val = run("info", dst, "--split", "val")
    assert val.exit_code == 0 and "  val: 12 samples" in val.stdout and "  train: " not in val.stdout
    doc = json.loads(run("info", dst, "--split", "val", "--json").stdout)
    assert list(doc["splits"]) == ["val"] and len(doc["classes"]) == 4
    wrong = run("info", dst, "--split", "test")
    assert wrong.exit_code == 2
    assert one_line_error(wrong) == f"Error: {dst} has no split 'test'; its splits: train, val"


# ---- pack --help in sections ---------------------------------------------------------------------


def test_pack_help_lists_the_common_options_first_in_sections():
    text = run("pack", "--help").output
    titles = [title for title, _ in SECTIONS]
    found = [line[:-1] for line in text.splitlines() if line.endswith(":") and not line.startswith(" ")]
    assert found == titles, found  # every section, in order, and no "Other options": each one placed
    common = text.split("Common options:", 1)[1].split("\n\n", 1)[0]
    for flag in ("--split", "--val-fraction", "--shard-size", "--max-samples", "-j, --workers", "--dry-run"):
        assert flag in common
    assert "-h, --help" in common
    options = re.findall(r"^  (-{1,2}[\w-]+)", text, flags=re.M)
    assert len(options) == len(set(options)) >= 24, options  # each option once


# ---- a tree of splits, a flat folder -------------------------------------------------------------


def test_a_flat_folder_of_images_names_split_file(tiny_tree, tmp_path):
    flat = tmp_path / "flat"
    flat.mkdir()
    for image in sorted(tiny_tree.rglob("*.JPEG"))[:5]:
        shutil.copy(image, flat / image.name)
    result = run("pack", flat, tmp_path / "dst")
    assert result.exit_code == 2
    error = one_line_error(result)
    assert "no class directories" in error and "only 5 images" in error
    assert "one folder per class" in error and "--split-file" in error
    assert not (tmp_path / "dst").exists()


def test_a_tree_of_splits_packed_to_a_url_is_refused_before_any_request(tiny_tree, tmp_path):
    photos = tmp_path / "photos"
    shutil.copytree(tiny_tree, photos / "train")
    shutil.copytree(tiny_tree, photos / "test")
    url = "s3://no-such-bucket-here/x"  # refused before the bucket is looked up: no server needed
    result = run("pack", photos, url)
    assert result.exit_code == 2
    assert f"imgshards pack {photos / 'test'} {url} --split test" in one_line_error(result)
    with pytest.raises(SourceError, match=r"^refused: .* all split names \(test, train\)"):
        pack_to_url(photos, url, PackConfig())


def test_a_tree_of_one_split_folder_is_refused_too(tiny_tree, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(tiny_tree, root / "Validation")
    result = run("pack", root, tmp_path / "dst")
    assert result.exit_code == 2
    assert f"imgshards pack {root / 'Validation'} {tmp_path / 'dst'} --split validation" in one_line_error(
        result
    )
    allowed = run("pack", root, tmp_path / "dst", "--allow-split-names", "-q", "-j", "1")
    assert allowed.exit_code == 0 and read_manifest(tmp_path / "dst").classes == ("Validation",)
    assert pack(root, tmp_path / "api", PackConfig(allow_split_names=True, workers=1)).info.samples == 40


# ---- the demo ends pointing at what exists --------------------------------------------------------


def test_the_demo_lists_its_rejects_and_ends_on_keep_not_a_deleted_file():
    result = run("demo", "-j", "2")
    assert result.exit_code == 0
    lines = result.stdout.strip().splitlines()
    assert "rejected 4 files" in result.stdout and "rejects/train.jsonl" not in result.stdout
    assert "    square/empty.jpg: empty" in lines and "    cross/truncated.jpg: truncated" in lines
    assert "imgshards demo --keep DIR" in lines[-1] and "/" not in lines[-1].split("(")[0]


def test_the_demo_kept_ends_on_commands_that_work(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = run("demo", "--keep", "demo", "-j", "2")
    assert result.exit_code == 0
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("kept in demo: the tree demo/photos, its shards demo/shards")
    assert (tmp_path / "demo" / "shards" / "index.json").is_file()
    command = last.rsplit("or pack the tree into train and val: ", 1)[1].split()
    assert command[:2] == ["imgshards", "pack"]
    packed = run(*command[1:], "-q", "-j", "2")  # what the README's quick start runs next
    assert packed.exit_code == 0
    assert sorted(read_manifest(tmp_path / "shards").splits) == ["train", "val"]
