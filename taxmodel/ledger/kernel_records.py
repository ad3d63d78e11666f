"""What a fused kernel's in-kernel records say about its time (kernels/device/trace.py writes them):
how long its CTAs waited on flags, and how long they only moved data between GPUs.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

#: Phases of in-kernel records in which a CTA only moves data between GPUs (kernels/device/trace.py).
COMM_PHASES = ("remote_load", "store_push")


def record_shares(gpu, g_start, g_end, ev, offsets, role) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per GPU row, from the in-kernel records inside it (fused kernels only): the flag_wait time --
    the larger of the mean flag_wait time per CTA and the time in which every running CTA waited
    (``_all_waiting_time``) --, the mean time per CTA in communication-only phases
    (``COMM_PHASES``; sum of those record durations divided by the kernel's number of recorded
    CTAs), and whether any record lies in it."""
    out = np.zeros(len(gpu))
    comm_out = np.zeros(len(gpu))
    recorded = np.zeros(len(gpu), bool)
    rec = ev["record"]
    fused = np.flatnonzero(role == "fused")
    if rec.empty or not len(fused):
        return out, comm_out, recorded
    r_off = rec["rank"].map(offsets).fillna(0).to_numpy(np.int64)
    r_s = rec["start_ns"].to_numpy(np.int64) + r_off
    r_e = rec["end_ns"].to_numpy(np.int64) + r_off
    r_rank = rec["rank"].to_numpy(np.int64)
    r_cta = rec["cta"].to_numpy(np.int64)
    r_phase = rec["phase"].astype(str)
    r_flag = (r_phase == "flag_wait").to_numpy()
    r_comm = r_phase.isin(COMM_PHASES).to_numpy()
    f_rank = gpu["rank"].to_numpy(np.int64)[fused]
    owner = np.full(len(rec), -1, np.int64)
    for r in np.unique(f_rank):  # a loop over ranks
        kk = fused[f_rank == r]
        kk = kk[np.argsort(g_start[kk], kind="stable")]
        m = np.flatnonzero(r_rank == r)
        j = np.searchsorted(g_start[kk], r_s[m], side="right") - 1
        ok = (j >= 0) & (r_s[m] < g_end[kk[np.maximum(j, 0)]])
        owner[m[ok]] = kk[j[ok]]
    # A record belongs to a kernel of its own name: another instrumented kernel (a copy kernel on a
    # side stream, say) can run while a fused kernel runs, and its records are not the fused kernel's.
    has = owner >= 0
    if has.any():
        k_names = gpu["name"].astype(str).to_numpy()
        r_names = rec["name"].astype(str).to_numpy()
        same = k_names[owner[has]] == r_names[has]
        owner[np.flatnonzero(has)[~same]] = -1
    has = owner >= 0
    if not has.any():
        return out, comm_out, recorded
    inside = (np.minimum(r_e, g_end[np.maximum(owner, 0)]) - r_s).astype(np.float64)
    wsum = np.bincount(owner[has], weights=np.where(r_flag, inside, 0.0)[has], minlength=len(gpu))
    csum = np.bincount(owner[has], weights=np.where(r_comm, inside, 0.0)[has], minlength=len(gpu))
    pairs = pd.DataFrame({"k": owner[has], "c": r_cta[has]}).drop_duplicates()
    ncta = np.bincount(pairs["k"].to_numpy(np.int64), minlength=len(gpu))
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(ncta > 0, wsum / np.where(ncta > 0, ncta, 1), 0.0)
        comm_out = np.where(ncta > 0, csum / np.where(ncta > 0, ncta, 1), 0.0)
    out = np.maximum(out, _all_waiting_time(owner[has], r_s[has], np.minimum(r_e, g_end[np.maximum(owner, 0)])[has],
                                            r_flag[has], len(gpu)))
    return out, comm_out, ncta > 0


def _all_waiting_time(owner: np.ndarray, start: np.ndarray, end: np.ndarray, waiting: np.ndarray, n: int) -> np.ndarray:
    """Per kernel row: how long every CTA that was running (had a record open) was in a
    flag_wait record -- the kernel's time in which nothing but waiting happened (e.g. a few CTAs
    waiting for a late peer after the others finished). One sweep over the records' boundaries."""
    if not len(owner):
        return np.zeros(n)
    end = np.maximum(end, start)
    times = np.concatenate([start, end])
    own = np.concatenate([owner, owner])
    w = waiting.astype(np.int64)
    d_wait = np.concatenate([w, -w])
    d_other = np.concatenate([1 - w, -(1 - w)])
    order = np.lexsort((times, own))
    times, own = times[order], own[order]
    n_wait, n_other = np.cumsum(d_wait[order]), np.cumsum(d_other[order])  # each kernel's events net to 0
    same = own[1:] == own[:-1]
    seg = (times[1:] - times[:-1]).astype(np.float64)
    only_waiting = same & (n_wait[:-1] > 0) & (n_other[:-1] == 0)
    return np.bincount(own[:-1][only_waiting], weights=seg[only_waiting], minlength=n)
