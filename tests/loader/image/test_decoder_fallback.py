"""A JPEG decoder that is installed but does not load is passed over with one warning, not a crash.

A new user's CPU install had a torchcodec whose native library did not load next to the torch pip
chose (``OSError: Could not load this library: .../libtorchcodec_image.so``), and
``from imgshards.loader import ImageFolder`` raised it. Each test here runs a script on disk in a
fresh Python whose ``PYTHONPATH`` puts first a ``torchcodec`` package that fails as that one did (the
real failure needs a mismatched pair of wheels, which cannot be installed here), and checks that
the loader imports, decodes a real JPEG, loads batches, and says once why torchcodec was passed over.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# The script a user would run: import the loader, decode a JPEG, load a batch both ways.
SCRIPT = """
import sys

import torch

from imgshards.loader import ImageFolder, ShardDataset, decode_image, make_loader
from imgshards.loader.image.decode import JPEG_DECODER

if __name__ == "__main__":  # the spawned worker imports this file again
    jpeg, root = sys.argv[1], sys.argv[2]
    print("decoder", JPEG_DECODER)
    image = decode_image(open(jpeg, "rb").read(), "jpg", key=jpeg)
    assert image.dtype == torch.uint8 and image.shape[0] == 3, image.shape
    print("decoded", list(image.shape))
    if len(sys.argv) > 3:
        batch = next(iter(make_loader(ShardDataset(root, batch_size=8), num_workers=0)))
        print("batch", list(batch.images.shape))
        spawned = ShardDataset(root, batch_size=8)
        loader = make_loader(spawned, num_workers=1, multiprocessing_context="spawn")
        print("spawned", list(next(iter(loader)).images.shape))
        picture, label = ImageFolder(root)[0]
        print("imagefolder", picture.mode, picture.size, label)
"""

# What each fake torchcodec does when imported (its __init__.py, and its decoders module if any).
FAILURES = {
    # The user's case: torch.ops.load_library's error for a library built against another torch.
    "oserror": (
        "raise OSError('Could not load this library: /site-packages/torchcodec/libtorchcodec_image.so')",
    ),
    # torchcodec's own loader giving up, in several lines (the warning keeps the first).
    "runtimeerror": (
        "raise RuntimeError('Could not load libtorchcodec. Likely causes:\\n"
        "  1. FFmpeg is not installed.\\n  2. The PyTorch version is not compatible.')",
    ),
    # An extension module that does not link against this torch.
    "importerror": ("raise ImportError('libtorchcodec_pybind_ops.so: undefined symbol: _ZN3c104impl')",),
    # Imports, then fails at its first decode.
    "first call": (
        "",
        "def decode_jpeg(source, mode=None):\n"
        "    raise RuntimeError('torchcodec_ns::decode_jpeg: no kernel for CPU')\n",
    ),
}


def _fake_torchcodec(where: Path, init: str, decoders: str | None = None) -> Path:
    package = where / "fake" / "torchcodec"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(init + "\n")
    if decoders is not None:
        (package / "decoders.py").write_text(decoders)
    return package.parent


def _run(tmp_path: Path, fake: Path, *args: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(fake), env.get("PYTHONPATH", "")) if p)
    env.pop("PYTHONWARNINGS", None)  # the default filters, as a user has them
    result = subprocess.run(
        [sys.executable, str(script), *args], env=env, capture_output=True, text=True, timeout=240
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def _torchcodec_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "torchcodec" in line]


@pytest.fixture(scope="module")
def jpeg(tiny_tree) -> Path:
    return next(p for p in sorted(tiny_tree.rglob("*")) if p.suffix.lower() in (".jpg", ".jpeg"))


def test_a_torchcodec_that_cannot_load_leaves_the_loader_working(tmp_path, jpeg, tiny_packed):
    fake = _fake_torchcodec(tmp_path, *FAILURES["oserror"])
    result = _run(tmp_path, fake, str(jpeg), str(tiny_packed), "load")
    out = result.stdout.splitlines()
    assert "decoder torchvision" in out
    assert any(line.startswith("decoded [3, ") for line in out)
    assert "batch [8, 3, 224, 224]" in out and "spawned [8, 3, 224, 224]" in out
    assert any(line.startswith("imagefolder RGB ") for line in out)
    # One warning for the whole run: the spawned worker, which imported the loader again, said nothing.
    (line,) = _torchcodec_lines(result.stderr)
    assert "RuntimeWarning: torchcodec cannot load here (OSError: Could not load this library: " in line
    assert "JPEGs decode with torchvision instead; " in line
    assert "pip install --force-reinstall torch torchvision torchcodec" in line


@pytest.mark.parametrize("failure", ["runtimeerror", "importerror", "first call"])
def test_any_failure_to_load_is_one_line_naming_it(tmp_path, jpeg, failure):
    fake = _fake_torchcodec(tmp_path, *FAILURES[failure])
    result = _run(tmp_path, fake, str(jpeg), "-")
    assert "decoder torchvision" in result.stdout.splitlines()
    (line,) = _torchcodec_lines(result.stderr)
    said = {
        "runtimeerror": "RuntimeError: Could not load libtorchcodec. Likely causes:)",
        "importerror": "ImportError: libtorchcodec_pybind_ops.so: undefined symbol: _ZN3c104impl)",
        "first call": "RuntimeError: torchcodec_ns::decode_jpeg: no kernel for CPU)",
    }[failure]
    assert f"torchcodec cannot load here ({said}: " in line
    assert "FFmpeg" not in result.stderr  # the first line of the error only
    assert "JPEGs decode with torchvision instead" in line


def test_a_torchcodec_not_installed_is_passed_over_in_silence(tmp_path, jpeg):
    # What `import torchcodec` raises where it is not installed (the real one is, further on the path).
    fake = _fake_torchcodec(
        tmp_path, "raise ModuleNotFoundError(\"No module named 'torchcodec'\", name='torchcodec')"
    )
    result = _run(tmp_path, fake, str(jpeg), "-")
    assert "decoder torchvision" in result.stdout.splitlines()
    assert not _torchcodec_lines(result.stderr), result.stderr
    assert "Warning" not in result.stderr, result.stderr
