"""Which PyTorch op launched each GPU kernel of a Kineto trace, and what that op had to do at the
least (``op_costs``): the columns ``op``, ``dtype``, ``flops``, ``floor_bytes`` and ``uncosted``.

The link: kernel -> ``correlation`` -> the runtime launch call (``cudaLaunchKernel``,
``cuLaunchKernel``, ...) -> the innermost ``cpu_op`` on the same thread whose time range
contains the call and that has recorded input shapes (``record_shapes=True``). Kineto nests a
thread's ops properly, so the innermost op containing a time ``t`` is the latest-starting op
whose nesting depth equals the depth at ``t``; both depths come from counts of starts and ends
(searchsorted), with no loop over events.

Several kernels under one op instance (a split-K GEMM and its reduce, a GEMM and its cast)
share the op's flops and bytes in proportion to their durations (in integers that add up to the
op's; ``op_id`` numbers the instance) (copies and memsets are costed
from their own byte count by ``ledger/kernel_costs.py``, for every trace format). NCCL kernels get the bytes their
rank's link carries (``op_costs.collective_bus_bytes``) in ``floor_bytes``. Kernels of a CUDA
graph replay are launched by the one graph launch, not by an op: they stay uncosted (the
capture's shapes are not in a trace of the replay).
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from taxmodel.trace import ints
from taxmodel.trace.op_costs import (OpCall, collective_bus_bytes, collective_bus_bytes_at_least, collective_call, has_shapes,
                                     list_type_from_kernel, op_cost)

OP_COLUMNS = ("op", "dtype", "floor_bytes", "uncosted")
_SHIFT = np.int64(42)


def attach_op_costs(frame: pd.DataFrame, group_size: np.ndarray, gpu_idx: np.ndarray, is_launch: np.ndarray,
                    tid: np.ndarray, ops: list[dict], ops_start: np.ndarray, ops_end: np.ndarray,
                    pg: np.ndarray | None = None, group_sizes: dict | None = None) -> dict:
    """Fill ``op``, ``dtype``, ``flops``, ``floor_bytes`` and ``uncosted`` of the GPU rows of
    ``frame`` (positions ``gpu_idx``; ``group_size`` is each selected trace event's process group
    size (``op_costs.recorded_group_size`` of its args, -1 unknown) in frame order, ``tid`` their thread ids; ``ops``
    the trace's ``cpu_op`` events with their exact start and end in ns; ``pg`` each selected
    event's process group name (None: not recorded) and ``group_sizes`` the sizes of the trace's
    process groups (``process_group_sizes``), for collectives whose own args give no size).
    Returns what the meta should say about the capture (whether shapes
    were recorded, how many kernels were linked to an op)."""
    n = len(frame)
    op_name = np.full(n, "", dtype=object)
    dtype = np.full(n, "", dtype=object)
    flops = np.full(n, -1, np.int64)
    fbytes = np.full(n, -1, np.int64)
    reason = np.full(n, "", dtype=object)
    op_id = np.full(n, -1, np.int64)
    kind = frame["kind"].to_numpy(object)
    corr = frame["correlation"].to_numpy(np.int64)
    start = frame["start_ns"].to_numpy(np.int64)
    end = frame["end_ns"].to_numpy(np.int64)
    gk = gpu_idx[kind[gpu_idx] == "kernel"]
    shaped = np.array([_has_shapes(o) for o in ops], bool)
    sel = shaped if shaped.any() else ops_end > ops_start
    cand = [o for o, keep in zip(ops, sel) if keep]
    c_start, c_end = ops_start[sel], ops_end[sel]

    # launch call -> innermost candidate op on its thread
    launches = np.flatnonzero(is_launch & (corr >= 0))
    op_of_launch = _innermost(c_start, c_end, _tids(cand), tid[launches], start[launches])
    op_of_gpu = _by_correlation(op_of_launch, corr[launches], corr[gk])
    graph = frame["graph_id"].to_numpy(np.int64)[gk] >= 0
    op_of_gpu[graph] = -1
    role = frame["role"].to_numpy(object)[gk]
    comm = role == "comm"
    op_of_gpu[comm] = -1

    # cost per linked op instance (a loop over distinct op signatures, not events)
    linked = np.unique(op_of_gpu[op_of_gpu >= 0])
    list_types = _list_types(op_of_gpu, frame["name"].to_numpy(object)[gk])
    costs = {}
    cache: dict = {}
    for k in linked:
        o = cand[int(k)]
        a = o.get("args") if isinstance(o.get("args"), dict) else {}
        lt = list_types.get(int(k), "")
        sig = (o.get("name"), _key(a.get("Input Dims")), _key(a.get("Input type")), _key(a.get("Concrete Inputs")),
               ints.truncated(a.get("flops")), lt, _key(a.get("Input Strides")))
        if sig not in cache:
            cache[sig] = op_cost(OpCall(str(o.get("name", "")), _list(a.get("Input Dims")), [str(t) for t in _list(a.get("Input type"))],
                                        [str(c) for c in _list(a.get("Concrete Inputs"))], ints.truncated(a.get("flops")), lt,
                                        _list(a.get("Input Strides"))))
        costs[int(k)] = cache[sig]
    has_op = op_of_gpu >= 0
    names = np.array([str(cand[int(k)].get("name", "")) for k in op_of_gpu[has_op]], dtype=object)
    op_name[gk[has_op]] = names
    if has_op.any():
        ok = np.array([costs[int(k)].uncosted == "" for k in op_of_gpu[has_op]], bool)
        f_op = np.array([costs[int(k)].flops for k in op_of_gpu[has_op]], np.float64)
        b_op = np.array([costs[int(k)].bytes for k in op_of_gpu[has_op]], np.float64)
        dur = (end - start)[gk[has_op]].astype(np.float64)
        inst = op_of_gpu[has_op]
        rows = gk[has_op]
        flops[rows] = np.where(ok & (f_op >= 0), split_by_duration(np.maximum(f_op, 0), dur, inst), -1)
        fbytes[rows] = np.where(ok & (b_op >= 0), split_by_duration(np.maximum(b_op, 0), dur, inst), -1)
        op_id[rows] = inst
        dtype[rows] = np.array([costs[int(k)].dtype for k in inst], dtype=object)
        reason[rows] = np.array([costs[int(k)].uncosted for k in inst], dtype=object)
    no_op = ~has_op & ~comm
    if shaped.any() and (no_op & ~graph).any():
        # no op with shapes encloses the launch: name the innermost op anyway (e.g. a foreach op whose
        # long tensor lists the profiler recorded as empty)
        unshaped = ~shaped & (ops_end > ops_start)
        u_idx = np.flatnonzero(unshaped)
        rows = gk[no_op & ~graph]
        li = _by_correlation(launches, corr[launches], corr[rows])
        ok = li >= 0
        u = np.full(len(rows), -1, np.int64)
        u[ok] = _innermost(ops_start[unshaped], ops_end[unshaped], _tids([ops[i] for i in u_idx]), tid[li[ok]], start[li[ok]])
        got = u >= 0
        op_name[rows[got]] = [str(ops[int(u_idx[j])].get("name", "")) for j in u[got]]
        reason[rows[got]] = "its op recorded no input shapes"
        named = rows[got]
    else:
        named = np.zeros(0, np.int64)
    reason[gk[no_op & graph]] = "CUDA graph replay (the capture's shapes are not in the trace)"
    rest = ~np.isin(gk[no_op & ~graph], named)
    reason[gk[no_op & ~graph][rest]] = ("no CPU ops in the trace (capture with ProfilerActivity.CPU and record_shapes=True)"
                                        if not ops else "no op recorded its shapes (capture with record_shapes=True)"
                                        if not shaped.any() else "no enclosing op with shapes")
    # collectives: the bytes the rank's link carries, from the kernel's own metadata, else from the op
    # that launched it (record_param_comms / c10d::... on the launch's thread); a group size that
    # neither records is taken as 2, the fewest bytes any group carries (a lower bound)
    without_group = 0
    if comm.any():
        rows = gk[comm]
        msg = frame["bytes"].to_numpy(np.int64)[rows].copy()
        group = group_size[rows]
        need = (msg < 0) | (group < 0)
        if need.any():
            op_msg, op_group, op_names = _launching_collective(rows[need], corr, is_launch, tid, start, ops, ops_start, ops_end)
            msg[need] = np.where(msg[need] < 0, op_msg, msg[need])
            group[need] = np.where(group[need] < 0, op_group, group[need])
            op_name[rows[need]] = np.where(op_names != "", op_names, op_name[rows[need]])
            frame.iloc[rows, frame.columns.get_loc("bytes")] = msg
        if group_sizes and pg is not None and (group <= 0).any():  # the trace's process groups (distributedInfo.pg_config)
            known = np.array([group_sizes.get(p, -1) for p in pg[rows]], np.int64)
            group = np.where(group > 0, group, known)
        cop = frame["collective_op"].to_numpy(object)[rows]
        bus = np.array([collective_bus_bytes(str(o), int(m), int(g)) if g > 0 else collective_bus_bytes_at_least(str(o), int(m))
                        for o, m, g in zip(cop, msg, group)], np.int64)
        without_group = int(((group <= 0) & (bus >= 0)).sum())
        fbytes[rows] = bus
        reason[rows] = np.where(bus >= 0, "", "collective size not recorded (neither the kernel nor the op that launched it "
                                              "carries a message size; PyTorch records one from 1.13 on)")
    frame["op"] = op_name
    frame["dtype"] = dtype
    frame["flops"] = flops
    frame["floor_bytes"] = fbytes
    frame["uncosted"] = reason
    frame["op_id"] = op_id
    return {"record_shapes": bool(shaped.any()), "ops_linked": int(has_op.sum()), "collectives_without_group": without_group}


_COLLECTIVE_OP = re.compile(r"(?i)^(?:record_param_comms|c10d::|nccl:|gloo:|rccl:)")


def _launching_collective(rows: np.ndarray, corr: np.ndarray, is_launch: np.ndarray, tid: np.ndarray, start: np.ndarray,
                          ops: list[dict], ops_start: np.ndarray, ops_end: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(message bytes, group size, op name) that the innermost collective op (``record_param_comms``,
    ``c10d::allreduce_``, ...) around each comm kernel's launch call recorded (``op_costs.collective_call``);
    -1 / -1 / "" where none did."""
    n = len(rows)
    msg, group, names = np.full(n, -1, np.int64), np.full(n, -1, np.int64), np.full(n, "", dtype=object)
    cand = [i for i, o in enumerate(ops) if type(o.get("name")) is str and _COLLECTIVE_OP.search(o["name"])
            and isinstance(o.get("args"), dict)]
    calls = [collective_call(ops[i]["args"]) for i in cand]
    keep = [k for k, (m, g) in enumerate(calls) if m > 0 or g > 0]
    if not keep or not n:
        return msg, group, names
    idx = np.asarray([cand[k] for k in keep], np.int64)
    launches = np.flatnonzero(is_launch & (corr >= 0))
    li = _by_correlation(launches, corr[launches], corr[rows])
    ok = li >= 0
    inner = np.full(n, -1, np.int64)
    inner[ok] = _innermost(ops_start[idx], ops_end[idx], _tids([ops[i] for i in idx]), tid[li[ok]], start[li[ok]])
    got = inner >= 0
    picked = [calls[keep[int(j)]] for j in inner[got]]
    msg[got] = [m for m, _ in picked]
    group[got] = [g for _, g in picked]
    names[got] = [str(ops[int(idx[int(j)])]["name"]) for j in inner[got]]
    return msg, group, names


