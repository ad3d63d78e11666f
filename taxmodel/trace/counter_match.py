"""Attach per-kernel hardware counters (``ncu.read_counters``) to a bundle's kernels.

Why strict: a counter row set on the wrong kernel makes a measured locality tax that is simply
false. Counters are matched to kernels by order and name per (rank, device), and anything that
does not line up is refused with the first mismatch; nothing is attached partially.

Names: ncu and the tracers spell one kernel differently (ncu: ``void at::<unnamed>::f<T>(T2 *)``,
Kineto: ``void at::native::(anonymous namespace)::f<float>(float*)``: namespaces dropped,
template parameters instead of types, ``1`` for ``true``), so two names match when their
*function names* agree (the identifier before the template arguments and parameter list,
without namespaces), and the launch configuration agrees where both sides record it (grid and
block dimensions, which ncu and the tracers report exactly).

Which kernels: ``C`` counter rows of one (rank, device) against that rank's kernels in start
order, tried in this order:

1. ``all``: C equals the rank's kernel count: row k is kernel k.
2. ``steps``: C equals the count of kernels inside iterations (``iteration >= 0``): the
   counters cover exactly the traced steps.
3. ``per_step``: C equals the kernels of one step, and every step (repetition, iteration) has
   that many kernels with matching names: the one profiled step's counters stand for every
   step (kernels outside steps stay unmeasured). This is how ``taxmodel profile --counters``
   measures (one step under ncu, replayed kernel by kernel).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from taxmodel.errors import InputError

COUNTER_COLUMNS = ("dram_read_bytes", "dram_write_bytes", "l2_hit_pct_x100")
"""The event columns this module fills (-1 where not measured)."""

_ANON = re.compile(r"\(anonymous namespace\)|<unnamed>|\{anonymous\}")


def function_name(name: str) -> str:
    """The kernel's function name, without return type, namespaces, template arguments or
    parameters: what ncu and the tracers agree on (``void at::native::f<4>(int)`` -> ``f``)."""
    s = _ANON.sub("anon", str(name).strip())
    if s.startswith("void "):
        s = s[5:]
    cut = min((i for i in (s.find("<"), s.find("(")) if i >= 0), default=len(s))
    head = s[:cut].strip()
    return head.rsplit("::", 1)[-1].strip() if head else s


def _dims(text: pd.Series) -> pd.Series:
    """Grid/block dims as 'x,y,z' from '(512, 1, 1)' or '512,1,1'; '' when absent."""
    return text.astype(str).str.replace(r"[()\s\[\]]", "", regex=True)


@dataclass(frozen=True)
class MatchReport:
    mode: str  # all | steps | per_step (same for every group)
    kernels: int  # kernels given counters
    counter_rows: int
    groups: int


def attach_counters(events: pd.DataFrame, counters: pd.DataFrame, *, source: str = "counters") -> tuple[pd.DataFrame, MatchReport]:
    """``events`` with the counter columns filled from ``counters``; InputError naming the first
    mismatch (and nothing changed) when they do not line up."""
    pairs = _groups(events, counters, source)
    out = events.copy()
    for col in COUNTER_COLUMNS:
        if col not in out.columns:
            out[col] = np.full(len(out), -1, dtype="int32" if col == "l2_hit_pct_x100" else "int64")
    modes, total = set(), 0
    for (rank, device), kidx, crows in pairs:
        mode, target, source_rows = _match(events, kidx, crows, rank, device, source)
        modes.add(mode)
        total += len(target)
        out.loc[target, "dram_read_bytes"] = source_rows["dram_read_bytes"].to_numpy()
        out.loc[target, "dram_write_bytes"] = source_rows["dram_write_bytes"].to_numpy()
        hit = source_rows["l2_hit_pct"].to_numpy(dtype=float)
        out.loc[target, "l2_hit_pct_x100"] = np.where(np.isfinite(hit), np.round(hit * 100), -1).astype(out["l2_hit_pct_x100"].dtype)
    report = MatchReport(mode="/".join(sorted(modes)), kernels=total, counter_rows=len(counters), groups=len(pairs))
    return out, report


def attach_counters_file(events: pd.DataFrame, meta: dict, path: str | Path) -> tuple[pd.DataFrame, dict]:
    """``attach_counters`` with the counters read from an ncu export; meta gains ``counters``."""
    from taxmodel.trace.ncu import read_counters

    out, report = attach_counters(events, read_counters(path), source=str(path))
    meta = dict(meta)
    meta["counters"] = {"source": "ncu", "file": Path(path).name, "match": report.mode,
                        "kernels_with_counters": report.kernels, "counter_rows": report.counter_rows}
    return out, meta


def _groups(events: pd.DataFrame, counters: pd.DataFrame, source: str):
    """[((rank, device), kernel row index in start order, counter rows)] pairing the bundle's
    (rank, device) groups with the counters' (process, device) groups."""
    kern = events[events["kind"] == "kernel"].sort_values(["rank", "start_ns", "end_ns"], kind="stable")
    if kern.empty:
        raise InputError(f"{source}: the bundle has no kernels to attach counters to")
    bundle_groups = {key: g.index.to_numpy() for key, g in kern.groupby(["rank", "device"], sort=True)}
    counter_groups = {key: g for key, g in counters.groupby(["process_id", "device"], sort=True)}
    if len(bundle_groups) == 1 and len(counter_groups) == 1:
        return [(next(iter(bundle_groups)), next(iter(bundle_groups.values())), next(iter(counter_groups.values())))]
    b_dev = [d for _, d in bundle_groups]
    c_dev = [d for _, d in counter_groups]
    if len(set(b_dev)) == len(b_dev) and sorted(b_dev) == sorted(c_dev):
        by_dev = {d: g for (_, d), g in counter_groups.items()}
        return [(key, idx, by_dev[key[1]]) for key, idx in bundle_groups.items()]
    raise InputError(f"{source}: cannot pair the counters' {len(counter_groups)} (process, device) group(s) "
                     f"(devices {sorted(set(c_dev))}) with the bundle's {len(bundle_groups)} (rank, device) group(s) "
                     f"(devices {sorted(set(b_dev))}); give counters of the same run, one GPU per rank")


