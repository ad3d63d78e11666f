"""Phase (d) of the ledger: the ranks' pieces (``sweep.py``) put together in (repetition, iteration,
rank) order, the per-kernel table from their rows in the bundle's row order, and the caveats that
need all ranks.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from taxmodel.hardware.specs import HardwareSpec
from taxmodel.ledger import per_kernel
from taxmodel.ledger.kernel_costs import hardware_mismatch
from taxmodel.ledger.plan import LedgerPlan
from taxmodel.ledger.result import Ledger
from taxmodel.ledger.sweep import RankLedger
from taxmodel.trace.capture_meta import CPU_RUN_CAVEAT, emulated_gpu


def assemble_ledger(plan: LedgerPlan, pieces: list[RankLedger], label: str, hardware: HardwareSpec | None = None) -> Ledger:
    """Phase (d): the ranks' parts and intervals concatenated in (repetition, iteration, rank)
    order, the per-kernel table from the ranks' rows in the bundle's row order, the caveats."""
    order = {r: i for i, r in enumerate(plan.ranks)}
    pieces = sorted(pieces, key=lambda p: order[p.rank])
    hw, cost, meta, nr = plan.hw, plan.cost, plan.meta, len(plan.ranks)
    by = ["repetition", "iteration", "rank"]
    parts = pd.concat([p.parts for p in pieces], ignore_index=True).sort_values(by, kind="stable").reset_index(drop=True)
    intervals = pd.concat([p.intervals for p in pieces], ignore_index=True).sort_values(by, kind="stable").reset_index(drop=True)
    windows = plan.windows.sort_values(["repetition", "iteration"]).reset_index(drop=True)
    caveats = list(plan.caveats)
    records = _record_caveats(pieces, caveats)
    locality, kc, rows = _kernel_costs(plan, pieces)
    cpu_run = emulated_gpu(meta)
    _add_caveats(caveats, hw, cost, parts, plan.clock, plan.ranks,
                 (sum(p.unknown_gaps[0] for p in pieces), sum(p.unknown_gaps[1] for p in pieces)), kc, cpu_run=cpu_run,
                 fused_without_records=any(p.has_fused for p in pieces) and not records,
                 active={p.rank for p in pieces if p.has_gpu}, outside=sum(p.outside for p in pieces))
    d = rows["d"].to_numpy(np.float64)
    everywhere = np.ones(len(rows), bool)
    kernels = per_kernel.kernel_table(rows, kc, d, everywhere, rows["useful"].to_numpy(np.float64),
                                      rows["locality"].to_numpy(np.float64), rows["wait_before"].to_numpy(np.float64), locality,
                                      rows["bsp"].to_numpy(np.float64))
    caveats.extend(per_kernel.kernel_caveats(kernels, kc, rows, d, everywhere, meta))
    capped = [p.floor_capped for p in pieces if p.floor_capped[0]]
    if capped:
        caveats.append(per_kernel.declared_floor_caveat(sum(c[0] for c in capped), max(c[1] for c in capped),
                                                        [p.rank for p in pieces if p.floor_capped[0]], hw, cpu_run=cpu_run))
    mism = hardware_mismatch(meta, hw)
    if mism:
        caveats.append(mism)
    ws, we = plan.windows["start_ns"].to_numpy(np.int64), plan.windows["end_ns"].to_numpy(np.int64)
    launch_pct = float(parts.loc[parts["category"] == "launch_tax", "ns"].sum()) / max(float((we - ws).sum()) * nr, 1.0) * 100
    prof = per_kernel.profiler_caveat(meta, launch_pct, pd.concat([p.launches for p in pieces], ignore_index=True),
                                      len(plan.windows), nr)
    if prof:
        caveats.append(prof)
    return Ledger(parts=parts, windows=windows, intervals=intervals, clock=plan.clock,
                  caveats=list(dict.fromkeys(caveats)),  # each caveat once
                  skipped=list(plan.skipped), meta=meta, label=label, hardware=hw, ranks=plan.ranks, locality=locality,
                  kernels=kernels, kernel_locality_ns=_kernel_locality(locality, pieces), launch_tax_inflated=prof is not None)


def _record_caveats(pieces: list[RankLedger], caveats: list[str]) -> bool:
    """The caveats of declared intermediates and of fused launches without in-kernel records;
    whether any rank has records."""
    reached = [p.intermediate_caveats for p in pieces if p.intermediate_caveats is not None]
    if reached:  # a declared intermediate is reported when it matches no kernel on any rank
        caveats.extend(c for c in reached[0] if all(c in other for other in reached[1:]))
    unrecorded = sum(p.unrecorded for p in pieces)
    records = any(p.has_records for p in pieces)
    if records and unrecorded:
        caveats.append(f"{unrecorded} fused kernel launch(es) inside iterations have no in-kernel records "
                       "(not instrumented, or records lost): their flag waits are not visible and count as compute")
    return records


def _kernel_costs(plan: LedgerPlan, pieces: list[RankLedger]) -> tuple[str, per_kernel.KernelCosts | None, pd.DataFrame]:
    """How locality was obtained, the floors of every rank's kernel rows, and those rows in the
    bundle's row order."""
    hw, cost = plan.hw, plan.cost
    kc_any = not (cost and not plan.measured_anywhere)  # per_kernel.prepare returns a KernelCosts
    use_floors = not cost and hw is not None
    locality = per_kernel.locality_mode(None, cost) if not kc_any else (
        per_kernel.LOCALITY_MEASURED if plan.measured_anywhere else
        per_kernel.LOCALITY_ESTIMATED if cost else per_kernel.LOCALITY_ABSENT)
    rows = pd.concat([p.kernel_rows for p in pieces], ignore_index=True)
    if not rows["pos"].is_monotonic_increasing:  # ranks interleaved in the bundle's rows: back to its order
        rows = rows.sort_values("pos", kind="stable").reset_index(drop=True)
    kc = per_kernel.KernelCosts(rows[["floor_ns", "reason", "basis"]], np.zeros(0), np.zeros(0), use_floors, locality,
                                hw.hbm_bytes_per_s if hw is not None else 0.0) if kc_any else None
    return locality, kc, rows


