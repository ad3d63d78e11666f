"""Phase (c) of the ledger: one rank's windows split into the ledger's parts (definitions:
docs/ledger.md), given the global plan (``plan.py``).

Every window is cut into elementary segments by what runs on the rank's GPU (any stream):

  local compute (compute/fused/copy kernels; comm under them is overlapped)   -> shares: flag_wait and
      exposed_comm (fused kernels' in-kernel records), useful (roofline floor), locality_tax,
      compute_inefficiency (``kernel_shares.py``)
  communication only, before the collective's last member arrived            -> skew_wait
  communication only, afterwards                                             -> useful (link floor
      above the compute floor), exposed_comm
  only 'other' GPU activity                                                  -> unattributed
  idle                                                                       -> by its cause (``idle_gaps.py``)

The steps, in order: the rank's GPU rows on the aligned clock, clipped to the windows; the skew
intervals of its collectives; the sweep that labels the segments; the idle pieces; the busy
segments' shares; the parts table (which must sum to each window); where each part lies; the
per-kernel rows. Everything is vectorized interval arithmetic (``intervals.py``); the only Python
loops run over ranks, declared intermediates and sub-categories.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from taxmodel.ledger import intervals as iv
from taxmodel.ledger import per_kernel
from taxmodel.ledger.categories import LEDGER_COLUMNS, PARENT, SUBCATEGORY_ORDER
from taxmodel.ledger.idle_gaps import idle_pieces, launch_ends, launch_tax_before
from taxmodel.ledger.kernel_costs import NO_COST
from taxmodel.ledger.kernel_shares import declared_floors, kernel_shares
from taxmodel.ledger.plan import LedgerPlan
from taxmodel.ledger.rank_summary import KindFrames, RankEvents, split_kinds
from taxmodel.ledger.segments import (CLS_COMM, CLS_LOCAL, CLS_OTHER, CLS_SKEW, LOCAL_LABELS, NO_LAUNCH, SEG_IDLE,
                                      SEG_LOCAL, SEG_OTHER, SEG_SKEW, SEG_TRANSFER, SUB, role_class)
from taxmodel.ledger.stream_waits import gap_keys, gated_by_stream_wait
from taxmodel.trace import schema

#: the shares of exposed transfer time: the link floor first, the rest exposed
TRANSFER_LABELS = ("useful", "exposed_comm")
#: the bulk-synchronous sub-parts that happen inside a running kernel (the others are idle time)
BSP_INSIDE_KERNELS = ("skew_wait", "exposed_comm", "flag_wait")


@dataclass
class RankLedger:
    """Phase (c): one rank's parts and intervals, the per-row figures of its GPU rows inside the
    windows (for the per-kernel table), and what the caveats count."""

    rank: int
    parts: pd.DataFrame
    intervals: pd.DataFrame
    kernel_rows: pd.DataFrame  # one row per GPU row in a window, column "pos" = position in the bundle's events
    locality_ns: pd.Series | None  # per GPU row (bundle index), when locality is measured
    positions: np.ndarray  # positions of the rank's GPU rows (the index order of ``locality_ns``)
    intermediate_caveats: list[str] | None  # None: the rank has no costed kernel to match intermediates on
    unrecorded: int  # fused launches in iterations without in-kernel records
    unknown_gaps: tuple[int, int]
    has_gpu: bool
    has_fused: bool
    has_records: bool
    outside: int  # GPU rows outside any iteration
    launches: pd.DataFrame  # rank, start_ns, end_ns of launch rows, when the profiler caveat may need them
    floor_capped: tuple[int, float] = (0, 0.0)  # windows whose declared floor exceeded the kernels' time, worst factor


@dataclass
class _RankRows:
    """One rank's GPU rows on the aligned clock, its host-side rows by kind, and the windows."""

    rank: int
    gpu: pd.DataFrame
    ev: KindFrames
    positions: np.ndarray  # of the GPU rows in the bundle's events
    start: np.ndarray
    end: np.ndarray
    rep: np.ndarray
    it: np.ndarray
    cls: np.ndarray  # sweep class (segments.CLS_*)
    ws: np.ndarray  # windows' aligned start and end
    we: np.ndarray
    # one rank: group g of the sweep is window g // nr of rank ranks[g % nr]
    ranks: list[int]
    nr: int
    rank_pos: pd.Series

    @property
    def ngroups(self) -> int:
        return len(self.ws) * self.nr


