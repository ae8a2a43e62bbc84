"""Every notebook in notebooks/ runs top to bottom on its demo default, and is stored clean.

A run draws its figures (PNG outputs), writes nothing to stderr (no warning, no progress bar), and
leaves no temporary directory behind: neither when it runs to its last cell (which removes it) nor when
the kernel stops before (the notebook's ``atexit`` hook removes it then). The kernel runs with
``IMGSHARDS_NOTEBOOK_SMALL=1``, which the notebooks read to shrink their demo and their rounds, and
with ``TMPDIR`` in the test's own directory, where the demo's ``imgshards-notebook-*`` folder is made.
A notebook is pointed at a dataset without editing it: ``IMGSHARDS_DATA``, read by its first code
cell, which is tagged ``parameters`` for papermill's ``-p DST ...``.
"""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

from imgshards.converter import PackConfig, make_synthetic_tree, pack

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT_S = 240
DEMO_PREFIX = "imgshards-notebook-"
# Calls that draw data on axes: a cell making them labels both axes. Pictures alone (imshow) need a title.
PLOTS = (".hist(", ".scatter(", ".bar(", ".barh(", ".plot(", ".errorbar(")


def test_there_are_notebooks():
    # A moved folder must not turn the tests below into zero tests that pass.
    assert NOTEBOOKS, "no notebooks/*.ipynb found"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_stored_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    dirty = [
        i
        for i, cell in enumerate(nb.cells)
        if cell.cell_type == "code" and (cell.outputs or cell.execution_count is not None)
    ]
    assert not dirty, f"{path.name}: cells {dirty} hold outputs; clear them before committing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_imports_only_the_installed_package(path):
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        assert "sys.path" not in cell.source, f"{path.name}: import imgshards as installed, no sys.path edits"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_figures_are_titled_and_labelled(path):
    nb = nbformat.read(path, as_version=4)
    figures = [c.source for c in nb.cells if c.cell_type == "code" and "plt.subplots(" in c.source]
    assert figures, f"{path.name} draws no figure"
    for source in figures:
        first = source.strip().splitlines()[0]
        assert "set_title(" in source or "suptitle(" in source, f"{path.name}: untitled figure in {first!r}"
        if any(call in source for call in PLOTS):
            assert "set_xlabel(" in source and "set_ylabel(" in source, (
                f"{path.name}: a plot without axis labels in the cell starting {first!r}"
            )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_reads_the_small_switch_and_cleans_up(path):
    source = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells)
    assert "IMGSHARDS_NOTEBOOK_SMALL" in source, f"{path.name}: CI runs it small; read the switch"
    assert f'prefix="{DEMO_PREFIX}"' in source, f"{path.name}: make the demo directory with this prefix"
    assert "atexit.register(" in source, f"{path.name}: remove the demo directory when the kernel stops"


def _run(nb, tmp_path: Path, data: Path | None = None) -> Path:
    """Run ``nb`` in a fresh kernel, then shut the kernel down as a user's Jupyter does; return its TMPDIR.

    ``data``: the dataset given in ``IMGSHARDS_DATA``; None runs the notebook's demo (whatever the
    environment running the tests holds).
    """
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env = {**os.environ, "TMPDIR": str(tmpdir), "IMGSHARDS_NOTEBOOK_SMALL": "1"}
    env.pop("IMGSHARDS_DATA", None)
    if data is not None:
        env["IMGSHARDS_DATA"] = str(data)
    env.pop("MPLBACKEND", None)  # the kernel's inline backend, which makes the PNG outputs
    # ipykernel's own "python3" spec, whose command is this interpreter: a user's or the system's
    # kernelspec of the same name could start another Python, without imgshards installed.
    kernel = KernelManager(kernel_name="python3", kernel_spec_manager=KernelSpecManager(kernel_dirs=[]))
    client = NotebookClient(
        nb, km=kernel, timeout=CELL_TIMEOUT_S, resources={"metadata": {"path": str(tmp_path)}}
    )
    try:
        client.execute(env=env)  # raises CellExecutionError, with the cell and its traceback, if a cell fails
    finally:
        if kernel.has_kernel:  # a client given its kernel manager leaves the kernel running
            kernel.shutdown_kernel()  # graceful: the kernel's atexit hooks run
    return tmpdir


def _outputs(nb):
    return [(i, out) for i, cell in enumerate(nb.cells) if cell.cell_type == "code" for out in cell.outputs]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_runs_end_to_end(path, tmp_path):
    nb = nbformat.read(path, as_version=4)
    tmpdir = _run(nb, tmp_path)
    outputs = _outputs(nb)

    stderr = [(i, out.text) for i, out in outputs if out.output_type == "stream" and out.name == "stderr"]
    assert not stderr, f"{path.name} wrote to stderr (cell, text): {stderr}"
    pngs = [i for i, out in outputs if out.output_type == "display_data" and "image/png" in out.data]
    assert pngs, f"{path.name} drew no figure"

    printed = "".join(out.text for _, out in outputs if out.output_type == "stream")
    assert str(tmpdir / DEMO_PREFIX) in printed, "the demo was not made under TMPDIR"
    left = list(tmpdir.glob(f"{DEMO_PREFIX}*"))
    assert not left, f"{path.name} left {left} behind"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_a_kernel_stopped_early_removes_the_demo(path, tmp_path):
    nb = nbformat.read(path, as_version=4)
    # Up to the cell that makes the demo dataset: the cleanup cell never runs, the atexit hook must.
    demo = next(i for i, c in enumerate(nb.cells) if f'prefix="{DEMO_PREFIX}"' in c.source)
    nb.cells = nb.cells[: demo + 1]
    tmpdir = _run(nb, tmp_path)
    printed = "".join(out.text for _, out in _outputs(nb) if out.output_type == "stream")
    assert str(tmpdir / DEMO_PREFIX) in printed, "the demo was not made under TMPDIR"
    left = list(tmpdir.glob(f"{DEMO_PREFIX}*"))
    assert not left, f"{path.name} left {left} behind when stopped after cell {demo}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_the_first_code_cell_takes_the_dataset_from_the_environment_and_papermill(path):
    nb = nbformat.read(path, as_version=4)
    first = next(c for c in nb.cells if c.cell_type == "code")
    assert "parameters" in first.metadata.get("tags", []), (
        f"{path.name}: tag the first code cell 'parameters'"
    )
    assert 'DST = os.environ.get("IMGSHARDS_DATA")' in first.source


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    """A packed dataset of the notebooks' kind (train and val), made through the real packer."""
    root = tmp_path_factory.mktemp("given")
    src = make_synthetic_tree(root / "photos", classes=8, per_class=40)
    return pack(src, root / "shards", PackConfig(val_fraction=0.25, shard_size=300_000, workers=2)).dst


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_runs_on_the_dataset_imgshards_data_names(path, tmp_path, dataset):
    nb = nbformat.read(path, as_version=4)
    tmpdir = _run(nb, tmp_path, data=dataset)
    outputs = _outputs(nb)
    stderr = [(i, out.text) for i, out in outputs if out.output_type == "stream" and out.name == "stderr"]
    assert not stderr, f"{path.name} wrote to stderr (cell, text): {stderr}"
    printed = "".join(out.text for _, out in outputs if out.output_type == "stream")
    assert f"dataset: {dataset}" in printed
    assert DEMO_PREFIX not in printed and not list(tmpdir.glob(f"{DEMO_PREFIX}*")), (
        "it built the demo instead"
    )
    assert any(out.output_type == "display_data" and "image/png" in out.data for _, out in outputs)
