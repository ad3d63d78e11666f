"""A click test runner that keeps stderr apart from stdout, where this click can (the error-line tests
read the one line the CLI writes to stderr)."""
from __future__ import annotations

from click.testing import CliRunner


def stderr_runner() -> CliRunner:
    try:
        return CliRunner(mix_stderr=False)  # click < 8.2
    except TypeError:
        return CliRunner()  # click >= 8.2 keeps stderr apart by default
