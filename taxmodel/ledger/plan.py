"""Phase (b) of the ledger: the global decisions every rank's sweep needs, made once from the ranks'
summaries (``rank_summary.py``): the hardware spec, skipped iterations, the clock offsets, the
iteration windows and each collective's last arrival.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from taxmodel.errors import AnalysisError, InputError
from taxmodel.hardware.specs import HardwareSpec, resolve_hardware
from taxmodel.ledger.clock import ClockAlignment, estimate_clock
from taxmodel.ledger.collectives import last_arrivals, match_instances
from taxmodel.ledger.coverage import coverage_caveat
from taxmodel.ledger.rank_summary import RankSummary
from taxmodel.ledger.windows import GPU_SPAN_NOTE, partition_windows

SPAN_COLUMNS = ["repetition", "iteration", "start_ns", "end_ns", "rank"]
MARKER_COLUMNS = ["kind", "name", "rank", "start_ns", "end_ns"]


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
    hw = _hardware_spec(meta, hardware, cost, caveats)
    subset = coverage_caveat(meta, ranks)
    if subset:  # ledger/coverage.py
        caveats.append(subset)
    spans, inst, spanned = _spans_and_collectives(summaries, caveats)
    skip = _check_iterations(spans[["rank", "repetition", "iteration"]], lenient, skipped)
    if len(inst):
        inst = inst.sort_values(["repetition", "collective_id", "rank"], kind="stable").reset_index(drop=True)
    match = match_instances(inst)
    _skip_incomplete_collectives(match.incomplete, lenient, skip, skipped)
    markers = pd.concat([s.markers for s in summaries], ignore_index=True) if summaries else pd.DataFrame(
        columns=MARKER_COLUMNS)
    clock = estimate_clock(markers, meta, match.complete(), ranks)
    caveats.extend(clock.notes)
    wdf = _iteration_windows(spans, clock, skip, lenient, caveats, skipped)
    complete = match.complete()
    last = last_arrivals(complete, clock.offsets_ns) if len(complete) else None
    return LedgerPlan(meta=meta, ranks=ranks, hw=hw, cost=cost, lenient=lenient, spanned=spanned, skip=skip, clock=clock,
                      windows=wdf, last=last, measured_anywhere=any(s.measured_bytes for s in summaries),
                      caveats=caveats, skipped=skipped)


def _hardware_spec(meta: dict, hardware: HardwareSpec | None, cost: dict | None, caveats: list[str]) -> HardwareSpec | None:
    """The spec passed, else the one the bundle's device resolves to; none (with a caveat saying
    why) when there is none and the bundle declares no cost that would need it."""
    if hardware is not None:
        return hardware
    try:
        return resolve_hardware(meta)
    except InputError as exc:
        if cost:
            raise
        caveats.append(f"no hardware spec: {exc}. Without one no kernel gets a floor (useful is 0 and all kernel time "
                       "counts as compute_inefficiency)")
        return None


def _spans_and_collectives(summaries: list[RankSummary], caveats: list[str]) -> tuple[pd.DataFrame, pd.DataFrame, bool]:
    """All ranks' iteration spans and collective instances; without iteration markers one window
    per repetition over all GPU activity (``windows.py``), and whether that is so."""
    spans = pd.concat([s.spans for s in summaries], ignore_index=True) if summaries else pd.DataFrame(
        columns=SPAN_COLUMNS, dtype=np.int64)
    rep_spans = pd.concat([s.rep_spans for s in summaries], ignore_index=True) if summaries else spans
    spanned = spans.empty and not rep_spans.empty  # fallback_iterations over all ranks' GPU rows
    inst = pd.concat([s.instances for s in summaries], ignore_index=True) if summaries else pd.DataFrame()
    if spanned:
        spans = rep_spans
        inst = inst.assign(iteration=np.zeros(len(inst), np.int64))
        caveats.append(GPU_SPAN_NOTE)
    return spans, inst, spanned


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
        _raise_unless_lenient(msg, "the ranks' iterations do not match. Check every rank's iteration markers "
                              "(ProfilerStep# or --iteration-pattern), or pass --lenient to skip such iterations.", lenient,
                              skipped, "iteration skipped")
        skip.add((int(rep), int(it)))
    return skip


def _skip_incomplete_collectives(incomplete: pd.DataFrame, lenient: bool, skip: set, skipped: list[str]) -> None:
    """A collective that never ran on some member: an error, or with ``lenient`` its iteration skipped."""
    for row in incomplete.itertuples(index=False):
        msg = (f"collective {row.collective_id} (repetition {row.repetition}, iteration {row.iteration}) never ran "
               f"on rank(s) {row.missing}")
        _raise_unless_lenient(msg, "every member of a process group must run each of its collectives. The trace may be "
                              "cut short on that rank; re-capture, or pass --lenient to skip that iteration.", lenient,
                              skipped, "iteration skipped")
        skip.add((int(row.repetition), int(row.iteration)))


def _iteration_windows(spans: pd.DataFrame, clock: ClockAlignment, skip: set, lenient: bool, caveats: list[str],
                       skipped: list[str]) -> pd.DataFrame:
    """Each (repetition, iteration) not skipped, from the earliest aligned start on any rank to
    the latest end, sorted by start and cut where it reaches into the next (``windows.py``)."""
    off = spans["rank"].map(clock.offsets_ns).fillna(0).to_numpy(np.int64)
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
    _check_clock(clock, wdf, lenient, caveats, skipped)
    if len(wdf) > 1 and (ws[1:] < np.maximum.accumulate(we)[:-1]).any():
        n_over = int((ws[1:] < np.maximum.accumulate(we)[:-1]).sum())
        caveats.append(f"{n_over} iteration window(s) overlap the previous one (a rank started the next iteration "
                       "before another finished); the overlapping time is counted in both windows")
    return wdf


def _check_clock(clock: ClockAlignment, wdf: pd.DataFrame, lenient: bool, caveats: list[str], skipped: list[str]) -> None:
    """Alignment is trusted only while its uncertainty stays below the median window."""
    median_window = float(wdf["window_ns"].median())
    if clock.uncertainty_ns > median_window:
        msg = (f"clock alignment across ranks is uncertain by {clock.uncertainty_ns / 1e3:.1f} us ({clock.method}), "
               f"more than the median iteration window ({median_window / 1e3:.1f} us)")
        _raise_unless_lenient(msg, "skew between ranks cannot be measured. Capture with a clock barrier marker or "
                              "measured clock offsets, or pass --lenient to analyze anyway.", lenient, skipped,
                              "analyzed anyway; skew_wait and barrier_idle are not reliable")


def _raise_unless_lenient(msg: str, remedy: str, lenient: bool, skipped: list[str], outcome: str) -> None:
    """Data that cannot be analyzed as is: an AnalysisError saying what to do, or with ``lenient``
    a line in ``Ledger.skipped`` saying what was done instead."""
    if not lenient:
        raise AnalysisError(f"{msg}: {remedy}")
    skipped.append(f"{msg}: {outcome}")