@dataclass
class _Clipped:
    """The GPU rows clipped to the windows: row ``ai[k]`` lies in group ``group[k]`` from
    ``start[k]`` to ``end[k]``; ``key`` orders the idle gap each one ends (``stream_waits.py``)."""

    ai: np.ndarray
    group: np.ndarray
    start: np.ndarray
    end: np.ndarray
    cls: np.ndarray
    key: np.ndarray


def rank_ledger(rank_events: RankEvents, plan: LedgerPlan) -> RankLedger:
    """Phase (c) of the ledger for one rank, given the global plan."""
    rows = _rank_rows(rank_events, plan)
    clip = _clip_to_windows(rows, plan)
    seg, lab = _labelled_segments(rows, clip, plan)
    sg, ss, se = seg["group"], seg["start"], seg["end"]
    pieces = []  # (group, sub index, start, end) arrays of sweep-based sub-parts
    pieces.append((sg[lab == SEG_SKEW], SUB["skew_wait"], ss[lab == SEG_SKEW], se[lab == SEG_SKEW]))
    pieces.append((sg[lab == SEG_OTHER], SUB["unattributed"], ss[lab == SEG_OTHER], se[lab == SEG_OTHER]))
    unknown_gaps = idle_pieces(seg, lab, rows.ev, plan.clock.offsets_ns, rows.ranks, rows.nr, pieces)
    local_len, transfer_len = (np.round(np.bincount(sg[lab == s], weights=(se - ss)[lab == s], minlength=rows.ngroups))
                               .astype(np.int64) for s in (SEG_LOCAL, SEG_TRANSFER))
    kc = per_kernel.prepare(rows.gpu, plan.hw, plan.cost, plan.measured_anywhere)  # per-kernel floors (no declared cost) and measured DRAM bytes
    t_compute, t_link_excess = declared_floors(plan.cost, plan.hw)
    link_float, link_int = _transfer_split(rows, clip, kc, t_link_excess, transfer_len)
    inter_caveats: list[str] = []
    shares = kernel_shares(rows.gpu, rows.start, rows.end, rows.ev, plan.clock.offsets_ns, plan.cost, t_compute,
                           t_link_excess, link_float, plan.win_of, rows.rank_pos, rows.nr, plan.skip, inter_caveats,
                           plan.hw.hbm_bytes_per_s if plan.hw is not None else 0.0, kc)
    local_int = _local_split(rows, clip, shares, local_len)
    wrep, wit, wrank = _group_keys(rows, plan)
    parts = _parts(rows, pieces, local_int, link_int, transfer_len, wrep, wit, wrank)
    intervals = _intervals(pieces, seg, lab, local_int, link_int, transfer_len, wrep, wit, wrank)
    gpu, ev = rows.gpu, rows.ev
    measured = kc is not None and kc.locality == per_kernel.LOCALITY_MEASURED
    launches = ev["launch"][["rank", "start_ns", "end_ns"]] if _profiler_heavy(plan.meta) else ev["launch"].iloc[:0][["rank", "start_ns", "end_ns"]]
    return RankLedger(rank=rows.rank, parts=parts, intervals=intervals,
                      kernel_rows=_kernel_rows(rows, plan, shares, kc, pieces, intervals),
                      locality_ns=pd.Series(shares["locality_tax"], index=gpu.index, name="locality_ns") if measured else None,
                      positions=rows.positions, intermediate_caveats=inter_caveats if shares.get("matched_intermediates") else None,
                      unrecorded=int(((gpu["role"].to_numpy(object) == "fused") & (rows.it >= 0) & ~shares["recorded"]).sum()),
                      unknown_gaps=unknown_gaps, has_gpu=len(gpu) > 0,
                      has_fused=bool((gpu["role"] == "fused").any()), has_records=not ev["record"].empty,
                      outside=int((rows.it < 0).sum()), launches=launches, floor_capped=shares.get("floor_capped", (0, 0.0)))


