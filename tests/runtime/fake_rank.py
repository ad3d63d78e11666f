"""A stand-in rank for the launcher's tests, fast and without torch: ``python fake_rank.py MODE``.

Every rank reports phase ``work`` in the launcher's status directory, then by MODE:
``raise`` rank 1 fails with a traceback (logged as a real rank logs it) and rank 0 a moment
later with one of its own (a peer's echo); ``sleep`` every rank sleeps (killed by the launcher);
``noise`` every rank prints a third-party library's line on stderr, rank 0 a line on the terminal
(``status.terminal``, as its progress bar), and both end well.
"""
from __future__ import annotations

import os
import sys
import time
import traceback

from taxmodel.runtime.status import STATUS_DIR_ENV, report_traceback, terminal, write_status


def main(mode: str) -> int:
    rank, status_dir = int(os.environ["RANK"]), os.environ.get(STATUS_DIR_ENV)
    write_status(status_dir, rank, phase="work")
    if mode == "raise":
        time.sleep(0.2 if rank == 0 else 0.0)
        try:
            raise ValueError(f"fake failure on rank {rank}")
        except ValueError as exc:
            report_traceback(status_dir, rank, traceback.format_exc())
            write_status(status_dir, rank, phase="work", error=f"ValueError: {exc}", exit_code=3)
        return 3
    if mode == "noise":
        print(f"USDT:2026-11-27 {os.getpid()} SyncActivityProfilerHandler.cpp:52] profiler_start", file=sys.stderr,
              flush=True)
        if rank == 0:
            print("progress: done", file=terminal(), flush=True)
        if len(sys.argv) > 2:  # and then fail
            write_status(status_dir, rank, phase="work", error="ValueError: failed after printing", exit_code=3)
            return 3
        return 0
    time.sleep(300)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
