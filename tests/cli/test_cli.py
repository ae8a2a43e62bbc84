"""The CLI through click's CliRunner: exit codes and one-line errors, no tracebacks."""

import json

import pytest
from click.testing import CliRunner

from imgshards.cli.main import cli


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
        (["pack", "{tree}", "{tmp}/out", "--split", "Val"], 2, "split must be"),
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
