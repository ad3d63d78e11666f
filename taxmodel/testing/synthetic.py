"""Synthetic profile bundles with known taxes, for testing everything downstream of the trace.

``synthetic_bundle`` lays out, per rank and iteration, a small bulk-synchronous step on one
stream (or its fine-grained counterpart), injecting exactly the taxes asked for:

    bsp:    prologue -> [gap | skew] all-gather (collective) -> gemm -> [sync] -> [extra launches] -> [host gap] epilogue
    fused:  prologue -> [gap | skew] fused_ag_gemm (flag_wait records)  -> [sync] -> [extra launches] -> [host gap] epilogue

It writes the events a tracer would (kernels, their launch calls linked by correlation, host
syncs, iteration markers, in-kernel records), and computes the expected ledger with a plain,
loop-based reference (``_reference_ledger``) that applies the definitions of docs/ledger.md
to the timeline it built. The reference is deliberately simple scalar code, independent of the
vectorized ledger, so that a test comparing the two checks the ledger to the nanosecond.

The construction supports one overlapping stream (``overlap_ns``: a side compute kernel on a
second stream running at the start of each collective) but never two local kernels at once, so
the reference can treat a rank's timeline as a sequence of disjoint pieces.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from taxmodel.ledger.categories import LEDGER_COLUMNS, PARENT, SUBCATEGORY_ORDER
from taxmodel.trace.bundle import Bundle, make_meta
from taxmodel.trace import schema

PROLOGUE, GEMM, EPILOGUE, FUSED = "prologue_kernel", "gemm_kernel", "epilogue_kernel", "fused_ag_gemm"
COLLECTIVE, EMPTY, SIDE = "ncclDevKernel_AllGather_RING_LL", "empty_kernel", "side_kernel"
MAIN_STREAM, SIDE_STREAM = 7, 8
CTAS_PER_FUSED_KERNEL = 4
T_BASE_NS = 1_000_000_000


@dataclass
class SyntheticCase:
    """A synthetic bundle and the ledger parts it must produce.

    ``expected``: columns ``LEDGER_COLUMNS`` (every sub-category of every rank and iteration,
    zeros included); ``expected_windows``: repetition, iteration, start_ns, end_ns, window_ns on
    the aligned clock; ``hardware``: the spec the expectation was computed with.
    """

    bundle: Bundle
    expected: pd.DataFrame
    expected_windows: pd.DataFrame
    hardware: Any
    params: dict[str, Any] = field(default_factory=dict)

    def expected_ns(self, subcategory: str, rank: int | None = None, iteration: int | None = None,
                    repetition: int | None = None) -> int:
        """Sum of the expected ns of ``subcategory`` over the selected ranks/iterations."""
        e = self.expected[self.expected["subcategory"] == subcategory]
        for col, val in (("rank", rank), ("iteration", iteration), ("repetition", repetition)):
            if val is not None:
                e = e[e[col] == val]
        return int(e["ns"].sum())


@dataclass
class _Kernel:
    rank: int
    name: str
    role: str
    start: int
    end: int
    repetition: int
    iteration: int
    launch_end: int | None
    correlation: int
    stream: int = MAIN_STREAM
    collective_id: str = ""
    graph_id: int = -1
    flag_ns: int = 0
    skew_end: int | None = None  # for collectives: the last rank's arrival


def synthetic_bundle(*, world_size: int = 2, iterations: int = 3, repetitions: int = 1, variant: str = "bsp",
                     workload: str = "synthetic", skew_ns: int | Sequence[int] | Mapping[int, int] | None = None,
                     kernel_gap_ns: int = 0, extra_launches: int = 0, host_starved_ns: int = 0,
                     intermediate_bytes: int = 0, flag_wait_ns: int = 0, scale: float = 1.0, seed: int = 0,
                     launch_latency_ns: int = 2000, iteration_gap_ns: int = 5000, jitter_ns: int = 0,
                     tail_ns: int = 0, overlap_ns: int = 0, idle_ranks: Sequence[int] = (), graph: bool = False,
                     sync_ns: int = 0, link_bytes: int = 0, useful_fraction: float = 0.5,
                     clock_offsets_ns: Mapping[int, int] | None = None, clock_measured: bool = True,
                     hardware: str = "H200 SXM", shape: Mapping[str, int] | None = None) -> SyntheticCase:
    """Build a bundle whose ledger is known exactly (see the module docstring for the layout).

    Parameters in ns unless said otherwise:
      skew_ns: host delay before the collective (fused kernel) per rank: an int applies to the
        last rank, a sequence/mapping gives each rank's delay. The delayed rank shows
        host_starved + launch_latency; the others show skew_wait inside the collective.
      kernel_gap_ns: GPU-side gap before every queued kernel. extra_launches: empty kernels
        launched one by one (host-starved, 4 us host time each) or as one CUDA graph (``graph``).
      host_starved_ns: the host is this late launching the epilogue.
      intermediate_bytes: a declared intermediate written by the gemm and read by the epilogue.
      flag_wait_ns: per fused kernel (variant != "bsp"): mean per-CTA flag_wait record time.
      jitter_ns: random extra gemm time per (rank, iteration), uniform in [0, jitter_ns].
      tail_ns: the last rank's epilogue runs this much longer; with tail_ns > iteration_gap_ns
        the next iteration starts on the other ranks before it ends (windows overlap).
      overlap_ns: a side compute kernel on a second stream runs this long from each
        collective's start (comm overlapped by compute).
      idle_ranks: ranks with no GPU activity at all. sync_ns: a host sync after the gemm that
        returns this long after the gemm ends. link_bytes: declared link bytes per iteration.
      useful_fraction: the declared compute floor as a fraction of the nominal compute time.
      clock_offsets_ns: rank -> ns added to that rank's local clock to align it; written to
        meta as measured when ``clock_measured``, else left for the ledger to estimate.
    """
    from taxmodel.hardware.specs import resolve_hardware

    if variant == "bsp" and flag_wait_ns:
        raise ValueError("flag_wait_ns needs a fused variant (variant != 'bsp'): BSP kernels have no in-kernel waits")
    rng = np.random.default_rng(seed)
    hw = resolve_hardware({}, hardware)
    s = lambda ns: int(round(ns * scale))  # noqa: E731
    dur = {"prologue": s(30_000), "comm": s(20_000), "gemm": s(60_000), "epilogue": s(10_000),
           "empty": s(1_500), "extra_host": s(4_000), "graph_gap": s(1_000)}
    if flag_wait_ns and flag_wait_ns * 2 > dur["gemm"]:
        raise ValueError(f"flag_wait_ns={flag_wait_ns} must be below half the fused kernel ({dur['gemm']} ns)")
    if overlap_ns > dur["comm"]:
        raise ValueError(f"overlap_ns={overlap_ns} must not exceed the collective's transfer ({dur['comm']} ns): the reference "
                         "ledger supports comm under compute, not two compute kernels at once")
    skews = _per_rank(skew_ns, world_size)
    offsets = {r: int((clock_offsets_ns or {}).get(r, 0)) for r in range(world_size)}
    active = [r for r in range(world_size) if r not in set(idle_ranks)]

    # the same declared cost for every variant, as a real workload declares it
    nominal_compute = dur["prologue"] + dur["gemm"] + dur["epilogue"]
    floor_ns = useful_fraction * nominal_compute
    cost = {"flops": int(round(floor_ns * 1e-9 * hw.flops_per_s("bf16"))), "hbm_bytes": 0,
            "link_bytes": int(link_bytes), "dtype": "bf16",
            "intermediates": ([{"name": "partial", "bytes": int(intermediate_bytes), "producer": "gemm|fused",
                                "consumer": "epilogue"}] if intermediate_bytes else [])}

    kernels: list[_Kernel] = []
    launches: list[dict] = []  # rank, name, start, end, correlation, graph_id
    syncs: list[dict] = []
    markers: list[dict] = []
    records: list[dict] = []
    corr = iter(range(1, 10**9))
    seq = iter(range(10**9))
    cursor = {r: T_BASE_NS for r in active}  # GPU time at which each rank's stream is free

    def launch(rank, name, start, launch_end, role="compute", it=0, rep=0, stream=MAIN_STREAM, d=0, **kw):
        c = next(corr)
        k = _Kernel(rank, name, role, start, start + d, rep, it, launch_end, c, stream, **kw)
        kernels.append(k)
        launches.append({"rank": rank, "name": "cudaLaunchKernel", "start": launch_end - 3000, "end": launch_end, "correlation": c})
        return k

    def queued(rank, name, d, it, rep, role="compute"):
        start = cursor[rank] + kernel_gap_ns
        k = launch(rank, name, start, cursor[rank] - 1000, role, it, rep, d=d)
        cursor[rank] = k.end
        return k

    def starved(rank, name, d, it, rep, host_ns, role="compute", after=None):
        """Host launch ends ``host_ns`` after ``after`` (default: when the stream went idle)."""
        base = cursor[rank] if after is None else after
        lat = min(launch_latency_ns, max(host_ns, 0))
        start = base + host_ns
        k = launch(rank, name, start, start - lat, role, it, rep, d=d)
        cursor[rank] = k.end
        return k

    for rep in range(repetitions):
        if rep:
            t = max(cursor.values()) + 1_000_000 if cursor else T_BASE_NS
            for r in active:
                cursor[r] = t
        for it in range(iterations):
            first_launch = {}
            for r in active:
                first_launch[r] = cursor[r] - 4000
                queued(r, PROLOGUE, dur["prologue"], it, rep)
            # the collective (or fused kernel): every rank arrives after its own host delay
            arrivals = {}
            for r in active:
                if skews[r] > 0:
                    arrivals[r] = starved(r, "__pending__", 0, it, rep, skews[r] + kernel_gap_ns)
                else:
                    arrivals[r] = queued(r, "__pending__", 0, it, rep)
            if variant == "bsp":
                cid = f"0:{next(seq)}"
                last = max(k.start for k in arrivals.values()) if arrivals else 0
                for r, k in arrivals.items():
                    k.name, k.role, k.collective_id, k.skew_end = COLLECTIVE, "comm", cid, last
                    k.end = last + dur["comm"]
                    cursor[r] = k.end
                    if overlap_ns:
                        launch(r, SIDE, k.start, k.launch_end, "compute", it, rep, SIDE_STREAM, d=overlap_ns)
                for r in active:
                    queued(r, GEMM, dur["gemm"] + int(rng.integers(0, jitter_ns + 1)), it, rep)
            else:
                for r, k in arrivals.items():
                    k.name, k.role, k.flag_ns = FUSED, "fused", int(flag_wait_ns)
                    k.end = k.start + dur["gemm"] + dur["comm"] // 2 + int(rng.integers(0, jitter_ns + 1))
                    cursor[r] = k.end
                    for cta in range(CTAS_PER_FUSED_KERNEL):
                        # one flag_wait record per CTA at a different offset, and a compute record
                        # chained to it (as real kernels record phases) that the ledger must ignore
                        off = k.start + 100 + cta * 50
                        if flag_wait_ns:
                            records.append({"rank": r, "name": FUSED, "start": off, "end": off + flag_wait_ns, "cta": cta, "phase": "flag_wait"})
                        records.append({"rank": r, "name": FUSED, "start": off + flag_wait_ns, "end": k.end - 10, "cta": cta, "phase": "compute"})
            after_sync = {}
            if sync_ns:
                for r in active:
                    sync_end = cursor[r] + sync_ns
                    syncs.append({"rank": r, "name": "cudaDeviceSynchronize", "start": cursor[r] - 20_000, "end": sync_end})
                    after_sync[r] = sync_end
            for r in active:
                gid = 0
                for j in range(extra_launches):
                    if graph and j > 0:
                        c = kernels[-1].correlation
                        start = cursor[r] + dur["graph_gap"]
                        kernels.append(_Kernel(r, EMPTY, "compute", start, start + dur["empty"], rep, it, kernels[-1].launch_end, c, graph_id=gid))
                        cursor[r] = start + dur["empty"]
                        continue
                    base = after_sync.pop(r, None)
                    k = starved(r, EMPTY, dur["empty"], it, rep, dur["extra_host"] + (3000 if base else 0), after=base)
                    if graph:
                        gid = 1000 * rep + it + 1
                        k.graph_id = gid
                        launches[-1]["name"], launches[-1]["graph_id"] = "cudaGraphLaunch", gid
                epi = dur["epilogue"] + (tail_ns if r == active[-1] else 0)
                base = after_sync.pop(r, None)
                if base is not None:
                    starved(r, EPILOGUE, epi, it, rep, host_starved_ns + 3000, after=base)
                elif host_starved_ns:
                    starved(r, EPILOGUE, epi, it, rep, host_starved_ns)
                else:
                    queued(r, EPILOGUE, epi, it, rep)
                markers.append({"rank": r, "name": f"ProfilerStep#{it}", "start": first_launch[r], "end": cursor[r] - 1500, "it": it, "rep": rep})
                cursor[r] += iteration_gap_ns

    events = _events_frame(kernels, launches, syncs, markers, records, offsets)
    meta = make_meta(
        source="synthetic", workload=workload, variant=variant, shape=dict(shape or {"m": 128, "n": 256, "k": 512}),
        world_size=world_size, ranks=list(range(world_size)), hardware={"name": hw.name, "vendor": hw.vendor},
        clock_offsets_ns={str(r): o for r, o in offsets.items()} if clock_measured else {},
        capture={"tracer": "synthetic", "clock_offsets_source": "measured" if clock_measured else "unknown",
                 "injected": {"skew_ns": skews, "kernel_gap_ns": kernel_gap_ns, "extra_launches": extra_launches,
                              "host_starved_ns": host_starved_ns, "intermediate_bytes": intermediate_bytes,
                              "flag_wait_ns": flag_wait_ns}},
        repetitions=repetitions, cost=cost,
    )
    bundle = Bundle(events=events, meta=meta)
    expected, windows = _reference_ledger(kernels, syncs, cost, hw, world_size)
    params = {k: v for k, v in locals().items() if k in synthetic_bundle.__kwdefaults__}
    return SyntheticCase(bundle=bundle, expected=expected, expected_windows=windows, hardware=hw, params=params)


def _per_rank(value, world_size: int) -> dict[int, int]:
    if value is None:
        return {r: 0 for r in range(world_size)}
    if isinstance(value, Mapping):
        return {r: int(value.get(r, 0)) for r in range(world_size)}
    if isinstance(value, (int, np.integer)):
        return {r: (int(value) if r == world_size - 1 else 0) for r in range(world_size)}
    vals = list(value)
    return {r: int(vals[r]) if r < len(vals) else 0 for r in range(world_size)}


def _events_frame(kernels, launches, syncs, markers, records, offsets) -> pd.DataFrame:
    """All rows on each rank's local clock (aligned time minus the rank's offset)."""
    rows = []
    for k in kernels:
        rows.append({"rank": k.rank, "device": k.rank, "stream": k.stream, "kind": "kernel", "role": k.role, "name": k.name,
                     "start_ns": k.start, "end_ns": k.end, "correlation": k.correlation, "repetition": k.repetition,
                     "iteration": k.iteration, "collective_id": k.collective_id,
                     "collective_op": "allgather" if k.collective_id else "", "graph_id": k.graph_id,
                     "bytes": (1 << 20) if k.collective_id else -1})
    rep_of = {k.correlation: (k.repetition, k.iteration) for k in kernels}
    for ln in launches:
        rep, it = rep_of.get(ln["correlation"], (0, -1))
        rows.append({"rank": ln["rank"], "stream": 1, "kind": "launch", "role": "other", "name": ln["name"],
                     "start_ns": ln["start"], "end_ns": ln["end"], "correlation": ln["correlation"],
                     "repetition": rep, "iteration": it, "graph_id": ln.get("graph_id", -1)})
    for sy in syncs:
        rows.append({"rank": sy["rank"], "stream": 1, "kind": "sync", "role": "other", "name": sy["name"],
                     "start_ns": sy["start"], "end_ns": sy["end"]})
    for m in markers:
        rows.append({"rank": m["rank"], "stream": 1, "kind": "marker", "role": "other", "name": m["name"],
                     "start_ns": m["start"], "end_ns": m["end"], "repetition": m["rep"], "iteration": m["it"]})
    for rc in records:
        rows.append({"rank": rc["rank"], "device": rc["rank"], "stream": MAIN_STREAM, "kind": "record", "role": "fused",
                     "name": rc["name"], "start_ns": rc["start"], "end_ns": rc["end"], "cta": rc["cta"], "phase": rc["phase"]})
    if not rows:
        return schema.empty_events()
    df = pd.DataFrame(rows)
    shift = df["rank"].map(offsets).fillna(0).astype("int64")
    df["start_ns"] = df["start_ns"].astype("int64") - shift
    df["end_ns"] = df["end_ns"].astype("int64") - shift
    return schema.normalize_events(df)


# --- the reference ledger: scalar code over the disjoint pieces of each rank's timeline -------

def _largest_remainder(values: list[float], total: int) -> list[int]:
    values = [round(max(v, 0.0), 6) for v in values]  # the same float-noise rule as the ledger's
    floors = [math.floor(v) for v in values]
    rest = total - sum(floors)
    order = sorted(range(len(values)), key=lambda i: (-(values[i] - floors[i]), i))
    for i in order[:max(rest, 0)]:
        floors[i] += 1
    return floors


def _kernel_shares(kernels: list[_Kernel], cost: Mapping[str, Any], hw, link_in_window) -> dict[int, dict[str, float]]:
    """Per local kernel (by correlation+name), the ns of flag_wait, useful, link useful and
    locality over its whole duration, following docs/ledger.md."""
    import re

    peak = hw.flops_per_s(cost.get("dtype", "bf16"))
    t_compute = max(cost["flops"] / peak, cost["hbm_bytes"] / hw.hbm_bytes_per_s) * 1e9
    t_link = cost["link_bytes"] / hw.link_bytes_per_s * 1e9
    out: dict[int, dict[str, float]] = {}
    groups: dict[tuple, list[_Kernel]] = {}
    for k in kernels:
        if k.role in ("compute", "fused", "copy"):
            groups.setdefault((k.rank, k.repetition, k.iteration), []).append(k)
    for key, ks in groups.items():
        sh = {id(k): {"flag_wait": min(k.flag_ns, k.end - k.start), "useful": 0.0, "link": 0.0, "locality": 0.0} for k in ks}
        work = [k for k in ks if k.role in ("compute", "fused")]
        avail = {id(k): (k.end - k.start) - sh[id(k)]["flag_wait"] for k in work}
        total = sum(avail.values())
        if total > 0:
            f = min(1.0, t_compute / total)
            for k in work:
                sh[id(k)]["useful"] = f * avail[id(k)]
        # link floor beyond the compute floor: first into exposed transfer time, rest into fused kernels
        rest = max(0.0, t_link - t_compute) - link_in_window.get(key, 0)
        fused = [k for k in ks if k.role == "fused"]
        head = {id(k): (k.end - k.start) - sh[id(k)]["flag_wait"] - sh[id(k)]["useful"] for k in fused}
        hsum = sum(head.values())
        if rest > 0 and hsum > 0:
            g = min(1.0, rest / hsum)
            for k in fused:
                sh[id(k)]["link"] = g * head[id(k)]
        for inter in cost.get("intermediates", []):
            t_loc = 2 * inter["bytes"] / hw.hbm_bytes_per_s * 1e9
            sel = [k for k in ks if re.search(inter["producer"], k.name) or re.search(inter["consumer"], k.name)]
            head = {id(k): (k.end - k.start) - sum(sh[id(k)].values()) for k in sel}
            hsum = sum(head.values())
            if hsum > 0:
                g = min(1.0, t_loc / hsum)
                for k in sel:
                    sh[id(k)]["locality"] += g * head[id(k)]
        for k in ks:
            out[id(k)] = sh[id(k)]
    return out


def _pieces(rank_kernels: list[_Kernel]) -> list[tuple[int, int, str, _Kernel | None]]:
    """The rank's busy time as disjoint pieces: ('local', kernel), ('skew', None), ('transfer', None)."""
    side = {k.start: k for k in rank_kernels if k.stream == SIDE_STREAM}
    out = []
    for k in rank_kernels:
        if k.stream == SIDE_STREAM:
            continue
        if k.role != "comm":
            out.append((k.start, k.end, "local", k))
            continue
        t = k.start
        s = side.get(k.start)
        if s is not None:
            out.append((s.start, s.end, "local", s))
            t = s.end
        if t < k.skew_end:
            out.append((t, k.skew_end, "skew", k))
            t = k.skew_end
        if t < k.end:
            out.append((t, k.end, "transfer", k))
    return sorted(out, key=lambda p: p[0])


