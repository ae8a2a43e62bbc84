"""Every notebook in notebooks/ runs top to bottom on its demo default, and is stored clean."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT_S = 240


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
def test_runs_end_to_end(path, tmp_path):
    nb = nbformat.read(path, as_version=4)
    # ipykernel's own "python3" spec, whose command is this interpreter: a user's or the system's
    # kernelspec of the same name could start another Python, without imgshards installed.
    kernel = KernelManager(kernel_name="python3", kernel_spec_manager=KernelSpecManager(kernel_dirs=[]))
    client = NotebookClient(
        nb, km=kernel, timeout=CELL_TIMEOUT_S, resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # raises CellExecutionError, with the cell and its traceback, if a cell fails