def split_by_duration(total: np.ndarray, dur: np.ndarray, inst: np.ndarray) -> np.ndarray:
    """Each op instance's ``total`` (the same on each of its kernels) split over its kernels in
    proportion to their durations (equally when they all lasted 0), in integers that add up to
    the total exactly (largest remainders): the kernels of one call of an op carry its work
    between them, whatever their timings."""
    if not len(total):
        return np.zeros(0, np.int64)
    tot = pd.Series(dur).groupby(inst).transform("sum").to_numpy(np.float64)
    count = pd.Series(dur).groupby(inst).transform("size").to_numpy(np.float64)
    share = np.where(tot > 0, dur / np.where(tot > 0, tot, 1.0), 1.0 / count)
    raw = np.round(total).astype(np.float64) * share
    base = np.floor(raw)
    short = np.round(total) - pd.Series(base).groupby(inst).transform("sum").to_numpy(np.float64)
    order = pd.Series(raw - base).groupby(inst).rank(method="first", ascending=False).to_numpy(np.float64) - 1
    return (base + (order < short)).astype(np.int64)


def _list_types(op_of_gpu: np.ndarray, names: np.ndarray) -> dict[int, str]:
    """Per op instance, the element type its kernels' names state (``list_type_from_kernel``),
    when all its kernels agree; the tensor-list ops' only source of a dtype."""
    has = op_of_gpu >= 0
    if not has.any():
        return {}
    codes, uniq = pd.factorize(pd.Series(names[has], dtype=object))
    per_name = np.array([list_type_from_kernel(str(u)) for u in uniq], dtype=object)  # per distinct name
    df = pd.DataFrame({"inst": op_of_gpu[has], "t": per_name[codes]})
    df = df[df["t"] != ""]
    agree = df.groupby("inst")["t"].agg(lambda s: s.iloc[0] if s.nunique() == 1 else "")
    return {int(k): str(v) for k, v in agree.items() if v}