def _reference_ledger(kernels, syncs, cost, hw, world_size):
    win = {}
    for k in kernels:
        key = (k.repetition, k.iteration)
        lo, hi = win.get(key, (k.start, k.end))
        win[key] = (min(lo, k.start), max(hi, k.end))
    # docs/ledger.md, 2: overlapping windows become a partition -- each ends at the next one's
    # start, or at the latest end so far where that comes first
    order = sorted(win, key=lambda key: win[key][0])
    reach = None
    for i, key in enumerate(order):
        lo, hi = win[key]
        reach = hi if reach is None else max(reach, hi)
        if i + 1 < len(order):
            cut = min(reach, win[order[i + 1]][0])
            if cut > lo:
                win[key] = (lo, cut)
    by_rank = {r: sorted([k for k in kernels if k.rank == r], key=lambda k: (k.start, k.stream)) for r in range(world_size)}
    pieces = {r: _pieces(ks) for r, ks in by_rank.items()}
    t_compute = max(cost["flops"] / hw.flops_per_s(cost["dtype"]), cost["hbm_bytes"] / hw.hbm_bytes_per_s) * 1e9
    t_link_excess = max(0.0, cost["link_bytes"] / hw.link_bytes_per_s * 1e9 - t_compute)

    # link useful placed in each window's transfer time, needed before the kernel shares
    link_in_window = {}
    for (rep, it), (ws, we) in win.items():
        for r in range(world_size):
            transfer = sum(max(0, min(e, we) - max(s, ws)) for s, e, lab, _ in pieces[r] if lab == "transfer")
            link_in_window[(r, rep, it)] = min(t_link_excess, transfer)
    shares = _kernel_shares(kernels, cost, hw, link_in_window)

    rows, wrows = [], []
    for (rep, it), (ws, we) in sorted(win.items()):
        wrows.append({"repetition": rep, "iteration": it, "start_ns": ws, "end_ns": we, "window_ns": we - ws})
        for r in range(world_size):
            acc = {s: 0.0 for s in SUBCATEGORY_ORDER}
            clipped = [(max(s, ws), min(e, we), lab, k) for s, e, lab, k in pieces[r] if min(e, we) > max(s, ws)]
            local = {"flag_wait": 0.0, "useful": 0.0, "link": 0.0, "locality_tax": 0.0}
            busy_local = 0
            transfer = 0
            for s, e, lab, k in clipped:
                if lab == "local":
                    busy_local += e - s
                    frac = (e - s) / (k.end - k.start)
                    sh = shares[id(k)]
                    local["flag_wait"] += sh["flag_wait"] * frac
                    local["useful"] += sh["useful"] * frac
                    local["link"] += sh["link"] * frac
                    local["locality_tax"] += sh["locality"] * frac
                elif lab == "skew":
                    acc["skew_wait"] += e - s
                else:
                    transfer += e - s
            link_useful = link_in_window[(r, rep, it)]
            acc["exposed_comm"] += transfer - link_useful
            # idle: the gaps between consecutive clipped pieces, and before the first / after the last
            if not clipped:
                acc["barrier_idle"] += we - ws
            else:
                acc["barrier_idle"] += clipped[0][0] - ws + we - clipped[-1][1]
                for (s0, e0, _, _), (s1, e1, _, k1) in zip(clipped, clipped[1:]):
                    if s1 <= e0:
                        continue
                    _classify_gap(acc, e0, s1, k1.launch_end, [sy for sy in syncs if sy["rank"] == r])
            parts = [local["flag_wait"], local["useful"] + local["link"], local["locality_tax"]]
            parts.append(busy_local - sum(parts))
            fw, use_c, loc, ineff = _largest_remainder(parts, busy_local)
            acc["flag_wait"] += fw
            acc["locality_tax"] += loc
            acc["compute_inefficiency"] += ineff
            # useful from compute and from link, exact ints: link part is rounded within comm
            link_int = _largest_remainder([link_useful, transfer - link_useful], transfer)[0] if transfer else 0
            acc["exposed_comm"] = transfer - link_int
            acc["useful"] = use_c + link_int
            for sub in SUBCATEGORY_ORDER:
                rows.append({"repetition": rep, "iteration": it, "rank": r, "category": PARENT[sub],
                             "subcategory": sub, "ns": int(round(acc[sub]))})
    expected = pd.DataFrame(rows, columns=list(LEDGER_COLUMNS))
    expected["ns"] = expected["ns"].astype("int64")
    return expected, pd.DataFrame(wrows)


