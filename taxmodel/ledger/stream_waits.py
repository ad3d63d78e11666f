"""Which idle gaps are waits on another stream, not launch overhead (docs/ledger.md, 7).

An idle gap that ends with a GPU activity X whose launch call had already returned when the
gap began is normally ``kernel_gap``: the work was queued and the GPU was slow to start it.
But X may have been queued *behind a cross-stream dependency*: a ``cudaStreamWaitEvent`` (a
``wait`` row) enqueued on X's stream after the stream's previous activity was launched and
before X was. Then X could not start until the other stream reached the event, and the gap is
a bulk-synchronous wait -- ``stream_wait`` -- which no launch optimization recovers.

The ledger learns which activity ends a gap through the sweep's ``next_key`` (the launch end
of the activities starting where the gap ends, the smallest one); ``gap_keys`` packs the
"queued behind a wait" flag into that key's lowest bit so the sweep carries it unchanged:
``key = 2 * launch_end + gated``, order-preserving, and the unknown-launch sentinels stay as
they are.
"""
from __future__ import annotations

import numpy as np
import pandas as pd


def gated_by_stream_wait(gpu: pd.DataFrame, launch_end: np.ndarray, waits: pd.DataFrame, offsets: dict[int, int],
                         unknown: int) -> np.ndarray:
    """For each GPU row: was a ``wait`` enqueued on its (rank, stream) after the launch of the
    stream's previous activity and no later than its own launch? ``launch_end`` is aligned;
    ``>= unknown`` means the launch is not known (never gated)."""
    out = np.zeros(len(gpu), bool)
    if waits.empty or not len(gpu):
        return out
    rank = gpu["rank"].to_numpy(np.int64)
    stream = gpu["stream"].to_numpy(np.int64)
    known = launch_end < unknown
    w_off = waits["rank"].map(offsets).fillna(0).to_numpy(np.int64)
    w = pd.DataFrame({"rank": waits["rank"].to_numpy(np.int64), "stream": waits["stream"].to_numpy(np.int64),
                      "t": waits["start_ns"].to_numpy(np.int64) + w_off})
    for (r, s), grp in w.groupby(["rank", "stream"], sort=False):  # a loop over waiting streams, not events
        idx = np.flatnonzero((rank == r) & (stream == s) & known)
        if not len(idx):
            continue
        idx = idx[np.argsort(launch_end[idx], kind="stable")]
        ends = launch_end[idx]
        prev = np.r_[np.iinfo(np.int64).min, ends[:-1]]
        t = np.sort(grp["t"].to_numpy(np.int64))
        out[idx] = np.searchsorted(t, ends, side="right") > np.searchsorted(t, prev, side="right")
    return out


def gap_keys(launch_end: np.ndarray, gated: np.ndarray, unknown: int) -> np.ndarray:
    """Sweep keys: ``2 * launch_end + gated`` for known launches, the sentinel otherwise."""
    launch_end = np.asarray(launch_end, np.int64)
    return np.where(launch_end < unknown, launch_end * 2 + gated.astype(np.int64), launch_end)


def split_gap_keys(key: np.ndarray, unknown: int) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of ``gap_keys``: (launch end or sentinel, gated)."""
    key = np.asarray(key, np.int64)
    known = key < unknown
    return np.where(known, key >> 1, key), known & ((key & 1) == 1)
