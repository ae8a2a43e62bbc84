"""CI runs the README's set-up, word for word, in a virtual environment it makes itself."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _setup_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Set up\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def test_ci_runs_the_readme_commands_in_a_fresh_venv():
    commands = _setup_commands()
    assert commands == ['pip install -e ".[dev]" && imgshards demo', "python -m pytest"]
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    for command in commands:
        assert command in ci, f"the README's {command!r} is not what .ci/run runs"
    venv = next(i for i, line in enumerate(ci) if line.startswith("python3 -m venv"))
    activate = next(i for i, line in enumerate(ci) if line.startswith("source ") and "bin/activate" in line)
    assert venv < activate < ci.index(commands[0])
    assert "--system-site-packages" not in ci[venv]
