"""Windows when the trace does not hand them over cleanly (taxmodel/ledger/windows.py)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from taxmodel.ledger.windows import fallback_iterations, partition_windows


def _windows(spans):
    df = pd.DataFrame(spans, columns=["start_ns", "end_ns"])
    df["repetition"], df["iteration"] = 0, np.arange(len(df))
    df["window_ns"] = df["end_ns"] - df["start_ns"]
    return df


def test_fallback_only_when_no_row_is_in_an_iteration():
    it, used = fallback_iterations(np.array([-1, -1, -1]))
    assert used and it.tolist() == [0, 0, 0]
    it, used = fallback_iterations(np.array([-1, 3, -1]))
    assert not used and it.tolist() == [-1, 3, -1]


def test_pipelined_windows_become_a_partition_of_the_step_periods():
    # step n's GPU work runs 40 ns into step n+1 (a prefetching loop)
    wdf, cut = partition_windows(_windows([(0, 140), (100, 240), (200, 340)]))
    assert cut == 2
    assert wdf[["start_ns", "end_ns"]].values.tolist() == [[0, 100], [100, 200], [200, 340]]
    assert int(wdf["window_ns"].sum()) == 340  # the covered time, counted once


def test_a_window_outlasted_by_an_earlier_one_takes_over_its_tail():
    wdf, cut = partition_windows(_windows([(0, 300), (100, 150), (400, 450)]))
    assert wdf[["start_ns", "end_ns"]].values.tolist() == [[0, 100], [100, 300], [400, 450]]
    assert cut == 1


def test_disjoint_windows_are_left_alone():
    df = _windows([(0, 90), (100, 190)])
    out, cut = partition_windows(df)
    assert cut == 0 and out is df
