"""CI runs the README's set-up, word for word, in a fresh clone and a virtual environment it makes itself."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _setup_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Set up\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def _quick_start_installs() -> list[str]:
    """The ``pip install`` commands of the README's quick start, without their comments."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    lines = [line.split("#", 1)[0].strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line.startswith("pip install")]


def _ci_lines() -> list[str]:
    return [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]


def _first(lines: list[str], predicate) -> int:
    return next(i for i, line in enumerate(lines) if predicate(line))


def test_ci_runs_the_readme_commands_in_a_fresh_venv():
    commands = _setup_commands()
    assert commands == [
        'pip install -e ".[dev]" && imgshards demo',
        "python -m pytest -n 2",
        "python -m pytest -n 2 -m integration",
    ]
    ci = _ci_lines()
    for command in commands:
        assert command in ci, f"the README's {command!r} is not what .ci/run runs"
    venv = _first(ci, lambda line: line.startswith("python3 -m venv"))
    activate = _first(ci, lambda line: line.startswith("source ") and "bin/activate" in line)
    assert venv < activate < ci.index(commands[0])
    assert "--system-site-packages" not in ci[venv]


def test_ci_first_runs_the_user_install_and_the_demo_without_the_dev_extra():
    # The quick start's install, as a user types it (its first line, PyTorch's CPU-only index, is not
    # reachable from CI: torch comes from pip's default index there, and the README says so).
    installs = _quick_start_installs()
    assert installs[-1] == "pip install -e ." and all("[" not in line for line in installs)
    ci = _ci_lines()
    assert not any("download.pytorch.org" in line for line in ci if not line.startswith("#"))
    user, dev = ci.index("pip install -e ."), ci.index('pip install -e ".[dev]" && imgshards demo')
    demo = ci.index("imgshards demo")
    activate = _first(ci, lambda line: line.startswith("source ") and "bin/activate" in line)
    cd = _first(ci, lambda line: line == 'cd "$clone"')
    assert activate < cd < user < demo < dev, "the user install and its demo come first, in the clone"
    # Between them, nothing installs anything, and a check that no dev package came with it.
    between = [line for line in ci[user + 1 : demo] if line and not line.startswith("#")]
    assert not any("pip " in line for line in between)
    assert any("pytest" in line and "find_spec" in line for line in ci[user:demo])
    readme = (ROOT / "README.md").read_text()
    assert "`imgshards demo` then checks the install" in readme


def test_ci_runs_them_in_a_fresh_clone_with_no_shared_beside_it():
    ci = _ci_lines()
    install, test = ci.index('pip install -e ".[dev]" && imgshards demo'), ci.index("python -m pytest -n 2")
    integration = ci.index("python -m pytest -n 2 -m integration")
    clone = _first(ci, lambda line: line.startswith("git clone "))
    assert ci[clone].endswith('"$checkout" "$clone"')
    cd = _first(ci, lambda line: line == 'cd "$clone"')
    assert clone < cd < install < test < integration, "install and tests run inside the clone"
    # The clone's parent is a new temporary directory; ../shared appears beside it only after both
    # tiers ran (the last run, with the real photos).
    assert ci[_first(ci, lambda line: line.startswith("work=$(mktemp -d"))]
    link = [i for i, line in enumerate(ci) if line.startswith("ln -s ") and '"$work/shared"' in line]
    assert all(i > integration for i in link)
    # pytest's exit status is checked after each tier, and 5 (no test collected) is a failure.
    for run in (test, integration):
        after = ci[run + 1 : run + 4]
        assert "status=$?" in after and any(line.startswith("tests_passed ") for line in after)
    passed = "\n".join(ci[_first(ci, lambda line: line.startswith("tests_passed()")) :])
    assert re.search(r"0\) return 0 ;;", passed) and not re.search(r"5\) return 0", passed)


def test_every_tree_cut_from_the_photos_is_made_by_a_marked_fixture():
    # .ci/run's second run (../shared made visible) runs only the tests marked `photos`: those whose
    # fixtures include one of conftest's PHOTO_FIXTURES. A make_tree call anywhere else would read
    # the photos unmarked, and never run against them in CI.
    import ast

    from .conftest import PHOTO_FIXTURES

    callers = set()
    for path in sorted((ROOT / "tests").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        # Module-level functions and methods: a call in a nested function counts for the one it is in.
        outer = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
        outer += [
            m
            for c in tree.body
            if isinstance(c, ast.ClassDef)
            for m in c.body
            if isinstance(m, ast.FunctionDef)
        ]
        for func in outer:
            if func.name != "make_tree":
                for node in ast.walk(func):
                    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "make_tree":
                        callers.add(f"{path.relative_to(ROOT)}:{func.name}")
    unmarked = sorted(c for c in callers if c.rsplit(":", 1)[1] not in PHOTO_FIXTURES)
    assert callers and not unmarked, f"make_tree called outside PHOTO_FIXTURES: {unmarked}"
