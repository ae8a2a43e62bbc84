"""Guards for the layout traps: subpackages dropping out of the wheel, `converter` imported twice."""

import ast
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_holds_every_subpackage_under_imgshards(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("imgshards-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert top == {"imgshards"}
    packages = {n.rsplit("/", 1)[0] for n in names if n.endswith("/__init__.py")}
    on_disk = {
        f"imgshards/{init.parent.relative_to(ROOT).as_posix()}"
        for folder in ("converter", "loader", "cli")
        for init in (ROOT / folder).rglob("__init__.py")
    }
    assert {"imgshards/loader/remote", "imgshards/loader/profiling"} <= on_disk
    assert packages == on_disk
    modules = {
        f"imgshards/{p.relative_to(ROOT).as_posix()}"
        for f in ("converter", "loader", "cli")
        for p in (ROOT / f).rglob("*.py")
    }
    assert modules <= set(names), sorted(modules - set(names))
    # PEP 561: users' type checkers read the annotations of every part of the namespace.
    assert {f"imgshards/{f}/py.typed" for f in ("converter", "loader", "cli")} <= set(names)
    # `pip show imgshards` lists webdataset: the loader's pass is a webdataset pipeline.
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    requires = re.findall(
        r"^Requires-Dist: ([A-Za-z0-9_.-]+)", zipfile.ZipFile(wheel).read(metadata).decode(), re.M
    )
    assert "webdataset" in requires and "torch" in requires


def test_top_level_names_are_not_importable_twice():
    assert "converter" not in sys.modules and "loader" not in sys.modules and "cli" not in sys.modules
    import imgshards.converter

    assert Path(imgshards.converter.__file__).parent == ROOT / "converter"


def test_converter_needs_no_torch_ray_loader_or_click():
    code = (
        # The engine seam included: Ray is imported only when `--engine ray` starts it.
        "import sys, imgshards.converter, imgshards.converter.engines.engine\n"
        "imgshards.converter.PackConfig(engine='ray', ray_address='auto')\n"
        "bad = [m for m in ('torch', 'webdataset', 'click', 'ray', 'imgshards.loader', 'imgshards.cli')"
        " if m in sys.modules]\n"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd="/")


def _imports(folder: str) -> set[str]:
    found = set()
    for path in (ROOT / folder).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module)
    return found


# What the loader shares with the converter: the packed format, converter/format/ (issue 45): the
# index, the errors, and the readers both sides must agree on (one tar member parser, one image
# header walker, the tables of formats and protocols), never the packing itself. tests/test_layout.py
# checks that format/ imports nothing else of the converter.
SHARED_WITH_THE_LOADER = {"imgshards.converter.format"} | {
    f"imgshards.converter.format.{path.stem}"
    for path in (ROOT / "converter" / "format").glob("*.py")
    if path.name != "__init__.py"
}


def test_loader_imports_only_the_index_and_the_shared_readers_from_the_converter():
    assert "imgshards.converter.format.manifest" in SHARED_WITH_THE_LOADER
    used = {m for m in _imports("loader") if m.startswith("imgshards.converter") or m == "click"}
    assert used <= SHARED_WITH_THE_LOADER, used


def test_converter_never_imports_the_loader_or_the_cli():
    assert not {
        m
        for m in _imports("converter")
        if m.split(".")[0] in ("click", "torch", "torchvision")
        or m.startswith(("imgshards.loader", "imgshards.cli"))
    }


# Distribution name -> the module it installs, where they differ.
_MODULE_OF = {"pillow": "PIL", "pillow-heif": "pillow_heif"}


def test_core_dependencies_are_exactly_what_the_packages_import():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = _modules(project["dependencies"])
    extras = _modules(project["optional-dependencies"]["plot"])  # imported only by `bench --plot`
    extras |= _modules(project["optional-dependencies"]["ray"])  # only by `pack --engine ray`
    extras |= _modules(project["optional-dependencies"]["http"])  # only for http(s):// URLs (timeouts)
    extras |= _modules(project["optional-dependencies"]["heic"])  # only to open a HEIC file
    imported = (
        {m.split(".")[0] for folder in ("converter", "loader", "cli") for m in _imports(folder)}
        - set(sys.stdlib_module_names)
        - {"imgshards"}
    )
    assert imported - core <= extras, f"imported but not a dependency: {sorted(imported - core - extras)}"
    assert core <= imported, f"a dependency nothing imports: {sorted(core - imported)}"


def _modules(requirements: list[str]) -> set[str]:
    names = (re.split(r"[\s<>=!~\[;]", req, maxsplit=1)[0].lower() for req in requirements)
    return {_MODULE_OF.get(name, name) for name in names}
