"""Warnings and errors about damaged images name the file the sample was packed from.

A tree with ``cat/truncated.jpg`` (half a JPEG: does not decode) and ``dog/damaged.jpg`` (cut, with
an end marker: libjpeg decodes it, writing ``Corrupt JPEG data: premature end of data segment`` to
stderr), packed with ``check="none"``, read by real DataLoader workers.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import warnings

import pytest
import torch

from imgshards.loader import CorruptImageError, ShardDataset, make_loader
from imgshards.loader.pipeline import tar

IDENTITY = torch.nn.Identity()


@pytest.fixture(autouse=True)
def _fresh_budget_of_member_looks(monkeypatch):
    """A process reads a shard again for a message's file name 64 times at most (``tar._member``).

    The tests before these in the same process (two files at a time under ``pytest -n 2``) may have
    spent it; these start from a fresh budget, as a training process does.
    """
    monkeypatch.setattr(tar, "_member_looks", 0)


@pytest.fixture(scope="module")
def damaged(tiny_tree, packed_factory, tmp_path_factory):
    src = tmp_path_factory.mktemp("damaged") / "src"
    for name, folder in zip(
        ["cat", "dog"], sorted(p for p in tiny_tree.iterdir() if p.is_dir()), strict=False
    ):
        shutil.copytree(folder, src / name)
    whole = sorted((src / "cat").iterdir())[0].read_bytes()
    (src / "cat" / "truncated.jpg").write_bytes(whole[: len(whole) // 2])
    other = sorted((src / "dog").iterdir())[0].read_bytes()
    (src / "dog" / "damaged.jpg").write_bytes(other[: len(other) * 9 // 10] + b"\xff\xd9")
    return packed_factory(src, shard_size=20_000, check="none")


def one_pass(root, num_workers, **kw):
    loader = make_loader(ShardDataset(root, batch_size=4, transform=IDENTITY, **kw), num_workers=num_workers)
    return [b for b in loader]


def test_warnings_in_this_process_name_the_files_and_give_no_advice_in_force(damaged):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batches = one_pass(damaged, 0)
    messages = [str(w.message) for w in caught]
    skipped = [m for m in messages if m.startswith("skipped image cat/truncated.jpg (sample '")]
    assert len(skipped) == 1, messages
    assert "does not decode" in skipped[0] and "on_error" not in skipped[0]  # skip is in force
    libjpeg = [m for m in messages if m.startswith("image dog/damaged.jpg (sample '")]
    assert len(libjpeg) == 1 and "libjpeg: Corrupt JPEG data: premature end of data segment" in libjpeg[0]
    assert sum(len(b.labels) for b in batches) == 21  # 20 + 2, less the one that does not decode


SCRIPT = """
import sys, torch
from imgshards.loader import ShardDataset, make_loader
ds = ShardDataset(sys.argv[1], batch_size=4, transform=torch.nn.Identity())
print(sum(len(b.labels) for b in make_loader(ds, num_workers=2)))
"""


def test_workers_name_the_files_and_libjpeg_writes_nothing_of_its_own(damaged, tmp_path):
    """As users run it: a script, whose DataLoader workers print their warnings to its stderr."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    run = subprocess.run(
        [sys.executable, str(script), str(damaged)], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "21"
    err = run.stderr
    assert re.search(r"RuntimeWarning: skipped image cat/truncated\.jpg \(sample '\d+' in shard ", err), err
    assert "dog/damaged.jpg" in err
    # libjpeg's own line only inside ours, which names the file
    lines = [line for line in err.splitlines() if "Corrupt JPEG data" in line]
    assert lines and all("dog/damaged.jpg" in line for line in lines), err
    assert 'on_error="skip"' not in err


def test_the_error_with_on_error_raise_names_the_file(damaged):
    with pytest.raises(
        CorruptImageError, match=r"^image cat/truncated\.jpg \(sample '\d+' in shard .*does not decode"
    ):
        one_pass(damaged, 2, on_error="raise", shuffle=False)
