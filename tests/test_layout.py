"""The code stays laid out by concern: no import cycle between modules, the converter apart from the
loader, the data path apart from the benchmark package, every folder saying what it holds.

A module is as long as its one concern needs: there is no line cap (files cut at a cap split concerns).
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"converter": "imgshards.converter", "loader": "imgshards.loader", "cli": "imgshards.cli"}


def _module_name(path: Path) -> str:
    folder, *rest = path.relative_to(ROOT).with_suffix("").parts
    parts = [FOLDERS[folder], *rest]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _import_graph() -> dict[str, set[str]]:
    """Module -> imgshards modules it imports when loaded (module level, not TYPE_CHECKING)."""
    modules = {_module_name(p): p for f in FOLDERS for p in (ROOT / f).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in ast.parse(path.read_text()).body:  # module level only
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                base = f"{base}.{node.module}" if node.level and node.module else (node.module or base)
                # `from . import x` and `from .pkg import mod` import modules; `from .m import f` imports m.
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            edges.update(t for t in targets if t in modules and t != name)
        graph[name] = edges
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycle_between_modules():
    graph = _import_graph()
    assert "imgshards.loader.remote.source" in graph["imgshards.loader.dataset"] or any(
        m.startswith("imgshards.loader.remote") for m in graph["imgshards.loader.dataset"]
    )
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_the_converter_never_imports_the_loader_or_the_cli():
    graph = _import_graph()
    wrong = {
        (m, t)
        for m, targets in graph.items()
        if m.startswith("imgshards.converter")
        for t in targets
        if t.startswith(("imgshards.loader", "imgshards.cli"))
    }
    assert not wrong, wrong


def test_the_data_path_imports_nothing_from_the_benchmark_package():
    # imgshards.loader.profiling (imgshards bench) reads the data path; never the other way round.
    graph = _import_graph()
    wrong = {
        (m, t)
        for m, targets in graph.items()
        if m.startswith("imgshards.loader") and not m.startswith("imgshards.loader.profiling")
        for t in targets
        if t.startswith("imgshards.loader.profiling")
    }
    assert not wrong, wrong


@pytest.mark.parametrize("folder", sorted(FOLDERS))
def test_every_package_says_what_it_holds(folder):
    for init in (ROOT / folder).rglob("__init__.py"):
        tree = ast.parse(init.read_text())
        assert ast.get_docstring(tree), f"{init.relative_to(ROOT)} has no docstring saying what it holds"


def test_no_name_of_the_loader_masks_one_of_its_modules():
    # `imgshards.loader.image.decode` is the module; the function is `decode_image` (or `.decode.decode`).
    import importlib
    import inspect

    for init in (ROOT / "loader").rglob("__init__.py"):
        package = importlib.import_module(_module_name(init))
        for path in init.parent.iterdir():
            is_package = (path / "__init__.py").exists()
            name = path.stem if path.suffix == ".py" else path.name if is_package else None
            if name and name != "__init__" and name in vars(package):
                assert inspect.ismodule(vars(package)[name]), f"{package.__name__}.{name} masks its module"
