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


def test_predict_plot_without_a_sweep_is_refused_not_ignored(tmp_path):
    """--plot drew nothing without --sweep and exited 0: the figure asked for was never written."""
    png = tmp_path / "curve.png"
    r = stderr_runner().invoke(cli, ["predict", "ag_gemm", "--plot", str(png)], prog_name="taxmodel")
    assert r.exit_code == 2 and "--plot draws the curve of a --sweep" in r.stderr and not png.exists(), r.stderr


def test_predict_plot_never_replaces_the_hardware_file_it_reads(tmp_path):
    import json

    from taxmodel.hardware.specs import find_preset

    hw = tmp_path / "hw.json"
    hw.write_text(json.dumps(find_preset("h100").to_dict()))
    before = hw.read_bytes()
    r = stderr_runner().invoke(cli, ["predict", "ag_gemm", "--hardware", str(hw), "--sweep", "M=1024:4096",
                                     "--plot", str(hw)], prog_name="taxmodel")
    assert r.exit_code == 2 and "is the input" in r.stderr and hw.read_bytes() == before, r.stderr


def test_profile_of_a_command_shows_trace_names_without_obeying_them(tmp_path, monkeypatch):
    """What `profile -- COMMAND` prints of its bundle (names from the job's trace) goes through the
    same terminal filter as every other command's output: an escape sequence is shown, not obeyed."""
    from taxmodel.runtime import command
    from taxmodel.testing.synthetic import synthetic_bundle
    from taxmodel.trace.bundle import write_bundle

    from taxmodel.trace.bundle import load_bundle

    case = synthetic_bundle()
    events = case.bundle.events.copy()
    events.loc[events["name"] == "gemm_kernel", "name"] = "evil\x1b]0;owned\x07kernel"
    out = write_bundle(tmp_path / "job", events, {**case.bundle.meta, "variant": "evil\x1b[2Jvariant"})

    outcome = command.CommandOutcome(out=out, bundle=load_bundle(out), fmt="kineto")
    monkeypatch.setattr(command, "profile_command", lambda req, say=None: outcome)
    r = stderr_runner().invoke(cli, ["profile", "-o", str(out), "--", "python", "train.py"], prog_name="taxmodel")
    assert "evil" in r.output and "\x1b" not in r.output and "\x07" not in r.output, repr(r.output[-400:])
