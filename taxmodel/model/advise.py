"""What fusing would buy: fusion candidates in a measured bundle, each with the taxes that lie on
the boundaries between its kernels and a bound on what fusing them would recover (definitions:
docs/advise.md).

Candidates come from the trace alone, per rank and iteration:

- ``run``: consecutive kernels on one stream with no host synchronization returning between them
  (what one fused kernel, or one graph, could replace);
- a collective with the GEMM (or attention) that feeds it or consumes it: ``AG+GEMM`` (an
  all-gather, then the GEMM that starts next), ``GEMM+RS`` / ``GEMM+AR`` (a GEMM, then a
  reduce-scatter / all-reduce), ``attention+AG`` (attention kernels, an all-gather of their
  partials and the kernel that combines them: flash decode's bulk-synchronous form);
- ``chain``: a GEMM or attention kernel followed on its stream by memory-bound kernels (an
  epilogue that a fused kernel would apply to its tiles in registers).

What a candidate could recover is read off the ledger (``Ledger.intervals``) over its span on its
rank: the idle gaps between its kernels (launch tax, barrier idle), the waits and exposed
transfers of its collective (bulk-synchronous tax; only for candidates that hold one), and the
HBM round trips of intermediates that both its producer and consumer belong to (locality tax).
The analytic model's prediction for a matching built-in workload stands beside it
(``advise_predict``). Per-kernel roofline floors, when a caller has them (``kernel_costs``),
cap the bound: no fused kernel runs below the sum of its kernels' floors.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import pandas as pd

from taxmodel.ledger.kernel_costs import has_kernel_costs, kernel_floors
from taxmodel.model import advise_predict
from taxmodel.model import advise_regions as regions
from taxmodel.ledger.result import Ledger
from taxmodel.ledger.kernel_shares import matches  # the ledger's own matching of declared producers/consumers
from taxmodel.trace.bundle import Bundle
from taxmodel.trace.capture_meta import CPU_RUN_CAVEAT
from taxmodel.trace.counter_match import function_name
from taxmodel.vocabulary import GEMM_KERNELS, SHORT_LABELS, normalize_collective

ATTENTION_PATTERN = r"(?i)flash|attn|attention|fmha|sdpa|decode"
#: Elementwise, normalization, reduction and small data-movement kernels: memory-bound by name
#: (a kernel's roofline floor says it better; ``kernel_costs["bound"]`` wins when given).
MEMORY_BOUND_PATTERN = (r"(?i)elementwise|vectorized|unrolled|reduce_kernel|softmax|norm|triton_poi|triton_per|"
                        r"triton_red|copy|cat_|gelu|silu|relu|swiglu|activation|bias|add|mul|rotary|rope|dropout|"
                        r"cast|fill|combine|epilogue")
LAUNCH_PARTS = ("host_starved", "launch_latency", "kernel_gap")
BSP_PARTS = ("skew_wait", "exposed_comm", "flag_wait")
IDLE_BSP_PARTS = ("barrier_idle",)
NS_PER_US = 1000.0
COLUMNS = ("kind", "kernels", "ops", "n_kernels", "per_iteration", "span_us", "launch_tax_us", "locality_tax_us",
           "bsp_tax_us", "bound_us", "bound_pct", "model", "predicted_fused_us", "predicted_saving_us",
           "predicted_saving_lo_us", "predicted_saving_hi_us",
           "predicted_pct", "confidence", "missing")


@dataclass(frozen=True)
class Inputs:
    """What the advisor reads of one analyzed bundle."""

    bundle: Bundle
    ledger: Ledger
    #: Optional per-kernel costs, indexed like ``bundle.events`` (GPU rows): ``floor_ns`` (a kernel's
    #: roofline floor), ``bound`` ("memory" / "compute"), ``locality_ns`` (measured HBM round-trip
    #: time of what it reads back). Absent: the confidence says what is missing.
    kernel_costs: pd.DataFrame | None = None


# --- kernels -------------------------------------------------------------------------------------

def kernel_table(inp: Inputs) -> pd.DataFrame:
    """Kernels of the analyzed iterations on the ledger's aligned clock, sorted by (rank,
    repetition, iteration, stream, start), with a class (comm, gemm, attention, memory, other),
    the op that launched each (``launch_op``, "" unknown) and where it was launched from
    (``thread``, ``scope``: ``advise_regions``)."""
    ev = inp.bundle.events
    k = ev[(ev["kind"] == "kernel") & (ev["iteration"] >= 0)]
    windows = pd.MultiIndex.from_frame(inp.ledger.windows[["repetition", "iteration"]])
    k = k[pd.MultiIndex.from_arrays([k["repetition"], k["iteration"]]).isin(windows)]
    off = k["rank"].map(inp.ledger.clock.offsets_ns).fillna(0).to_numpy(np.int64)
    names = k["name"].astype(str)
    out = pd.DataFrame({
        "row": k.index.to_numpy(), "rank": k["rank"].to_numpy(np.int64), "repetition": k["repetition"].to_numpy(np.int64),
        "iteration": k["iteration"].to_numpy(np.int64), "stream": k["stream"].to_numpy(np.int64),
        "start": k["start_ns"].to_numpy(np.int64) + off, "end": k["end_ns"].to_numpy(np.int64) + off,
        "name": names.to_numpy(object), "short": short_names(names).to_numpy(object),
        "role": k["role"].astype(str).to_numpy(object),
        "op": k["collective_op"].astype(str).str.lower().to_numpy(object),
        "cls": _classes(names, k["role"].astype(str), k["collective_op"].astype(str), inp.kernel_costs, k.index),
        "launch_op": (k["op"].astype(str) if "op" in k.columns else pd.Series("", index=k.index)).to_numpy(object),
    })
    out = out.join(regions.kernel_regions(inp.bundle, k.index.to_numpy()), on="row")
    return out.sort_values(["rank", "repetition", "iteration", "stream", "start"], kind="stable").reset_index(drop=True)


def short_names(names: pd.Series) -> pd.Series:
    """Kernel names as a reader knows them: the function's own name, without return type,
    namespaces (``(anonymous namespace)`` included), template and argument lists
    (``void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<...>(...)`` ->
    ``vectorized_layer_norm_kernel``; ``ncclDevKernel_AllGather_RING_LL``); the op that launched
    a kernel stands beside it in the ``ops`` column."""
    uniq = pd.unique(names)
    short = {u: function_name(u) or u for u in uniq}  # a loop over distinct names
    return names.map(short)


def _classes(names: pd.Series, role: pd.Series, op: pd.Series, costs: pd.DataFrame | None, index) -> np.ndarray:
    comm = (role == "comm").to_numpy() | (op != "").to_numpy()
    codes, uniq = pd.factorize(names)  # names repeat: match each distinct one once
    uniq = pd.Series(uniq)
    gemm, attn, memory = (uniq.str.contains(p, regex=True).to_numpy(bool)[codes]
                          for p in (GEMM_KERNELS, ATTENTION_PATTERN, MEMORY_BOUND_PATTERN))
    if costs is not None and "bound" in costs:
        b = costs["bound"].reindex(index).astype(object).to_numpy()
        known = pd.notna(b)
        memory = np.where(known, b == "memory", memory)
        gemm = gemm & ~(known & (b == "memory"))
    # a GEMM with a fused epilogue ("..._gemm_relu_...") is a GEMM; attention kernels that only
    # combine partials ("flash_decode_combine") are memory-bound
    return np.select([comm, gemm, memory, attn], ["comm", "gemm", "memory", "attention"], "other").astype(object)


def _sync_ends(inp: Inputs) -> dict[int, np.ndarray]:
    """Per rank, the sorted ends (aligned) of host synchronization calls."""
    s = inp.bundle.events[inp.bundle.events["kind"] == "sync"]
    off = s["rank"].map(inp.ledger.clock.offsets_ns).fillna(0).to_numpy(np.int64)
    ends = s["end_ns"].to_numpy(np.int64) + off
    ranks = s["rank"].to_numpy(np.int64)
    return {int(r): np.sort(ends[ranks == r]) for r in np.unique(ranks)}


def stream_runs(k: pd.DataFrame, sync_ends: Mapping[int, np.ndarray]) -> np.ndarray:
    """Run id per kernel (``k`` sorted as ``kernel_table`` sorts): a run is broken by a new (rank,
    repetition, iteration, stream), by a host synchronization that returned between the end of
    the previous kernel and the start of this one, or by a new launching thread or step
    annotation (``advise_regions.region_breaks``)."""
    n = len(k)
    if not n:
        return np.zeros(0, np.int64)
    key = k[["rank", "repetition", "iteration", "stream"]].to_numpy(np.int64)
    brk = np.r_[True, (key[1:] != key[:-1]).any(axis=1)] | regions.region_breaks(k)
    prev_end = np.r_[np.iinfo(np.int64).min, k["end"].to_numpy(np.int64)[:-1]]
    start = k["start"].to_numpy(np.int64)
    rank = key[:, 0]
    for r, ends in sync_ends.items():  # a loop over ranks
        m = rank == r
        if len(ends) and m.any():
            brk[m] |= np.searchsorted(ends, start[m], side="right") > np.searchsorted(ends, prev_end[m], side="right")
    return np.cumsum(brk) - 1


def chains(k: pd.DataFrame, run: np.ndarray) -> np.ndarray:
    """Chain id per kernel (-1 outside chains): a GEMM or attention kernel and the memory-bound
    kernels that follow it in its run."""
    cls = k["cls"].to_numpy(object)
    head = np.isin(cls, ("gemm", "attention"))
    memory = cls == "memory"
    new_run = np.r_[True, run[1:] != run[:-1]] if len(run) else np.zeros(0, bool)
    grp = np.cumsum(new_run | ~memory) - 1
    size = np.bincount(grp, minlength=grp.max() + 1 if len(grp) else 0)
    first = np.flatnonzero(np.r_[True, grp[1:] != grp[:-1]]) if len(grp) else np.zeros(0, np.int64)
    ok = np.zeros(len(size), bool)
    ok[grp[first]] = head[first] & (size[grp[first]] >= 2)
    return np.where(ok[grp], grp, -1) if len(grp) else np.zeros(0, np.int64)


# --- collective pairs ---------------------------------------------------------------------------

def collective_pairs(k: pd.DataFrame, chain: np.ndarray) -> pd.DataFrame:
    """Members (occurrence, kernel position, kind) of every collective with its producer and
    consumer: the compute kernel that ended last before it started and the one that started first
    after it ended, on the same rank and iteration (any stream)."""
    occ, pos, kind = [], [], []
    coll = np.flatnonzero(k["cls"].to_numpy(object) == "comm")
    if not len(coll):
        return pd.DataFrame({"occ": np.zeros(0, np.int64), "pos": np.zeros(0, np.int64), "kind": np.zeros(0, object)})
    prod, cons = _neighbours(k, coll)
    cls = k["cls"].to_numpy(object)
    op = k["op"].to_numpy(object)
    for i, c in enumerate(coll):  # one pass over collectives, a handful of rows each
        short = SHORT_LABELS.get(normalize_collective(op[c]), "")
        p, q = prod[i], cons[i]
        members, label = _pair_members(short, c, p, q, cls, chain)
        if members:
            occ.extend([i] * len(members))
            pos.extend(members)
            kind.extend([label] * len(members))
    return pd.DataFrame({"occ": np.asarray(occ, np.int64), "pos": np.asarray(pos, np.int64), "kind": kind})


def _pair_members(short: str, c: int, p: int, q: int, cls: np.ndarray, chain: np.ndarray) -> tuple[list[int], str]:
    if short == "AG" and q >= 0 and cls[q] == "gemm":
        return [c, q], "AG+GEMM"
    if short in ("RS", "AR") and p >= 0 and cls[p] == "gemm":
        return [p, c], f"GEMM+{short}"
    if short == "AG" and p >= 0 and (cls[p] == "attention" or chain[p] >= 0):
        head = [int(j) for j in np.flatnonzero(chain == chain[p])] if chain[p] >= 0 else [p]
        return head + [c] + ([q] if q >= 0 else []), "attention+AG"
    return [], ""


def _neighbours(k: pd.DataFrame, coll: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each collective position: the position of its producer and consumer (-1: none)."""
    cls = k["cls"].to_numpy(object)
    comp = np.flatnonzero(cls != "comm")
    rank, rep, it = (k[c].to_numpy(np.int64) for c in ("rank", "repetition", "iteration"))
    start, end = k["start"].to_numpy(np.int64), k["end"].to_numpy(np.int64)
    prod = np.full(len(coll), -1, np.int64)
    cons = np.full(len(coll), -1, np.int64)
    for r in np.unique(rank[coll]):  # a loop over ranks
        cr = coll[rank[coll] == r]
        pr = comp[rank[comp] == r]
        if not len(pr):
            continue
        by_start = pr[np.argsort(start[pr], kind="stable")]
        by_end = pr[np.argsort(end[pr], kind="stable")]
        j = np.searchsorted(start[by_start], end[cr], side="left")
        q = np.where(j < len(by_start), by_start[np.minimum(j, len(by_start) - 1)], -1)
        j = np.searchsorted(end[by_end], start[cr], side="right") - 1
        p = np.where(j >= 0, by_end[np.maximum(j, 0)], -1)
        same = lambda x: (x >= 0) & (rep[np.maximum(x, 0)] == rep[cr]) & (it[np.maximum(x, 0)] == it[cr])  # noqa: E731
        sel = np.flatnonzero(rank[coll] == r)
        prod[sel] = np.where(same(p), p, -1)
        cons[sel] = np.where(same(q), q, -1)
    return prod, cons