def _rank_rows(rank_events: RankEvents, plan: LedgerPlan) -> _RankRows:
    r = rank_events.rank
    gpu, ev = split_kinds(rank_events.events)
    gpu_pos = rank_events.positions[np.isin(rank_events.events["kind"].to_numpy(object), schema.GPU_KINDS)] \
        if len(rank_events.positions) else np.zeros(0, np.int64)
    if plan.spanned:
        gpu = gpu.assign(iteration=np.zeros(len(gpu), np.int64))
    off = gpu["rank"].map(plan.clock.offsets_ns).fillna(0).to_numpy(np.int64)
    return _RankRows(rank=r, gpu=gpu, ev=ev, positions=gpu_pos,
                     start=gpu["start_ns"].to_numpy(np.int64) + off, end=gpu["end_ns"].to_numpy(np.int64) + off,
                     rep=gpu["repetition"].to_numpy(np.int64), it=gpu["iteration"].to_numpy(np.int64),
                     cls=role_class(gpu["role"]),
                     ws=plan.windows["start_ns"].to_numpy(np.int64), we=plan.windows["end_ns"].to_numpy(np.int64),
                     ranks=[r], nr=1, rank_pos=pd.Series(np.arange(1), index=[r]))


def _clip_to_windows(rows: _RankRows, plan: LedgerPlan) -> _Clipped:
    """The GPU rows clipped to every window they overlap, and the launch key of each clipped row
    that starts where its row starts (what the idle gap it ends is charged to)."""
    ai, wi = iv.expand_to_windows(rows.start, rows.end, rows.ws, rows.we)
    c_start = np.maximum(rows.start[ai], rows.ws[wi])
    c_end = np.minimum(rows.end[ai], rows.we[wi])
    c_group = wi * rows.nr + rows.rank_pos.reindex(rows.gpu["rank"].to_numpy(np.int64)[ai]).to_numpy(np.int64)
    offsets = plan.clock.offsets_ns
    launch_end = launch_ends(rows.ev, rows.gpu, offsets)
    gated = gated_by_stream_wait(rows.gpu, launch_end, rows.ev["wait"], offsets, NO_LAUNCH)  # ledger/stream_waits.py
    key = np.where(c_start == rows.start[ai], gap_keys(launch_end, gated, NO_LAUNCH)[ai], iv.INT64_MAX)
    return _Clipped(ai=ai, group=c_group, start=c_start, end=c_end, cls=rows.cls[ai], key=key)


def _skew_intervals(rows: _RankRows, clip: _Clipped, plan: LedgerPlan) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(group, start, end) of the skew intervals: from a collective kernel's start until its
    collective's last arrival on any rank."""
    gpu, ai = rows.gpu, clip.ai
    cid = gpu["collective_id"].to_numpy(object)
    has_cid = np.zeros(len(gpu), bool)
    cand = rows.cls == CLS_COMM
    has_cid[cand] = gpu["collective_id"].to_numpy(object)[cand] != ""
    is_coll = has_cid[ai]
    last = plan.last
    if last is None or not len(last) or not is_coll.any():
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    lk = pd.MultiIndex.from_frame(last[["repetition", "collective_id"]])
    pos = lk.get_indexer(pd.MultiIndex.from_arrays([rows.rep[ai][is_coll], cid[ai][is_coll]]))
    la = np.where(pos >= 0, last["last_arrival_ns"].to_numpy(np.int64)[np.maximum(pos, 0)], iv.INT64_MAX * 0 - 1)
    sk_s = clip.start[is_coll]
    sk_e = np.minimum(np.minimum(la, rows.end[ai][is_coll]), clip.end[is_coll])
    sk_s = np.maximum(sk_s, rows.start[ai][is_coll])
    ok = sk_e > sk_s
    return clip.group[is_coll][ok], sk_s[ok], sk_e[ok]


