"""Phase (a) of the ledger: each rank's events, and the small summary of them that the global plan
needs (``plan.py``): a few rows per iteration and collective, not per event.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd

from taxmodel.ledger import per_kernel
from taxmodel.ledger.clock import BARRIER_MARKER
from taxmodel.ledger.collectives import collective_instances
from taxmodel.trace import schema
from taxmodel.trace.bundle import Bundle


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


def bundle_ranks(bundle: Bundle) -> list[int]:
    """Ranks to account for: those in meta (a rank may have recorded no GPU activity) and in events."""
    return ledger_ranks(bundle.meta, bundle.events["rank"].unique())


def ledger_ranks(meta: dict, present_ranks) -> list[int]:
    """``bundle_ranks`` from meta and the ranks that have events."""
    declared = {int(r) for r in (meta.get("ranks") or [])}
    present = {int(r) for r in present_ranks}
    if not declared:
        ws = meta.get("world_size")
        declared = set(range(int(ws))) if ws else set()
    return sorted(declared | present)


def rank_rows(events: pd.DataFrame) -> dict[int, np.ndarray]:
    """Positions (ascending) of each rank's rows in ``events``."""
    if events.empty:
        return {}
    return {int(r): np.asarray(p, np.int64) for r, p in events.groupby("rank", sort=True).indices.items()}


def events_by_rank(events: pd.DataFrame) -> Callable[[int], RankEvents]:
    """A function giving each rank's ``RankEvents`` out of the bundle's events."""
    rows = rank_rows(events)

    def events_of(r: int) -> RankEvents:
        pos = rows.get(r, np.zeros(0, np.int64))
        if len(pos) and pos[-1] - pos[0] + 1 == len(pos):  # a rank's rows are contiguous in written bundles: a slice
            return RankEvents(r, events.iloc[int(pos[0]):int(pos[-1]) + 1], pos)
        return RankEvents(r, events.take(pos), pos)

    return events_of


class KindFrames:
    """Host-side rows split by kind once (comparing a 'kind' string per row is the slow part of
    selecting them); ``frames["sync"]`` is an empty frame when there are none."""

    def __init__(self, empty: pd.DataFrame, frames: dict[str, pd.DataFrame]):
        self.empty, self.frames = empty, frames

    def __getitem__(self, kind: str) -> pd.DataFrame:
        return self.frames.get(kind, self.empty)


def split_kinds(events: pd.DataFrame) -> tuple[pd.DataFrame, KindFrames]:
    """GPU rows, and the host-side rows split by kind (small frames)."""
    codes, kind_names = pd.factorize(events["kind"])
    kinds = {k: events[codes == i] for i, k in enumerate(kind_names) if k not in schema.GPU_KINDS}
    gpu = events[np.isin(codes, [i for i, k in enumerate(kind_names) if k in schema.GPU_KINDS])]
    return gpu, KindFrames(events.iloc[:0], kinds)


def summarize_rank(rank_events: RankEvents) -> RankSummary:
    """Phase (a) of the ledger for one rank."""
    r = rank_events.rank
    gpu, ev = split_kinds(rank_events.events)
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
