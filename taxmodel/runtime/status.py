"""What every rank tells the launcher through the run directory: its PID, phase, and error.

A rank of ``taxmodel profile`` cannot rely on its exit code alone to say what went wrong (a peer's
"connection reset" looks like a failure of its own), so each rank keeps ``rank<R>.json`` in the
status directory up to date: its PID (the launcher kills ranks by PID and checks they are gone),
the phase and variant it is in, whether it waits for its peers, and its error if it fails. Rank 0
adds ``result.json`` on success. Files are replaced atomically, so a reader never sees half of one.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from taxmodel.fsutil import atomic_write

STATUS_DIR_ENV = "TAXMODEL_STATUS_DIR"
"""Where each rank writes ``rank<R>.json`` (its phase, or its error) for the launcher to read."""

RESULT_FILE = "result.json"
"""Written by rank 0 into the status directory on success: the bundles written and variants skipped."""


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


def read_result(directory: str | os.PathLike) -> dict[str, Any]:
    path = Path(directory) / RESULT_FILE
    return json.loads(path.read_text()) if path.exists() else {}
