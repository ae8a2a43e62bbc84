"""The CLI through click's CliRunner: exit codes and one-line errors, no tracebacks.

``info`` runs here (cli/info.py), and the parameter types the commands share (cli/options.py:
``--shard-size`` and its units).
"""

import json
import os
import shutil
import tarfile

import pytest
from click.testing import CliRunner

from imgshards.cli.main import cli
from imgshards.converter.format.tarwriter import BLOCK, END_AT_MOST, RECORD


@pytest.fixture
def run():
    def invoke(*args: str):
        result = CliRunner().invoke(cli, list(args))
        assert result.exception is None or isinstance(result.exception, SystemExit), result.output
        return result

    return invoke


def test_pack_info_verify(run, tiny_tree, tmp_path):
    out = tmp_path / "out"
    packed = run("pack", str(tiny_tree), str(out), "--shard-size", "20kB", "--workers", "2", "--no-progress")
    assert packed.exit_code == 0
    assert "40 samples of 4 classes" in packed.output and "no file rejected" in packed.output
    info = run("info", str(out))
    assert info.exit_code == 0 and "train: 40 samples" in info.output
    as_json = json.loads(run("info", str(out), "--json").output)
    assert as_json["splits"]["train"]["samples"] == 40
    verified = run("verify", str(out))
    assert verified.exit_code == 0 and verified.output.startswith("ok:")
    victim = next(out.glob("train-*.tar"))
    victim.write_bytes(victim.read_bytes()[:-512])
    broken = run("verify", str(out))
    assert broken.exit_code == 1 and victim.name in broken.output  # 1: the data is bad


def test_shard_size_caps_the_samples_and_the_help_says_what_the_tar_end_adds(run, tiny_tree, tmp_path):
    help_text = " ".join(run("pack", "--help").output.split())
    assert "Close a shard before its samples pass this size" in help_text
    assert f"The tar's end adds up to {END_AT_MOST:,} bytes to the file" in help_text
    out = tmp_path / "out"
    assert run("pack", str(tiny_tree), str(out), "--shard-size", "20kB", "--no-progress").exit_code == 0
    shards = sorted(out.glob("train-*.tar"))
    assert len(shards) > 3
    for shard in shards:
        with tarfile.open(shard) as tar:
            last = tar.getmembers()[-1]
        samples_end = last.offset_data + -(-last.size // BLOCK) * BLOCK  # headers and padding counted
        assert samples_end <= 20_000, shard.name
        size = shard.stat().st_size  # two end blocks, then padding to a whole record: as the help says
        assert size == -(-(samples_end + 2 * BLOCK) // RECORD) * RECORD <= 20_000 + END_AT_MOST


def test_demo_runs_end_to_end(run):
    result = run("demo", "--workers", "2")
    assert result.exit_code == 0, result.output
    assert "320 samples of 8 classes" in result.output
    assert "rejected 4 files" in result.output and "verified:" in result.output


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["pack", "{tmp}/missing", "{tmp}/out"], 2, "does not exist"),
        (["pack", "{tree}", "{tmp}/out", "--shard-size", "lots"], 2, "is not a size"),
        (["pack", "{tree}", "{tmp}/out", "--check", "deep"], 2, "'deep' is not one of"),
        (["pack", "{tree}", "{tmp}/out", "--quality", "50"], 2, "add --resize"),
        (["pack", "{tree}", "{tree}/out"], 2, "inside the source tree"),
        (["pack", "{tree}", "{tmp}/out", "--split", "Val"], 2, "split 'Val' must be"),
        (["info", "{tmp}"], 2, "no index.json"),
        (["verify", "{tmp}"], 2, "no index.json"),
    ],
)
def test_user_mistakes_get_one_line_errors(run, tiny_tree, tmp_path, args, code, message):
    result = run(*[a.format(tmp=tmp_path, tree=tiny_tree) for a in args])
    assert result.exit_code == code
    assert message in result.output
    assert "Traceback" not in result.output


def test_rerun_with_other_arguments_says_how_to_proceed(run, tiny_tree, tmp_path):
    assert run("pack", str(tiny_tree), str(tmp_path / "o"), "--workers", "1", "--no-progress").exit_code == 0
    again = run("pack", str(tiny_tree), str(tmp_path / "o"), "--workers", "1", "--seed", "2", "--no-progress")
    assert again.exit_code == 2 and "--overwrite" in again.output


# ---- machine-readable output, exit codes, progress ------------------------------------------------


def test_pack_json_is_one_document_on_stdout(run, mixed_tree, tmp_path):
    result = run(
        "pack",
        str(mixed_tree),
        str(tmp_path / "out"),
        "--shard-size",
        "30kB",
        "--json",
        "--val-fraction",
        "0.2",
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)  # nothing but the document on stdout
    assert doc["classes"] == 4 and set(doc["splits"]) == {"train", "val"}
    train = doc["splits"]["train"]
    assert train["samples"] == 32 and train["formats"] == {"jpg": 32}
    assert doc["splits"]["val"]["samples"] == 8
    assert sum(s["converted"].get("png_to_jpg", 0) for s in doc["splits"].values()) == 3
    assert train["rejects"] == {
        "total": 0,
        "by_reason": {},
        "file": str(tmp_path / "out" / ".imgshards/rejects/train.jsonl"),
    }
    assert doc["warnings"] == [] and doc["read_order"] in ("disk", "plan")
    assert result.stderr == ""  # stderr is not a terminal here: no progress bars