# --- occurrences ----------------------------------------------------------------------------------

def occurrences(k: pd.DataFrame, sync_ends: Mapping[int, np.ndarray]) -> pd.DataFrame:
    """Members of every candidate occurrence: occ (id), pos (position in ``k``), kind, and cut
    (for a chain cut at ``advise_regions.MAX_CHAIN_KERNELS``: how many kernels it lost; else 0)."""
    run = stream_runs(k, sync_ends)
    chain, lost = regions.cap_chains(chains(k, run))
    frames = []
    n_run = np.bincount(run) if len(run) else np.zeros(0, np.int64)
    keep = n_run[run] >= 2 if len(run) else np.zeros(0, bool)
    frames.append(pd.DataFrame({"occ": run[keep], "pos": np.flatnonzero(keep), "kind": "run"}))
    base = int(run.max()) + 1 if len(run) else 0
    in_chain = chain >= 0
    frames.append(pd.DataFrame({"occ": chain[in_chain] + base, "pos": np.flatnonzero(in_chain), "kind": "chain",
                                "cut": lost[in_chain]}))
    base += int(chain.max()) + 1 if in_chain.any() else 0
    opt = regions.optimizer_groups(k, run)
    in_opt = opt >= 0
    frames.append(pd.DataFrame({"occ": opt[in_opt] + base, "pos": np.flatnonzero(in_opt), "kind": "optimizer"}))
    base += int(opt.max()) + 1 if in_opt.any() else 0
    pairs = collective_pairs(k, chain)
    frames.append(pairs.assign(occ=pairs["occ"].to_numpy(np.int64) + base))
    out = pd.concat(frames, ignore_index=True)
    out["cut"] = out["cut"].fillna(0) if "cut" in out else 0
    return out.astype({"occ": np.int64, "pos": np.int64, "cut": np.int64})