def _match(events: pd.DataFrame, kidx: np.ndarray, crows: pd.DataFrame, rank: int, device: int, source: str):
    """(mode, event index to fill, counter rows in the same order) for one (rank, device)."""
    crows = crows.sort_values("kernel_id", kind="stable")
    kern = events.loc[kidx]
    where = f"{source}: rank {rank} device {device}"
    n = len(crows)
    if n == len(kern):
        _check_names(kern, crows, where, "kernel")
        return "all", kidx, crows
    inside = kern[kern["iteration"] >= 0]
    if n == len(inside):
        _check_names(inside, crows, where, "kernel inside the steps")
        return "steps", inside.index.to_numpy(), crows
    steps = inside.groupby(["repetition", "iteration"], sort=True)
    sizes = steps.size()
    if len(sizes) and (sizes == n).all():
        order = []
        for (rep, it), step in steps:
            _check_names(step, crows, where, f"kernel of step {it} (repetition {rep})")
            order.append(step.index.to_numpy())
        target = np.concatenate(order)
        return "per_step", target, pd.concat([crows] * len(order), ignore_index=True)
    per_step = (f"{sizes.min()}-{sizes.max()} per step" if sizes.min() != sizes.max() else f"{sizes.iloc[0]} per step") \
        if len(sizes) else "no steps"
    first = _first_mismatch(kern, crows)
    raise InputError(f"{where}: {n} kernels in the counters, the bundle has {len(kern)} "
                     f"({len(inside)} inside steps, {per_step}): not the same run{first}; "
                     "profile the same program and steps under ncu (see the README's 'measured DRAM bytes')")


def _check_names(kern: pd.DataFrame, crows: pd.DataFrame, where: str, what: str) -> None:
    mismatch = _mismatches(kern, crows)
    if mismatch is not None:
        k, why = mismatch
        raise InputError(f"{where}: {what} {k} differs: bundle {kern['name'].iloc[k][:90]!r} vs counters "
                         f"{crows['name'].iloc[k][:90]!r} ({why}); the counters are from another run or other steps")


def _mismatches(kern: pd.DataFrame, crows: pd.DataFrame) -> tuple[int, str] | None:
    """(position, reason) of the first kernel whose function name or launch dims differ, or None."""
    n = min(len(kern), len(crows))
    a = kern["name"].iloc[:n].map(function_name).to_numpy()
    b = crows["name"].iloc[:n].map(function_name).to_numpy()
    bad = a != b
    reason = np.where(bad, "function name", "")
    for col in ("grid", "block"):
        if col in kern.columns and col in crows.columns:
            x, y = _dims(kern[col].iloc[:n]).to_numpy(), _dims(crows[col].iloc[:n]).to_numpy()
            dim_bad = (x != y) & (x != "") & (y != "")
            reason = np.where(~bad & dim_bad, f"{col} dims", reason)
            bad = bad | dim_bad
    if not bad.any():
        return None
    k = int(np.argmax(bad))
    return k, str(reason[k])


def _first_mismatch(kern: pd.DataFrame, crows: pd.DataFrame) -> str:
    m = _mismatches(kern, crows)
    if m is None:
        return ""
    k, why = m
    return f"; the first difference is kernel {k}: bundle {kern['name'].iloc[k][:70]!r} vs counters {crows['name'].iloc[k][:70]!r} ({why})"
