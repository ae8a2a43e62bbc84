"""``imgshards demo``, the README's smoke check, loads what it packed: a broken loader fails it.

A new user's install had a torchcodec that did not load next to its torch; ``imgshards demo`` packed
and verified (neither imports torch) and exited 0, while ``from imgshards.loader import ImageFolder``
raised. The demo now loads a batch through ``ShardDataset`` and a sample through ``ImageFolder``. The
broken installs are made by a package put first on ``PYTHONPATH`` that fails as the real one did (a
mismatched pair of wheels cannot be installed here); the demo runs as a user runs it, in a process
of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from .conftest import run

LOADED = "loaded: a batch of 8 images [8, 3, 224, 224] through ShardDataset, and sample 0 through ImageFolder"


def _demo(tmp_path: Path, fake: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``imgshards demo ARGS`` in a fresh Python whose path starts with packages ``fake`` (name: __init__)."""
    for name, init in fake.items():
        (tmp_path / "fake" / name).mkdir(parents=True)
        (tmp_path / "fake" / name / "__init__.py").write_text(init + "\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tmp_path / "fake"), env.get("PYTHONPATH", "")) if p)
    env.pop("PYTHONWARNINGS", None)
    return subprocess.run(
        [sys.executable, "-m", "imgshards.cli", "demo", "-j", "1", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )


def test_the_demo_loads_a_batch_through_both_datasets():
    result = run("demo", "-j", "2")
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    # After the verify line, before the last one (what to do next).
    loaded = next(i for i, line in enumerate(lines) if line.startswith("loaded: "))
    assert lines[loaded - 1].startswith("verified: ") and loaded == len(lines) - 2
    assert lines[loaded].startswith(LOADED)
    assert lines[loaded].endswith(("JPEG decoder: torchcodec", "JPEG decoder: torchvision"))


def test_the_demo_json_has_the_load():
    result = run("demo", "-j", "1", "--json")
    assert result.exit_code == 0
    load = json.loads(result.stdout)["load"]
    assert load["ok"] and load["batch"] == [8, 3, 224, 224] and load["warnings"] == []
    assert load["imagefolder"]["mode"] == "RGB" and 0 <= load["imagefolder"]["class"] < 8
    assert load["jpeg_decoder"] in ("torchcodec", "torchvision")


def test_a_torchcodec_that_cannot_load_is_one_warning_and_the_demo_passes(tmp_path):
    fake = {
        "torchcodec": "raise OSError('Could not load this library: /venv/torchcodec/libtorchcodec_image.so')"
    }
    result = _demo(tmp_path, fake)
    assert result.returncode == 0, result.stderr
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("loaded: ")]
    assert line.startswith(LOADED) and line.endswith("JPEG decoder: torchvision")
    (warning,) = [line for line in result.stderr.splitlines() if line.strip()]
    assert warning.startswith("warning: torchcodec cannot load here (OSError: Could not load this library: ")
    assert "JPEGs decode with torchvision instead; " in warning
    # --json says it too; -q says nothing.
    doc = json.loads(_demo(tmp_path / "json", fake, "--json").stdout)
    assert doc["load"]["jpeg_decoder"] == "torchvision" and len(doc["load"]["warnings"]) == 1
    quiet = _demo(tmp_path / "quiet", fake, "-q")
    assert quiet.returncode == 0 and quiet.stdout == "" and quiet.stderr == ""


def test_a_loader_that_does_not_import_fails_the_demo_in_one_line(tmp_path):
    # torch itself does not load: pack and verify still run (the converter never imports torch).
    fake = {"torch": "raise OSError('libtorch_cpu.so: cannot open shared object file: No such file')"}
    result = _demo(tmp_path, fake, "-q")
    assert result.returncode == 2 and result.stdout == ""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [
        "Error: imgshards.loader does not work on this install (OSError: libtorch_cpu.so: cannot open "
        "shared object file: No such file): reinstall torch and its image libraries together, from one "
        "index: pip install --force-reinstall torch torchvision torchcodec --index-url URL, URL the index "
        "torch came from (https://download.pytorch.org/whl/cpu for a CPU-only torch), or "
        "https://pypi.org/simple where that one cannot be reached; then run imgshards demo again"
    ]
    doc = json.loads(_demo(tmp_path / "json", fake, "--json").stdout)
    assert doc["verify"]["ok"] and doc["load"]["ok"] is False and "libtorch_cpu.so" in doc["load"]["error"]


def test_the_reinstall_line_and_the_readme_say_what_to_run_without_pytorchs_cpu_index():
    # Issue 50, point 19: "from the index torch came from" repeats the mix where that index (PyTorch's
    # CPU one) cannot be reached: pip takes a CUDA torchvision from PyPI beside a torch+cpu. Both say
    # to take the three from PyPI's index alone then, in one command that replaces torch too.
    from imgshards.cli.demo import _REINSTALL

    fallback = (
        "pip install --force-reinstall torch torchvision torchcodec --index-url https://pypi.org/simple"
    )
    assert "https://pypi.org/simple where that one cannot be reached" in _REINSTALL
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    quick_start = readme[readme.index("## Quick start") : readme.index("Extras, from the clone too")]
    assert fallback in quick_start and "cannot be reached" in quick_start


def test_the_command_line_imports_no_torch_until_the_demo_loads():
    code = "import sys, imgshards.cli.main\n"
    code += "print([m for m in ('torch', 'imgshards.loader') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
