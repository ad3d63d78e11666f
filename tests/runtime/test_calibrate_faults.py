"""`taxmodel calibrate` starts its ranks through the launcher of `taxmodel profile` (issues 28, 29):
on 2 CPU ranks (``taxmodel calibrate --device cpu``: the collectives step on gloo), a frozen rank, a killed rank
and a signal to the command each end it within seconds with one line naming the rank and step
(or 128 + the signal), no process left behind, no run directory, and the hardware file unwritten.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from processes import MARK, PAST_TIMEOUT_S, last_line, outlived
from shipped_calibration import shipped_four_ranks

HERE = Path(__file__).parent
# Long enough on gloo that a test catches the ranks measuring (every size of the default curve).
SIZES = "8192,65536,1048576,8388608,33554432,134217728"


def _start(tmp_path: Path, timeout: float) -> tuple[subprocess.Popen, str, Path, Path]:
    old = shipped_four_ranks()
    old["measured"]["world_size"] = 2
    (tmp_path / "old.json").write_text(json.dumps(old))
    mark = uuid.uuid4().hex
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env = {**os.environ, MARK: mark, "TMPDIR": str(tmpdir),
           "PYTHONPATH": os.pathsep.join([str(HERE.parents[1]), os.environ.get("PYTHONPATH", "")])}
    out = tmp_path / "hw.json"
    cmd = [sys.executable, "-m", "taxmodel", "calibrate", "--device", "cpu", "--only", "collectives", "-n", "2", "-o", str(out),
           "--update", str(tmp_path / "old.json"), "--timeout", str(timeout), "--sizes", SIZES]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, mark, tmpdir, out


def _rank_pid_in(proc: subprocess.Popen, tmpdir: Path, rank: int, phase: str) -> int:
    """The PID of ``rank`` once its status file says it is in ``phase``."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        for status in tmpdir.glob(f"taxmodel-run-*/status/rank{rank}.json"):
            try:
                s = json.loads(status.read_text())
            except (OSError, ValueError):
                continue
            if s.get("phase") == phase:
                return int(s["pid"])
        time.sleep(0.1)
    raise AssertionError(f"rank {rank} never reached {phase}")


def _assert_nothing_left(mark: str, tmpdir: Path, out: Path, err: str) -> None:
    left = outlived(mark)
    assert left == {}, f"processes of the calibration outlived the command: {left}"
    assert not out.exists()
    assert not [p for p in tmpdir.iterdir() if not p.name.startswith("taxmodel-ranks-")], list(tmpdir.iterdir())
    assert "Traceback" not in err, err
    assert len(re.findall(r"(?m)^taxmodel: error", err)) <= 1, err


def test_a_frozen_rank_ends_the_calibration_within_its_timeout(tmp_path):
    timeout = 25
    t0 = time.monotonic()
    proc, mark, tmpdir, out = _start(tmp_path, timeout)
    os.kill(_rank_pid_in(proc, tmpdir, 1, "collectives"), signal.SIGSTOP)  # as a rank stuck in a GPU kernel
    _, err = proc.communicate(timeout=timeout + 60)
    assert proc.returncode == 3, err
    assert re.match(rf"taxmodel: error: run timed out after {timeout:g} s: rank 0 hung in phase 'collectives'; "
                    r"rank 1 hung in phase 'collectives'", last_line(err)), err
    assert time.monotonic() - t0 - timeout < PAST_TIMEOUT_S
    _assert_nothing_left(mark, tmpdir, out, err)


def test_a_killed_rank_is_named_with_its_signal_and_step(tmp_path):
    proc, mark, tmpdir, out = _start(tmp_path, 120)
    os.kill(_rank_pid_in(proc, tmpdir, 1, "collectives"), signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 3, err
    assert re.match(r"taxmodel: error: rank 1 was killed by SIGKILL in phase 'collectives'", last_line(err)), err
    _assert_nothing_left(mark, tmpdir, out, err)


def test_sigterm_stops_every_rank_and_exits_143_and_multicast_was_off_in_each(tmp_path, monkeypatch):
    """SIGTERM (a CI cancel, `timeout`, a preemption) ends the command and every rank alike, as
    Ctrl-C does. Before it, each rank's environment holds the one definition of multicast off
    (heap.NO_MULTICAST_ENV), whatever the user's environment said."""
    from taxmodel.runtime.heap import NO_MULTICAST_ENV

    for k, v in NO_MULTICAST_ENV.items():  # the opposite of each
        monkeypatch.setenv(k, "1" if v == "0" else "0")
    proc, mark, tmpdir, out = _start(tmp_path, 300)
    envs = []
    for rank in (0, 1):
        pid = _rank_pid_in(proc, tmpdir, rank, "collectives")
        raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        envs.append(dict(kv.decode().split("=", 1) for kv in raw if b"=" in kv))
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert time.monotonic() - t0 < 10
    assert last_line(err).startswith(f"taxmodel: interrupted: every rank was stopped; {out} was not written"), err
    _assert_nothing_left(mark, tmpdir, out, err)
    assert NO_MULTICAST_ENV == {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                                "NVSHMEM_DISABLE_NVLS": "1"}
    for env in envs:
        assert {k: env[k] for k in NO_MULTICAST_ENV} == NO_MULTICAST_ENV
