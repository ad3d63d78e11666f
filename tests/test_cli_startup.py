"""The command line starts without the heavy libraries it does not need: `taxmodel --help` (and
every command's --help) imports neither pandas nor matplotlib, torch or triton, and the commands
that only read ledgers (show, analyze, advise) do not import matplotlib, which only a report or a
figure draws with. Each check runs in a fresh interpreter: this test process has them all loaded."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("pandas", "pyarrow", "matplotlib", "torch", "triton")


def _loaded_after(code: str) -> list[str]:
    probe = f"import sys\n{code}\nimport json\nprint(json.dumps(sorted(m for m in {list(HEAVY)!r} if m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_help_imports_no_heavy_library():
    code = ("from click.testing import CliRunner\nfrom taxmodel.cli import cli\n"
            "for args in (['--help'], ['analyze', '--help'], ['profile', '--help'], ['predict', '--help']):\n"
            "    assert CliRunner().invoke(cli, args).exit_code == 0, args")
    assert _loaded_after(code) == []


@pytest.mark.parametrize("module", ["taxmodel.report.build", "taxmodel.report.advice", "taxmodel.report.terminal",
                                    "taxmodel.report.blocks", "taxmodel.api"])
def test_reading_ledgers_does_not_import_matplotlib(module):
    assert "matplotlib" not in _loaded_after(f"import {module}")


def test_the_trace_package_still_exports_the_bundle_store():
    import taxmodel.trace as trace
    from taxmodel.trace import Bundle, load_bundle, write_bundle
    from taxmodel.trace import bundle

    assert (Bundle, load_bundle, write_bundle) == (bundle.Bundle, bundle.load_bundle, bundle.write_bundle)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        trace.nope  # noqa: B018
