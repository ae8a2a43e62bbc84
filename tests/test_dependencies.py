"""Every module the tests, the notebooks and the benchmarks import is declared in pyproject.

A package installed by hand on the CI machine once hid a missing ``dev`` entry (``hypothesis``):
the suite passed there and failed at collection on a fresh machine. This reads the imports with
``ast`` and maps each top-level module to the distributions that install it
(``importlib.metadata.packages_distributions()``); one of them must be a core dependency or in the
``dev`` extra, which the README's install command installs.
"""

import ast
import json
import re
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("tests", "notebooks", "bench")


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared() -> set[str]:
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = project["dependencies"] + project["optional-dependencies"]["dev"]
    return {_normalize(re.split(r"[\s<>=!~\[;]", req, maxsplit=1)[0]) for req in requirements}


def _sources() -> dict[Path, str]:
    found: dict[Path, str] = {}
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            found[path] = path.read_text()
        for path in sorted((ROOT / folder).rglob("*.ipynb")):
            cells = json.loads(path.read_text())["cells"]
            code = ("".join(c["source"]) for c in cells if c["cell_type"] == "code")
            # IPython magics and shell escapes are not Python.
            lines = (
                ln for cell in code for ln in cell.splitlines() if not ln.lstrip().startswith(("%", "!"))
            )
            found[path] = "\n".join(lines)
    return found


def _top_level_imports(source: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def _local_modules() -> set[str]:
    """Modules of the repo itself (test helpers, bench scripts), importable beside the importer."""
    return {p.stem for folder in SCANNED for p in (ROOT / folder).rglob("*.py")} | {"imgshards"}


def undeclared_imports() -> dict[str, list[str]]:
    """Module -> files importing it, for every import no declared distribution provides."""
    declared = _declared()
    providers = packages_distributions()
    local = _local_modules()
    missing: dict[str, list[str]] = {}
    for path, source in _sources().items():
        for module in sorted(_top_level_imports(source) - set(sys.stdlib_module_names) - local):
            if not {_normalize(d) for d in providers.get(module, [])} & declared:
                missing.setdefault(module, []).append(str(path.relative_to(ROOT)))
    return missing


def test_every_imported_module_is_declared():
    missing = undeclared_imports()
    assert not missing, "imported but not provided by the dependencies or the dev extra: " + "; ".join(
        f"{module} (in {', '.join(files)})" for module, files in sorted(missing.items())
    )


def test_the_guard_sees_notebooks_and_benchmarks():
    sources = _sources()
    assert any(p.suffix == ".ipynb" for p in sources)
    assert any(p.parent.name == "bench" for p in sources)
    # The notebook's own imports are read (matplotlib, say), not only the test that runs it.
    notebook = next(s for p, s in sources.items() if p.suffix == ".ipynb")
    assert "matplotlib" in _top_level_imports(notebook)


def test_the_dev_extra_holds_every_other_extra():
    # `pip install -e ".[dev]"` (the README's set-up, what CI installs) is enough for the remote
    # file systems, bench --plot and the notebooks: every other extra's packages are in dev. Except
    # gcs: nothing here reaches Google Cloud Storage, and no test imports gcsfs.
    tomllib = pytest.importorskip("tomllib")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    dev = {_normalize(re.split(r"[\s<>=!~\[;]", req, maxsplit=1)[0]) for req in extras["dev"]}
    assert {"jupyterlab", "ipywidgets"} <= {_normalize(req.split(">")[0]) for req in extras["notebooks"]}
    for name, requirements in extras.items():
        if name == "gcs":
            continue
        for req in requirements:
            base = _normalize(re.split(r"[\s<>=!~\[;]", req, maxsplit=1)[0])
            assert base in dev, f"the {name!r} extra's {req!r} is not in the dev extra"


def _names(requirements: list[str]) -> set[str]:
    return {_normalize(re.split(r"[\s<>=!~\[;]", req, maxsplit=1)[0]) for req in requirements}


def notebook_imports_not_installed(extra: list[str]) -> dict[str, list[str]]:
    """Module -> notebooks importing it, for every import that the base dependencies plus ``extra`` lack.

    What ``pip install -e ".[notebooks]"`` installs is the dependencies and the extra's packages (and
    theirs); a module counts as installed when a distribution that provides it is one of those named.
    """
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    installed = _names(project["dependencies"]) | _names(extra)
    providers = packages_distributions()
    missing: dict[str, list[str]] = {}
    for path, source in _sources().items():
        if path.suffix != ".ipynb":
            continue
        for module in sorted(_top_level_imports(source) - set(sys.stdlib_module_names) - {"imgshards"}):
            if not {_normalize(d) for d in providers.get(module, [])} & installed:
                missing.setdefault(module, []).append(path.name)
    return missing


def test_the_notebooks_extra_holds_every_module_the_notebooks_import():
    # `pip install -e ".[notebooks]"`, then a notebook, on a user's install (no dev extra): a module
    # imported by a code cell but in neither the dependencies nor the extra is a ModuleNotFoundError
    # there (matplotlib was, in explore.ipynb's first cell).
    tomllib = pytest.importorskip("tomllib")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    missing = notebook_imports_not_installed(extras["notebooks"])
    assert not missing, "imported by a notebook but not installed by the notebooks extra: " + "; ".join(
        f"{module} (in {', '.join(files)})" for module, files in sorted(missing.items())
    )
    # The check sees the notebooks' cells: without the extra, matplotlib is missing from both.
    assert notebook_imports_not_installed([])["matplotlib"] == ["explore.ipynb", "loader.ipynb"]
