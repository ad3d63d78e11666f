"""The ledger's per-kernel parts (docs/ledger.md, "Per-kernel floors" and "Locality"): the
floors of a bundle that declares no workload cost, the locality tax from measured DRAM bytes,
the per-kernel table, what could not be costed, kernels faster than their floor, the
profiler's own overhead, and a label from the job.

``compute_ledger`` calls ``prepare`` once per bundle; everything here is vectorized over GPU
rows (loops run over the few distinct kernel names or dtypes only).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd

from taxmodel.hardware.specs import HardwareSpec
from taxmodel.ledger.kernel_costs import BASIS_EAGER_STEP, BASIS_LAUNCH_GRID, NO_COST, copy_bytes, kernel_floors

#: how a bundle's locality tax was obtained
LOCALITY_MEASURED, LOCALITY_ESTIMATED, LOCALITY_ABSENT = "measured", "estimated", "not measured"
#: torch.profiler options that add host work to every op (shapes, stacks, memory events, flop counts)
HEAVY_PROFILER_OPTIONS = ("record_shapes", "with_stack", "profile_memory", "with_flops")
#: a kernel counts as faster than its floor below this fraction of it (timer granularity aside)
FASTER_THAN_FLOOR = 0.98
#: a copy from or to pageable host memory, as Kineto and Nsight Systems name it ("Memcpy HtoD (Pageable -> Device)")
PAGEABLE = r"^Mem(?:cpy|set)\b.*\bPageable\b"


@dataclass
class KernelCosts:
    """Per GPU row (positions of the ledger's ``gpu`` frame): the floor in ns (NaN uncosted;
    collectives carry their link floor), the measured DRAM bytes (NaN unmeasured), the
    compulsory bytes, whether per-kernel floors replace a workload cost, and the locality mode."""

    floors: pd.DataFrame
    dram_bytes: np.ndarray
    compulsory: np.ndarray
    use_floors: bool
    locality: str
    hbm_bytes_per_s: float

    @property
    def floor_ns(self) -> np.ndarray:
        return self.floors["floor_ns"].to_numpy(np.float64)

    def measured_locality(self, useful: np.ndarray, headroom: np.ndarray, rows: np.ndarray,
                          compulsory: np.ndarray | None = None) -> np.ndarray:
        """Locality tax of ``rows`` (mask) that have a floor (finite compulsory bytes): the time
        their measured DRAM traffic takes at the HBM bandwidth beyond their ``useful`` floor, at
        most the kernel's time left after useful (``headroom``). The roofline with the traffic
        the kernel really moved, minus the roofline with its compulsory traffic: for a
        memory-bound kernel the traffic beyond compulsory, for a compute-bound one only what no
        longer hides under its compute (docs/ledger.md 5b)."""
        comp = self.compulsory if compulsory is None else compulsory
        ok = rows & np.isfinite(self.dram_bytes) & np.isfinite(comp)
        t = np.zeros(len(headroom))
        beyond = np.maximum(np.where(ok, self.dram_bytes / self.hbm_bytes_per_s * 1e9 - useful, 0.0), 0.0)
        t[ok] = np.minimum(beyond[ok], np.maximum(headroom[ok], 0.0))
        return t


def prepare(gpu: pd.DataFrame, hw: HardwareSpec | None, cost: Mapping[str, Any] | None,
            measured_anywhere: bool | None = None) -> KernelCosts | None:
    """Per-kernel costs of the bundle's GPU rows; None for a bundle that declares a workload cost
    and has no measured DRAM bytes (taxmodel's own bundles: the workload's cost alone applies).
    A bundle without a declared cost always gets per-kernel floors, whatever its format: what
    its importer could not cost is shown as uncosted. ``measured_anywhere``: whether any rank of
    the bundle has measured DRAM bytes, when ``gpu`` holds one rank's rows (the ledger's
    per-rank phase); None: look at ``gpu``."""
    measured = measured_bytes(gpu)
    any_measured = bool(np.isfinite(measured).any()) if measured_anywhere is None else measured_anywhere
    if cost and not any_measured:
        return None
    floors = kernel_floors(gpu, hw)
    fb = copy_bytes(gpu, gpu["floor_bytes"].to_numpy(np.float64) if "floor_bytes" in gpu.columns else np.full(len(gpu), -1.0))
    compulsory = np.where(fb >= 0, fb, np.nan)
    mode = LOCALITY_MEASURED if any_measured else (LOCALITY_ESTIMATED if cost else LOCALITY_ABSENT)
    return KernelCosts(floors, measured, compulsory, use_floors=not cost and hw is not None, locality=mode,
                       hbm_bytes_per_s=hw.hbm_bytes_per_s if hw is not None else 0.0)


def locality_mode(kc: KernelCosts | None, cost: Mapping[str, Any] | None) -> str:
    """measured (DRAM counters), estimated (a declared workload cost: its intermediates, or none
    declared), or not measured (a foreign trace without counters)."""
    if kc is not None:
        return kc.locality
    return LOCALITY_ESTIMATED if cost else LOCALITY_ABSENT


def declared_compulsory(gpu: pd.DataFrame, cost: Mapping[str, Any], work: np.ndarray, gid: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Compulsory bytes per kernel of a bundle with a declared cost: its ``hbm_bytes`` spread over
    the rank-iteration's work kernels in proportion to their durations (NaN elsewhere)."""
    out = np.full(len(gpu), np.nan)
    rows = work & (gid >= 0)
    if not rows.any():
        return out
    tot = np.bincount(gid[rows], weights=d[rows], minlength=int(gid.max()) + 1)
    share = d[rows] / np.where(tot[gid[rows]] > 0, tot[gid[rows]], 1.0)
    out[rows] = float(cost.get("hbm_bytes", 0)) * share
    return out


