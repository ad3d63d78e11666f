"""The idle time of a rank's window, by its cause (docs/ledger.md, "Idle gaps"): before its first
and after its last activity barrier_idle; between activities, by the launch call of the kernel
that ends the gap and the host syncs, barrier_idle (a sync pending), host_starved, launch_latency,
kernel_gap, stream_wait (queued behind another stream's event, ``stream_waits.py``), or
unattributed when the kernel has no launch record.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from taxmodel.ledger import intervals as iv
from taxmodel.ledger.segments import NO_LAUNCH, SEG_IDLE, SUB
from taxmodel.ledger.stream_waits import split_gap_keys


def launch_ends(ev: pd.DataFrame, gpu: pd.DataFrame, offsets: dict[int, int]) -> np.ndarray:
    """Aligned end of the host launch call that enqueued each GPU row (linked by correlation on
    the same rank; for a CUDA/HIP graph that is the graph launch); NO_LAUNCH when unknown."""
    launches = ev["launch"]
    launches = launches[launches["correlation"] >= 0]
    out = np.full(len(gpu), NO_LAUNCH, np.int64)
    if launches.empty:
        return out
    off = launches["rank"].map(offsets).fillna(0).to_numpy(np.int64)
    # one int64 key per (rank, correlation); the earliest launch end wins for duplicates
    shift = np.int64(40)
    lkey = (launches["rank"].to_numpy(np.int64) << shift) + launches["correlation"].to_numpy(np.int64)
    lend = launches["end_ns"].to_numpy(np.int64) + off
    order = np.lexsort((lend, lkey))
    lkey, lend = lkey[order], lend[order]
    first = np.r_[True, lkey[1:] != lkey[:-1]]
    lkey, lend = lkey[first], lend[first]
    gcorr = gpu["correlation"].to_numpy(np.int64)
    gkey = (gpu["rank"].to_numpy(np.int64) << shift) + gcorr
    pos = np.minimum(np.searchsorted(lkey, gkey), len(lkey) - 1)
    has = (lkey[pos] == gkey) & (gcorr >= 0)
    out[has] = lend[pos[has]]
    return out


def idle_pieces(seg: dict, lab: np.ndarray, ev: pd.DataFrame, offsets: dict[int, int], ranks: list[int], nr: int,
                 pieces: list) -> tuple[int, int]:
    """Split idle segments into barrier_idle / host_starved / launch_latency / kernel_gap /
    unattributed pieces (appended to ``pieces``)
    return (count, ns) of gaps with no launch."""
    sg, ss, se, nxt = seg["group"], seg["start"], seg["end"], seg["next_key"]
    busy = lab != SEG_IDLE
    ng = int(sg.max()) + 1 if len(sg) else 0
    first_busy = np.full(ng, iv.INT64_MAX, np.int64)
    last_busy = np.full(ng, np.iinfo(np.int64).min, np.int64)
    bg = sg[busy]
    if len(bg):
        first_idx = np.flatnonzero(np.r_[True, bg[1:] != bg[:-1]])  # segments are sorted by group
        u = bg[first_idx]
        first_busy[u] = ss[busy][first_idx]
        last_idx = np.r_[first_idx[1:], len(bg)] - 1
        last_busy[u] = se[busy][last_idx]
    idle = ~busy
    edge = idle & ((se <= first_busy[sg]) | (ss >= last_busy[sg]))
    pieces.append((sg[edge], SUB["barrier_idle"], ss[edge], se[edge]))
    inner = idle & ~edge
    g, a, b = sg[inner], ss[inner], se[inner]
    L, gated = split_gap_keys(nxt[inner], NO_LAUNCH)
    unknown = L >= NO_LAUNCH
    cap = np.where(unknown, b, np.clip(L, a, b))
    # host syncs: the gap is barrier_idle until the last sync that returned inside it
    s = a.copy()
    syncs = ev["sync"]
    if len(syncs) and len(g):
        rank_of = np.asarray(ranks, np.int64)[g % nr]
        for r in np.unique(rank_of):  # a loop over ranks, not events
            ends = np.sort(syncs.loc[syncs["rank"] == r, "end_ns"].to_numpy(np.int64) + int(offsets.get(int(r), 0)))
            if not len(ends):
                continue
            m = rank_of == r
            j = np.searchsorted(ends, cap[m], side="right") - 1
            e = np.where(j >= 0, ends[np.maximum(j, 0)], np.iinfo(np.int64).min)
            s[m] = np.where(e > a[m], e, a[m])
    pieces.append((g, SUB["barrier_idle"], a, s))
    queued = ~unknown & (L <= a)
    starved = ~unknown & ~queued
    waited = queued & gated  # queued behind another stream's event: not launch overhead
    queued &= ~gated
    pieces.append((g[unknown], SUB["unattributed"], s[unknown], b[unknown]))
    pieces.append((g[waited], SUB["stream_wait"], a[waited], b[waited]))
    pieces.append((g[queued], SUB["kernel_gap"], a[queued], b[queued]))
    pieces.append((g[starved], SUB["host_starved"], s[starved], cap[starved]))
    pieces.append((g[starved], SUB["launch_latency"], cap[starved], b[starved]))
    return int(unknown.sum()), int((b - s)[unknown].sum())


def launch_tax_before(pieces, gpu, g_start, ranks, nr) -> np.ndarray:
    """Per GPU row, the launch tax (host_starved, launch_latency, kernel_gap) of the idle gaps that
    end at its start on its rank: what waiting for its launch cost. A piece belongs to the first
    activity that starts at or after its end (the gap it lies in is idle up to that start)."""
    out = np.zeros(len(gpu))
    subs = {SUB["host_starved"], SUB["launch_latency"], SUB["kernel_gap"]}
    sel = [(g, s1, s1 - s0) for g, sub, s0, s1 in pieces if sub in subs and len(g)]
    if not sel or not len(gpu):
        return out
    g = np.concatenate([x[0] for x in sel])
    end = np.concatenate([x[1] for x in sel])
    ln = np.concatenate([x[2] for x in sel]).astype(np.float64)
    keep = ln > 0
    rank = np.asarray(ranks, np.int64)[g[keep] % nr]
    end, ln = end[keep], ln[keep]
    g_rank = gpu["rank"].to_numpy(np.int64)
    for r in np.unique(rank):  # a loop over ranks
        rows = np.flatnonzero(g_rank == r)
        rows = rows[np.argsort(g_start[rows], kind="stable")]
        m = rank == r
        j = np.searchsorted(g_start[rows], end[m], side="left")
        ok = j < len(rows)
        np.add.at(out, rows[j[ok]], ln[m][ok])
    return out
