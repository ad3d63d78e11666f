"""Wrong options and arguments end in one line naming where to look, exit 2, like every other
error of the CLI (issue 27: "the CLI turns every failure into one line and exit 2")."""
from __future__ import annotations

import pytest
from cli_runner import stderr_runner

from taxmodel.cli import cli


@pytest.mark.parametrize("args, says, where", [
    (["import", "."], "is a directory", "taxmodel import --help"),
    (["analyze", "no/such/bundle"], "does not exist", "taxmodel analyze --help"),
    (["analyze", "--bogus", "x"], "No such option '--bogus'", "taxmodel analyze --help"),
    (["--bogus"], "No such option '--bogus'", "taxmodel --help"),
    (["nosuch"], "No such command 'nosuch'", "taxmodel --help"),
    (["analyze"], "Missing argument", "taxmodel analyze --help"),
    (["baseline", "update", "--bogus"], "No such option '--bogus'", "taxmodel baseline update --help"),
])
def test_a_usage_error_is_one_line(args, says, where):
    r = stderr_runner().invoke(cli, args, prog_name="taxmodel")
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith("taxmodel: error: ") and says in lines[0] and f"(see '{where}')" in lines[0]


def test_the_bare_command_still_shows_its_help():
    r = stderr_runner().invoke(cli, [], prog_name="taxmodel")
    assert "Usage: taxmodel" in r.output and "Commands:" in r.output
