"""README's two set-up commands are exactly what CI runs."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _readme_setup_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Set-up", 1)[1].split("\n## ", 1)[0]
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", section, flags=re.S)]


def test_readme_has_two_setup_commands():
    commands = _readme_setup_commands()
    assert len(commands) == 2, commands
    assert "pip install" in commands[0] and "taxmodel" in commands[0]
    assert "pytest" in commands[1]


def test_ci_runs_readme_commands_verbatim():
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    for command in _readme_setup_commands():
        assert command in ci_lines, f".ci/run does not run README's command: {command}"
