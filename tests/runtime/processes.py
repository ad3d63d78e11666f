"""Finding every process of a run from outside it, for the fault tests: each is found through a
marker in its environment (``/proc/PID/environ``; ranks inherit it from the command), so "no
process left" is checked without trusting the code under test to report its own children."""
from __future__ import annotations

import time
from pathlib import Path

MARK = "TAXMODEL_TEST_RUN_MARK"


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
