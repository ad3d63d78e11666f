"""Crash, hang and interruption of `taxmodel profile`, end to end on 2 CPU ranks (``--inject
kill_rank=R@PHASE`` / ``hang_rank=R@PHASE``): the command ends within seconds of ``--timeout`` with the
right exit code, names the rank that failed, leaves no process behind, no bundle in ``-o`` and no
run directory in the temp dir (the one file a failure keeps there: the ranks' tracebacks, which
the last line names), and says it in one line: the surviving ranks' noise stays off the terminal.

Every process of a run is found through a marker in its environment (``processes.py``), so "no
process left" is checked without trusting the code under test to report its own children.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from processes import MARK, PAST_TIMEOUT_S, last_line as _last_line, marked as _marked, outlived

TOY = str(Path(__file__).with_name("toy_workload.py"))


def _start(tmp_path: Path, *args: str, timeout: float = 120) -> tuple[subprocess.Popen, str, Path]:
    mark = uuid.uuid4().hex
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env = {**os.environ, MARK: mark, "TMPDIR": str(tmpdir)}
    cmd = [sys.executable, "-m", "taxmodel", "profile", "toy", "--workload-module", TOY, "--device", "cpu",
           "-n", "2", "--variants", "bsp", "--iterations", "2", "--warmup", "1", "-o", str(tmp_path / "out"),
           "--timeout", str(timeout), *args]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, mark, tmpdir


def _assert_nothing_left(tmp_path: Path, mark: str, tmpdir: Path, kept: tuple[Path, ...] = ()) -> None:
    assert outlived(mark) == {}, "processes of the run outlived the command"
    out = tmp_path / "out"
    assert not out.exists() or not any(out.rglob("*")), f"a bundle or part of one in -o: {list(out.rglob('*'))}"
    left = set(tmpdir.iterdir()) - set(kept)
    assert not left, f"left in the temp dir: {left}"


def _assert_one_line(err: str) -> None:
    """The launcher's diagnosis is the only error line; no rank's traceback reaches the terminal."""
    assert "Traceback" not in err, err
    assert len(re.findall(r"(?m)^taxmodel: error", err)) == 1, err


@pytest.mark.parametrize("phase", ["compile", "capture"])
def test_a_killed_rank_is_named_with_its_signal_and_phase(tmp_path, phase):
    proc, mark, tmpdir = _start(tmp_path, "--inject", f"kill_rank=1@{phase}")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, err
    # Rank 0 fails too ("Connection reset by peer" in its barrier): the message blames rank 1.
    assert re.match(rf"taxmodel: error: rank 1 was killed by SIGKILL in phase '{phase}' of variant 'bsp'",
                    _last_line(err)), err
    _assert_one_line(err)
    # Rank 0's traceback (the peer it lost), when it saw the loss before the launcher stopped it,
    # is kept in a file that the last line names (test_launcher.py checks that part exactly).
    logs = [Path(p) for p in re.findall(r"the tracebacks of rank\(s\) 0 are in (\S+\.log)$", _last_line(err))]
    for log in logs:
        assert log.parent == tmpdir and "Traceback" in log.read_text(), err
    _assert_nothing_left(tmp_path, mark, tmpdir, kept=tuple(logs))


def test_a_frozen_rank_is_named_and_killed_within_the_timeout(tmp_path):
    # The ranks must reach the phase within the timeout (start-up is seconds here; more under load):
    # the first phase after they joined keeps that margin wide.
    timeout = 20
    t0 = time.monotonic()
    proc, mark, tmpdir = _start(tmp_path, "--inject", "hang_rank=1@setup", timeout=timeout)
    _, err = proc.communicate(timeout=timeout + 60)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 3, err
    assert re.match(rf"taxmodel: error: run timed out after {timeout} s: rank 1 hung in phase 'setup' "
                    r"\(rank\(s\) 0 were waiting for it\)", _last_line(err)), err
    _assert_one_line(err)  # the ranks' watchdogs record their timeouts for the launcher, silently
    assert elapsed - timeout < PAST_TIMEOUT_S
    _assert_nothing_left(tmp_path, mark, tmpdir)


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGHUP, 129)])
def test_a_signal_stops_every_rank_and_exits_128_plus_it(tmp_path, sig, code):
    """SIGTERM (a CI cancel, `timeout`, a preemption), Ctrl-C and SIGHUP (a closed terminal) end the
    command and its ranks alike."""
    proc, mark, tmpdir = _start(tmp_path, "--inject", "hang_rank=1@setup", timeout=300)
    deadline = time.monotonic() + 90
    while "T" not in _marked(mark).values():  # rank 1 stopped itself: the run is under way
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1]
        time.sleep(0.2)
    t0 = time.monotonic()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert time.monotonic() - t0 < 10
    assert _last_line(err).startswith("taxmodel: interrupted: every rank was stopped"), err
    _assert_nothing_left(tmp_path, mark, tmpdir)


def test_bad_requests_stop_before_any_rank_starts(tmp_path):
    """-n 0, a shape the workload cannot run, a fault no rank can hit: exit 2 at once, nothing started."""
    from click.testing import CliRunner

    from taxmodel.cli import cli

    base = ["profile", "toy", "--workload-module", TOY, "--device", "cpu", "-o", str(tmp_path / "out")]
    cases = {
        ("-n", "0"): r"--world-size 0: give 1 or more ranks",
        ("--shape", "N=-3"): r"toy: N=-3 must be positive",
        ("--inject", "kill_rank=2@compile"): r"kill_rank=2@compile: there are only 2 ranks",
        ("--inject", "hang_rank=1@write"): r"only rank 0 writes bundles",
        ("--inject", "kill_rank=1@lunch"): r"PHASE must be one of setup, compile",
        ("--spin-timeout", "0"): r"--spin-timeout must be positive",
    }
    for args, expected in cases.items():
        result = CliRunner().invoke(cli, [*base, *args])
        assert result.exit_code == 2, (args, result.output)
        assert re.search(expected, result.output), (args, result.output)
    assert not (tmp_path / "out").exists()


def test_stopping_the_ranks_ends_what_they_started_too(tmp_path):
    """A rank's own children (a compiler, a tool it runs under) share its process group and go with
    it, a frozen rank included; the launcher reports how each rank ended."""
    from taxmodel.runtime.launcher import Ranks

    mark = uuid.uuid4().hex
    env = {**os.environ, MARK: mark}
    ranks = Ranks(["sh", "-c", "sleep 300 & sleep 300 & kill -STOP $$; wait"], env, 2, quiet=True)
    deadline = time.monotonic() + 30
    # both ranks stopped and all six processes seen (a child in the middle of its exec can be
    # missing from one read of /proc: wait for it rather than read once)
    while sorted(_marked(mark).values()).count("T") < 2 or len(_marked(mark)) < 6:
        assert time.monotonic() < deadline, _marked(mark)
        time.sleep(0.05)
    assert len(_marked(mark)) == 6
    ranks.poll()
    assert ranks.exits == {}
    ranks.stop()
    assert outlived(mark) == {}
    assert all(p.returncode == -signal.SIGTERM for p in ranks.procs)
