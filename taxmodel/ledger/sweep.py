"""The tax ledger: measured time split exactly into useful work, compute inefficiency, the three
taxes and what is left unattributed (definitions: docs/ledger.md).

For every (repetition, iteration) the window is global: from the earliest GPU activity of that
iteration on any rank to the latest end on any rank, on the aligned clock. For every rank the
window is cut into elementary segments by what runs on the rank's GPU (any stream):

  local compute (compute/fused/copy kernels; comm under them is overlapped)   -> shares: flag_wait and
      exposed_comm (fused kernels' in-kernel records), useful (roofline floor), locality_tax,
      compute_inefficiency
  communication only, before the collective's last member arrived            -> skew_wait
  communication only, afterwards                                             -> useful (link floor
      above the compute floor), exposed_comm
  only 'other' GPU activity                                                  -> unattributed
  idle before the rank's first / after its last activity in the window       -> barrier_idle
  idle between activities: by the launch call of the kernel that ends the gap and host syncs
      -> barrier_idle (sync pending), host_starved, launch_latency, kernel_gap, stream_wait (queued
      behind another stream's event, ``stream_waits.py``) (or unattributed
      when the kernel has no launch record)

Everything is computed with vectorized interval arithmetic (``intervals.py``); the only Python
loops run over ranks, declared intermediates and sub-categories.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from taxmodel.errors import AnalysisError, InputError
from taxmodel.ledger import intervals as iv
from taxmodel.ledger.categories import CATEGORY_ORDER, LEDGER_COLUMNS, PARENT, SUBCATEGORY_ORDER
from taxmodel.ledger.clock import BARRIER_MARKER, ClockAlignment, estimate_clock
from taxmodel.ledger.collectives import collective_instances, last_arrivals, match_instances
from taxmodel.ledger import per_kernel
from taxmodel.hardware.specs import HardwareSpec, resolve_hardware
from taxmodel.ledger.kernel_costs import NO_COST, hardware_mismatch
from taxmodel.ledger.coverage import coverage_caveat, missing_ranks
from taxmodel.ledger.stream_waits import gap_keys, gated_by_stream_wait, split_gap_keys
from taxmodel.ledger.windows import GPU_SPAN_NOTE, partition_windows
from taxmodel.trace import schema
from taxmodel.trace.capture_meta import CPU_RUN_CAVEAT, emulated_gpu
from taxmodel.trace.bundle import Bundle

LOCAL_ROLES = ("compute", "fused", "copy")
WORK_ROLES = ("compute", "fused")
CLS_LOCAL, CLS_COMM, CLS_OTHER, CLS_SKEW = 0, 1, 2, 3
SEG_LOCAL, SEG_SKEW, SEG_TRANSFER, SEG_OTHER, SEG_IDLE = 0, 1, 2, 3, 4
NO_LAUNCH = iv.INT64_MAX - 1  # start key of a GPU activity whose launch call is unknown
SUB = {s: i for i, s in enumerate(SUBCATEGORY_ORDER)}
LOCAL_LABELS = ("flag_wait", "exposed_comm", "useful", "locality_tax", "compute_inefficiency")
#: Phases of in-kernel records in which a CTA only moves data between GPUs (kernels/device/trace.py).
COMM_PHASES = ("remote_load", "store_push")
TRANSFER_LABELS = ("useful", "exposed_comm")


@dataclass
class Ledger:
    """Measured time of one bundle split into the ledger's parts (see module docstring)."""

    parts: pd.DataFrame
    windows: pd.DataFrame
    intervals: pd.DataFrame
    clock: ClockAlignment
    caveats: list[str]
    skipped: list[str]
    meta: dict
    label: str
    hardware: HardwareSpec | None = None
    ranks: list[int] = field(default_factory=list)
    #: how locality_tax was obtained: "measured" (DRAM counters), "estimated" (the workload's
    #: declared intermediates), "not measured" (NaN in summaries; its time is in compute_inefficiency)
    locality: str = "estimated"
    #: per distinct (kernel, op): launches, time, floor, useful, locality, inefficiency, launch tax, costed
    kernels: pd.DataFrame | None = None
    #: per GPU row (``bundle.events`` index) the locality tax the ledger measured from its DRAM
    #: counters, in ns; None unless ``locality`` is "measured" (what ``advise`` sums per candidate)
    kernel_locality_ns: pd.Series | None = None
    #: the launch tax may be the profiler's own host overhead (a heavy eager capture; see caveats)
    launch_tax_inflated: bool = False

    def summary(self) -> pd.DataFrame:
        """One row per sub-category: mean ns over repetitions, iterations and ranks, and % of
        the mean window; the rows sum to the mean window."""
        n = max(len(self.windows) * max(len(self.ranks), 1), 1)
        total = self.parts.groupby("subcategory")["ns"].sum()
        mean = np.array([float(total.get(s, 0)) / n for s in SUBCATEGORY_ORDER])
        mean_window = float(self.windows["window_ns"].mean()) if len(self.windows) else 0.0
        out = pd.DataFrame({
            "category": [PARENT[s] for s in SUBCATEGORY_ORDER],
            "subcategory": list(SUBCATEGORY_ORDER),
            "mean_ns": mean,
            "pct": mean / mean_window * 100.0 if mean_window else np.zeros(len(mean)),
        })
        if self.locality == per_kernel.LOCALITY_ABSENT:  # not a measured 0: its time stays in compute_inefficiency
            out.loc[out["subcategory"] == "locality_tax", ["mean_ns", "pct"]] = np.nan
        return out

    def category_summary(self) -> pd.DataFrame:
        """Like ``summary`` but one row per category."""
        s = self.summary().groupby("category", sort=False)[["mean_ns", "pct"]].sum()
        return s.reindex(list(CATEGORY_ORDER)).reset_index()

    def per_iteration(self) -> pd.DataFrame:
        """One row per (repetition, iteration): window_ns and each category's mean over ranks."""
        nr = max(len(self.ranks), 1)
        wide = (self.parts.groupby(["repetition", "iteration", "category"])["ns"].sum() / nr).unstack("category")
        wide = wide.reindex(columns=list(CATEGORY_ORDER)).fillna(0.0).reset_index()
        wide.columns.name = None
        return self.windows[["repetition", "iteration", "window_ns"]].merge(wide, on=["repetition", "iteration"], how="left")

    def per_rank(self) -> pd.DataFrame:
        """Mean ns per (rank, sub-category) over repetitions and iterations (wide)."""
        n = max(len(self.windows), 1)
        wide = (self.parts.groupby(["rank", "subcategory"])["ns"].sum() / n).unstack("subcategory")
        return wide.reindex(columns=list(SUBCATEGORY_ORDER)).fillna(0.0)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready document (what `taxmodel analyze --json` prints)."""
        return {
            "label": self.label,
            "workload": self.meta.get("workload"), "variant": self.meta.get("variant"), "shape": self.meta.get("shape"),
            "world_size": self.meta.get("world_size"), "ranks": self.ranks,
            "missing_ranks": missing_ranks(self.meta, self.ranks),
            "hardware": None if self.hardware is None else {"name": self.hardware.name, "source": self.hardware.source},
            "clock": self.clock.to_dict(),
            "mean_window_ns": float(self.windows["window_ns"].mean()) if len(self.windows) else 0.0,
            "summary": self.summary().astype(object).where(self.summary().notna(), None).to_dict(orient="records"),  # NaN -> null
            "per_iteration": self.per_iteration().to_dict(orient="records"),
            "caveats": list(self.caveats), "skipped": list(self.skipped),
            "locality": self.locality, "launch_tax_inflated": self.launch_tax_inflated,
            "kernels": [] if self.kernels is None else
            self.kernels.astype(object).where(self.kernels.notna(), None).to_dict(orient="records"),
        }


# --------------------------------------------------------------------------------------------

def compute_ledger(bundle: Bundle, hardware: HardwareSpec | None = None, lenient: bool = False) -> Ledger:
    """Split the bundle's measured time into the ledger's parts; see docs/ledger.md.

    Raises AnalysisError for data that cannot be analyzed as is (iterations that do not match
    across ranks, collectives missing on some member, clocks that cannot be aligned); with
    ``lenient`` the affected iterations are skipped and listed in ``Ledger.skipped``.

    Runs the ledger's four phases in one process (``model/ledger_dask.py`` runs the per-rank
    ones as tasks): (a) ``summarize_rank`` reduces each rank's events to a small summary,
    (b) ``plan_ledger`` makes the global decisions from the summaries (clock offsets, windows,
    collectives' last arrivals, skipped iterations), (c) ``rank_ledger`` computes each rank's
    parts and intervals given the plan, (d) ``assemble_ledger`` concatenates them.
    """
    plan, events_of = _plan_bundle(bundle, hardware, lenient)
    pieces = [rank_ledger(events_of(r), plan) for r in plan.ranks]
    return assemble_ledger(plan, pieces, per_kernel.job_label(plan.meta, bundle.path) or bundle.label, hardware)


def ledger_windows(bundle: Bundle, hardware: HardwareSpec | None = None, lenient: bool = False) -> pd.DataFrame:
    """The windows ``compute_ledger`` would split (its ``Ledger.windows``, before sorting), from
    phases (a) and (b) only: what needs a window's length and none of its parts (the analytic
    model's fit on predicted latencies) skips the per-rank split."""
    return _plan_bundle(bundle, hardware, lenient)[0].windows


def _plan_bundle(bundle: Bundle, hardware: HardwareSpec | None, lenient: bool):
    """Phases (a) and (b) of ``compute_ledger``: the plan, and each rank's events by rank."""
    ev = bundle.events
    ranks = _ranks(bundle)
    rows = rank_rows(ev)

    def events_of(r: int) -> RankEvents:
        pos = rows.get(r, np.zeros(0, np.int64))
        if len(pos) and pos[-1] - pos[0] + 1 == len(pos):  # a rank's rows are contiguous in written bundles: a slice
            return RankEvents(r, ev.iloc[int(pos[0]):int(pos[-1]) + 1], pos)
        return RankEvents(r, ev.take(pos), pos)

    return plan_ledger([summarize_rank(events_of(r)) for r in ranks], bundle.meta, ranks, hardware, lenient), events_of


def rank_rows(events: pd.DataFrame) -> dict[int, np.ndarray]:
    """Positions (ascending) of each rank's rows in ``events``."""
    if events.empty:
        return {}
    return {int(r): np.asarray(p, np.int64) for r, p in events.groupby("rank", sort=True).indices.items()}


@dataclass
class RankEvents:
    """One rank's events and their positions in the bundle's events (what orders per-row
    results of several ranks as one process would)."""

    rank: int
    events: pd.DataFrame
    positions: np.ndarray


@dataclass
class RankSummary:
    """Phase (a): what the global decisions need of one rank (a few rows per iteration and
    collective, not per event). Times on the rank's own clock."""

    rank: int
    spans: pd.DataFrame  # rank, repetition, iteration, start_ns, end_ns of GPU rows in iterations
    rep_spans: pd.DataFrame  # the same per repetition over all GPU rows (the no-marker fallback)
    instances: pd.DataFrame  # collectives.collective_instances of the rank's GPU rows
    markers: pd.DataFrame  # clock barrier markers
    measured_bytes: bool  # any GPU row with measured DRAM bytes


def _split_kinds(events: pd.DataFrame) -> tuple[pd.DataFrame, _KindFrames]:
    """GPU rows, and the host-side rows split by kind (small frames)."""
    codes, kind_names = pd.factorize(events["kind"])
    kinds = {k: events[codes == i] for i, k in enumerate(kind_names) if k not in schema.GPU_KINDS}
    gpu = events[np.isin(codes, [i for i, k in enumerate(kind_names) if k in schema.GPU_KINDS])]
    return gpu, _KindFrames(events.iloc[:0], kinds)


def summarize_rank(rank_events: RankEvents) -> RankSummary:
    """Phase (a) of the ledger for one rank."""
    r = rank_events.rank
    gpu, ev = _split_kinds(rank_events.events)
    rep, it = gpu["repetition"].to_numpy(np.int64), gpu["iteration"].to_numpy(np.int64)
    start, end = gpu["start_ns"].to_numpy(np.int64), gpu["end_ns"].to_numpy(np.int64)
    inside = it >= 0
    spans = _spans(r, rep[inside], it[inside], start[inside], end[inside])
    rep_spans = _spans(r, rep, np.zeros(len(rep), np.int64), start, end)
    markers = ev["marker"]
    markers = markers[markers["name"].astype(str).str.contains(BARRIER_MARKER, regex=False)][
        ["kind", "name", "rank", "start_ns", "end_ns"]] if len(markers) else rank_events.events.iloc[:0][
        ["kind", "name", "rank", "start_ns", "end_ns"]]
    return RankSummary(r, spans, rep_spans, collective_instances(gpu), markers,
                       bool(np.isfinite(per_kernel.measured_bytes(gpu)).any()))


def _spans(rank: int, rep: np.ndarray, it: np.ndarray, start: np.ndarray, end: np.ndarray) -> pd.DataFrame:
    """Earliest start and latest end per (repetition, iteration), sorted by them."""
    order = np.lexsort((it, rep))
    rep, it, start, end = rep[order], it[order], start[order], end[order]
    first = np.flatnonzero(np.r_[True, (rep[1:] != rep[:-1]) | (it[1:] != it[:-1])]) if len(rep) else np.zeros(0, np.int64)
    return pd.DataFrame({"repetition": rep[first], "iteration": it[first],
                         "start_ns": np.minimum.reduceat(start, first) if len(first) else start[:0],
                         "end_ns": np.maximum.reduceat(end, first) if len(first) else end[:0],
                         "rank": np.full(len(first), rank, np.int64)})


@dataclass
class LedgerPlan:
    """Phase (b): the global decisions every rank's second phase needs."""

    meta: dict
    ranks: list[int]
    hw: HardwareSpec | None
    cost: dict | None
    lenient: bool
    spanned: bool  # no iteration markers: every GPU row is in iteration 0
    skip: set
    clock: ClockAlignment
    windows: pd.DataFrame  # sorted by start, partitioned
    last: pd.DataFrame  # per (repetition, collective_id) of the complete collectives: last_arrival_ns (aligned)
    measured_anywhere: bool
    caveats: list[str]
    skipped: list[str]

    @property
    def win_of(self) -> pd.Series:
        return pd.Series(np.arange(len(self.windows)), index=pd.MultiIndex.from_frame(self.windows[["repetition", "iteration"]]))


def plan_ledger(summaries: list[RankSummary], meta: dict, ranks: list[int], hardware: HardwareSpec | None = None,
                lenient: bool = False) -> LedgerPlan:
    """Phase (b): clock offsets, windows, skipped iterations and collectives' last arrivals from
    the ranks' summaries (in rank order)."""
    meta = dict(meta)
    caveats: list[str] = []
    skipped: list[str] = []
    cost = meta.get("cost")
    hw = hardware
    if hw is None:
        try:
            hw = resolve_hardware(meta)
        except InputError as exc:
            if cost:
                raise
            hw = None
            caveats.append(f"no hardware spec: {exc}. Without one no kernel gets a floor (useful is 0 and all kernel time "
                           "counts as compute_inefficiency)")
    subset = coverage_caveat(meta, ranks)
    if subset:  # model/coverage.py
        caveats.append(subset)
    spans = pd.concat([s.spans for s in summaries], ignore_index=True) if summaries else pd.DataFrame(
        columns=["repetition", "iteration", "start_ns", "end_ns", "rank"], dtype=np.int64)
    rep_spans = pd.concat([s.rep_spans for s in summaries], ignore_index=True) if summaries else spans
    spanned = spans.empty and not rep_spans.empty  # fallback_iterations over all ranks' GPU rows
    inst = pd.concat([s.instances for s in summaries], ignore_index=True) if summaries else pd.DataFrame()
    if spanned:  # no markers: one window over all GPU activity (model/windows.py)
        spans = rep_spans
        inst = inst.assign(iteration=np.zeros(len(inst), np.int64))
        caveats.append(GPU_SPAN_NOTE)
    skip = _check_iterations(spans[["rank", "repetition", "iteration"]], lenient, skipped)
    if len(inst):
        inst = inst.sort_values(["repetition", "collective_id", "rank"], kind="stable").reset_index(drop=True)
    match = match_instances(inst)
    for row in match.incomplete.itertuples(index=False):
        msg = (f"collective {row.collective_id} (repetition {row.repetition}, iteration {row.iteration}) never ran "
               f"on rank(s) {row.missing}")
        if not lenient:
            raise AnalysisError(f"{msg}: every member of a process group must run each of its collectives. The trace "
                                "may be cut short on that rank; re-capture, or pass --lenient to skip that iteration.")
        skipped.append(f"{msg}: iteration skipped")
        skip.add((int(row.repetition), int(row.iteration)))

    markers = pd.concat([s.markers for s in summaries], ignore_index=True) if summaries else pd.DataFrame(
        columns=["kind", "name", "rank", "start_ns", "end_ns"])
    clock = estimate_clock(markers, meta, match.complete(), ranks)
    caveats.extend(clock.notes)
    offsets = clock.offsets_ns

    # --- windows: each (repetition, iteration) from the earliest aligned start to the latest end --
    off = spans["rank"].map(offsets).fillna(0).to_numpy(np.int64)
    s_rep, s_it = spans["repetition"].to_numpy(np.int64), spans["iteration"].to_numpy(np.int64)
    in_iter = s_it >= 0
    if skip:
        in_iter &= ~pd.MultiIndex.from_arrays([s_rep, s_it]).isin(list(skip))
    wdf = (pd.DataFrame({"repetition": s_rep[in_iter], "iteration": s_it[in_iter],
                         "s": spans["start_ns"].to_numpy(np.int64)[in_iter] + off[in_iter],
                         "e": spans["end_ns"].to_numpy(np.int64)[in_iter] + off[in_iter]})
           .groupby(["repetition", "iteration"], as_index=False).agg(start_ns=("s", "min"), end_ns=("e", "max")))
    if wdf.empty:
        raise AnalysisError("no GPU activity inside any iteration: the bundle has no iteration markers that contain "
                            "kernels (check the importer's --iteration-pattern, or profile with iteration markers)")
    wdf = wdf.sort_values(["start_ns", "repetition", "iteration"], kind="stable").reset_index(drop=True)
    wdf["window_ns"] = wdf["end_ns"] - wdf["start_ns"]
    wdf, n_cut = partition_windows(wdf)
    if n_cut:
        caveats.append(f"{n_cut} iteration window(s) reached into the next iteration's (pipelined steps); windows were cut "
                       "at the next iteration's first GPU activity, so each is one step period and no time is counted twice")
    ws, we = wdf["start_ns"].to_numpy(np.int64), wdf["end_ns"].to_numpy(np.int64)
    nw = len(wdf)
    _check_clock(clock, wdf, lenient, caveats, skipped)
    if nw > 1 and (ws[1:] < np.maximum.accumulate(we)[:-1]).any():
        n_over = int((ws[1:] < np.maximum.accumulate(we)[:-1]).sum())
        caveats.append(f"{n_over} iteration window(s) overlap the previous one (a rank started the next iteration "
                       "before another finished); the overlapping time is counted in both windows")
    complete = match.complete()
    last = last_arrivals(complete, offsets) if len(complete) else None
    return LedgerPlan(meta=meta, ranks=ranks, hw=hw, cost=cost, lenient=lenient, spanned=spanned, skip=skip, clock=clock,
                      windows=wdf, last=last, measured_anywhere=any(s.measured_bytes for s in summaries),
                      caveats=caveats, skipped=skipped)


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


def rank_ledger(rank_events: RankEvents, plan: LedgerPlan) -> RankLedger:
    """Phase (c) of the ledger for one rank, given the global plan."""
    r = rank_events.rank
    gpu, ev = _split_kinds(rank_events.events)
    gpu_pos = rank_events.positions[np.isin(rank_events.events["kind"].to_numpy(object), schema.GPU_KINDS)] \
        if len(rank_events.positions) else np.zeros(0, np.int64)
    if plan.spanned:
        gpu = gpu.assign(iteration=np.zeros(len(gpu), np.int64))
    ranks = [r]
    nr = 1
    rank_pos = pd.Series(np.arange(nr), index=ranks)
    cost, hw, skip, clock, wdf = plan.cost, plan.hw, plan.skip, plan.clock, plan.windows
    offsets = clock.offsets_ns

    def aligned(df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        off = df["rank"].map(offsets).fillna(0).to_numpy(np.int64)
        return df["start_ns"].to_numpy(np.int64) + off, df["end_ns"].to_numpy(np.int64) + off

    g_start, g_end = aligned(gpu)
    g_rank = gpu["rank"].to_numpy(np.int64)
    g_rep = gpu["repetition"].to_numpy(np.int64)
    g_it = gpu["iteration"].to_numpy(np.int64)
    g_cls = _role_class(gpu["role"])
    ws, we = wdf["start_ns"].to_numpy(np.int64), wdf["end_ns"].to_numpy(np.int64)
    nw = len(wdf)
    win_of = plan.win_of

    # --- GPU activity clipped to windows ------------------------------------------------------
    ai, wi = iv.expand_to_windows(g_start, g_end, ws, we)
    c_start = np.maximum(g_start[ai], ws[wi])
    c_end = np.minimum(g_end[ai], we[wi])
    c_group = wi * nr + rank_pos.reindex(g_rank[ai]).to_numpy(np.int64)
    cls = g_cls[ai]
    launch_end = _launch_ends(ev, gpu, offsets)
    gated = gated_by_stream_wait(gpu, launch_end, ev["wait"], offsets, NO_LAUNCH)  # model/stream_waits.py
    key = np.where(c_start == g_start[ai], gap_keys(launch_end, gated, NO_LAUNCH)[ai], iv.INT64_MAX)

    # skew intervals: from a collective kernel's start until its collective's last arrival
    cid = gpu["collective_id"].to_numpy(object)
    has_cid = np.zeros(len(gpu), bool)
    cand = g_cls == CLS_COMM
    has_cid[cand] = gpu["collective_id"].to_numpy(object)[cand] != ""
    is_coll = has_cid[ai]
    last = plan.last
    if last is not None and len(last) and is_coll.any():
        lk = pd.MultiIndex.from_frame(last[["repetition", "collective_id"]])
        pos = lk.get_indexer(pd.MultiIndex.from_arrays([g_rep[ai][is_coll], cid[ai][is_coll]]))
        la = np.where(pos >= 0, last["last_arrival_ns"].to_numpy(np.int64)[np.maximum(pos, 0)], iv.INT64_MAX * 0 - 1)
        sk_s = c_start[is_coll]
        sk_e = np.minimum(np.minimum(la, g_end[ai][is_coll]), c_end[is_coll])
        sk_s = np.maximum(sk_s, g_start[ai][is_coll])
        ok = sk_e > sk_s
        sk_group, sk_s, sk_e = c_group[is_coll][ok], sk_s[ok], sk_e[ok]
    else:
        sk_group = sk_s = sk_e = np.zeros(0, np.int64)

    ngroups = nw * nr
    bgroup = np.arange(ngroups, dtype=np.int64)
    seg = iv.sweep(
        np.concatenate([c_group, sk_group]), np.concatenate([c_start, sk_s]), np.concatenate([c_end, sk_e]),
        np.concatenate([cls, np.full(len(sk_group), CLS_SKEW, np.int64)]), 4,
        np.concatenate([key, np.full(len(sk_group), iv.INT64_MAX, np.int64)]),
        bgroup, ws[bgroup // nr], we[bgroup // nr])
    counts = seg["counts"]
    lab = np.select([counts[:, CLS_LOCAL] > 0, (counts[:, CLS_COMM] > 0) & (counts[:, CLS_SKEW] > 0),
                     counts[:, CLS_COMM] > 0, counts[:, CLS_OTHER] > 0], [SEG_LOCAL, SEG_SKEW, SEG_TRANSFER, SEG_OTHER], SEG_IDLE)
    sg, ss, se = seg["group"], seg["start"], seg["end"]
    slen = se - ss

    pieces = []  # (group, sub index, start, end) arrays of sweep-based sub-parts
    pieces.append((sg[lab == SEG_SKEW], SUB["skew_wait"], ss[lab == SEG_SKEW], se[lab == SEG_SKEW]))
    pieces.append((sg[lab == SEG_OTHER], SUB["unattributed"], ss[lab == SEG_OTHER], se[lab == SEG_OTHER]))
    unknown_gaps = _idle_pieces(seg, lab, ev, offsets, ranks, nr, pieces)
    # --- shares of local busy time and of exposed transfer time ----------------------------------
    local_len = np.bincount(sg[lab == SEG_LOCAL], weights=slen[lab == SEG_LOCAL], minlength=ngroups)
    transfer_len = np.bincount(sg[lab == SEG_TRANSFER], weights=slen[lab == SEG_TRANSFER], minlength=ngroups)
    local_len = np.round(local_len).astype(np.int64)
    transfer_len = np.round(transfer_len).astype(np.int64)

    t_compute, t_link_excess = _floors(cost, hw)
    kc = per_kernel.prepare(gpu, hw, cost, plan.measured_anywhere)  # per-kernel floors (no declared cost) and measured DRAM bytes
    link_excess = t_link_excess
    if kc is not None and kc.use_floors:
        is_c, is_l = cls == CLS_COMM, cls == CLS_LOCAL
        link_excess = per_kernel.link_floor_excess(kc, ai, c_group, is_c, is_l, (c_end - c_start) / np.maximum(g_end - g_start, 1)[ai],
                                           ngroups)
    link_float = np.minimum(link_excess, transfer_len.astype(np.float64))
    link_int = iv.largest_remainder(np.stack([link_float, transfer_len - link_float], axis=1), transfer_len)[:, 0]

    inter_caveats: list[str] = []
    shares = _kernel_shares(gpu, g_start, g_end, ev, offsets, cost, t_compute, t_link_excess, link_float, win_of, rank_pos,
                            nr, skip, inter_caveats, hw.hbm_bytes_per_s if hw is not None else 0.0, kc)
    unrecorded = int(((gpu["role"].to_numpy(object) == "fused") & (g_it >= 0) & ~shares["recorded"]).sum())
    is_local = cls == CLS_LOCAL
    lai, lgrp = ai[is_local], c_group[is_local]
    clip = (c_end - c_start)[is_local].astype(np.float64)
    wgt = clip / (g_end - g_start)[lai].astype(np.float64)
    # Shares of kernels clipped to the window, each capped by the local busy time still free:
    # where local kernels run concurrently their summed shares may exceed the busy time.
    room = local_len.astype(np.float64)
    vals = []
    for k in LOCAL_LABELS[:-1]:
        v = np.minimum(np.bincount(lgrp, weights=shares[k][lai] * wgt, minlength=ngroups), room)
        vals.append(v)
        room = np.maximum(room - v, 0.0)
    local_int = iv.largest_remainder(np.column_stack(vals + [room]), local_len)

    # --- parts ------------------------------------------------------------------------------------
    table = np.zeros((ngroups, len(SUBCATEGORY_ORDER)), np.int64)
    for grp, sub, s0, s1 in pieces:
        table[:, sub] += np.bincount(grp, weights=(s1 - s0), minlength=ngroups).round().astype(np.int64)
    for j, name in enumerate(LOCAL_LABELS):
        table[:, SUB[name]] += local_int[:, j]
    table[:, SUB["useful"]] += link_int
    table[:, SUB["exposed_comm"]] += transfer_len - link_int
    window_ns = (we - ws)[bgroup // nr]
    bad = table.sum(axis=1) != window_ns
    if bad.any():  # an internal error, never the user's: say where
        g = int(np.flatnonzero(bad)[0])
        raise AssertionError(f"ledger parts do not sum to the window for window {g // nr}, rank {ranks[g % nr]}: "
                             f"{table[g].tolist()} vs {window_ns[g]}")

    wrep = wdf["repetition"].to_numpy(np.int64)[bgroup // nr]
    wit = wdf["iteration"].to_numpy(np.int64)[bgroup // nr]
    wrank = np.asarray(ranks, np.int64)[bgroup % nr]
    nsub = len(SUBCATEGORY_ORDER)
    parts = pd.DataFrame({
        "repetition": np.repeat(wrep, nsub), "iteration": np.repeat(wit, nsub), "rank": np.repeat(wrank, nsub),
        "category": np.tile(np.array([PARENT[s] for s in SUBCATEGORY_ORDER], dtype=object), ngroups),
        "subcategory": np.tile(np.array(SUBCATEGORY_ORDER, dtype=object), ngroups),
        "ns": table.ravel(),
    }, columns=list(LEDGER_COLUMNS))
    intervals = _intervals(pieces, seg, lab, local_int, link_int, transfer_len, wrep, wit, wrank)

    in_win = g_it >= 0
    if skip:
        in_win &= ~pd.MultiIndex.from_arrays([g_rep, g_it]).isin(list(skip))
    d = (g_end - g_start).astype(np.float64)
    kernel_rows = pd.DataFrame({
        "pos": gpu_pos[in_win], "name": gpu["name"].to_numpy(object)[in_win],
        "op": gpu["op"].to_numpy(object)[in_win] if "op" in gpu.columns else np.full(int(in_win.sum()), "", dtype=object),
        "role": gpu["role"].to_numpy(object)[in_win], "kind": gpu["kind"].to_numpy(object)[in_win], "d": d[in_win],
        "replayed": gpu["graph_id"].to_numpy(np.int64)[in_win] >= 0,
        "useful": shares["useful"][in_win], "locality": shares["locality_tax"][in_win],
        "wait_before": _launch_tax_before(pieces, gpu, g_start, ranks, nr)[in_win],
        "floor_ns": kc.floor_ns[in_win] if kc is not None else np.full(int(in_win.sum()), np.nan),
        "reason": kc.floors["reason"].to_numpy(object)[in_win] if kc is not None else np.full(int(in_win.sum()), NO_COST, dtype=object),
        "basis": kc.floors["basis"].to_numpy(object)[in_win] if kc is not None else np.full(int(in_win.sum()), "", dtype=object),
        "bsp": _bsp_inside(intervals, gpu, g_start, g_end)[in_win]})
    measured = kc is not None and kc.locality == per_kernel.LOCALITY_MEASURED
    launches = ev["launch"][["rank", "start_ns", "end_ns"]] if _profiler_heavy(plan.meta) else ev["launch"].iloc[:0][["rank", "start_ns", "end_ns"]]
    return RankLedger(rank=r, parts=parts, intervals=intervals, kernel_rows=kernel_rows,
                      locality_ns=pd.Series(shares["locality_tax"], index=gpu.index, name="locality_ns") if measured else None,
                      positions=gpu_pos, intermediate_caveats=inter_caveats if shares.get("matched_intermediates") else None,
                      unrecorded=unrecorded, unknown_gaps=unknown_gaps, has_gpu=len(gpu) > 0,
                      has_fused=bool((gpu["role"] == "fused").any()), has_records=not ev["record"].empty,
                      outside=int((g_it < 0).sum()), launches=launches, floor_capped=shares.get("floor_capped", (0, 0.0)))


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
    """Whether ``ledger_kernels.profiler_caveat`` may look at the launch rows."""
    prof = (meta.get("capture") or {}).get("profiler") or {}
    return any(prof.get(k) for k in per_kernel.HEAVY_PROFILER_OPTIONS)


def assemble_ledger(plan: LedgerPlan, pieces: list[RankLedger], label: str, hardware: HardwareSpec | None = None) -> Ledger:
    """Phase (d): the ranks' parts and intervals concatenated in (repetition, iteration, rank)
    order, the per-kernel table from the ranks' rows in the bundle's row order, the caveats."""
    order = {r: i for i, r in enumerate(plan.ranks)}
    pieces = sorted(pieces, key=lambda p: order[p.rank])
    caveats = list(plan.caveats)
    hw, cost, clock, ranks, meta = plan.hw, plan.cost, plan.clock, plan.ranks, plan.meta
    nr, nw = len(ranks), len(plan.windows)
    by = ["repetition", "iteration", "rank"]
    parts = pd.concat([p.parts for p in pieces], ignore_index=True).sort_values(by, kind="stable").reset_index(drop=True)
    intervals = pd.concat([p.intervals for p in pieces], ignore_index=True).sort_values(by, kind="stable").reset_index(drop=True)
    windows = plan.windows.sort_values(["repetition", "iteration"]).reset_index(drop=True)
    reached = [p.intermediate_caveats for p in pieces if p.intermediate_caveats is not None]
    if reached:  # a declared intermediate is reported when it matches no kernel on any rank
        caveats.extend(c for c in reached[0] if all(c in other for other in reached[1:]))
    unrecorded = sum(p.unrecorded for p in pieces)
    records = any(p.has_records for p in pieces)
    if records and unrecorded:
        caveats.append(f"{unrecorded} fused kernel launch(es) inside iterations have no in-kernel records "
                       "(not instrumented, or records lost): their flag waits are not visible and count as compute")
    kc_any = not (cost and not plan.measured_anywhere)  # ledger_kernels.prepare returns a KernelCosts
    use_floors = not cost and hw is not None
    locality = per_kernel.locality_mode(None, cost) if not kc_any else (
        per_kernel.LOCALITY_MEASURED if plan.measured_anywhere else
        per_kernel.LOCALITY_ESTIMATED if cost else per_kernel.LOCALITY_ABSENT)
    rows = pd.concat([p.kernel_rows for p in pieces], ignore_index=True)
    if not rows["pos"].is_monotonic_increasing:  # ranks interleaved in the bundle's rows: back to its order
        rows = rows.sort_values("pos", kind="stable").reset_index(drop=True)
    kc = per_kernel.KernelCosts(rows[["floor_ns", "reason", "basis"]], np.zeros(0), np.zeros(0), use_floors, locality,
                                hw.hbm_bytes_per_s if hw is not None else 0.0) if kc_any else None
    gaps = (sum(p.unknown_gaps[0] for p in pieces), sum(p.unknown_gaps[1] for p in pieces))
    cpu_run = emulated_gpu(meta)
    _add_caveats(caveats, hw, cost, parts, clock, ranks, gaps, kc, cpu_run=cpu_run,
                 fused_without_records=any(p.has_fused for p in pieces) and not records,
                 active={p.rank for p in pieces if p.has_gpu}, outside=sum(p.outside for p in pieces))
    d = rows["d"].to_numpy(np.float64)
    everywhere = np.ones(len(rows), bool)
    kernels = per_kernel.kernel_table(rows, kc, d, everywhere, rows["useful"].to_numpy(np.float64),
                                      rows["locality"].to_numpy(np.float64), rows["wait_before"].to_numpy(np.float64), locality,
                                      rows["bsp"].to_numpy(np.float64))
    caveats.extend(per_kernel.kernel_caveats(kernels, kc, rows, d, everywhere, meta))
    capped = [p.floor_capped for p in pieces if p.floor_capped[0]]
    if capped:
        caveats.append(per_kernel.declared_floor_caveat(sum(c[0] for c in capped), max(c[1] for c in capped),
                                                        [p.rank for p in pieces if p.floor_capped[0]], hw, cpu_run=cpu_run))
    mism = hardware_mismatch(meta, hw)
    if mism:
        caveats.append(mism)
    ws, we = plan.windows["start_ns"].to_numpy(np.int64), plan.windows["end_ns"].to_numpy(np.int64)
    launch_pct = float(parts.loc[parts["category"] == "launch_tax", "ns"].sum()) / max(float((we - ws).sum()) * nr, 1.0) * 100
    prof = per_kernel.profiler_caveat(meta, launch_pct, pd.concat([p.launches for p in pieces], ignore_index=True), nw, nr)
    if prof:
        caveats.append(prof)
    caveats = list(dict.fromkeys(caveats))  # each caveat once
    kernel_locality = None
    if locality == per_kernel.LOCALITY_MEASURED:
        loc = [p.locality_ns for p in pieces if p.locality_ns is not None]
        pos = np.concatenate([p.positions for p in pieces if p.locality_ns is not None]) if loc else np.zeros(0, np.int64)
        kernel_locality = pd.concat(loc).iloc[np.argsort(pos, kind="stable")] if loc else pd.Series(dtype=np.float64, name="locality_ns")
    return Ledger(parts=parts, windows=windows, intervals=intervals, clock=clock, caveats=caveats, skipped=list(plan.skipped),
                  meta=meta, label=label, hardware=hw, ranks=ranks, locality=locality, kernels=kernels,
                  kernel_locality_ns=kernel_locality, launch_tax_inflated=prof is not None)


#: the bulk-synchronous sub-parts that happen inside a running kernel (the others are idle time)
BSP_INSIDE_KERNELS = ("skew_wait", "exposed_comm", "flag_wait")


# --- steps ----------------------------------------------------------------------------------------

class _KindFrames:
    """Host-side rows split by kind once (comparing a 'kind' string per row is the slow part of
    selecting them); ``frames["sync"]`` is an empty frame when there are none."""

    def __init__(self, empty: pd.DataFrame, frames: dict[str, pd.DataFrame]):
        self.empty, self.frames = empty, frames

    def __getitem__(self, kind: str) -> pd.DataFrame:
        return self.frames.get(kind, self.empty)


def _role_class(role: pd.Series) -> np.ndarray:
    """Sweep class of each GPU row from its role, comparing the few distinct roles only."""
    codes, uniq = pd.factorize(role)
    table = np.array([CLS_LOCAL if u in LOCAL_ROLES else CLS_COMM if u == "comm" else CLS_OTHER for u in uniq] or [CLS_OTHER],
                     np.int64)
    return table[codes]


def _ranks(bundle: Bundle) -> list[int]:
    """Ranks to account for: those in meta (a rank may have recorded no GPU activity) and in events."""
    return ledger_ranks(bundle.meta, bundle.events["rank"].unique())


def ledger_ranks(meta: dict, present_ranks) -> list[int]:
    """``_ranks`` from meta and the ranks that have events."""
    declared = {int(r) for r in (meta.get("ranks") or [])}
    present = {int(r) for r in present_ranks}
    if not declared:
        ws = meta.get("world_size")
        declared = set(range(int(ws))) if ws else set()
    return sorted(declared | present)


def _check_iterations(rows: pd.DataFrame, lenient: bool, skipped: list[str]) -> set[tuple[int, int]]:
    """Every rank that ran GPU work in iterations must have the same (repetition, iteration) set.
    ``rows``: the distinct (rank, repetition, iteration) of GPU rows in iterations."""
    if rows.empty:
        return set()
    active = sorted(int(r) for r in rows["rank"].unique())
    size = rows.groupby(["repetition", "iteration"]).size()
    short_keys = size.index[size.to_numpy() < len(active)]
    # only the (few) short iterations get their rank sets listed
    sel = rows.set_index(["repetition", "iteration"]).loc[list(short_keys)] if len(short_keys) else rows.iloc[:0]
    short = sel.groupby(level=[0, 1])["rank"].agg(lambda s: frozenset(int(r) for r in s)) if len(sel) else pd.Series(dtype=object)
    skip = set()
    for (rep, it), have in short.items():
        missing = ",".join(str(r) for r in active if r not in have)
        msg = f"iteration {it} (repetition {rep}) has GPU activity on rank(s) {','.join(map(str, sorted(have)))} but not on rank(s) {missing}"
        if not lenient:
            raise AnalysisError(f"{msg}: the ranks' iterations do not match. Check every rank's iteration markers "
                                "(ProfilerStep# or --iteration-pattern), or pass --lenient to skip such iterations.")
        skipped.append(f"{msg}: iteration skipped")
        skip.add((int(rep), int(it)))
    return skip


def _check_clock(clock: ClockAlignment, wdf: pd.DataFrame, lenient: bool, caveats: list[str], skipped: list[str]) -> None:
    """Alignment is trusted only while its uncertainty stays below the median window."""
    median_window = float(wdf["window_ns"].median())
    if clock.uncertainty_ns > median_window:
        msg = (f"clock alignment across ranks is uncertain by {clock.uncertainty_ns / 1e3:.1f} us ({clock.method}), "
               f"more than the median iteration window ({median_window / 1e3:.1f} us)")
        if not lenient:
            raise AnalysisError(f"{msg}: skew between ranks cannot be measured. Capture with a clock barrier marker or "
                                "measured clock offsets, or pass --lenient to analyze anyway.")
        skipped.append(f"{msg}: analyzed anyway; skew_wait and barrier_idle are not reliable")


def _launch_ends(ev: pd.DataFrame, gpu: pd.DataFrame, offsets: dict[int, int]) -> np.ndarray:
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


def _idle_pieces(seg: dict, lab: np.ndarray, ev: pd.DataFrame, offsets: dict[int, int], ranks: list[int], nr: int,
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


def _floors(cost: dict | None, hw: HardwareSpec | None) -> tuple[float, float]:
    """(T_compute, T_link_excess) in ns per rank and iteration: the roofline floor of the local
    work, and how much the link floor exceeds it (the part of communication that no overlap can
    hide)."""
    if not cost or hw is None:
        return 0.0, 0.0
    t_compute = max(float(cost.get("flops", 0)) / hw.flops_per_s(cost.get("dtype", "bf16")),
                    float(cost.get("hbm_bytes", 0)) / hw.hbm_bytes_per_s) * 1e9
    t_link = float(cost.get("link_bytes", 0)) / hw.link_bytes_per_s * 1e9
    return t_compute, max(0.0, t_link - t_compute)


def _kernel_shares(gpu, g_start, g_end, ev, offsets, cost, t_compute, t_link_excess, link_float, win_of, rank_pos, nr,
                   skip, caveats, hbm_bytes_per_s, kc=None) -> dict[str, np.ndarray]:
    """Per GPU row, the ns of its duration that are flag_wait, exposed_comm, useful and locality_tax
    (0 for rows that are not local kernels), and whether in-kernel records cover it ("recorded").
    Order: measured flag_wait and communication-only phases first (fused kernels' records), then
    the compute floor in proportion to the remaining time, then the link floor left over from
    exposed transfers (fused kernels: first out of their communication-only phases, then out of
    their remaining time), then each declared intermediate on its producer and consumer kernels."""
    n = len(gpu)
    d = (g_end - g_start).astype(np.float64)
    role = gpu["role"].to_numpy(object)
    local = np.isin(role, LOCAL_ROLES)
    flag, comm, recorded = _record_shares(gpu, g_start, g_end, ev, offsets, role)
    flag = np.minimum(flag, d)
    comm = np.minimum(comm, d - flag)
    useful = np.zeros(n)
    loc = np.zeros(n)
    rep = gpu["repetition"].to_numpy(np.int64)
    it = gpu["iteration"].to_numpy(np.int64)
    rk = gpu["rank"].to_numpy(np.int64)
    costed = local & (it >= 0)
    if skip:
        costed &= ~pd.MultiIndex.from_arrays([rep, it]).isin(list(skip))
    if not cost and kc is not None and kc.use_floors and costed.any():
        # per-kernel floors (docs/ledger.md "Per-kernel floors"): each kernel's own, capped by its time
        room = np.maximum(d - flag - comm, 0.0)
        useful[costed] = np.minimum(np.nan_to_num(kc.floor_ns, nan=0.0)[costed], room[costed])
        loc = kc.measured_locality(useful, d - flag - comm - useful, costed)
        return {"flag_wait": flag, "exposed_comm": comm, "useful": useful, "locality_tax": loc, "recorded": recorded}
    if not cost or not hbm_bytes_per_s or not costed.any():
        return {"flag_wait": flag, "exposed_comm": comm, "useful": useful, "locality_tax": loc, "recorded": recorded}
    # group id per (rank, repetition, iteration) of the costed rows
    keys = pd.DataFrame({"rank": rk, "rep": rep, "it": it})
    gid = np.full(n, -1, np.int64)
    gid[costed] = keys[costed].groupby(["rank", "rep", "it"], sort=False).ngroup().to_numpy(np.int64)
    ng = int(gid.max()) + 1
    work = costed & np.isin(role, WORK_ROLES)
    avail = np.where(work, d - flag - comm, 0.0)
    total = np.bincount(gid[costed], weights=avail[costed], minlength=ng)
    with np.errstate(divide="ignore", invalid="ignore"):
        f = np.where(total > 0, np.minimum(1.0, t_compute / np.where(total > 0, total, 1.0)), 0.0)
    useful[costed] = f[gid[costed]] * avail[costed]
    # a declared floor above the kernels' measured time is capped there: count it for the caveat
    over = (total > 0) & (total < per_kernel.FASTER_THAN_FLOOR * t_compute)
    floor_capped = (int(over.sum()), float((t_compute / total[over]).max()) if over.any() else 0.0)
    # the link floor beyond the compute floor that exposed transfers did not take: fused kernels
    fused = costed & (role == "fused")
    if t_link_excess > 0 and fused.any():
        widx = win_of.reindex(pd.MultiIndex.from_arrays([rep[fused], it[fused]])).to_numpy()
        grp = widx.astype(np.int64) * nr + rank_pos.reindex(rk[fused]).to_numpy(np.int64)
        rest = np.maximum(t_link_excess - link_float[grp], 0.0)
        head = np.where(fused, d - flag - comm - useful, 0.0)
        hsum = np.bincount(gid[fused], weights=head[fused], minlength=ng)
        restg = np.zeros(ng)
        restg[gid[fused]] = rest
        # communication-only phases carry the link floor first: what no overlap can hide is useful there
        csum = np.bincount(gid[fused], weights=comm[fused], minlength=ng)
        take = np.minimum(restg, csum)
        with np.errstate(divide="ignore", invalid="ignore"):
            g1 = np.where(csum > 0, take / np.where(csum > 0, csum, 1.0), 0.0)
        from_comm = np.zeros(n)
        from_comm[fused] = g1[gid[fused]] * comm[fused]
        comm = comm - from_comm
        restg = restg - take
        with np.errstate(divide="ignore", invalid="ignore"):
            g = np.where(hsum > 0, np.minimum(1.0, restg / np.where(hsum > 0, hsum, 1.0)), 0.0)
        useful[fused] += g[gid[fused]] * head[fused] + from_comm[fused]
    names = gpu["name"].astype(str)
    if kc is not None and kc.locality == per_kernel.LOCALITY_MEASURED:  # DRAM counters replace the declared intermediates
        comp = np.where(np.isfinite(kc.compulsory), kc.compulsory, per_kernel.declared_compulsory(gpu, cost, work, gid, d))
        loc = kc.measured_locality(useful, d - flag - comm - useful, costed, comp)
        return {"flag_wait": flag, "exposed_comm": comm, "useful": useful, "locality_tax": loc, "recorded": recorded,
                "floor_capped": floor_capped}
    for inter in cost.get("intermediates") or []:
        sel = costed & (_matches(names, role, inter.get("producer", "")) | _matches(names, role, inter.get("consumer", "")))
        if not sel.any():
            caveats.append(f"declared intermediate '{inter.get('name')}' matches no kernel (producer "
                           f"{inter.get('producer')!r}, consumer {inter.get('consumer')!r}): no locality_tax for it")
            continue
        t_loc = 2.0 * float(inter.get("bytes", 0)) / hbm_bytes_per_s * 1e9
        head = np.where(sel, np.maximum(d - flag - comm - useful - loc, 0.0), 0.0)
        hsum = np.bincount(gid[sel], weights=head[sel], minlength=ng)
        with np.errstate(divide="ignore", invalid="ignore"):
            g = np.where(hsum > 0, np.minimum(1.0, t_loc / np.where(hsum > 0, hsum, 1.0)), 0.0)
        loc[sel] += g[gid[sel]] * head[sel]
    return {"flag_wait": flag, "exposed_comm": comm, "useful": useful, "locality_tax": loc, "recorded": recorded,
            "matched_intermediates": True, "floor_capped": floor_capped}


def _matches(names: pd.Series, role: np.ndarray, pattern: str) -> np.ndarray:
    """Rows whose kernel name matches the regex ``pattern``, or whose role is X for 'role:X'."""
    if not pattern:
        return np.zeros(len(names), bool)
    if pattern.startswith("role:"):
        return role == pattern[5:]
    uniq = pd.unique(names)
    rx = re.compile(pattern)
    hit = {u: bool(rx.search(u)) for u in uniq}  # a loop over distinct names, not events
    return names.map(hit).to_numpy(bool)


def _record_shares(gpu, g_start, g_end, ev, offsets, role) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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


def _add_caveats(caveats, hw, cost, parts, clock, ranks, unknown_gaps, kc=None, *, fused_without_records: bool,
                 active: set[int], outside: int, cpu_run: bool = False) -> None:
    if cpu_run:  # first, in place of the nominal hardware's: nothing here is a GPU's time
        caveats.insert(0, CPU_RUN_CAVEAT)
    elif hw is not None and hw.source == "datasheet":
        caveats.append(f"hardware: {hw.name} datasheet peaks; 'useful' is measured against numbers real kernels rarely "
                       "reach (run `taxmodel calibrate` and pass --hardware FILE for measured ones)")
        if hw.estimated:
            caveats.append(f"hardware: {hw.name}'s {', '.join(hw.estimated)} are estimates, not data-sheet numbers "
                           f"(their basis: `taxmodel hardware {hw.key or hw.name}`)")
    elif hw is not None and hw.source == "estimated":
        caveats.append(f"hardware: {hw.label}: {hw.notes}")
    elif hw is not None and hw.source != "calibrated":
        caveats.append(f"hardware: {hw.name} numbers are {hw.source}, not measured on this machine")
    if not cost and kc is not None and kc.use_floors:
        caveats.append(f"useful = each kernel's roofline floor from its op's shapes (docs/ledger.md, per-kernel floors); "
                       f"locality_tax is {kc.locality}" + (" (its time stays in compute_inefficiency)"
                                                           if kc.locality == per_kernel.LOCALITY_ABSENT else ""))
    elif not cost and hw is None:
        pass  # plan_ledger said why there is no spec and what to pass
    elif not cost:
        caveats.append("the bundle declares no cost (meta 'cost') and its kernels carry no per-kernel cost: useful is 0, "
                       "locality_tax is not measured, and all compute time counts as compute_inefficiency")
    elif hw is None:
        caveats.append("no hardware spec: useful and locality_tax are 0")
    if fused_without_records:
        caveats.append("fused kernels ran without in-kernel trace records: waits on flags inside them are not visible "
                       "(flag_wait is 0) and count as compute time")
    for r in ranks:
        if r not in active:
            caveats.append(f"rank {r} has no GPU activity: its whole window is barrier_idle")
    if unknown_gaps[0]:
        caveats.append(f"{unknown_gaps[0]} idle gap(s) ({unknown_gaps[1] / 1e3:.1f} us in all) end at kernels with no "
                       "recorded launch call; they are unattributed (trace host runtime calls to classify them)")
    if clock.uncertainty_ns > 0:
        skew = parts[parts["subcategory"] == "skew_wait"].groupby("rank")["ns"].mean()
        for r, v in skew.items():
            if 0 < v < clock.uncertainty_ns:
                caveats.append(f"skew_wait on rank {r} ({v / 1e3:.1f} us) is below the clock uncertainty "
                               f"({clock.uncertainty_ns / 1e3:.1f} us)")
    if outside:
        caveats.append(f"{outside} GPU activities lie outside any iteration; where they overlap a window they count "
                       "as busy time without declared cost")


def _launch_tax_before(pieces, gpu, g_start, ranks, nr) -> np.ndarray:
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
