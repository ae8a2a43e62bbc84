"""Nothing from a dataset reaches a shell (issue 12, case 7).

webdataset opens a URL string through ``gopen``, which runs a string starting with ``pipe:`` as a
shell command (and expands braces): the notebook and the benchmarks hand it open files instead.
This test scans their code for any webdataset entry point that takes a URL string, and for shells.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from imgshards.converter import read_manifest

ROOT = Path(__file__).resolve().parents[1]
# webdataset's callables that open what a string names (gopen: pipe:, file:, http:...).
URL_OPENERS = {
    "WebDataset",
    "WebLoader",
    "FluidWrapper",
    "tarfile_to_samples",
    "tarfile_samples",
    "url_opener",
    "gopen",
    "SimpleShardList",
    "ResampledShards",
    "ResampledShardList",
    "MultiShardSample",
    "DirectoryShardList",
}
# os.system, os.popen, subprocess.getoutput run a shell; Popen and run do with shell=True only.
SHELLS = {"system", "popen", "getoutput", "getstatusoutput"}


def _sources() -> list[tuple[str, str]]:
    found = [(str(p.relative_to(ROOT)), p.read_text()) for p in sorted((ROOT / "bench").glob("*.py"))]
    for nb_path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(nb_path.read_text())["cells"]
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        found.append((str(nb_path.relative_to(ROOT)), code))
    return found


def _called_names(source: str) -> list[tuple[str, int]]:
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Attribute, ast.Name, ast.alias)):
            name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)
            name = name or getattr(node, "name", "").rpartition(".")[2]
            names.append((name, getattr(node, "lineno", 0)))
        if isinstance(node, ast.keyword) and node.arg == "shell":
            names.append(("shell=", node.lineno))
    return names


def test_there_is_code_to_scan():
    names = [name for name, _ in _sources()]
    assert "bench/loader.py" in names and "notebooks/explore.ipynb" in names


@pytest.mark.parametrize("name, source", _sources(), ids=[n for n, _ in _sources()])
def test_no_webdataset_url_opener_and_no_shell(name, source):
    bad = [(n, line) for n, line in _called_names(source) if n in URL_OPENERS | SHELLS | {"shell="}]
    assert not bad, f"{name} hands strings to something that may run a shell: {bad}"


def test_the_benchmarks_webdataset_reader_opens_a_pipe_name_as_a_file(tiny_packed, tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("bench_loader", ROOT / "bench" / "loader.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    shard = read_manifest(tiny_packed).split("train").shards[0]
    hostile = tmp_path / "pipe:touch marker; cat x.tar"
    shutil.copy(tiny_packed / shard.name, hostile)
    monkeypatch.chdir(tmp_path)
    samples = list(bench.local_samples([{"path": hostile}]))
    assert len(samples) == shard.samples
    assert not (tmp_path / "marker").exists()
