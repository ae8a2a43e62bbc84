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
        "import sys, imgshards.converter, imgshards.converter.engine\n"
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


# What the loader shares with the converter: the index, the errors, and the readers both sides must
# agree on (one tar member parser, one image header walker), never the packing itself.
SHARED_WITH_THE_LOADER = {
    "imgshards.converter.format.manifest",
    "imgshards.converter.format.errors",
    "imgshards.converter.format.headers",
    "imgshards.converter.format.tarstream",
    "imgshards.converter.format.tarsamples",
    # The timeouts a URL's file system is given (with_timeouts): the index is read with them too.
    "imgshards.converter.format.remotefs",
    # EXIF orientation, applied one way by pack's conversions and the loader's scaled decode.
    "imgshards.converter.format.formats",
    # Where a dataset is: a path or a URL, its index.json (ShardDataset takes what the CLI takes).
    "imgshards.converter.format.locate",
    # The tables of image formats and storage protocols, one each for both halves (issue 39).
    "imgshards.converter.format.imageformats",
    "imgshards.converter.format.protocols",
    # A split's label reader and its tables of samples (ImageFolder's random access, targets, samples).
    "imgshards.converter.format.labels",
    "imgshards.converter.format.tables",
    # The index's bounds (a sample's least size bounds a shard's claimed count against its file).
    "imgshards.converter.format.validate",
}


def test_loader_imports_only_the_index_and_the_shared_readers_from_the_converter():
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