def link_floor_excess(kc: KernelCosts, gpu_idx: np.ndarray, group: np.ndarray, is_comm: np.ndarray, is_local: np.ndarray,
                      weight: np.ndarray, ngroups: int) -> np.ndarray:
    """Per (window, rank): how much the collectives' link floors exceed the local kernels'
    floors (docs/ledger.md 6, per kernel): the part of communication no overlap could hide."""
    f = np.nan_to_num(kc.floor_ns, nan=0.0)[gpu_idx] * weight
    t_link = np.bincount(group[is_comm], weights=f[is_comm], minlength=ngroups)
    t_comp = np.bincount(group[is_local], weights=f[is_local], minlength=ngroups)
    return np.maximum(t_link - t_comp, 0.0)


def measured_bytes(gpu: pd.DataFrame) -> np.ndarray:
    if "dram_read_bytes" not in gpu.columns or "dram_write_bytes" not in gpu.columns:
        return np.full(len(gpu), np.nan)
    r = gpu["dram_read_bytes"].to_numpy(np.float64)
    w = gpu["dram_write_bytes"].to_numpy(np.float64)
    return np.where((r >= 0) & (w >= 0), r + w, np.nan)


# --- the per-kernel table and what it says -------------------------------------------------------

def kernel_table(gpu: pd.DataFrame, kc: KernelCosts | None, d: np.ndarray, in_window: np.ndarray, useful: np.ndarray,
                 loc: np.ndarray, wait_before: np.ndarray, locality: str, bsp: np.ndarray) -> pd.DataFrame:
    """One row per distinct (kernel name, op) inside the windows: launches, time, floor,
    useful, locality (NaN when not measured), compute inefficiency, the launch tax before its
    launches, the bulk-synchronous tax inside it, and whether it was costed; largest time first."""
    sel = in_window & gpu["kind"].isin(("kernel", "memcpy", "memset")).to_numpy()
    op = gpu["op"].astype(str).to_numpy(object) if "op" in gpu.columns else np.full(len(gpu), "", dtype=object)
    floor = kc.floor_ns if kc is not None else np.full(len(gpu), np.nan)
    reason = kc.floors["reason"].to_numpy(object) if kc is not None else np.full(len(gpu), NO_COST, dtype=object)
    basis = kc.floors["basis"].to_numpy(object) if kc is not None else np.full(len(gpu), "", dtype=object)
    role = gpu["role"].astype(str).to_numpy(object)
    local = np.isin(role, ("compute", "fused", "copy"))
    df = pd.DataFrame({
        "name": gpu["name"].astype(str).to_numpy(object)[sel], "op": op[sel], "role": role[sel],
        "time_ns": d[sel], "floor_ns": floor[sel], "useful_ns": useful[sel],
        "locality_ns": loc[sel], "inefficiency_ns": np.where(local[sel], d[sel] - useful[sel] - loc[sel], 0.0),
        "launch_tax_ns": wait_before[sel], "bsp_ns": bsp[sel],
        "costed": np.isfinite(floor[sel]), "reason": reason[sel], "basis": basis[sel]})
    if df.empty:
        return df.assign(launches=pd.Series(dtype=np.int64))
    g = df.groupby(["name", "op", "role"], sort=False)
    out = g.agg(launches=("time_ns", "size"), time_ns=("time_ns", "sum"), floor_ns=("floor_ns", lambda s: s.sum(min_count=1)),
                useful_ns=("useful_ns", "sum"), locality_ns=("locality_ns", "sum"), inefficiency_ns=("inefficiency_ns", "sum"),
                launch_tax_ns=("launch_tax_ns", "sum"), bsp_ns=("bsp_ns", "sum"), costed=("costed", "all"), reason=("reason", "first"),
                basis=("basis", "first")).reset_index()
    if locality == LOCALITY_ABSENT:
        out["locality_ns"] = np.nan
    return out.sort_values("time_ns", ascending=False, kind="stable").reset_index(drop=True)