def _has_shapes(o: dict) -> bool:
    a = o.get("args")
    return isinstance(a, dict) and has_shapes(a.get("Input Dims"), a.get("Input type"))


def _list(v) -> list:
    return v if isinstance(v, list) else []


def _key(v) -> str:
    return repr(v) if v is not None else ""  # a cache key for an op's recorded arguments


def _tids(ops: list[dict]) -> np.ndarray:
    """The thread id of each op (-1 where it records none)."""
    return np.array([-1 if (v := ints.truncated(o.get("tid"))) is None else v for o in ops], np.int64)


def _by_correlation(values: np.ndarray, keys: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """For each correlation id of ``wanted``: the value of ``values`` at the first of ``keys`` equal
    to it, else -1 (a writable array)."""
    first = pd.Series(values, index=keys)
    first = first[~first.index.duplicated()]
    return first.reindex(wanted).fillna(-1).to_numpy(np.int64, copy=True)  # pandas 3 hands out read-only views


def _innermost(s: np.ndarray, e: np.ndarray, otid: np.ndarray, tid: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Index of the innermost op (ranges ``[s, e]`` on threads ``otid``) on thread ``tid[i]``
    whose range contains ``t[i]`` (-1 where none does)."""
    out = np.full(len(t), -1, np.int64)
    nops = len(s)
    if not nops or not len(t):
        return out
    d = e - s
    codes, _ = pd.factorize(np.concatenate([otid, tid]))
    oc, tc = codes[:nops].astype(np.int64), codes[nops:].astype(np.int64)
    base = min(int(s.min()), int(t.min()))
    rs, re_, rt = s - base, e - base, t - base
    # ops ordered by (thread, start, longer first): a parent precedes a child that starts with it
    order = np.lexsort((-d, rs, oc))
    skey = (oc[order] << _SHIFT) + rs[order]
    ekey = np.sort((oc << _SHIFT) + re_)
    first = np.searchsorted(skey, oc[order] << _SHIFT, side="left")
    pos = np.arange(len(order))
    depth_sorted = (pos - first + 1) - (np.searchsorted(ekey, skey, side="right") - np.searchsorted(ekey, oc[order] << _SHIFT, side="left"))
    depth = np.empty(nops, np.int64)
    depth[order] = depth_sorted
    tkey = (tc << _SHIFT) + rt
    t_depth = (np.searchsorted(skey, tkey, side="right") - np.searchsorted(skey, tc << _SHIFT, side="left")) - \
              (np.searchsorted(ekey, tkey, side="right") - np.searchsorted(ekey, tc << _SHIFT, side="left"))
    # latest op with (thread, depth) == (thread, depth at t) and start <= t
    all_depth = np.concatenate([depth, t_depth])
    dmin = int(all_depth.min())
    span = int(all_depth.max()) - dmin + 1
    gcodes, _ = pd.factorize(np.concatenate([oc, tc]) * span + (all_depth - dmin))  # one int per (thread, depth)
    og, tg = gcodes[:nops].astype(np.int64), gcodes[nops:].astype(np.int64)
    order2 = np.lexsort((np.arange(nops), rs, og))
    gkey = (og[order2] << _SHIFT) + rs[order2]
    j = np.searchsorted(gkey, (tg << _SHIFT) + rt, side="right") - 1
    jj = np.maximum(j, 0)
    cand = order2[jj]
    ok = (j >= 0) & (og[cand] == tg) & (rs[cand] <= rt) & (re_[cand] >= rt) & (t_depth > 0)
    out[ok] = cand[ok]
    return out


# --- what the capture recorded ------------------------------------------------------------------

_OPTIONS = ("record_shapes", "with_stack", "with_flops", "profile_memory")


class EventFlags:
    """What ``profiler_options`` reads off the events, gathered one event at a time (``see``)
    while a trace streams by: python stack events, memory events, the profiler's overhead."""

    def __init__(self) -> None:
        self.with_stack = False
        self.profile_memory = False
        self.overhead_ns = 0

    def see(self, e: dict) -> None:
        cat = e.get("cat")
        if cat == "python_function":
            self.with_stack = True
        elif cat == "overhead" and e.get("ph") == "X":
            self.overhead_ns += (ints.truncated(e.get("dur")) or 0) * 1000
        if e.get("name") == "[memory]":
            self.profile_memory = True


def profiler_options(top: dict, flags: EventFlags, ops: list[dict], linked: dict) -> dict:
    """The torch.profiler options this trace was captured with: Kineto writes them at the top
    level (``top``: the document's keys but its events) in recent versions; otherwise they are
    read off the events (shapes, python stack events, flops, memory events: ``flags``).
    ``overhead_ns``: the profiler's own ``overhead`` events."""
    opts: dict = {}
    for key in _OPTIONS:
        v = top.get(key)
        if v is not None:
            opts[key] = bool(ints.truncated(v)) if not isinstance(v, bool) else v
    if "record_shapes" not in opts:
        opts["record_shapes"] = bool(linked.get("record_shapes"))
    if "with_stack" not in opts:
        opts["with_stack"] = flags.with_stack
    if "with_flops" not in opts:
        opts["with_flops"] = any(isinstance(o.get("args"), dict) and "flops" in o["args"] for o in ops)
    if "profile_memory" not in opts:
        opts["profile_memory"] = flags.profile_memory
    opts["overhead_ns"] = int(flags.overhead_ns)
    opts["cpu_ops"] = len(ops)
    opts["kernels_linked_to_ops"] = int(linked.get("ops_linked", 0))
    return opts


def merge_profiler_options(per_rank: list[dict]) -> dict:
    """One description for all ranks: an option is on when any rank's trace had it on."""
    if not per_rank:
        return {}
    out = {k: any(p.get(k) for p in per_rank) for k in _OPTIONS}
    out["overhead_ns"] = int(sum(p.get("overhead_ns", 0) for p in per_rank))
    out["cpu_ops"] = int(sum(p.get("cpu_ops", 0) for p in per_rank))
    out["kernels_linked_to_ops"] = int(sum(p.get("kernels_linked_to_ops", 0) for p in per_rank))
    return out


def clock_domain(hosts: list[dict], ranks: list[int] | None = None) -> dict:
    """Whether the ranks' traces share one clock (one host), and with ``ranks`` (one per entry of
    ``hosts``) which rank ran on which named host when there are several. Evidence, first that applies:
    every trace names the same ``host_name`` (one host) or different ones (several); without
    names, one host is inferred when all traces share Kineto's ``baseTimeNanoseconds``, their
    processes and GPUs are all distinct and there are no more ranks than GPUs per host."""
    if len(hosts) < 2:
        return {"shared": True, "evidence": "one trace"}
    names = [h.get("host_name") for h in hosts]
    if all(names):
        if len(set(names)) == 1:
            return {"shared": True, "evidence": f"every trace was recorded on host {names[0]!r}"}
        out = {"shared": False, "evidence": f"traces come from {len(set(names))} hosts", "hosts": sorted(set(names))}
        if ranks is not None and len(ranks) == len(names):  # ranks of one host share its clock (ledger/clock.py)
            out["host_of_rank"] = {str(r): n for r, n in zip(ranks, names)}
        return out
    bases = {h.get("base_time_ns") for h in hosts}
    pids = [p for h in hosts for p in h.get("pids") or []]
    devices = [d for h in hosts for d in h.get("devices") or []]
    per_host = {h.get("devices_per_host") for h in hosts}
    if (len(bases) == 1 and None not in bases and len(pids) == len(set(pids)) and pids
            and len(devices) == len(set(devices)) == len(hosts) and len(per_host) == 1 and None not in per_host
            and len(hosts) <= next(iter(per_host))):
        return {"shared": True, "evidence": "inferred: same Kineto base time, distinct processes and distinct GPUs "
                                            "of one machine's device table"}
    return {"shared": None, "evidence": "not known (no host names in the traces)"}


def process_group_sizes(dist: dict) -> dict:
    """Process group name -> size from ``distributedInfo.pg_config`` (PyTorch 2.1+), with key None
    for the group a collective without a group name ran in when the trace has only one."""
    out: dict = {}
    for pg in dist.get("pg_config") or [] if isinstance(dist.get("pg_config"), list) else []:
        if isinstance(pg, dict):
            size = ints.truncated(pg.get("pg_size"))
            if size is None and isinstance(pg.get("ranks"), list):
                size = len(pg["ranks"])
            if size and size > 0:
                out[str(pg.get("pg_name"))] = size
    if len(out) == 1:
        out[None] = next(iter(out.values()))
    return out