def _classify_gap(acc: dict, a: int, b: int, launch_end: int | None, syncs: list[dict]) -> None:
    """An idle gap [a, b) before a kernel whose launch call ended at ``launch_end``."""
    cap = b if launch_end is None else min(max(launch_end, a), b)
    sync_ends = [sy["end"] for sy in syncs if a < sy["end"] <= cap]
    s = max(sync_ends) if sync_ends else a
    acc["barrier_idle"] += s - a
    if launch_end is None:
        acc["unattributed"] += b - s
    elif launch_end <= a:
        acc["kernel_gap"] += b - a
    else:
        acc["host_starved"] += cap - s
        acc["launch_latency"] += b - cap


def large_synthetic_bundle(*, world_size: int = 4, kernels: int = 1_000_000, kernels_per_iteration: int = 8,
                           seed: int = 0) -> Bundle:
    """A big bundle built with numpy only (no expected ledger): ``kernels`` GPU kernels in all,
    each with its launch call, for benchmarks. Per rank and iteration: one all-gather (ranks
    arrive up to 5 us apart, finish together) then compute kernels with random gaps, some of
    them host-starved."""
    rng = np.random.default_rng(seed)
    k = kernels_per_iteration
    n_iter = max(kernels // (world_size * k), 1)
    r = np.repeat(np.arange(world_size), n_iter * k)
    it = np.tile(np.repeat(np.arange(n_iter), k), world_size)
    j = np.tile(np.arange(k), world_size * n_iter)
    period = 20_000 * k
    dur = rng.integers(1_000, 15_000, len(r))
    slot = it.astype(np.int64) * period + j.astype(np.int64) * 17_000
    arrive = rng.integers(0, 5_000, (world_size, n_iter))
    start = T_BASE_NS + slot + rng.integers(0, 2_000, len(r))
    comm = j == 0
    start[comm] = T_BASE_NS + it[comm].astype(np.int64) * period + arrive[r[comm], it[comm]]
    dur[comm] = (5_000 + 15_000) - arrive[r[comm], it[comm]]  # all finish at +20 us
    end = start + dur
    corr = np.arange(1, len(r) + 1)
    starved = rng.random(len(r)) < 0.2
    launch_end = np.where(starved, start - 2_000, start - 30_000)
    n = len(r)
    kern = pd.DataFrame({
        "rank": r, "device": r, "stream": 7, "kind": "kernel", "role": np.where(comm, "comm", "compute"),
        "name": np.where(comm, COLLECTIVE, np.where(j % 2 == 1, GEMM, EPILOGUE)), "start_ns": start, "end_ns": end,
        "correlation": corr, "repetition": 0, "iteration": it,
        "collective_id": np.where(comm, pd.Series(it).astype(str).radd("0:").to_numpy(), ""),
        "collective_op": np.where(comm, "allgather", ""), "graph_id": -1, "grid": "", "block": "", "bytes": -1,
        "flops": -1, "cta": -1, "phase": ""})
    launch = pd.DataFrame({
        "rank": r, "device": -1, "stream": 1, "kind": "launch", "role": "other", "name": "cudaLaunchKernel",
        "start_ns": launch_end - 3_000, "end_ns": launch_end, "correlation": corr, "repetition": 0, "iteration": it,
        "collective_id": "", "collective_op": "", "graph_id": -1, "grid": "", "block": "", "bytes": -1, "flops": -1,
        "cta": -1, "phase": ""})
    events = pd.concat([kern, launch], ignore_index=True)
    events = schema.add_missing_columns(events)  # columns added to the schema since (floor_bytes, counters)
    for c in schema.COLUMNS:
        if c.dtype != "string":
            events[c.name] = events[c.name].astype(c.dtype)
    events = events.sort_values(["rank", "start_ns", "end_ns"], kind="stable").reset_index(drop=True)
    cost = {"flops": int(0.4 * period * 1e-9 * 989.4e12), "hbm_bytes": 0, "link_bytes": 0, "dtype": "bf16",
            "intermediates": [{"name": "partial", "bytes": 24_000_000, "producer": "gemm", "consumer": "epilogue"}]}
    meta = make_meta(source="synthetic", workload="synthetic_large", variant="bsp", world_size=world_size,
                     ranks=list(range(world_size)), hardware={"name": "H200 SXM"}, cost=cost,
                     clock_offsets_ns={str(i): 0 for i in range(world_size)}, capture={"clock_offsets_source": "measured"},
                     notes=[f"{n} kernels, {n_iter} iterations"])
    return Bundle(events=events, meta=meta)
