"""The launcher's part that every command starting ranks shares (``launch_ranks``), with stand-in
ranks (``fake_rank.py``): one diagnosis naming the first failure, the ranks' tracebacks kept in
one file that it names (off the terminal unless TAXMODEL_TRACEBACK is set), every rank gone
after a timeout, and the run directory removed."""
from __future__ import annotations

import os
import re
import sys
import time
import uuid
from pathlib import Path

import pytest
from processes import MARK, outlived

from taxmodel.errors import RunError
from taxmodel.runtime import launcher

FAKE = str(Path(__file__).with_name("fake_rank.py"))


@pytest.fixture
def tmpdir_env(tmp_path, monkeypatch):
    """The temp dir the launcher uses (its run directory, a kept log), empty at the start."""
    import tempfile

    d = tmp_path / "tmp"
    d.mkdir()
    monkeypatch.setenv("TMPDIR", str(d))
    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    mark = uuid.uuid4().hex
    monkeypatch.setenv(MARK, mark)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")]))
    yield d, mark
    monkeypatch.setattr(tempfile, "tempdir", None)


def _launch(mode: str, timeout_s: float = 60, *extra: str) -> launcher.RanksRun:
    with launcher.run_directory() as run_dir:
        return launcher.launch_ranks([sys.executable, FAKE, mode, *extra], 2, run_dir=run_dir, device="cpu",
                                     deadline_unix=time.time() + timeout_s, timeout_s=timeout_s, quiet=False)


def test_what_the_ranks_print_on_stderr_goes_to_the_runs_log_and_what_they_say_to_the_terminal(tmpdir_env, capfd):
    """Third-party libraries print on a rank's stderr (Kineto's USDT lines, 16 per CPU profile):
    the run's log keeps them, the terminal gets only what a rank says to the user (rank 0's
    progress, through status.terminal)."""
    tmpdir, _ = tmpdir_env
    run = _launch("noise")
    err = capfd.readouterr().err
    assert "USDT" not in err and err.count("progress: done") == 1, err
    assert run.log is not None and list(tmpdir.iterdir()) == [run.log] and run.lines == 2
    text = run.log.read_text()
    assert text.index("== rank 0 output ==") < text.index("== rank 1 output ==") and text.count("profiler_start") == 2
    assert str(run.log) in launcher.ranks_output_note(run) and "2 line(s)" in launcher.ranks_output_note(run)
    # a failed run keeps it too, in the file its message names
    with pytest.raises(RunError) as failed:
        _launch("noise", 60, "fail")
    kept = Path(re.search(r"what the ranks printed is in (\S+)$", str(failed.value)).group(1))
    assert kept.read_text().count("profiler_start") == 2 and "USDT" not in capfd.readouterr().err


def test_a_failed_run_keeps_the_tracebacks_in_one_file_it_names(tmpdir_env, capfd):
    tmpdir, mark = tmpdir_env
    with pytest.raises(RunError) as err:
        _launch("raise")
    msg = str(err.value)
    assert msg.startswith("rank 1 failed in phase 'work': ValueError: fake failure on rank 1 (rank(s) 0 failed after it)")
    log = Path(re.fullmatch(r".*; the tracebacks of rank\(s\) 0, 1 are in (\S+)", msg).group(1))
    text = log.read_text()
    assert text.index("== rank 0 ==") < text.index("== rank 1 ==")
    assert text.count("Traceback (most recent call last)") == 2 and "fake failure on rank 1" in text
    assert "Traceback" not in capfd.readouterr().err  # the ranks said nothing on the terminal
    assert list(tmpdir.iterdir()) == [log]  # the run directory went, the log stayed
    assert outlived(mark) == {}


def test_tracebacks_reach_stderr_too_with_taxmodel_traceback(tmpdir_env, capfd, monkeypatch):
    monkeypatch.setenv("TAXMODEL_TRACEBACK", "1")
    with pytest.raises(RunError, match="tracebacks of rank"):
        _launch("raise")
    assert "ValueError: fake failure on rank 1" in capfd.readouterr().err


def test_a_timeout_kills_every_rank_within_seconds(tmpdir_env):
    tmpdir, mark = tmpdir_env
    t0 = time.monotonic()
    with pytest.raises(RunError, match=r"run timed out after 3 s: rank 0 hung in phase 'work'; rank 1 hung"):
        _launch("sleep", timeout_s=3)
    assert time.monotonic() - t0 < 3 + launcher.KILL_GRACE_S + 5
    assert outlived(mark) == {} and list(tmpdir.iterdir()) == []  # no log: no rank had a traceback


@pytest.mark.parametrize("module", ["taxmodel.runtime.worker", "taxmodel.runtime.calibrate"])
def test_a_rank_never_imports_modules_of_the_working_directory(tmp_path, module):
    """Issue 38: ranks started with `python -m` had the working directory first on sys.path, so a
    `numpy.py` there ran inside every rank of `taxmodel profile`."""
    import subprocess

    (tmp_path / "numpy.py").write_text("open('pwned', 'w').write('x')\nraise SystemExit(7)\n")
    cmd = [*launcher.python_module_command(module), "--help"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not (tmp_path / "pwned").exists()