def occurrence_table(k: pd.DataFrame, members: pd.DataFrame) -> pd.DataFrame:
    """One row per occurrence: kind, signature (member names in time order), rank, repetition,
    iteration, span [start, end), whether it holds a collective. Reductions over each
    occurrence's members run as ``reduceat`` over the members sorted by (occurrence, start)."""
    pos = members["pos"].to_numpy(np.int64)
    start, end = k["start"].to_numpy(np.int64)[pos], k["end"].to_numpy(np.int64)[pos]
    occ_id = members["occ"].to_numpy(np.int64)
    order = np.lexsort((pos, start, occ_id))
    pos, start, end, occ_id = pos[order], start[order], end[order], occ_id[order]
    kinds = members["kind"].to_numpy(object)[order]
    first = np.flatnonzero(np.r_[True, occ_id[1:] != occ_id[:-1]])
    cls = k["cls"].to_numpy(object)[pos]
    launch_op = k["launch_op"].to_numpy(object)[pos]
    scope = k["scope"].to_numpy(object)[pos]
    # the collective, else the op that launched the kernel, else its step annotation, else its class
    op = np.where(cls == "comm", k["op"].to_numpy(object)[pos],
                  np.where(launch_op != "", launch_op, np.where(scope != "", scope, cls)))
    sep = np.array(" -> ", dtype=object)

    def joined(values: np.ndarray) -> np.ndarray:  # "a -> b -> c" per occurrence, in C over the members
        return np.array([v[:-4] for v in np.add.reduceat(values.astype(object) + sep, first)], dtype=object)

    out = pd.DataFrame({
        "occ": occ_id[first], "kind": kinds[first],
        "rank": k["rank"].to_numpy(np.int64)[pos[first]], "repetition": k["repetition"].to_numpy(np.int64)[pos[first]],
        "iteration": k["iteration"].to_numpy(np.int64)[pos[first]],
        "start": np.minimum.reduceat(start, first), "end": np.maximum.reduceat(end, first),
        "kernels": joined(k["short"].to_numpy(object)[pos]), "ops": joined(op),
        "n_kernels": np.diff(np.r_[first, len(pos)]),
        "has_collective": np.add.reduceat((cls == "comm").astype(np.int64), first) > 0,
        "cut": np.maximum.reduceat(members["cut"].to_numpy(np.int64)[order], first),
    })
    return out


