"""The predicted timeline: each rank's kernels of one iteration placed from their plans (host
launch calls, GPU start and end, collectives waiting for their last member, fused kernels waiting
on flags), the spread of the ranks' starts, and the timeline written as bundle events."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import pandas as pd

from taxmodel.trace.capture_meta import GATED_ALIGNMENTS, START_ALIGNMENTS

from .params import ModelParams


def release_offsets(world: int, params: "ModelParams") -> list[float]:
    """When each rank's GPU may start the iteration, from the earliest.

    Host barrier: ``start_offsets(world, barrier_skew_s)``. Device gate (kernels/device/gate.py): every
    rank adds to every counter, so the last rank to arrive sees the count complete at once (its own
    add is local) and every other rank one flag latency later, when that rank's add lands: one
    rank at 0, the others at half the calibrated flag round trip. Back-to-back steps (one gate per
    repetition, then each step right after the previous one on every GPU): the same spread, since
    each step of the workloads ends on every rank with a wait on the others (a collective, flags)."""
    if params.start_alignment not in START_ALIGNMENTS:
        raise ValueError(f"start_alignment {params.start_alignment!r}: expected one of {START_ALIGNMENTS}")
    if params.start_alignment in GATED_ALIGNMENTS:
        return [0.0] + [params.flag_roundtrip_s / 2] * (world - 1)
    return start_offsets(world, params.barrier_skew_s)


def start_offsets(world: int, scale_s: float) -> list[float]:
    """Expected release times of ``world`` ranks after a host barrier, earliest first: the order
    statistics of i.i.d. exponential delays of mean ``scale_s``, measured from the earliest:
    E[X_(k+1) - X_(1)] = scale * sum_{i=1}^{k} 1/(W-i). Their spread, scale * H_{W-1}, grows with
    the world size: one source of the bulk-synchronous tax that no kernel can remove."""
    out, acc = [], 0.0
    for k in range(world):
        if k:
            acc += scale_s / (world - k)
        out.append(acc)
    return out



ROLES = ("compute", "comm", "fused", "copy", "other")


@dataclass
class KernelPlan:
    """One kernel of one iteration on one rank.

    ``duration_s``: for a collective, the transfer after the last member arrived; for a fused
    kernel with ``sync``, the local work before its wait (``post_s`` after it); else its length.
    ``host_s``: host time spent before its launch call returns (Python, runtime). ``stream`` 0 is
    the main stream; kernels on other streams run concurrently with it. ``sync_after_s``: for a
    fused kernel with ``sync``, when (after its start) the work that peers wait for is done on
    this rank (default ``duration_s``). ``after``: the index (in this rank's plan) of an earlier
    kernel on another stream that must end before this one starts (a CUDA event wait between
    streams, e.g. a copy that needs the GEMM which produced its data)."""

    name: str
    role: str
    duration_s: float
    host_s: float
    stream: int = 0
    collective: str = ""  # op name when this kernel is a collective of all ranks
    sync: bool = False
    post_s: float = 0.0
    sync_after_s: float | None = None
    flag_latency_s: float = 0.0
    after: int | None = None
    #: For a fused kernel: the mean time a CTA of it spends in communication-only phases (moving
    #: data between GPUs; in-kernel records ``store_push``/``remote_load``), within its duration.
    comm_s: float = 0.0
    #: DRAM bytes the kernel reads and writes (what hardware counters would count for it; -1: not
    #: predicted, as for copies and collectives, which the counters pass does not count). The
    #: prediction's locality tax comes from them (docs/model.md, "Locality").
    dram_read_bytes: float = -1.0
    dram_write_bytes: float = -1.0


def as_graph_launch(plans: Sequence[Sequence[KernelPlan]], params: ModelParams) -> list[list[KernelPlan]]:
    """The plans as one captured graph per iteration: the host spends one launch call (a graph
    launch costs about a torch launch) before the first kernel and nothing before the others, so
    every later kernel is queued (the ledger's kernel_gap, never host_starved)."""
    return [[replace(p, host_s=params.host_launch_torch_s if k == 0 else 0.0) for k, p in enumerate(rank)]
            for rank in plans]


@dataclass
class PredictedTimeline:
    """Per rank, the kernels as placed, plus host launch ends (seconds from the earliest release)."""

    rows: list[dict]  # rank, name, role, stream, start, end, launch_end, collective_id, wait (flag wait inside)


def simulate(plans: Sequence[Sequence[KernelPlan]], params: ModelParams) -> PredictedTimeline:
    """Place every rank's kernels of one iteration (``plans[r]``, the same sequence on every rank
    up to durations).

    Host: rank r is released from the barrier at ``start_offsets(W)[r]`` and returns from kernel
    k's launch call ``host_s`` later than from kernel k-1's. GPU: a kernel starts at
    max(its stream free + kernel gap, launch end + launch latency, its ``after`` kernel's end +
    kernel gap), the kernel gap being ``params.queued_gap_s`` (the graph gap for graph launches; the
    first kernel after a device gate, launched apart from the graph, waits ``kernel_gap_s``); a
    collective ends ``duration``
    after its last member started; a synced fused kernel ends at
    max(start + work, last peer's work done + flag latency) + post.
    """
    world = len(plans)
    if world == 0:
        return PredictedTimeline([])
    n = len(plans[0])
    if any(len(p) != n for p in plans):
        raise ValueError("every rank must run the same number of kernels")
    offs = release_offsets(world, params)
    gated = params.start_alignment in GATED_ALIGNMENTS
    host = [o - params.gate_hold_s for o in offs] if gated else list(offs)
    gap = params.queued_gap_s  # between kernels of one rank (of one graph, for graph launches)
    free: list[dict[int, float]] = [{} for _ in range(world)]
    ends: list[list[float]] = [[] for _ in range(world)]  # per rank, every placed kernel's end
    rows: list[dict] = []
    seq = 0
    for k in range(n):
        starts, launch_end = [], []
        for r in range(world):
            p = plans[r][k]
            host[r] += p.host_s
            launch_end.append(host[r])
            f = free[r].get(p.stream)
            s = host[r] + params.launch_latency_s
            if gated:  # queued behind the gate: not before its release
                s = max(s, offs[r] + params.kernel_gap_s)
            if f is not None:
                s = max(s, f + gap)
            if p.after is not None:
                if not 0 <= p.after < k:
                    raise ValueError(f"kernel {k} ({p.name}) waits on kernel {p.after}, which is not an earlier one")
                s = max(s, ends[r][p.after] + gap)
            starts.append(s)
        coll_id = ""
        if plans[0][k].collective:
            coll_id = f"0:{seq}"
            seq += 1
        last = max(starts)
        ready = max(st + (plans[r][k].sync_after_s if plans[r][k].sync_after_s is not None else plans[r][k].duration_s)
                    for r, st in enumerate(starts))
        for r in range(world):
            p, s = plans[r][k], starts[r]
            wait = 0.0
            if p.collective:
                e = last + p.duration_s
            elif p.sync and world > 1:
                own = s + p.duration_s
                e0 = max(own, ready + p.flag_latency_s)
                wait = e0 - own
                e = e0 + p.post_s
            else:
                e = s + p.duration_s + p.post_s
            if params.instrumented and p.role == "fused":  # its records' own cost, at its end
                e += params.record_overhead_s
            e = max(e, s + 1e-9)
            free[r][p.stream] = e
            ends[r].append(e)
            rows.append({"rank": r, "name": p.name, "role": p.role, "stream": p.stream, "start": s, "end": e,
                         "launch_end": launch_end[r], "collective_id": coll_id, "collective_op": p.collective,
                         "wait": wait, "comm": p.comm_s, "host_s": p.host_s,
                         "dram_read": p.dram_read_bytes, "dram_write": p.dram_write_bytes})
    return PredictedTimeline(rows)


def timeline_events(tl: PredictedTimeline, *, instrumented: bool = False, iterations: int = 1,
                    counters: bool = False) -> pd.DataFrame:
    """The timeline as bundle events (kernels, their launch calls, iteration markers and, when
    ``instrumented``, per fused kernel one flag_wait record for its wait and one store_push record
    for its communication-only time, on one CTA), ``iterations`` times over
    with a quiet gap in between, integer ns on one clock. ``counters``: kernels carry their
    predicted DRAM bytes as ``dram_read_bytes``/``dram_write_bytes`` (-1 where none is predicted),
    as a bundle with hardware counters does."""
    from taxmodel.trace import schema

    rows: list[dict] = []
    base = 1_000_000_000
    span = max((r["end"] for r in tl.rows), default=0.0) + 1e-3
    corr = 0
    for it in range(iterations):
        t0 = base + int(round(it * span * 1e9))
        first: dict[int, int] = {}
        last: dict[int, int] = {}
        for row in tl.rows:
            corr += 1
            s = t0 + int(round(row["start"] * 1e9))
            e = max(s + 1, t0 + int(round(row["end"] * 1e9)))
            le = t0 + int(round(row["launch_end"] * 1e9))
            r = int(row["rank"])
            cid = f"{row['collective_id']}.{it}" if row["collective_id"] else ""
            kernel = {"rank": r, "device": r, "stream": 7 + int(row["stream"]), "kind": "kernel", "role": row["role"],
                      "name": row["name"], "start_ns": s, "end_ns": e, "correlation": corr, "iteration": it,
                      "collective_id": cid, "collective_op": row["collective_op"]}
            if counters:
                rd, wr = row.get("dram_read", -1.0), row.get("dram_write", -1.0)
                known = rd >= 0 and wr >= 0
                kernel.update(dram_read_bytes=int(round(rd)) if known else -1, dram_write_bytes=int(round(wr)) if known else -1)
            rows.append(kernel)
            host = max(1, min(int(round(row["host_s"] * 1e9)), 3000))
            rows.append({"rank": r, "stream": 1, "kind": "launch", "role": "other", "name": "cudaLaunchKernel",
                         "start_ns": le - host, "end_ns": le, "correlation": corr, "iteration": it})
            if instrumented and row["role"] == "fused":
                at = s + 1
                for phase, secs in (("flag_wait", row["wait"]), ("store_push", row.get("comm", 0.0))):
                    length = int(round(secs * 1e9))
                    if length > 0 and at < e:
                        rows.append({"rank": r, "device": r, "stream": 7, "kind": "record", "role": "fused",
                                     "name": row["name"], "start_ns": at, "end_ns": min(e, at + length), "cta": 0,
                                     "phase": phase})
                        at = min(e, at + length)
            first[r] = min(first.get(r, le), le - host - 1000)
            last[r] = max(last.get(r, e), e)
        for r in first:
            rows.append({"rank": r, "stream": 1, "kind": "marker", "role": "other", "name": f"ProfilerStep#{it}",
                         "start_ns": first[r], "end_ns": last[r] + 1000, "iteration": it})
    return schema.normalize_events(pd.DataFrame(rows))


