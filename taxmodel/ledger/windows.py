"""Where the ledger's iteration windows come from when the trace does not hand them over cleanly.

Two cases real traces bring (docs/ledger.md, "Windows"):

* **No iteration markers** (inference servers, torch.compile runs, nsys or rocprofv3 captures
  without NVTX/ROCTx ranges): no GPU activity lies inside an iteration. Rather than refusing,
  every GPU activity of a repetition is put into one iteration (number 0), so the window spans
  from the first GPU activity on any rank to the last one: the ledger of the whole capture.
* **Pipelined steps** (a prefetching training loop whose GPU work for step *n* runs into step
  *n+1*): windows built from each iteration's first and last GPU activity overlap, and the
  overlapping time would be counted in both. The windows are then cut into a partition of
  time: each ends where the next one starts (or at the latest end so far, where that comes
  first), so every nanosecond belongs to exactly one window and a window's length is the step
  period.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

GPU_SPAN_NOTE = ("no iteration markers contain GPU activity: one window per repetition spans every rank's GPU activity, "
                 "from the first to the last (profile with ProfilerStep#N / NVTX / ROCTx ranges, or import with "
                 "--iteration-pattern, for per-iteration windows)")


def fallback_iterations(iteration: np.ndarray) -> tuple[np.ndarray, bool]:
    """The iteration of each GPU row, with every row in iteration 0 when none lies in an
    iteration (no usable markers); and whether that fallback was taken."""
    iteration = np.asarray(iteration, np.int64)
    if len(iteration) == 0 or (iteration >= 0).any():
        return iteration, False
    return np.zeros_like(iteration), True


def partition_windows(wdf: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """Windows (sorted by ``start_ns``) cut so that none overlaps the next; returns the new
    frame and how many windows were cut.

    Window *i* keeps its start and ends at ``min(max(end_0..end_i), start_{i+1})``: where a
    window reaches into the next one it ends at the next start, and where an earlier window's
    work outlasted it the window extends over that tail (up to the next start), so the windows
    cover exactly the time some window covered before, once. Windows that start together (only
    possible across repetitions) are left as they are.
    """
    if len(wdf) < 2:
        return wdf, 0
    start = wdf["start_ns"].to_numpy(np.int64)
    end = wdf["end_ns"].to_numpy(np.int64)
    reach = np.maximum.accumulate(end)
    nxt = np.r_[start[1:], np.iinfo(np.int64).max]
    new_end = np.minimum(reach, nxt)
    cut = (new_end != end) & (new_end > start)
    if not cut.any():
        return wdf, 0
    out = wdf.copy()
    out["end_ns"] = np.where(cut, new_end, end)
    if "window_ns" in out:
        out["window_ns"] = out["end_ns"] - out["start_ns"]
    return out, int((cut & (reach > nxt)).sum())
