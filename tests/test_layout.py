"""The code stays laid out by concern: no import cycle between modules, no module past ~400 lines."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"converter": "imgshards.converter", "loader": "imgshards.loader", "cli": "imgshards.cli"}
MAX_LINES = 400


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


@pytest.mark.parametrize("folder", sorted(FOLDERS))
def test_no_module_is_too_long_to_read_in_one_sitting(folder):
    long = {
        str(p.relative_to(ROOT)): n
        for p in (ROOT / folder).rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"split these by concern (more than {MAX_LINES} lines): {long}"