def kernel_caveats(table: pd.DataFrame, kc: KernelCosts | None, gpu: pd.DataFrame, d: np.ndarray, in_window: np.ndarray,
                   meta: Mapping[str, Any]) -> list[str]:
    """What a reader of a per-kernel ledger must know: the uncosted share with its top kernels,
    kernels faster than their floor, a trace without shapes."""
    out: list[str] = []
    if kc is None or not kc.use_floors or table.empty:
        return out
    total = float(table["time_ns"].sum())
    unc = table[~table["costed"]]
    if len(unc) and total > 0:
        top = unc.groupby(["op", "reason"], sort=False)["time_ns"].sum().sort_values(ascending=False).head(3)
        names = "; ".join(f"{op or '(no op)'}: {t / total * 100:.1f}% ({r})" for (op, r), t in top.items())
        out.append(f"uncosted: {unc['time_ns'].sum() / total * 100:.1f}% of GPU time in {int(unc['launches'].sum())} "
                   f"kernel(s) of {len(unc)} kind(s) have no floor and count as compute_inefficiency; top: {names}")
    grid = table[table["costed"] & (table["basis"] == BASIS_LAUNCH_GRID)]
    if len(grid) and total > 0:
        out.append(f"floored from their launch grid: {grid['time_ns'].sum() / total * 100:.1f}% of GPU time in "
                   f"{int(grid['launches'].sum())} tensor-list kernel launch(es) (foreach / fused optimizer) whose op recorded "
                   "no shapes or that replayed from a CUDA graph; each CTA of PyTorch's multi_tensor_apply does one "
                   "65,536-element chunk, so the floor is a lower bound (docs/ledger.md 5a)")
    replay = replay_caveat(gpu, kc, d, in_window, meta)
    if replay:
        out.append(replay)
    pageable = table[table["name"].str.contains(PAGEABLE, regex=True) & table["costed"]]
    if len(pageable) and total > 0:
        out.append(f"pageable host copies: {pageable['time_ns'].sum() / total * 100:.1f}% of GPU time in "
                   f"{int(pageable['launches'].sum())} copies from or to pageable memory, floored at the host link's rate; "
                   "pageable memory stages through a driver buffer and cannot reach it: pin the host buffers "
                   "(pin_memory=True, cudaHostAlloc) to approach the floor and overlap the copies with compute")
    prof = ((meta.get("capture") or {}).get("profiler") or {})
    if prof and not prof.get("record_shapes") and not table["costed"][table["role"] != "comm"].any():
        out.append("the trace has no input shapes: no kernel could be costed (useful is 0). Capture again with "
                   "torch.profiler.profile(record_shapes=True) (with_flops=True helps too)")
    fl = kc.floor_ns
    res = timer_resolution_ns(d)
    fast = in_window & np.isfinite(fl) & (d + res < FASTER_THAN_FLOOR * fl) & (d > 0)
    if fast.any():
        names = gpu["name"].astype(str).to_numpy(object)[fast]
        ops = gpu["op"].astype(str).to_numpy(object)[fast] if "op" in gpu.columns else np.full(len(names), "", dtype=object)
        factor = fl[fast] / d[fast]
        worst = pd.DataFrame({"n": names, "op": ops, "f": factor}).groupby(["n", "op"])["f"].max().sort_values(ascending=False)
        text = "; ".join(f"{n[:60]}{f' [{op}]' if op else ''} x{f:.2f}" for (n, op), f in worst.head(3).items())
        out.append(f"{int(fast.sum())} kernel run(s) finished faster than their roofline floor (their useful is capped at "
                   f"their time; the peaks used are beaten, inputs were already in L2, or the op's cost is over-counted): "
                   f"{text}")
    return out


