"""Where a fusion candidate may end: the structure a trace gives each kernel beyond its stream.

A training step launches hundreds of kernels between two host synchronizations, so "consecutive
kernels on one stream" alone makes one candidate of the whole step and a GEMM's "epilogue" of
the rest of backward plus the optimizer. Fusing across these lines is not what anyone can do, so
candidates stop at them (docs/advise.md, "Where candidates end"):

- the **host thread** that launched the kernel: PyTorch's autograd engine launches backward from
  its own thread, so a change of launching thread is the forward/backward boundary;
- the **step annotation** around the launch call: the innermost ``record_function`` range named
  like a phase of the step (``Optimizer.step#AdamW.step``, ``Optimizer.zero_grad#...``,
  ``## forward ##``); iteration markers and other annotations do not count.

The kernels of an ``Optimizer.step`` annotation that runs a multi-tensor (foreach) kernel are an
``optimizer`` candidate of their own: one fused optimizer kernel per parameter group replaces
them (``fused=True``). A trace without optimizer annotations gets the candidate from
consecutive multi-tensor kernels instead.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from taxmodel.trace.bundle import Bundle

#: record_function ranges that are phases of a training step (a candidate never crosses one)
STEP_SCOPE_PATTERN = r"^(?:Optimizer\.(?:step|zero_grad)#|##.*##$)"
#: the optimizer's own step (what ``fused=True`` replaces)
OPTIMIZER_SCOPE_PATTERN = r"^Optimizer\.step#"
#: kernels of a foreach / multi-tensor optimizer (PyTorch's ``multi_tensor_apply_kernel``, Apex's)
MULTI_TENSOR_PATTERN = r"(?i)multi_tensor_apply|foreach"
#: A chain holds at most this many kernels: a GEMM epilogue or one generated pointwise/reduction
#: kernel takes a handful of ops; longer sequences between two GEMMs (a backward layer's gradient
#: accumulations) are cut here, and the candidate says so.
MAX_CHAIN_KERNELS = 8
NO_THREAD = -1


def kernel_regions(bundle: Bundle, rows: np.ndarray) -> pd.DataFrame:
    """For the GPU rows ``rows`` (index labels of ``bundle.events``): ``thread``, the host thread
    of the launch call (``NO_THREAD`` without one: graph replays, traces without launch rows), and
    ``scope``, the name of the innermost step annotation around that call ("" outside any)."""
    ev = bundle.events
    k = ev.loc[rows, ["rank", "correlation"]]
    launch = ev[(ev["kind"] == "launch") & (ev["correlation"] >= 0)]
    launch = launch.drop_duplicates(["rank", "correlation"])[["rank", "correlation", "stream", "start_ns"]]
    linked = k.reset_index(drop=True).merge(launch, on=["rank", "correlation"], how="left")
    thread = linked["stream"].fillna(NO_THREAD).to_numpy(np.int64)
    t = linked["start_ns"].to_numpy(np.float64)
    scope = np.full(len(rows), "", dtype=object)
    marks = ev[(ev["kind"] == "marker") & ev["name"].astype(str).str.match(STEP_SCOPE_PATTERN)]
    rank = k["rank"].to_numpy(np.int64)
    for r in np.unique(marks["rank"].to_numpy(np.int64)):  # a loop over ranks
        m = marks[marks["rank"] == r].sort_values("start_ns")
        q = np.flatnonzero((rank == r) & np.isfinite(t))
        # step annotations follow one another: the last one that started before the call holds it
        # when it has not ended yet
        j = np.searchsorted(m["start_ns"].to_numpy(np.float64), t[q], side="right") - 1
        inside = (j >= 0) & (t[q] <= m["end_ns"].to_numpy(np.float64)[np.maximum(j, 0)])
        scope[q[inside]] = m["name"].astype(str).to_numpy(object)[j[inside]]
    return pd.DataFrame({"thread": thread, "scope": scope}, index=rows)


def region_breaks(k: pd.DataFrame) -> np.ndarray:
    """Per kernel of ``k`` (sorted as ``advise.kernel_table`` sorts): whether its launching thread
    or step annotation differs from the previous kernel's (a run or chain must end before it)."""
    if not len(k):
        return np.zeros(0, bool)
    thread = k["thread"].to_numpy(np.int64)
    scope = k["scope"].to_numpy(object)
    return np.r_[False, (thread[1:] != thread[:-1]) | (scope[1:] != scope[:-1])]


def cap_chains(chain: np.ndarray, limit: int = MAX_CHAIN_KERNELS) -> tuple[np.ndarray, np.ndarray]:
    """``chain`` ids (-1 outside chains, members consecutive) with members past the first
    ``limit`` of each chain set to -1; and, per kernel, how many members its chain lost (0 for
    kernels outside chains and chains within the limit)."""
    n = len(chain)
    if not n:
        return chain, np.zeros(0, np.int64)
    in_chain = chain >= 0
    first = np.r_[True, chain[1:] != chain[:-1]]
    start = np.maximum.accumulate(np.where(first, np.arange(n), 0))
    pos = np.arange(n) - start
    size = np.zeros(int(chain.max()) + 1 if in_chain.any() else 0, np.int64)
    np.add.at(size, chain[in_chain], 1)
    lost = np.where(in_chain, np.maximum(size[np.maximum(chain, 0)] - limit, 0), 0) if len(size) else np.zeros(n, np.int64)
    return np.where(in_chain & (pos >= limit), -1, chain), np.where(in_chain & (pos < limit), lost, 0)


def optimizer_groups(k: pd.DataFrame, run: np.ndarray) -> np.ndarray:
    """Optimizer group id per kernel (-1 outside): the kernels of one run launched inside an
    ``Optimizer.step`` annotation, when one of them is a multi-tensor kernel; without such
    annotations in the trace, consecutive multi-tensor kernels of one run."""
    n = len(k)
    if not n:
        return np.zeros(0, np.int64)
    multi = k["name"].astype(str).str.contains(MULTI_TENSOR_PATTERN, regex=True).to_numpy(bool)
    in_step = k["scope"].astype(str).str.match(OPTIMIZER_SCOPE_PATTERN).to_numpy(bool)
    member = in_step if in_step.any() else multi
    new = np.r_[True, (run[1:] != run[:-1]) | (member[1:] != member[:-1])]
    grp = np.cumsum(new) - 1
    ng = int(grp.max()) + 1
    count = np.bincount(grp, weights=member, minlength=ng)
    has_multi = np.bincount(grp, weights=multi & member, minlength=ng) > 0
    ok = (count >= 2) & has_multi
    return np.where(member & ok[grp], grp, -1)
