"""Finding every process of a run from outside it, for the fault tests: each is found through a
marker in its environment (``/proc/PID/environ``; ranks inherit it from the command), so "no
process left" is checked without trusting the code under test to report its own children."""
from __future__ import annotations

import time
from pathlib import Path

MARK = "TAXMODEL_TEST_RUN_MARK"

PAST_TIMEOUT_S = 35.0
"""How long past its ``--timeout`` a run may take to end. The timeout itself is what such a test
waits for, so only the time past it is bounded: every rank's watchdog records where it was
(``launcher.DEADLINE_GRACE_S``), the ranks left are killed (``launcher.KILL_GRACE_S``) and the
command exits. That took 0.1-2.8 s on a 2-core machine at load 3 and 11.3 s under heavier load;
the bound is 3x the worst, so that a test fails for a run that does not end, not for a busy machine."""


def marked(mark: str) -> dict[int, str]:
    """PID -> state letter (R, S, T...) of every process whose environment holds ``MARK=mark``."""
    found: dict[int, str] = {}
    needle = f"{MARK}={mark}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found[int(entry.name)] = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:  # gone meanwhile, or not ours
            continue
    return found


def outlived(mark: str, within_s: float = 10.0) -> dict[int, str]:
    """``marked(mark)`` once it is empty or ``within_s`` has passed: a killed process leaves the
    process table a moment after the signal (longer on a loaded machine), and a zombie (state Z)
    holds nothing but its entry until its parent reaps it. What is left is what outlived."""
    deadline = time.monotonic() + within_s
    while True:
        left = {pid: st for pid, st in marked(mark).items() if st != "Z"}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def last_line(stderr: str) -> str:
    return [line for line in stderr.splitlines() if line.strip()][-1]