def replay_caveat(rows: pd.DataFrame, kc: KernelCosts, d: np.ndarray, in_window: np.ndarray,
                  meta: Mapping[str, Any]) -> str | None:
    """How much of the CUDA-graph replays' kernel time has a floor, by where its work came from
    (the eager step's shapes, the launch grid), and how much has none, with the match rate of the
    replayed kernels against an eager step (``meta["graph_shapes"]``, trace/replay_shapes.py)."""
    if "replayed" not in rows.columns:
        return None
    sel = in_window & rows["replayed"].to_numpy(bool) & (rows["kind"].to_numpy(object) == "kernel") \
        & (rows["role"].to_numpy(object) != "comm")
    total, all_gpu = float(d[sel].sum()), float(d[in_window].sum())
    if total <= 0:
        return None
    basis = kc.floors["basis"].to_numpy(object)[sel]
    costed = np.isfinite(kc.floor_ns[sel])
    t = d[sel]
    share = {b: float(t[costed & (basis == b)].sum()) / total * 100 for b in (BASIS_EAGER_STEP, BASIS_LAUNCH_GRID)}
    none = float(t[~costed].sum()) / total * 100
    reasons = pd.Series(t[~costed]).groupby(kc.floors["reason"].to_numpy(object)[sel][~costed]).sum().sort_values(ascending=False)
    top = "; ".join(f"{r} ({v / total * 100:.1f}%)" for r, v in reasons.head(2).items())
    g = meta.get("graph_shapes") if isinstance(meta.get("graph_shapes"), Mapping) else {}
    rate = (f"; {g.get('matched', 0)} of {g.get('replayed_kernels', 0)} replayed kernels were matched to an eager step "
            f"({g.get('eager_steps')})" if g.get("replayed_kernels") else "")
    return (f"CUDA-graph replays: {total / all_gpu * 100:.1f}% of GPU time is replayed kernels; of it "
            f"{share[BASIS_EAGER_STEP]:.1f}% is floored from the shapes of the eager step, {share[BASIS_LAUNCH_GRID]:.1f}% "
            f"from launch grids, {none:.1f}% has no floor{': ' + top if top else ''}{rate} (docs/ledger.md 5a)")


def timer_resolution_ns(d: np.ndarray) -> float:
    """1000 when every GPU duration is a whole microsecond (older Kineto writes integer
    microseconds; its 0-us kernels are stored as 1 ns), else 0: a duration known only to the
    microsecond cannot be said to beat a floor within that microsecond."""
    real = d[d > 1]
    return 1000.0 if len(real) and not np.any(np.mod(real, 1000.0)) else 0.0