def test_keep_formats_summary_says_which_readers_miss_what(run, mixed_tree, tmp_path):
    result = run("pack", str(mixed_tree), str(tmp_path / "out"), "--keep-formats")
    assert result.exit_code == 0
    assert "warning: timm's wds reader skips the 3 bmp/tiff samples" in result.stdout
    quiet = run("pack", str(mixed_tree), str(tmp_path / "q"), "--keep-formats", "-q")
    assert quiet.exit_code == 0 and quiet.stdout == "" and "timm's wds reader skips" in quiet.stderr


def test_verify_json_and_exit_codes(run, tiny_tree, tmp_path):
    out = tmp_path / "out"
    assert run("pack", str(tiny_tree), str(out), "--shard-size", "20kB", "-q").exit_code == 0
    good = run("verify", str(out), "--json")
    assert good.exit_code == 0 and json.loads(good.stdout)["ok"] is True
    assert run("verify", str(out), "-q").stdout == ""
    victim = next(out.glob("train-*.tar"))
    victim.write_bytes(victim.read_bytes()[:-512])
    bad = run("verify", str(out), "--json")
    doc = json.loads(bad.stdout)
    assert bad.exit_code == 1 and doc["ok"] is False  # 1: the data is bad
    assert {p["shard"] for p in doc["problems"]} == {victim.name}
    missing = run("verify", str(tmp_path / "nothing"), "--json")
    assert (
        missing.exit_code == 2 and missing.stdout == "" and "does not exist" in missing.stderr
    )  # 2: cannot run


def test_pack_exits_1_when_every_file_is_rejected(run, tmp_path):
    for cls in ("a", "b"):
        (tmp_path / "src" / cls).mkdir(parents=True)
        (tmp_path / "src" / cls / "x.jpg").write_bytes(b"")
    result = run("pack", str(tmp_path / "src"), str(tmp_path / "out"), "--json")
    assert result.exit_code == 1
    assert json.loads(result.stdout)["splits"]["train"]["rejects"]["by_reason"] == {"empty": 2}
    assert "every file of split(s) train was rejected" in result.stderr


def test_progress_only_when_asked_or_on_a_terminal(run, tiny_tree, tmp_path):
    quiet = run("pack", str(tiny_tree), str(tmp_path / "a"))
    assert quiet.exit_code == 0 and quiet.stderr == ""
    shown = run("pack", str(tiny_tree), str(tmp_path / "b"), "--progress", "--read-order", "disk")
    assert shown.exit_code == 0
    assert "scan: 100%" in shown.stderr and "4/4" in shown.stderr  # the class count, not "0 class"
    assert "read train" in shown.stderr and "pack train" in shown.stderr


def test_pack_uses_tqdm_auto_for_notebook_widgets():
    import importlib

    import tqdm.auto

    assert importlib.import_module("imgshards.converter.pack").tqdm is tqdm.auto.tqdm


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--split-file", "{split_file}", "--split", "x"], "leave out --split"),
        (["--val-split", "holdout"], "add --val-fraction"),
        (["--val-fraction", "1.5"], "--val-fraction"),
        (["--val-fraction", "0.2", "--val-split", "train"], "val_split must differ"),
        (["--read-order", "random"], "'random' is not one of"),
    ],
)
def test_split_options_are_checked_up_front(run, tiny_tree, tmp_path, args, message):
    (tmp_path / "s.json").write_text("{}")
    result = run(
        "pack",
        str(tiny_tree),
        str(tmp_path / "out"),
        *[a.format(split_file=tmp_path / "s.json") for a in args],
    )
    assert result.exit_code == 2 and message in result.output


def strict_json(text: str):
    """``text`` parsed as JSON that every parser reads: no NaN, and no string a lone surrogate.

    Python's ``json`` reads ``"\\udcff"`` (a lone surrogate escape) without a word; strict parsers
    (Rust's serde_json, Go's encoding/json in its strict modes, I-JSON) refuse it. So every string
    must be valid Unicode, encodable as UTF-8.
    """

    def refuse(name: str):
        raise ValueError(f"{name} is not JSON")

    doc = json.loads(text, parse_constant=refuse)
    json.dumps(doc, ensure_ascii=False).encode("utf-8")  # raises on a lone surrogate anywhere
    return doc


def test_info_json_writes_a_name_that_is_not_utf8_as_text(run, tiny_tree, tmp_path):
    # Issue 50: a class folder named by bytes that are not UTF-8 ("caf" + 0xE9, Latin-1).
    src = tmp_path / "src"
    for name, folder in ((b"caf\xe9", "n00000000"), (b"dog", "n00000001")):
        target = os.path.join(os.fsencode(src), name)
        os.makedirs(target)
        for image in sorted((tiny_tree / folder).iterdir())[:3]:
            shutil.copy(image, os.path.join(target, os.fsencode(image.name)))
    out = tmp_path / "out"
    assert run("pack", str(src), str(out), "--no-progress", "-j", "1").exit_code == 0
    text = run("info", str(out), "--json").output
    assert "\\ud" not in text.lower()  # no surrogate escape
    doc = strict_json(text)
    assert doc["classes"] == ["caf\\xe9", "dog"] and doc["version"] == 2
    with pytest.raises(UnicodeEncodeError):  # what the index holds, as Python reads it
        strict_json(json.dumps({"classes": ["caf\udce9"]}))