# --- attribution from the ledger's intervals ------------------------------------------------------

def covered(intervals: pd.DataFrame, sub: str, rank: np.ndarray, rep: np.ndarray, it: np.ndarray,
            a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ns of ``sub``'s intervals inside [a, b) of each query's (repetition, iteration, rank):
    prefix sums over each group's sorted intervals and two binary searches per query."""
    iv = intervals[intervals["subcategory"] == sub]
    out = np.zeros(len(a), np.int64)
    if iv.empty or not len(a):
        return out
    wkey = lambda r, i: r.astype(np.int64) * (1 << 32) + (i.astype(np.int64) + 1)  # noqa: E731
    for r in np.unique(rank):  # a loop over ranks
        x = iv[iv["rank"].to_numpy(np.int64) == r]
        q = np.flatnonzero(rank == r)
        if x.empty:
            continue
        w, wq = wkey(x["repetition"].to_numpy(), x["iteration"].to_numpy()), wkey(rep[q], it[q])
        codes, uniq = pd.factorize(np.r_[w, wq])
        gx, gq = codes[: len(w)], codes[len(w):]
        s0, s1 = x["start_ns"].to_numpy(np.int64), x["end_ns"].to_numpy(np.int64)
        t0 = int(min(s0.min(), a[q].min()))
        span = int(max(s1.max(), b[q].max())) - t0 + 1
        order = np.lexsort((s0, gx))
        gx, s0, s1 = gx[order], s0[order], s1[order]
        length = s1 - s0
        cum = np.cumsum(length) - length
        first = np.r_[True, gx[1:] != gx[:-1]]
        base = np.maximum.accumulate(np.where(first, cum, 0))
        keys = gx.astype(np.int64) * span + (s0 - t0)

        def upto(t: np.ndarray) -> np.ndarray:
            j = np.searchsorted(keys, gq.astype(np.int64) * span + (t - t0), side="right") - 1
            jj = np.maximum(j, 0)
            ok = (j >= 0) & (gx[jj] == gq)
            return np.where(ok, cum[jj] - base[jj] + np.clip(t - s0[jj], 0, length[jj]), 0)

        out[q] = upto(b[q]) - upto(a[q])
    return out


def attribute(occ: pd.DataFrame, intervals: pd.DataFrame) -> pd.DataFrame:
    """The launch tax and bulk-synchronous tax over each occurrence's span (bulk-synchronous
    waits and transfers only where the occurrence holds a collective)."""
    args = [occ[c].to_numpy(np.int64) for c in ("rank", "repetition", "iteration", "start", "end")]
    launch = sum(covered(intervals, s, *args) for s in LAUNCH_PARTS)
    idle_bsp = sum(covered(intervals, s, *args) for s in IDLE_BSP_PARTS)
    comm_bsp = sum(covered(intervals, s, *args) for s in BSP_PARTS)
    bsp = idle_bsp + np.where(occ["has_collective"].to_numpy(bool), comm_bsp, 0)
    return occ.assign(launch_ns=np.asarray(launch, np.int64), bsp_ns=np.asarray(bsp, np.int64))


def per_occurrence(values: np.ndarray, occ: pd.DataFrame, members: pd.DataFrame, how: str = "sum") -> np.ndarray:
    """``values`` (one per kernel position) summed (or any-ed) over each occurrence's members."""
    at = pd.Index(occ["occ"]).get_indexer(members["occ"])
    v = np.asarray(values, np.float64)[members["pos"].to_numpy(np.int64)]
    total = np.bincount(at, weights=v, minlength=len(occ))
    return total > 0 if how == "any" else total


def declared_locality(occ: pd.DataFrame, members: pd.DataFrame, k: pd.DataFrame, inp: Inputs) -> tuple[np.ndarray, str]:
    """Per occurrence, ns of HBM round trips of declared intermediates whose producer and consumer
    both lie in it (2 x bytes / HBM bandwidth), capped by the ledger's locality tax of its rank and
    iteration; and how it was known: "measured" (``kernel_costs["locality_ns"]``), "declared", or
    "" (not known)."""
    costs = inp.kernel_costs
    if costs is not None and "locality_ns" in costs:
        per_kernel = costs["locality_ns"].reindex(k["row"]).fillna(0).to_numpy(np.float64)
        return per_occurrence(per_kernel, occ, members), "measured"
    cost = inp.ledger.meta.get("cost") or {}
    inters = cost.get("intermediates") or []
    hw = getattr(inp.ledger, "hardware", None)
    if not inters or hw is None:
        return np.zeros(len(occ)), ""
    names = k["name"].astype(str)
    role = k["role"].to_numpy(object)
    loc = np.zeros(len(occ))
    for inter in inters:  # a loop over declared intermediates
        t = 2.0 * float(inter.get("bytes", 0)) / hw.hbm_bytes_per_s * 1e9
        prod = per_occurrence(matches(names, role, inter.get("producer", "")), occ, members, "any")
        cons = per_occurrence(matches(names, role, inter.get("consumer", "")), occ, members, "any")
        loc += np.where(prod & cons, t, 0.0)
    return np.minimum(loc, _ledger_locality(inp.ledger, occ)), "declared"


def _ledger_locality(ledger: Ledger, occ: pd.DataFrame) -> np.ndarray:
    parts = ledger.parts[ledger.parts["subcategory"] == "locality_tax"]
    per = parts.groupby(["repetition", "iteration", "rank"])["ns"].sum()
    idx = pd.MultiIndex.from_arrays([occ["repetition"], occ["iteration"], occ["rank"]])
    return per.reindex(idx).fillna(0).to_numpy(np.float64)


#: candidate kinds whose fix makes one kernel of several (their intermediates stay on chip)
FUSING_KINDS = ("chain", "optimizer")
#: the locality source of estimated intermediates (docs/advise.md, "The taxes on a candidate's boundaries")
INTERMEDIATES = "intermediates"


def estimated_intermediates(occ: pd.DataFrame, members: pd.DataFrame, k: pd.DataFrame, inp: Inputs) -> np.ndarray:
    """Per occurrence of a fusing kind (``FUSING_KINDS``), ns of the HBM round trips of the
    intermediates between its consecutive kernels, at most: the tensor one kernel writes and the
    next reads is no larger than the smaller of their compulsory bytes (``floor_bytes``, from the
    ops' shapes), and it costs a write and a read at the HBM bandwidth. NaN for other kinds, and
    where a boundary has a kernel without compulsory bytes (a trace without shapes, our own
    bundles: their intermediates are declared instead)."""
    out = np.full(len(occ), np.nan)
    ev, hw = inp.bundle.events, inp.ledger.hardware
    fusing = members["kind"].isin(FUSING_KINDS).to_numpy()
    if "floor_bytes" not in ev.columns or hw is None or not fusing.any():
        return out
    fb = ev["floor_bytes"].reindex(k["row"]).to_numpy(np.float64)
    fb = np.where(fb >= 0, fb, np.nan)
    m = members[fusing]
    occ_id, pos = m["occ"].to_numpy(np.int64), m["pos"].to_numpy(np.int64)
    order = np.lexsort((k["start"].to_numpy(np.int64)[pos], occ_id))
    occ_id, pos = occ_id[order], pos[order]
    inner = occ_id[1:] == occ_id[:-1]  # boundaries inside an occurrence
    trip = 2.0 * np.fmin(fb[pos[:-1]], fb[pos[1:]])[inner] / hw.hbm_bytes_per_s * 1e9
    trip = np.where(np.isnan(fb[pos[:-1]][inner]) | np.isnan(fb[pos[1:]][inner]), np.nan, trip)
    at = pd.Index(occ["occ"]).get_indexer(occ_id[1:][inner])
    total = np.bincount(at, weights=np.nan_to_num(trip), minlength=len(occ))
    unknown = np.bincount(at, weights=np.isnan(trip), minlength=len(occ)) > 0
    counted = np.bincount(at, minlength=len(occ)) > 0
    return np.where(counted & ~unknown, total, np.nan)


def floor_sum(occ: pd.DataFrame, members: pd.DataFrame, k: pd.DataFrame, costs: pd.DataFrame | None) -> np.ndarray | None:
    """Per occurrence, the sum of its kernels' roofline floors, NaN where one of them has none
    (None without per-kernel floors)."""
    if costs is None or "floor_ns" not in costs:
        return None
    f = costs["floor_ns"].reindex(k["row"]).to_numpy(np.float64)
    unknown = per_occurrence(~np.isfinite(f), occ, members, "any")
    return np.where(unknown, np.nan, per_occurrence(np.nan_to_num(f), occ, members))


# --- the table -------------------------------------------------------------------------------------

def candidates(inp: Inputs) -> pd.DataFrame:
    """Every candidate (one row per kind and kernel sequence), mean ns per rank and iteration of
    the taxes on its boundaries and of the bound on what fusing it recovers; unranked, no model."""
    k = kernel_table(inp)
    members = occurrences(k, _sync_ends(inp))
    if members.empty:
        return pd.DataFrame(columns=["kind", "kernels", "ops", "n_kernels", "per_iteration", "span_ns", "launch_ns",
                                     "locality_ns", "bsp_ns", "bound_ns", "cut", "locality_source", "no_intermediates",
                                     "floors"])
    occ = attribute(occurrence_table(k, members), inp.ledger.intervals)
    loc, loc_source = declared_locality(occ, members, k, inp)
    inter = (estimated_intermediates(occ, members, k, inp) if loc_source != "declared"
             else np.full(len(occ), np.nan))
    has_inter = np.isfinite(inter)
    occ["locality_ns"] = loc + np.nan_to_num(inter)
    occ["locality_source"] = np.where(has_inter, (loc_source + "+" if loc_source else "") + INTERMEDIATES, loc_source)
    occ["no_intermediates"] = occ["kind"].isin(FUSING_KINDS).to_numpy() & ~has_inter & (loc_source != "declared")
    occ["span_ns"] = occ["end"] - occ["start"]
    bound = occ["launch_ns"] + occ["bsp_ns"] + occ["locality_ns"]
    floors = floor_sum(occ, members, k, inp.kernel_costs)
    if floors is not None:
        # a fused kernel no longer moves the intermediates it keeps on chip: its floor is the
        # separate kernels' floors less those round trips
        fused_floor = np.maximum(floors - np.nan_to_num(inter), 0.0)
        bound = np.minimum(bound, np.where(np.isfinite(floors), occ["span_ns"] - fused_floor, bound))
    occ["bound_ns"] = np.maximum(bound, 0)
    n = max(len(inp.ledger.windows) * rank_count(inp.ledger), 1)
    g = occ.groupby(["kind", "kernels"], sort=False)
    out = g.agg(ops=("ops", "first"), n_kernels=("n_kernels", "first"), count=("occ", "size"),
                span_ns=("span_ns", "sum"), launch_ns=("launch_ns", "sum"), locality_ns=("locality_ns", "sum"),
                bsp_ns=("bsp_ns", "sum"), bound_ns=("bound_ns", "sum"), cut=("cut", "max"),
                locality_source=("locality_source", "first"), no_intermediates=("no_intermediates", "any")).reset_index()
    for c in ("span_ns", "launch_ns", "locality_ns", "bsp_ns", "bound_ns"):
        out[c] = out[c] / n
    out["per_iteration"] = out.pop("count") / n
    out["floors"] = floors is not None
    return _drop_duplicates_of_specific(out)


def rank_count(ledger: Ledger) -> int:
    """Ranks the ledger's means are taken over (every rank of the bundle, idle ones included)."""
    ranks = getattr(ledger, "ranks", None) or ledger.parts["rank"].unique()
    return max(len(ranks), 1)


def _drop_duplicates_of_specific(out: pd.DataFrame) -> pd.DataFrame:
    """A run with exactly the kernels of a chain or a collective pair is that candidate: keep the
    specific one (it gets a prediction and names what it is); an optimizer is always specific."""
    specific = set(out.loc[out["kind"] != "run", "kernels"])
    return out[~((out["kind"] == "run") & out["kernels"].isin(specific))].reset_index(drop=True)


def missing_inputs(row: Mapping[str, Any], ledger: Ledger) -> list[str]:
    """What the candidate's numbers could not use (the confidence column's 'missing')."""
    out = []
    if not row["floors"]:
        out.append("per-kernel floors" + (" (memory-bound by kernel name)" if row["kind"] == "chain" else ""))
    if not row["locality_source"]:
        out.append("locality (no counters, no declared intermediates)")
    if len(ledger.windows) < 2:
        out.append("repeats (one iteration: no spread)")
    if row.get("no_intermediates", False):
        out.append("intermediates between its kernels (a kernel without compulsory bytes: no op shapes)")
    if row.get("cut", 0) > 0:
        out.append(f"the rest of the chain (cut at {regions.MAX_CHAIN_KERNELS} kernels; up to {int(row['cut'])} more "
                   "memory-bound kernels followed)")
    if row["launch_ns"] > 0 and profiler_inflated(ledger):
        out.append(PROFILER_NOTE)
    return out


#: how the ledger's caveat reads when the profiler's own options inflated the launch tax
#: (``per_kernel.profiler_caveat``)
PROFILER_CAVEAT_MARK = "may be inflated by the profiler"
PROFILER_NOTE = "the job's own launch tax (profiler-inflated: see the caveat)"


def profiler_inflated(ledger: Ledger) -> bool:
    """Whether the ledger says its launch tax is inflated by the profiler's options."""
    return any(PROFILER_CAVEAT_MARK in c for c in ledger.caveats)


def advise(inp: Inputs, *, top: int | None = 10, hardware: Any = None, predict: bool = True) -> pd.DataFrame:
    """The ranked table of fusion candidates (columns ``COLUMNS``, times in us per iteration and
    rank, % of the mean step): largest bound first, ``top`` rows (None: all)."""
    inp = with_trace_floors(inp)
    c = candidates(inp).sort_values(["bound_ns", "kind"], ascending=[False, True], kind="stable")
    if top is not None:
        c = c.head(int(top))
    window = float(inp.ledger.windows["window_ns"].mean()) if len(inp.ledger.windows) else 0.0
    rows = []
    preds: dict[str, Any] = {}  # one prediction per kind: the shape comes from the bundle, not the kernels
    for r in c.to_dict(orient="records"):  # a loop over the listed candidates
        missing = missing_inputs(r, inp.ledger)
        if r["kind"] not in preds:
            preds[r["kind"]] = (advise_predict.for_candidate(r["kind"], inp.ledger.meta, rank_count(inp.ledger),
                                                             hardware) if predict
                                else advise_predict.NO_PREDICTION)
        pred = preds[r["kind"]]
        if pred.missing:
            missing.append(pred.missing)
        elif pred.model and pred.sign_uncertain:
            missing.append("the saving's sign (the model's error band spans 0)")
        if pred.model and pred.range_borrowed_from:
            missing.append(f"a validation on this GPU (the saving's range is {pred.range_borrowed_from}'s error band)")
        estimated = ((r["locality_source"] == "declared" or INTERMEDIATES in r["locality_source"]) and r["locality_ns"] > 0
                     or bool(pred.model))
        rows.append({
            "kind": r["kind"], "kernels": r["kernels"], "ops": r["ops"], "n_kernels": int(r["n_kernels"]),
            "per_iteration": float(r["per_iteration"]), "span_us": r["span_ns"] / NS_PER_US,
            "launch_tax_us": r["launch_ns"] / NS_PER_US,
            "locality_tax_us": r["locality_ns"] / NS_PER_US if r["locality_source"] else np.nan,
            "bsp_tax_us": r["bsp_ns"] / NS_PER_US, "bound_us": r["bound_ns"] / NS_PER_US,
            "bound_pct": 100.0 * r["bound_ns"] / window if window else np.nan,
            "model": pred.model, "predicted_fused_us": pred.fused_us, "predicted_saving_us": pred.saving_us,
            "predicted_saving_lo_us": pred.saving_lo_us, "predicted_saving_hi_us": pred.saving_hi_us,
            "predicted_pct": 100.0 * pred.saving_us * NS_PER_US / window if window else np.nan,
            "confidence": "estimated" if estimated else "measured", "missing": "; ".join(missing),
        })
    table = pd.DataFrame(rows, columns=list(COLUMNS))
    # what a reader of the table must know from the ledger (renderers print it under the table)
    table.attrs["caveats"] = [c for c in inp.ledger.caveats if PROFILER_CAVEAT_MARK in c or c == CPU_RUN_CAVEAT]
    return table


def with_trace_floors(inp: Inputs) -> Inputs:
    """The per-kernel seam filled from the bundle and its ledger: kernels imported with their op's
    shapes carry flops and compulsory bytes (``ledger/kernel_costs.py``), whose floors then cap the
    bound; a ledger that measured locality from DRAM counters gives each kernel's
    (``Ledger.kernel_locality_ns``, computed once, there). What the caller passed wins."""
    ev = inp.bundle.events
    costs = inp.kernel_costs
    if costs is None and has_kernel_costs(ev):
        gpu = ev[ev["kind"].isin(("kernel", "memcpy", "memset"))]
        floors = kernel_floors(gpu, inp.ledger.hardware)
        costs = floors.loc[floors["costed"], ["floor_ns", "bound"]].reindex(ev.index)
    measured = getattr(inp.ledger, "kernel_locality_ns", None)
    if measured is not None and (costs is None or "locality_ns" not in costs):
        costs = (pd.DataFrame(index=ev.index) if costs is None else costs).assign(locality_ns=measured.reindex(
            costs.index if costs is not None else ev.index))
    return inp if costs is inp.kernel_costs else dataclasses.replace(inp, kernel_costs=costs)