def _kernel_locality(locality: str, pieces: list[RankLedger]) -> pd.Series | None:
    """Per GPU row (in the bundle's row order) the measured locality tax, when it is measured."""
    if locality != per_kernel.LOCALITY_MEASURED:
        return None
    loc = [p.locality_ns for p in pieces if p.locality_ns is not None]
    pos = np.concatenate([p.positions for p in pieces if p.locality_ns is not None]) if loc else np.zeros(0, np.int64)
    return pd.concat(loc).iloc[np.argsort(pos, kind="stable")] if loc else pd.Series(dtype=np.float64, name="locality_ns")


def _add_caveats(caveats, hw, cost, parts, clock, ranks, unknown_gaps, kc=None, *, fused_without_records: bool,
                 active: set[int], outside: int, cpu_run: bool = False) -> None:
    if cpu_run:  # first, in place of the nominal hardware's: nothing here is a GPU's time
        caveats.insert(0, CPU_RUN_CAVEAT)
    elif hw is not None and hw.source == "datasheet":
        caveats.append(f"hardware: {hw.name} datasheet peaks; 'useful' is measured against numbers real kernels rarely "
                       "reach (run `taxmodel calibrate` and pass --hardware FILE for measured ones)")
        if hw.estimated:
            caveats.append(f"hardware: {hw.name}'s {', '.join(hw.estimated)} are estimates, not data-sheet numbers "
                           f"(their basis: `taxmodel hardware {hw.key or hw.name}`)")
    elif hw is not None and hw.source == "estimated":
        caveats.append(f"hardware: {hw.label}: {hw.notes}")
    elif hw is not None and hw.source != "calibrated":
        caveats.append(f"hardware: {hw.name} numbers are {hw.source}, not measured on this machine")
    if not cost and kc is not None and kc.use_floors:
        caveats.append(f"useful = each kernel's roofline floor from its op's shapes (docs/ledger.md, per-kernel floors); "
                       f"locality_tax is {kc.locality}" + (" (its time stays in compute_inefficiency)"
                                                           if kc.locality == per_kernel.LOCALITY_ABSENT else ""))
    elif not cost and hw is None:
        pass  # plan_ledger said why there is no spec and what to pass
    elif not cost:
        caveats.append("the bundle declares no cost (meta 'cost') and its kernels carry no per-kernel cost: useful is 0, "
                       "locality_tax is not measured, and all compute time counts as compute_inefficiency")
    elif hw is None:
        caveats.append("no hardware spec: useful and locality_tax are 0")
    if fused_without_records:
        caveats.append("fused kernels ran without in-kernel trace records: waits on flags inside them are not visible "
                       "(flag_wait is 0) and count as compute time")
    for r in ranks:
        if r not in active:
            caveats.append(f"rank {r} has no GPU activity: its whole window is barrier_idle")
    if unknown_gaps[0]:
        caveats.append(f"{unknown_gaps[0]} idle gap(s) ({unknown_gaps[1] / 1e3:.1f} us in all) end at kernels with no "
                       "recorded launch call; they are unattributed (trace host runtime calls to classify them)")
    if clock.uncertainty_ns > 0:
        skew = parts[parts["subcategory"] == "skew_wait"].groupby("rank")["ns"].mean()
        for r, v in skew.items():
            if 0 < v < clock.uncertainty_ns:
                caveats.append(f"skew_wait on rank {r} ({v / 1e3:.1f} us) is below the clock uncertainty "
                               f"({clock.uncertainty_ns / 1e3:.1f} us)")
    if outside:
        caveats.append(f"{outside} GPU activities lie outside any iteration; where they overlap a window they count "
                       "as busy time without declared cost")