def declared_floor_caveat(windows: int, worst: float, ranks: list[int], hw: HardwareSpec | None,
                          cpu_run: bool = False) -> str:
    """The workload's declared compute floor exceeded its kernels' measured time: useful is
    capped at that time, and the reader must know the peaks in use were beaten (on a CPU run the
    peaks are nominal placeholders: no GPU to calibrate)."""
    peaks = hw.label if hw is not None else "the hardware spec"
    head = (f"the workload's declared floor exceeds its kernels' measured time in {windows} rank-iteration(s) "
            f"(ranks {', '.join(map(str, ranks[:8]))}{', ...' if len(ranks) > 8 else ''}; up to x{worst:.3f}): useful is "
            "capped at that time. ")
    if cpu_run:
        return head + f"The peaks of {peaks} are placeholders for the interpreter, not a GPU's"
    return head + (f"The kernels beat the peaks of {peaks}, or the declared cost over-counts; "
                   "calibrate this GPU (taxmodel calibrate) or pass the matching --hardware")


def profiler_caveat(meta: Mapping[str, Any], launch_pct: float, launches: pd.DataFrame, n_windows: int,
                    nranks: int) -> str | None:
    """When a trace was captured with costly profiler options, eagerly, and shows a large launch
    tax: say how much host time the profiler itself recorded and per launch, and how to
    capture without it."""
    prof = (meta.get("capture") or {}).get("profiler") or {}
    heavy = [k for k in HEAVY_PROFILER_OPTIONS if prof.get(k)]
    if not heavy or launch_pct < 20.0 or (meta.get("capture") or {}).get("graph"):
        return None
    per_launch = ""
    if len(launches) > 1:
        dur = (launches["end_ns"] - launches["start_ns"]).to_numpy(np.float64)
        gaps = launches.sort_values(["rank", "start_ns"]).groupby("rank")["start_ns"].diff().dropna().to_numpy(np.float64)
        if len(gaps):
            per_launch = (f"; the host issued a launch every {np.median(gaps) / 1e3:.1f} us (median), of which the launch call "
                          f"itself took {np.median(dur) / 1e3:.1f} us: the rest is framework and profiler bookkeeping")
    over = float(prof.get("overhead_ns", 0)) / max(n_windows * max(nranks, 1), 1)
    over_text = f", its own overhead events {over / 1e3:.1f} us per iteration and rank" if over > 0 else ""
    return (f"launch_tax ({launch_pct:.1f}% of the window) may be inflated by the profiler: the trace was captured with "
            f"{', '.join(heavy)}{over_text}{per_launch}. Capture with activities=[ProfilerActivity.CUDA] only (no "
            "record_shapes/with_stack/profile_memory/with_flops), or as a CUDA graph, to measure the job's own launch tax")


def job_label(meta: Mapping[str, Any], path: Path | None) -> str | None:
    """A label for a bundle with no workload: the traces' common file name, the world size and
    the device (e.g. 'train_step_rank* x4 on NVIDIA H200'); None when meta has a workload."""
    if meta.get("workload"):
        return None
    files = [str(i.get("file", "")) for i in meta.get("inputs") or [] if i.get("file")]
    stem = _common_name(files) or (path.name if path is not None else "trace")
    ws = meta.get("world_size") or len(meta.get("ranks") or []) or 1
    hw = (meta.get("hardware") or {}).get("name") if isinstance(meta.get("hardware"), Mapping) else None
    return f"{stem} x{ws}" + (f" on {hw}" if hw else "")


def _common_name(files: list[str]) -> str:
    if not files:
        return ""
    stems = [f.split(".")[0] for f in files]
    if len(stems) == 1:
        return stems[0]
    prefix = stems[0]
    for s in stems[1:]:
        while not s.startswith(prefix):
            prefix = prefix[:-1]
    prefix = prefix.rstrip("_-.")
    return (prefix + "*") if prefix else stems[0]
