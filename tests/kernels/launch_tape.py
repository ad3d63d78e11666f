"""A kernel stand-in that records launches: what a CUDA graph would capture, for CPU tests of
graph-safety (replaying the recorded launches verbatim is what a replay does)."""
from __future__ import annotations

import threading


class Recorder:
    """Stands in for a kernel: launches it, and while a thread records, keeps (grid, args, kwargs)."""

    def __init__(self, kernel, tape: threading.local) -> None:
        self.kernel, self.tape = kernel, tape

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            log = getattr(self.tape, "log", None)
            if log is not None:
                log.append((self.kernel, grid, args, kwargs))
            return self.kernel[grid](*args, **kwargs)

        return launch
