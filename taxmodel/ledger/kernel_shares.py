"""How much of each local kernel's time is flag_wait, exposed_comm, useful and locality_tax, before
the sweep caps them by the rank's local busy time (``sweep.py``): from the in-kernel records
(``kernel_records.py``), then from each kernel's own roofline floor (``per_kernel.py``) or from the
workload's declared cost (its FLOPs, bytes, link bytes and intermediates).
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from taxmodel.hardware.specs import HardwareSpec
from taxmodel.ledger import per_kernel
from taxmodel.ledger.kernel_records import record_shares
from taxmodel.ledger.segments import LOCAL_ROLES

#: roles whose kernels carry the declared compute floor (copies carry none)
WORK_ROLES = ("compute", "fused")


def declared_floors(cost: dict | None, hw: HardwareSpec | None) -> tuple[float, float]:
    """(T_compute, T_link_excess) in ns per rank and iteration: the roofline floor of the local
    work, and how much the link floor exceeds it (the part of communication that no overlap can
    hide)."""
    if not cost or hw is None:
        return 0.0, 0.0
    t_compute = max(float(cost.get("flops", 0)) / hw.flops_per_s(cost.get("dtype", "bf16")),
                    float(cost.get("hbm_bytes", 0)) / hw.hbm_bytes_per_s) * 1e9
    t_link = float(cost.get("link_bytes", 0)) / hw.link_bytes_per_s * 1e9
    return t_compute, max(0.0, t_link - t_compute)


def kernel_shares(gpu, g_start, g_end, ev, offsets, cost, t_compute, t_link_excess, link_float, win_of, rank_pos, nr,
                  skip, caveats, hbm_bytes_per_s, kc=None) -> dict[str, np.ndarray]:
    """Per GPU row, the ns of its duration that are flag_wait, exposed_comm, useful and locality_tax
    (0 for rows that are not local kernels), and whether in-kernel records cover it ("recorded").
    Order: measured flag_wait and communication-only phases first (fused kernels' records), then
    the compute floor in proportion to the remaining time, then the link floor left over from
    exposed transfers (fused kernels: first out of their communication-only phases, then out of
    their remaining time), then each declared intermediate on its producer and consumer kernels."""
    n = len(gpu)
    d = (g_end - g_start).astype(np.float64)
    role = gpu["role"].to_numpy(object)
    flag, comm, recorded = record_shares(gpu, g_start, g_end, ev, offsets, role)
    flag = np.minimum(flag, d)
    comm = np.minimum(comm, d - flag)
    rep = gpu["repetition"].to_numpy(np.int64)
    it = gpu["iteration"].to_numpy(np.int64)
    costed = np.isin(role, LOCAL_ROLES) & (it >= 0)
    if skip:
        costed &= ~pd.MultiIndex.from_arrays([rep, it]).isin(list(skip))
    shares = {"flag_wait": flag, "exposed_comm": comm, "useful": np.zeros(n), "locality_tax": np.zeros(n),
              "recorded": recorded}
    if not cost and kc is not None and kc.use_floors and costed.any():
        # per-kernel floors (docs/ledger.md "Per-kernel floors"): each kernel's own, capped by its time
        useful = shares["useful"]
        room = np.maximum(d - flag - comm, 0.0)
        useful[costed] = np.minimum(np.nan_to_num(kc.floor_ns, nan=0.0)[costed], room[costed])
        shares["locality_tax"] = kc.measured_locality(useful, d - flag - comm - useful, costed)
        return shares
    if not cost or not hbm_bytes_per_s or not costed.any():
        return shares
    return _declared_cost_shares(gpu, d, role, flag, comm, recorded, costed, cost, t_compute, t_link_excess, link_float,
                                 win_of, rank_pos, nr, caveats, hbm_bytes_per_s, kc)


def _declared_cost_shares(gpu, d, role, flag, comm, recorded, costed, cost, t_compute, t_link_excess, link_float, win_of,
                          rank_pos, nr, caveats, hbm_bytes_per_s, kc) -> dict[str, np.ndarray]:
    """``kernel_shares`` from the workload's declared cost, per (rank, repetition, iteration):
    the compute floor over its work kernels in proportion to their time, the link floor left
    over on its fused kernels, then locality from DRAM counters or declared intermediates."""
    n = len(gpu)
    keys = pd.DataFrame({"rank": gpu["rank"].to_numpy(np.int64), "rep": gpu["repetition"].to_numpy(np.int64),
                         "it": gpu["iteration"].to_numpy(np.int64)})
    gid = np.full(n, -1, np.int64)  # group id per (rank, repetition, iteration) of the costed rows
    gid[costed] = keys[costed].groupby(["rank", "rep", "it"], sort=False).ngroup().to_numpy(np.int64)
    ng = int(gid.max()) + 1
    work = costed & np.isin(role, WORK_ROLES)
    avail = np.where(work, d - flag - comm, 0.0)
    total = np.bincount(gid[costed], weights=avail[costed], minlength=ng)
    with np.errstate(divide="ignore", invalid="ignore"):
        f = np.where(total > 0, np.minimum(1.0, t_compute / np.where(total > 0, total, 1.0)), 0.0)
    useful = np.zeros(n)
    useful[costed] = f[gid[costed]] * avail[costed]
    # a declared floor above the kernels' measured time is capped there: count it for the caveat
    over = (total > 0) & (total < per_kernel.FASTER_THAN_FLOOR * t_compute)
    floor_capped = (int(over.sum()), float((t_compute / total[over]).max()) if over.any() else 0.0)
    fused = costed & (role == "fused")
    if t_link_excess > 0 and fused.any():
        widx = win_of.reindex(pd.MultiIndex.from_arrays([keys["rep"].to_numpy()[fused], keys["it"].to_numpy()[fused]]))
        grp = widx.to_numpy().astype(np.int64) * nr + rank_pos.reindex(keys["rank"].to_numpy()[fused]).to_numpy(np.int64)
        rest = np.maximum(t_link_excess - link_float[grp], 0.0)
        comm = _link_floor_on_fused(fused, rest, d, flag, comm, useful, gid, ng)
    shares = {"flag_wait": flag, "exposed_comm": comm, "useful": useful, "recorded": recorded, "floor_capped": floor_capped}
    if kc is not None and kc.locality == per_kernel.LOCALITY_MEASURED:  # DRAM counters replace the declared intermediates
        comp = np.where(np.isfinite(kc.compulsory), kc.compulsory, per_kernel.declared_compulsory(gpu, cost, work, gid, d))
        return {**shares, "locality_tax": kc.measured_locality(useful, d - flag - comm - useful, costed, comp)}
    loc = _intermediates_locality(gpu, role, d - flag - comm - useful, costed, gid, ng, cost, hbm_bytes_per_s, caveats)
    return {**shares, "locality_tax": loc, "matched_intermediates": True}


def _link_floor_on_fused(fused, rest, d, flag, comm, useful, gid, ng) -> np.ndarray:
    """The link floor beyond the compute floor that exposed transfers did not take (``rest`` per
    fused row's window) made useful on the fused kernels: first out of their communication-only
    phases (what no overlap can hide is useful there), then out of their remaining time. Adds to
    ``useful`` in place; returns exposed_comm less what became useful."""
    n = len(d)
    head = np.where(fused, d - flag - comm - useful, 0.0)
    hsum = np.bincount(gid[fused], weights=head[fused], minlength=ng)
    restg = np.zeros(ng)
    restg[gid[fused]] = rest
    csum = np.bincount(gid[fused], weights=comm[fused], minlength=ng)
    take = np.minimum(restg, csum)
    with np.errstate(divide="ignore", invalid="ignore"):
        g1 = np.where(csum > 0, take / np.where(csum > 0, csum, 1.0), 0.0)
    from_comm = np.zeros(n)
    from_comm[fused] = g1[gid[fused]] * comm[fused]
    comm = comm - from_comm
    restg = restg - take
    with np.errstate(divide="ignore", invalid="ignore"):
        g = np.where(hsum > 0, np.minimum(1.0, restg / np.where(hsum > 0, hsum, 1.0)), 0.0)
    useful[fused] += g[gid[fused]] * head[fused] + from_comm[fused]
    return comm


def _intermediates_locality(gpu, role, free, costed, gid, ng, cost, hbm_bytes_per_s, caveats) -> np.ndarray:
    """Per GPU row, the locality tax of the declared intermediates (written to and read back from
    DRAM once each) on their producer and consumer kernels, out of each kernel's ``free`` time;
    an intermediate that matches no kernel is a caveat."""
    loc = np.zeros(len(gpu))
    names = gpu["name"].astype(str)
    for inter in cost.get("intermediates") or []:
        sel = costed & (matches(names, role, inter.get("producer", "")) | matches(names, role, inter.get("consumer", "")))
        if not sel.any():
            caveats.append(f"declared intermediate '{inter.get('name')}' matches no kernel (producer "
                           f"{inter.get('producer')!r}, consumer {inter.get('consumer')!r}): no locality_tax for it")
            continue
        t_loc = 2.0 * float(inter.get("bytes", 0)) / hbm_bytes_per_s * 1e9
        head = np.where(sel, np.maximum(free - loc, 0.0), 0.0)
        hsum = np.bincount(gid[sel], weights=head[sel], minlength=ng)
        with np.errstate(divide="ignore", invalid="ignore"):
            g = np.where(hsum > 0, np.minimum(1.0, t_loc / np.where(hsum > 0, hsum, 1.0)), 0.0)
        loc[sel] += g[gid[sel]] * head[sel]
    return loc


def matches(names: pd.Series, role: np.ndarray, pattern: str) -> np.ndarray:
    """Rows whose kernel name matches the regex ``pattern``, or whose role is X for 'role:X'
    (how a workload declares an intermediate's producer and consumer)."""
    if not pattern:
        return np.zeros(len(names), bool)
    if pattern.startswith("role:"):
        return role == pattern[5:]
    uniq = pd.unique(names)
    rx = re.compile(pattern)
    hit = {u: bool(rx.search(u)) for u in uniq}  # a loop over distinct names, not events
    return names.map(hit).to_numpy(bool)