def _labelled_segments(rows: _RankRows, clip: _Clipped, plan: LedgerPlan) -> tuple[dict, np.ndarray]:
    """The sweep of the clipped rows and skew intervals over every group's window, and each
    segment's label (``segments.SEG_*``): local work wins, then communication before its last
    member arrived (skew), communication after, other activity, idle."""
    sk_group, sk_s, sk_e = _skew_intervals(rows, clip, plan)
    bgroup = np.arange(rows.ngroups, dtype=np.int64)
    seg = iv.sweep(
        np.concatenate([clip.group, sk_group]), np.concatenate([clip.start, sk_s]), np.concatenate([clip.end, sk_e]),
        np.concatenate([clip.cls, np.full(len(sk_group), CLS_SKEW, np.int64)]), 4,
        np.concatenate([clip.key, np.full(len(sk_group), iv.INT64_MAX, np.int64)]),
        bgroup, rows.ws[bgroup // rows.nr], rows.we[bgroup // rows.nr])
    counts = seg["counts"]
    lab = np.select([counts[:, CLS_LOCAL] > 0, (counts[:, CLS_COMM] > 0) & (counts[:, CLS_SKEW] > 0),
                     counts[:, CLS_COMM] > 0, counts[:, CLS_OTHER] > 0], [SEG_LOCAL, SEG_SKEW, SEG_TRANSFER, SEG_OTHER], SEG_IDLE)
    return seg, lab


def _transfer_split(rows: _RankRows, clip: _Clipped, kc, t_link_excess: float,
                    transfer_len: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per group, the link floor that exposed transfer time carries (as a float, and in whole ns
    that sum with exposed_comm to the transfer time): the declared link excess, or with
    per-kernel floors the communication kernels' own."""
    link_excess = t_link_excess
    if kc is not None and kc.use_floors:
        is_c, is_l = clip.cls == CLS_COMM, clip.cls == CLS_LOCAL
        link_excess = per_kernel.link_floor_excess(kc, clip.ai, clip.group, is_c, is_l,
                                                   (clip.end - clip.start) / np.maximum(rows.end - rows.start, 1)[clip.ai],
                                                   rows.ngroups)
    link_float = np.minimum(link_excess, transfer_len.astype(np.float64))
    link_int = iv.largest_remainder(np.stack([link_float, transfer_len - link_float], axis=1), transfer_len)[:, 0]
    return link_float, link_int


def _local_split(rows: _RankRows, clip: _Clipped, shares: dict, local_len: np.ndarray) -> np.ndarray:
    """Per group, local busy time in whole ns per ``LOCAL_LABELS``: the kernels' shares clipped to
    the window, each capped by the local busy time still free (where local kernels run
    concurrently their summed shares may exceed it); compute_inefficiency is what is left."""
    is_local = clip.cls == CLS_LOCAL
    lai, lgrp = clip.ai[is_local], clip.group[is_local]
    clipped = (clip.end - clip.start)[is_local].astype(np.float64)
    wgt = clipped / (rows.end - rows.start)[lai].astype(np.float64)
    room = local_len.astype(np.float64)
    vals = []
    for k in LOCAL_LABELS[:-1]:
        v = np.minimum(np.bincount(lgrp, weights=shares[k][lai] * wgt, minlength=rows.ngroups), room)
        vals.append(v)
        room = np.maximum(room - v, 0.0)
    return iv.largest_remainder(np.column_stack(vals + [room]), local_len)


def _group_keys(rows: _RankRows, plan: LedgerPlan) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Repetition, iteration and rank of every group."""
    bgroup = np.arange(rows.ngroups, dtype=np.int64)
    return (plan.windows["repetition"].to_numpy(np.int64)[bgroup // rows.nr],
            plan.windows["iteration"].to_numpy(np.int64)[bgroup // rows.nr],
            np.asarray(rows.ranks, np.int64)[bgroup % rows.nr])


def _parts(rows: _RankRows, pieces, local_int, link_int, transfer_len, wrep, wit, wrank) -> pd.DataFrame:
    """The tidy parts (``categories.LEDGER_COLUMNS``): per group and sub-category the ns, which
    sum exactly to the group's window."""
    ngroups, nr = rows.ngroups, rows.nr
    table = np.zeros((ngroups, len(SUBCATEGORY_ORDER)), np.int64)
    for grp, sub, s0, s1 in pieces:
        table[:, sub] += np.bincount(grp, weights=(s1 - s0), minlength=ngroups).round().astype(np.int64)
    for j, name in enumerate(LOCAL_LABELS):
        table[:, SUB[name]] += local_int[:, j]
    table[:, SUB["useful"]] += link_int
    table[:, SUB["exposed_comm"]] += transfer_len - link_int
    window_ns = (rows.we - rows.ws)[np.arange(ngroups) // nr]
    bad = table.sum(axis=1) != window_ns
    if bad.any():  # an internal error, never the user's: say where
        g = int(np.flatnonzero(bad)[0])
        raise AssertionError(f"ledger parts do not sum to the window for window {g // nr}, rank {rows.ranks[g % nr]}: "
                             f"{table[g].tolist()} vs {window_ns[g]}")
    nsub = len(SUBCATEGORY_ORDER)
    return pd.DataFrame({
        "repetition": np.repeat(wrep, nsub), "iteration": np.repeat(wit, nsub), "rank": np.repeat(wrank, nsub),
        "category": np.tile(np.array([PARENT[s] for s in SUBCATEGORY_ORDER], dtype=object), ngroups),
        "subcategory": np.tile(np.array(SUBCATEGORY_ORDER, dtype=object), ngroups),
        "ns": table.ravel(),
    }, columns=list(LEDGER_COLUMNS))


def _intervals(pieces, seg, lab, local_int, link_int, transfer_len, wrep, wit, wrank) -> pd.DataFrame:
    """Where each sub-part lies: measured pieces as they are; shares of busy time (flag_wait,
    exposed_comm of fused kernels, useful, locality, compute_inefficiency, the link floor) laid out one after another along
    the rank's local (resp. transfer) segments, in that order."""
    groups, subs, starts, ends = [], [], [], []
    for grp, sub, s0, s1 in pieces:
        keep = s1 > s0
        groups.append(grp[keep])
        subs.append(np.full(int(keep.sum()), sub, np.int64))
        starts.append(s0[keep])
        ends.append(s1[keep])
    sg, ss, se = seg["group"], seg["start"], seg["end"]
    for seg_kind, amounts, labels in ((SEG_LOCAL, local_int, LOCAL_LABELS),
                                      (SEG_TRANSFER, np.column_stack([link_int, transfer_len - link_int]), TRANSFER_LABELS)):
        m = lab == seg_kind
        if not m.any():
            continue
        have = np.unique(sg[m])
        out = iv.apportion(sg[m], ss[m], se[m], amounts[have], have)
        keep = out["end"] > out["start"]
        groups.append(out["group"][keep])
        subs.append(np.array([SUB[name] for name in labels], np.int64)[out["label"][keep]])
        starts.append(out["start"][keep])
        ends.append(out["end"][keep])
    g = np.concatenate(groups) if groups else np.zeros(0, np.int64)
    sub = np.concatenate(subs) if subs else np.zeros(0, np.int64)
    s0 = np.concatenate(starts) if starts else np.zeros(0, np.int64)
    s1 = np.concatenate(ends) if ends else np.zeros(0, np.int64)
    # position of each group in (repetition, iteration, rank) order, so one sort orders the output
    gorder = np.lexsort((wrank, wit, wrep))
    gkey = np.empty_like(gorder)
    gkey[gorder] = np.arange(len(gorder))
    key, sub, s0, s1 = iv.merge_adjacent(gkey[g.astype(np.int64)], sub, s0.astype(np.int64), s1.astype(np.int64))
    g = gorder[key]
    names = np.array(SUBCATEGORY_ORDER, dtype=object)
    return pd.DataFrame({"repetition": wrep[g], "iteration": wit[g], "rank": wrank[g], "subcategory": names[sub],
                         "start_ns": s0, "end_ns": s1})


def _kernel_rows(rows: _RankRows, plan: LedgerPlan, shares: dict, kc, pieces, intervals: pd.DataFrame) -> pd.DataFrame:
    """One row per GPU row inside a window that is not skipped: its time, floor, shares, the
    launch tax before it and the bulk-synchronous tax inside it (for the per-kernel table)."""
    gpu = rows.gpu
    in_win = rows.it >= 0
    if plan.skip:
        in_win &= ~pd.MultiIndex.from_arrays([rows.rep, rows.it]).isin(list(plan.skip))
    n = int(in_win.sum())
    return pd.DataFrame({
        "pos": rows.positions[in_win], "name": gpu["name"].to_numpy(object)[in_win],
        "op": gpu["op"].to_numpy(object)[in_win] if "op" in gpu.columns else np.full(n, "", dtype=object),
        "role": gpu["role"].to_numpy(object)[in_win], "kind": gpu["kind"].to_numpy(object)[in_win],
        "d": (rows.end - rows.start).astype(np.float64)[in_win],
        "replayed": gpu["graph_id"].to_numpy(np.int64)[in_win] >= 0,
        "useful": shares["useful"][in_win], "locality": shares["locality_tax"][in_win],
        "wait_before": launch_tax_before(pieces, gpu, rows.start, rows.ranks, rows.nr)[in_win],
        "floor_ns": kc.floor_ns[in_win] if kc is not None else np.full(n, np.nan),
        "reason": kc.floors["reason"].to_numpy(object)[in_win] if kc is not None else np.full(n, NO_COST, dtype=object),
        "basis": kc.floors["basis"].to_numpy(object)[in_win] if kc is not None else np.full(n, "", dtype=object),
        "bsp": _bsp_inside(intervals, gpu, rows.start, rows.end)[in_win]})


def _bsp_inside(intervals: pd.DataFrame, gpu: pd.DataFrame, g_start: np.ndarray, g_end: np.ndarray) -> np.ndarray:
    """Per GPU row of one rank: the bulk-synchronous tax that lies inside it (skew_wait,
    exposed_comm, flag_wait: the parts that happen while a collective or fused kernel runs), for
    the per-kernel table. Only communicating kernels (roles comm, fused) carry it; where two of
    them run at once each is charged the overlap."""
    out = np.zeros(len(gpu))
    talk = np.isin(gpu["role"].to_numpy(object), ("comm", "fused"))
    inside = intervals[intervals["subcategory"].isin(BSP_INSIDE_KERNELS)]
    if talk.any() and len(inside):
        out[talk] = iv.covered(inside["start_ns"].to_numpy(np.int64), inside["end_ns"].to_numpy(np.int64),
                               g_start[talk], g_end[talk])
    return out


def _profiler_heavy(meta: dict) -> bool:
    """Whether ``per_kernel.profiler_caveat`` may look at the launch rows."""
    prof = (meta.get("capture") or {}).get("profiler") or {}
    return any(prof.get(k) for k in per_kernel.HEAVY_PROFILER_OPTIONS)
