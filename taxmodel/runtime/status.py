"""What every rank tells the launcher through the run directory: its PID, phase, and error.

A rank of ``taxmodel profile`` cannot rely on its exit code alone to say what went wrong (a peer's
"connection reset" looks like a failure of its own), so each rank keeps ``rank<R>.json`` in the
status directory up to date: its PID (the launcher kills ranks by PID and checks they are gone),
the phase and variant it is in, whether it waits for its peers, and its error if it fails. Rank 0
adds ``result.json`` on success. Files are replaced atomically, so a reader never sees half of one.

A rank that fails with an unexpected exception puts its traceback in ``rank<R>.log`` there
(``write_log``) instead of on the terminal: when one rank dies its peers fail too, and their
tracebacks would bury the launcher's one-line diagnosis; the launcher keeps the logs in a file
that its message names. ``TAXMODEL_TRACEBACK=1`` prints them as well.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from taxmodel.fsutil import atomic_write

STATUS_DIR_ENV = "TAXMODEL_STATUS_DIR"
"""Where each rank writes ``rank<R>.json`` (its phase, or its error) for the launcher to read."""

TRACEBACK_ENV = "TAXMODEL_TRACEBACK"
"""Set (to anything but empty): tracebacks go to stderr too, as the CLI's own do."""

RESULT_FILE = "result.json"
"""Written by rank 0 into the status directory on success: the bundles written and variants skipped."""

TERMINAL_FD_ENV = "TAXMODEL_TERMINAL_FD"
"""A file descriptor of the launcher's terminal, passed to each rank. The launcher sends a rank's
stderr to the run's log (``output_file``), since third-party libraries print there (Kineto's
``USDT: ... profiler_start`` lines, Triton's and torch's warnings); what a rank says to the user
(rank 0's progress bar) goes here (``terminal``)."""

_TERMINAL: list[TextIO] = []


def terminal() -> TextIO:
    """Where this rank speaks to the user: the launcher's terminal (``TERMINAL_FD_ENV``), else stderr
    (a rank started by torchrun, or by hand)."""
    fd = os.environ.get(TERMINAL_FD_ENV)
    if not fd:
        return sys.stderr
    if not _TERMINAL:
        try:
            _TERMINAL.append(os.fdopen(int(fd), "w", buffering=1, encoding="utf-8", errors="replace", closefd=False))
        except (OSError, ValueError):
            _TERMINAL.append(sys.stderr)
    return _TERMINAL[0]


def output_file(directory: str | os.PathLike, rank: int) -> Path:
    """Where the launcher keeps a rank's own stderr (the run's log, ``read_logs``)."""
    return Path(directory) / f"rank{rank}.out"


def _write_json(directory: Path, name: str, payload: Any) -> None:
    atomic_write(directory / name, json.dumps(payload), what="rank status")


def write_status(directory: str | os.PathLike | None, rank: int, **fields: Any) -> None:
    """Atomically record this rank's state (pid, phase, variant, waiting, error) for the launcher."""
    if not directory:
        return
    _write_json(Path(directory), f"rank{rank}.json", {"rank": rank, "pid": os.getpid(), "time": time.time(), **fields})


def write_result(directory: str | os.PathLike | None, result: dict[str, Any]) -> None:
    """Rank 0's summary of a successful run (bundles written, variants skipped)."""
    if directory:
        _write_json(Path(directory), RESULT_FILE, result)


def read_statuses(directory: str | os.PathLike) -> dict[int, dict[str, Any]]:
    """The latest status of every rank that wrote one, by rank."""
    out: dict[int, dict[str, Any]] = {}
    for p in Path(directory).glob("rank*.json"):
        try:
            s = json.loads(p.read_text())
            out[int(s["rank"])] = s
        except (ValueError, KeyError, TypeError, OSError):
            continue
    return out


def write_log(directory: str | os.PathLike | None, rank: int, text: str) -> bool:
    """Append ``text`` (a traceback) to this rank's log for the launcher; False when no launcher
    reads one (a rank started by hand or by torchrun: then the caller prints it)."""
    if not directory:
        return False
    try:
        with open(Path(directory) / f"rank{rank}.log", "a", encoding="utf-8", errors="replace") as f:
            f.write(text if text.endswith("\n") else text + "\n")
    except OSError:
        return False
    return True


def read_logs(directory: str | os.PathLike, suffix: str = ".log") -> dict[int, str]:
    """The logs the ranks wrote (``write_log``; with ``suffix`` ".out", what they printed on
    stderr, ``output_file``), by rank; empty ones left out."""
    out: dict[int, str] = {}
    for p in Path(directory).glob(f"rank*{suffix}"):
        try:
            text = p.read_text(encoding="utf-8", errors="replace")
            if text.strip():
                out[int(p.name[4:-len(suffix)])] = text
        except (ValueError, OSError):
            continue
    return out


def report_traceback(directory: str | os.PathLike | None, rank: int, text: str) -> None:
    """A rank's traceback: into its log when a launcher reads one (and to stderr as well with
    ``TAXMODEL_TRACEBACK`` set), else to stderr."""
    if not write_log(directory, rank, text) or os.environ.get(TRACEBACK_ENV):
        terminal().write(text)
        terminal().flush()


def read_result(directory: str | os.PathLike) -> dict[str, Any]:
    path = Path(directory) / RESULT_FILE
    return json.loads(path.read_text()) if path.exists() else {}
