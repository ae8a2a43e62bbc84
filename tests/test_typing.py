"""A user's script on the documented API passes ``mypy --strict``; the same script with a typo fails it.

The package is checked as a user's type checker sees it once installed: ``imgshards.converter``,
``imgshards.loader`` and ``imgshards.cli`` (copied under an ``imgshards/`` folder on ``MYPYPATH``, as
the wheel lays them out: mypy cannot see through the editable install's import hook), its own
errors not reported (``follow_imports = silent``, as for a package in site-packages). One mypy run
checks every script: reading torch's annotations is most of its 15 s.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mypy")


SCRIPT = """\
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from imgshards.loader import ImageFolder, ShardDataset, ShardLoader, make_loader, to_device


def train(root: str, device: torch.device, model: nn.Module) -> dict[str, Any]:
    dataset = ShardDataset(root, split="train", batch_size=16, transform="train")
    assert dataset.batch_size == 16
    loader: ShardLoader = make_loader(dataset, num_workers=2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for epoch in range(2):
        loader.set_epoch(epoch)
        for batch in loader:
            images, labels = to_device(batch, device, channels_last=True)
            loss = nn.functional.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    state = loader.state_dict()
    loader.load_state_dict(state)
    return state


def folder_loader(root: str) -> DataLoader[tuple[Any, Any]]:
    folder = ImageFolder(f"{root}/train", transform=None)
    names: list[str] = folder.classes
    ids: dict[str, int] = folder.class_to_idx
    targets: list[int] = folder.targets
    assert len(names) == len(ids) and len(targets) == len(folder)
    return DataLoader(folder, batch_size=32, shuffle=True, num_workers=2)
"""

# What a strict user of torch has in their config: torch leaves Tensor.backward unannotated.
CONFIG = """\
[mypy]
strict = True
untyped_calls_exclude = torch._tensor

[mypy-imgshards.*]
follow_imports = silent
"""

# script name -> (text in SCRIPT, its typo, the error mypy must give)
TYPOS = {
    "typo_imagefolder": ("folder.classes", "folder.clases", '"ImageFolder" has no attribute "clases"'),
    "typo_shardloader": (
        "loader.set_epoch(epoch)",
        "loader.set_epcoh(epoch)",
        '"ShardLoader" has no attribute "set_epcoh"',
    ),
    "typo_setting": (
        "dataset.batch_size ==",
        "dataset.bacth_size ==",
        '"ShardDataset" has no attribute "bacth_size"',
    ),
}


@pytest.fixture(scope="module")
def errors(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """Each script's errors (``LINE: error: ...``) from one ``mypy --strict`` run over all of them."""
    work = tmp_path_factory.mktemp("typing")
    for sub in ("converter", "loader", "cli"):
        spec = importlib.util.find_spec(f"imgshards.{sub}")
        assert spec is not None and spec.submodule_search_locations
        src = Path(next(iter(spec.submodule_search_locations)))
        shutil.copytree(src, work / "site" / "imgshards" / sub, ignore=shutil.ignore_patterns("__pycache__"))
    scripts = {"documented": SCRIPT}
    for name, (right, wrong, _) in TYPOS.items():
        assert SCRIPT.count(right) == 1, right
        scripts[name] = SCRIPT.replace(right, wrong)
    for name, text in scripts.items():
        (work / f"{name}.py").write_text(text)
    (work / "mypy.ini").write_text(CONFIG)
    cmd = [sys.executable, "-m", "mypy", "--config-file", "mypy.ini", "--cache-dir", str(work / "cache")]
    env = {**os.environ, "MYPYPATH": str(work / "site")}
    run = subprocess.run(
        [*cmd, *(f"{name}.py" for name in scripts)],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    out = run.stdout + run.stderr
    assert run.returncode in (0, 1) and re.search(r"^(Success|Found \d+ error)", out, re.M), out
    found: dict[str, list[str]] = {name: [] for name in scripts}
    for line in out.splitlines():
        m = re.match(r"(\w+)\.py:(\d+: error: .*)", line)
        if m:
            found[m.group(1)].append(m.group(2))
    return found


def test_documented_use_passes_strict(errors: dict[str, list[str]]) -> None:
    assert errors["documented"] == []


@pytest.mark.parametrize("script", sorted(TYPOS))
def test_typo_fails_strict(errors: dict[str, list[str]], script: str) -> None:
    said = TYPOS[script][2]
    assert len(errors[script]) == 1 and said in errors[script][0], errors[script]
    assert errors[script][0].endswith("[attr-defined]"), errors[script]
