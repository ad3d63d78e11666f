"""Clock alignment across ranks: per-rank offsets (ns added to a rank's local times).

Each rank's tracer timestamps with its own clock. Skew between ranks is exactly what the ledger
measures, so the clocks must be put on one time base first. Sources, best first:

1. ``measured``: the capture measured offsets (``meta["clock_offsets_ns"]`` with
   ``meta["capture"]["clock_offsets_source"] == "measured"``); taken as given, uncertainty
   from ``meta["capture"]["clock_uncertainty_ns"]`` (0 when absent).
2. ``barrier``: markers named ``*clock_barrier*`` recorded right after a barrier on every rank;
   the k-th such marker ends at (nearly) the same true time on every rank.
3. ``collectives``: a ring/tree collective (NCCL, RCCL) finishes on all members at nearly the
   same true time, since nobody can finish before the last byte arrived. The offset of rank r
   is minus the median over shared collectives of (end on r - end on the reference rank).
4. ``meta``: offsets in meta not marked measured; 5. ``none``: all zero (one clock assumed).

Between 1 and 2: ranks whose traces share one clock (``meta["clock_domain"]["shared"]``, set by
the importer from the traces' host names or, failing those, Kineto's shared base time and
distinct GPUs of one machine) get no offsets at all: estimating offsets from collective end
times would only invent a few microseconds of noise where the clock is one. On several hosts
whose ranks are known (``clock_domain["host_of_rank"]``), sources 2 and 3 estimate one offset
per host, from every sample of its ranks, and the ranks of a host share it.

The uncertainty is the largest, over ranks, median absolute deviation of the per-sample
estimates around their median: how far one sample typically strays from the chosen offset.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
import pandas as pd

BARRIER_MARKER = "clock_barrier"


@dataclass
class ClockAlignment:
    offsets_ns: dict[int, int]
    uncertainty_ns: int
    method: str
    samples: int = 0
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"offsets_ns": {str(k): int(v) for k, v in self.offsets_ns.items()},
                "uncertainty_ns": int(self.uncertainty_ns), "method": self.method, "samples": int(self.samples),
                "notes": list(self.notes)}


def offsets_from_simultaneous_ends(ends: pd.DataFrame, ranks: list, noun: str = "rank") -> ClockAlignment | None:
    """Offsets from events that end at the same true time on every rank (or every host).

    ``ends``: columns instance, rank, end_ns (local clock); ``ranks`` the clocks to place, as the
    ``rank`` column names them (ranks, or host names with ``noun`` "host"). The reference (offset
    0) is the one present in most instances. None when no instance is shared by two of them.
    """
    if ends.empty:
        return None
    wide = ends.pivot_table(index="instance", columns="rank", values="end_ns", aggfunc="max")
    if wide.shape[1] < 2 or len(wide) == 0:
        return None
    counts = wide.notna().sum()
    ref = sorted(counts.index, key=lambda r: (-counts[r], r))[0]
    offsets, spreads, notes, samples = {}, [], [], 0
    for r in ranks:
        if r == ref:
            offsets[r] = 0
            continue
        if r not in wide.columns:
            offsets[r] = 0
            continue
        d = (wide[r] - wide[ref]).dropna().to_numpy(dtype=np.float64)
        if len(d) == 0:
            offsets[r] = 0
            notes.append(f"{noun} {r} shares no synchronizing event with {noun} {ref}: its clock is assumed aligned")
            continue
        med = float(np.median(d))
        offsets[r] = -int(round(med))
        spreads.append(float(np.median(np.abs(d - med))))
        samples = max(samples, len(d))
    return ClockAlignment(offsets, int(round(max(spreads, default=0.0))), "", samples, notes)


def _per_host(ends: pd.DataFrame, ranks: list[int], host_of_rank: Mapping[str, str]) -> ClockAlignment | None:
    """Offsets from simultaneous ends with one clock per host: each host's samples are its
    ranks' ends, and its ranks take its offset."""
    host = {r: host_of_rank.get(str(r)) for r in ranks}
    if any(h is None for h in host.values()):
        return None
    pooled = ends.assign(rank=ends["rank"].map(lambda r: host[int(r)]))
    est = offsets_from_simultaneous_ends(pooled, sorted(set(host.values())), noun="host")
    if est is None:
        return None
    est.offsets_ns = {r: est.offsets_ns[host[r]] for r in ranks}
    return est


def _simultaneous(ends: pd.DataFrame, ranks: list[int], meta: Mapping[str, Any]) -> ClockAlignment | None:
    by_host = (meta.get("clock_domain") or {}).get("host_of_rank")
    if by_host and len(set(by_host.values())) > 1:
        est = _per_host(ends, ranks, by_host)
        if est is not None:
            est.notes.insert(0, f"one clock per host ({len(set(by_host.values()))} hosts): each host's ranks share its offset")
            return est
    return offsets_from_simultaneous_ends(ends, ranks)


def estimate_clock(events: pd.DataFrame, meta: Mapping[str, Any], collective_instances: pd.DataFrame,
                   ranks: list[int]) -> ClockAlignment:
    """Pick the best available source (see the module docstring)."""
    given = {int(k): int(v) for k, v in (meta.get("clock_offsets_ns") or {}).items()}
    capture = meta.get("capture") or {}
    source = capture.get("clock_offsets_source") or meta.get("clock_offsets_source")
    if given and source == "measured":
        how = (meta.get("clock") or {}).get("method")
        return ClockAlignment({r: given.get(r, 0) for r in ranks}, int(capture.get("clock_uncertainty_ns", 0) or 0),
                              f"measured by the capture ({how})" if how else "measured by the capture")
    domain = meta.get("clock_domain") or {}
    if domain.get("shared") is True and len(ranks) > 1:
        return ClockAlignment({r: 0 for r in ranks}, 0, f"one host, one clock ({domain.get('evidence', 'shared')}): no offsets")
    markers = events[(events["kind"] == "marker") & events["name"].astype(str).str.contains(BARRIER_MARKER, regex=False)]
    if markers["rank"].nunique() >= 2:
        m = markers.sort_values(["rank", "start_ns"]).copy()
        m["instance"] = m.groupby("rank").cumcount()
        est = _simultaneous(m[["instance", "rank", "end_ns"]], ranks, meta)
        if est is not None:
            est.method = f"barrier markers ({est.samples})"
            return est
    if len(collective_instances) and collective_instances["rank"].nunique() >= 2:
        inst = collective_instances.assign(
            instance=collective_instances["repetition"].astype(str) + "/" + collective_instances["collective_id"].astype(str))
        est = _simultaneous(inst.rename(columns={"done_ns": "end_ns"})[["instance", "rank", "end_ns"]], ranks, meta)
        if est is not None:
            est.method = f"collective end times ({est.samples} collectives)"
            return est
    if given:
        return ClockAlignment({r: given.get(r, 0) for r in ranks}, 0, "meta (not marked measured)",
                              notes=["clock offsets come from the bundle's meta without a measurement mark; skew_wait is only as good as they are"])
    notes = [] if len(ranks) < 2 else ["no clock offsets and no collectives or barrier markers to estimate them: the ranks' clocks are assumed equal"]
    return ClockAlignment({r: 0 for r in ranks}, 0, "none", notes=notes)
