"""A small stand-in for ``taxmodel.ledger.Ledger`` (its ``parts`` and ``windows`` frames), for report tests.

Why it exists: the report must be testable on its own, with known numbers, and on in-kernel
records the synthetic generator may not produce. Events are laid out per rank and iteration;
the "ledger" partitions every rank's window into intervals by a fixed rule (compute kernels:
80% useful, 20% compute inefficiency; comm kernels: skew wait until the last rank arrives,
then exposed communication; fused kernels: flag_wait records become flag_wait, the rest
useful; gaps between kernels: kernel gap; before the first kernel: launch latency; after the
last: barrier idle), so parts, windows and intervals satisfy the contract's invariants exactly.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from taxmodel.ledger.categories import CATEGORY_ORDER, LEDGER_COLUMNS, PARENT, SUBCATEGORY_ORDER
from taxmodel.trace import schema
from taxmodel.trace.bundle import Bundle, make_meta


@dataclass
class FakeClock:
    offsets_ns: dict[int, int]
    uncertainty_ns: int = 0
    method: str = "fake"


@dataclass
class FakeLedger:
    parts: pd.DataFrame
    windows: pd.DataFrame
    intervals: pd.DataFrame
    clock: FakeClock
    caveats: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    meta: dict = field(default_factory=dict)
    label: str = ""

    def summary(self) -> pd.DataFrame:
        keys = ["repetition", "iteration", "rank"]
        n = len(self.parts[keys].drop_duplicates())
        s = self.parts.groupby("subcategory")["ns"].sum() / n
        s = s.reindex(list(SUBCATEGORY_ORDER), fill_value=0.0)
        mean_window = float(self.windows["window_ns"].mean())
        return pd.DataFrame({
            "category": [PARENT[x] for x in s.index],
            "subcategory": s.index,
            "mean_ns": s.to_numpy(),
            "pct": 100.0 * s.to_numpy() / mean_window,
        })

    def per_iteration(self) -> pd.DataFrame:
        by = self.parts.groupby(["repetition", "iteration", "rank", "category"])["ns"].sum().unstack("category", fill_value=0)
        by = by.groupby(level=["repetition", "iteration"]).mean().reindex(columns=list(CATEGORY_ORDER), fill_value=0)
        return self.windows.set_index(["repetition", "iteration"])[["window_ns"]].join(by).reset_index()


def _kernel(rank, stream, role, name, start, end, it, **kw):
    row = dict(rank=rank, device=rank, stream=stream, kind="kernel", role=role, name=name,
               start_ns=int(start), end_ns=int(end), iteration=it, repetition=0)
    row.update(kw)
    return row


def fake_case(variant: str = "bsp", *, world_size: int = 2, iterations: int = 3, m: int = 1024,
              skew_ns: int = 3000, offsets: dict[int, int] | None = None, ctas: int = 8,
              seed: int = 0) -> tuple[Bundle, FakeLedger]:
    """A (bundle, ledger) pair. ``variant`` "bsp" = allgather then GEMM on two streams;
    anything else = one fused kernel per iteration with per-CTA flag_wait/compute records."""
    rng = np.random.default_rng(seed)
    offsets = offsets if offsets is not None else {r: (0 if r == 0 else -1_000_000 - 7 * r) for r in range(world_size)}
    scale = m / 1024
    rows, ivs, wins = [], [], []
    t = 10_000_000
    for it in range(iterations):
        start = {r: t + (skew_ns if r == world_size - 1 else 0) + int(rng.integers(0, 200)) for r in range(world_size)}
        ends = {}
        kern = {r: [] for r in range(world_size)}
        if variant == "bsp":
            arrive = max(start.values())
            comm_end = arrive + int(20_000 * scale)
            for r in range(world_size):
                kern[r].append(_kernel(r, 20, "comm", "ncclKernel_AllGather", start[r], comm_end, it,
                                       collective_id=f"0:{it}", collective_op="allgather"))
                g0 = comm_end + 1500
                g1 = g0 + int(50_000 * scale) + int(rng.integers(0, 500))
                kern[r].append(_kernel(r, 7, "compute", "sm90_gemm_bf16", g0, g1, it))
        else:
            for r in range(world_size):
                k0 = start[r]
                k1 = k0 + int(60_000 * scale) + int(rng.integers(0, 500))
                kern[r].append(_kernel(r, 7, "fused", "ag_gemm_fused", k0, k1, it))
                for c in range(ctas):
                    w = int((k1 - k0) * (0.05 + 0.3 * c / ctas))
                    rows.append(dict(rank=r, device=r, stream=7, kind="record", role="fused", name="ag_gemm_fused",
                                     start_ns=k0, end_ns=k0 + w, iteration=it, repetition=0, cta=c, phase="flag_wait"))
                    rows.append(dict(rank=r, device=r, stream=7, kind="record", role="fused", name="ag_gemm_fused",
                                     start_ns=k0 + w, end_ns=k1, iteration=it, repetition=0, cta=c, phase="compute"))
        for r in range(world_size):
            ends[r] = max(k["end_ns"] for k in kern[r])
        w0 = min(start.values()) - 800
        w1 = max(ends.values()) + 200
        wins.append(dict(repetition=0, iteration=it, start_ns=w0, end_ns=w1, window_ns=w1 - w0))
        arrive = max(start.values())
        for r in range(world_size):
            cur = w0
            for k in kern[r]:
                # launch row (host), before each kernel
                rows.append(dict(rank=r, device=-1, stream=1000 + r, kind="launch", role="other",
                                 name="cudaLaunchKernel", start_ns=k["start_ns"] - 900, end_ns=k["start_ns"] - 700,
                                 iteration=it, repetition=0))
                if k["start_ns"] > cur:
                    ivs.append((r, it, "launch_latency" if cur == w0 else "kernel_gap", cur, k["start_ns"]))
                s, e = k["start_ns"], k["end_ns"]
                if k["role"] == "comm":
                    if arrive > s:
                        ivs.append((r, it, "skew_wait", s, arrive))
                    ivs.append((r, it, "exposed_comm", max(s, arrive), e))
                elif k["role"] == "compute":
                    u = s + (e - s) * 8 // 10
                    ivs.append((r, it, "useful", s, u))
                    ivs.append((r, it, "compute_inefficiency", u, e))
                else:
                    wait_end = s + (e - s) // 10
                    ivs.append((r, it, "flag_wait", s, wait_end))
                    ivs.append((r, it, "useful", wait_end, e))
                cur = e
            if w1 > cur:
                ivs.append((r, it, "barrier_idle", cur, w1))
            rows.extend(kern[r])
        t = w1 + 30_000
    events = pd.DataFrame(rows)
    # Rank-local clocks: the ledger's aligned time minus the rank's offset.
    shift = events["rank"].map(offsets).to_numpy()
    events["start_ns"] = events["start_ns"] - shift
    events["end_ns"] = events["end_ns"] - shift
    events = schema.normalize_events(events)
    intervals = pd.DataFrame(ivs, columns=["rank", "iteration", "subcategory", "start_ns", "end_ns"])
    intervals.insert(0, "repetition", 0)
    intervals = intervals.astype({"repetition": "int32", "iteration": "int32", "rank": "int32", "start_ns": "int64", "end_ns": "int64"})
    parts = (intervals.assign(ns=intervals["end_ns"] - intervals["start_ns"])
             .groupby(["repetition", "iteration", "rank", "subcategory"], as_index=False)["ns"].sum())
    parts["category"] = parts["subcategory"].map(PARENT)
    parts = parts[list(LEDGER_COLUMNS)]
    windows = pd.DataFrame(wins)
    shape = {"M": m, "N": 8192, "K": 8192}
    meta = make_meta(source="synthetic", workload="ag_gemm", variant=variant, shape=shape, world_size=world_size,
                     ranks=list(range(world_size)), hardware={"name": "NVIDIA H200", "source": "datasheet"},
                     software={"torch": "2.11.0", "triton": "3.6.0"}, clock_offsets_ns={str(k): v for k, v in offsets.items()},
                     repetitions=1, created="2026-11-22T10:00:00Z")
    bundle = Bundle(events=events, meta=meta)
    ledger = FakeLedger(parts=parts, windows=windows, intervals=intervals, clock=FakeClock(offsets, 2000),
                        caveats=["skew_wait on rank 0 (fake) is below the clock uncertainty (2 us)"],
                        meta=meta, label=bundle.label)
    return bundle, ledger


def ledger_from_parts(variant: str, ns: dict[str, int], *, workload: str = "ag_gemm",
                      shape: dict | None = None, ranks: int = 2, iterations: int = 2) -> FakeLedger:
    """A ledger whose every (iteration, rank) has exactly ``ns`` (sub-category -> ns), intervals laid
    end to end in ledger order: numbers chosen by hand for exact assertions."""
    window = sum(ns.values())
    parts, ivs, wins = [], [], []
    for it in range(iterations):
        w0 = 1_000_000 + it * (window + 10_000)
        wins.append(dict(repetition=0, iteration=it, start_ns=w0, end_ns=w0 + window, window_ns=window))
        for r in range(ranks):
            t = w0
            for sub in SUBCATEGORY_ORDER:
                v = int(ns.get(sub, 0))
                parts.append(dict(repetition=0, iteration=it, rank=r, category=PARENT[sub], subcategory=sub, ns=v))
                if v:
                    ivs.append(dict(repetition=0, iteration=it, rank=r, subcategory=sub, start_ns=t, end_ns=t + v))
                t += v
    meta = make_meta(workload=workload, variant=variant, shape=shape or {"M": 1024}, world_size=ranks)
    label = f"{workload}/{variant}"
    return FakeLedger(parts=pd.DataFrame(parts, columns=list(LEDGER_COLUMNS)), windows=pd.DataFrame(wins),
                      intervals=pd.DataFrame(ivs), clock=FakeClock({r: 0 for r in range(ranks)}), meta=meta, label=label)
