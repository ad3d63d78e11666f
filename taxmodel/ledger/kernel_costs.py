"""Per-kernel roofline floors: what each GPU row costs at the least on a given GPU, from the
per-kernel work the importer attached (``flops``, ``floor_bytes``, ``dtype``; see
``trace/op_costs.py``) and the hardware's peaks.

    floor_ns = max(flops / peak[dtype], floor_bytes / hbm_bw)        local kernels
    floor_ns = floor_bytes / link_bw                                 collectives (bus bytes)
    floor_ns = bytes over the link the copy crosses                  copies, memsets (copy_costs.py)

``basis`` says where a floor's work came from: "shapes" (the launching op's recorded shapes, or
work the importer declared), "shapes from eager step" (a CUDA-graph replay's kernel matched to
the same kernel of an eager step of the program, ``trace/replay_shapes.py``), "size" (a copy's
or memset's own byte count), "link" (a collective's bus bytes), "launch grid" (a tensor-list
kernel whose op recorded no shapes, or a CUDA-graph replay of one: a lower bound from its grid,
``trace/tensor_list_kernels.py``).

A row with neither flops nor bytes, or whose dtype has no peak on this GPU, is *uncosted*:
its floor is NaN and ``reason`` says why; nothing is filled in. This frame is the one the
ledger uses when a bundle declares no workload cost, and the one ``advise`` takes through its
per-kernel seam (``floor_ns``, ``bound``).
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pandas as pd

from taxmodel.ledger.copy_costs import DEVICE, copy_floors, copy_routes
from taxmodel.hardware.specs import HardwareSpec, match_device, normalized_name, same_name
from taxmodel.trace.replay_shapes import SHAPES_FROM_EAGER
from taxmodel.trace.tensor_list_kernels import tensor_list_launch_work

KERNEL_COST_COLUMNS = ("floor_ns", "bound", "costed", "reason", "basis")
#: where a floor's work came from (module docstring)
BASIS_SHAPES, BASIS_SIZE, BASIS_LINK, BASIS_LAUNCH_GRID = "shapes", "size", "link", "launch grid"
BASIS_EAGER_STEP = "shapes from eager step"
#: why a kernel without per-kernel work has no floor (other formats, or bundles imported before the columns)
NO_COST = ("no per-kernel cost in the bundle (ops and shapes come from Kineto traces captured with "
           "record_shapes=True; import such a trace)")


def kernel_floors(gpu: pd.DataFrame, hw: HardwareSpec | None) -> pd.DataFrame:
    """One row per row of ``gpu`` (GPU activities, same index): ``floor_ns`` (NaN when
    uncosted), ``bound`` ("compute" / "memory" / "link" / "host link" / "peer link" / ""),
    ``costed``, ``reason`` and ``basis`` (module docstring)."""
    n = len(gpu)
    flops = _col(gpu, "flops", -1).astype(np.float64)
    nbytes = _col(gpu, "floor_bytes", -1).astype(np.float64)
    dtype = _col(gpu, "dtype", "").astype(str)
    given = _col(gpu, "uncosted", "").astype(str).to_numpy(object)
    role = _col(gpu, "role", "").astype(str).to_numpy(object)
    floor = np.full(n, np.nan)
    bound = np.full(n, "", dtype=object)
    reason = np.where(given != "", given, NO_COST).astype(object)
    basis = np.full(n, "", dtype=object)
    if hw is None:
        reason[:] = "no hardware spec"
        return pd.DataFrame({"floor_ns": floor, "bound": bound, "costed": np.zeros(n, bool), "reason": reason, "basis": basis},
                            index=gpu.index)
    f = flops.to_numpy()
    b = nbytes.to_numpy()
    kind = _col(gpu, "kind", "").astype(str).to_numpy(object)
    copy = np.isin(kind, ("memcpy", "memset"))
    comm = (role == "comm") & ~copy
    basis[(f >= 0) | (b >= 0)] = BASIS_SHAPES
    basis[(basis == BASIS_SHAPES) & (_col(gpu, "shapes_from", "").astype(str).to_numpy(object) == SHAPES_FROM_EAGER)] = BASIS_EAGER_STEP
    by_grid, grid_flops, grid_bytes = launch_grid_work(gpu, f, b, comm)
    if by_grid.any():
        f, b, dtype = f.copy(), b.copy(), dtype.copy()
        f[by_grid], b[by_grid] = grid_flops, grid_bytes
        dtype.iloc[np.flatnonzero(by_grid)] = "fp32"
        basis[by_grid] = BASIS_LAUNCH_GRID
    # peak per distinct dtype (a loop over the few dtype classes)
    codes, uniq = pd.factorize(dtype)
    peaks = np.array([_peak(hw, u) for u in uniq] or [np.nan], np.float64)
    peak = peaks[codes] if n else np.zeros(0)
    t_f = np.where((f >= 0) & np.isfinite(peak) & (peak > 0), f / np.where(peak > 0, peak, 1.0) * 1e9, np.nan)
    t_b = np.where(b >= 0, b / hw.hbm_bytes_per_s * 1e9, np.nan)
    local = ~comm & ~copy
    has_f, has_b = np.isfinite(t_f), np.isfinite(t_b)
    ok = local & (has_f | has_b)
    floor[ok] = np.fmax(np.where(has_f, t_f, -np.inf), np.where(has_b, t_b, -np.inf))[ok]
    bound[ok] = np.where(np.where(has_f, t_f, -np.inf)[ok] >= np.where(has_b, t_b, -np.inf)[ok], "compute", "memory")
    no_peak = local & (f >= 0) & ~np.isfinite(peak) & ~has_b
    reason[no_peak] = np.array([f"no peak for dtype '{d}' on {hw.name}" for d in dtype.to_numpy(object)[no_peak]], dtype=object)
    cm = comm & (b >= 0)
    floor[cm] = b[cm] / hw.link_bytes_per_s * 1e9
    bound[cm] = "link"
    basis[cm] = BASIS_LINK
    if copy.any():  # every memcpy and memset: its bytes over the link it crosses
        cf = copy_floors(copy_routes(gpu), hw)
        floor[copy] = cf["floor_ns"].to_numpy(np.float64)[copy]
        bound[copy] = cf["bound"].to_numpy(object)[copy]
        reason[copy] = cf["reason"].to_numpy(object)[copy]
        basis[copy] = BASIS_SIZE
    costed = np.isfinite(floor)
    reason[costed] = ""
    basis[~costed] = ""
    return pd.DataFrame({"floor_ns": floor, "bound": bound, "costed": costed, "reason": reason, "basis": basis},
                        index=gpu.index)


def launch_grid_work(gpu: pd.DataFrame, flops: np.ndarray, nbytes: np.ndarray,
                     comm: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Kernels with no work of their own (no op shapes: a foreach op's long lists, a CUDA-graph
    replay) that are PyTorch tensor-list launches: (mask of those rows, their lower-bound flops,
    their bytes, in row order), from name and grid (``trace/tensor_list_kernels.py``). One parse
    per distinct (name, grid, block)."""
    n = len(gpu)
    none = (np.zeros(n, bool), np.zeros(0), np.zeros(0))
    kind = _col(gpu, "kind", "").astype(str).to_numpy(object)
    cand = (kind == "kernel") & (flops < 0) & (nbytes < 0) & ~comm
    if not cand.any():
        return none
    names = _col(gpu, "name", "").astype(str).to_numpy(object)
    codes, uniq = pd.factorize(names)
    cand &= np.array(["multi_tensor_apply_kernel" in u for u in uniq] or [False], bool)[codes]  # per distinct name
    if not cand.any():
        return none
    keys = pd.DataFrame({"name": names[cand], "grid": _col(gpu, "grid", "").astype(str).to_numpy(object)[cand],
                         "block": _col(gpu, "block", "").astype(str).to_numpy(object)[cand]})
    codes, combos = pd.factorize(pd.MultiIndex.from_frame(keys))
    work = [tensor_list_launch_work(*u) for u in combos]
    ok_u = np.array([w is not None for w in work], bool)
    f_u = np.array([w.flops if w is not None else -1 for w in work], np.float64)
    b_u = np.array([w.bytes if w is not None else -1 for w in work], np.float64)
    mask = np.zeros(n, bool)
    rows = np.flatnonzero(cand)
    keep = ok_u[codes]
    mask[rows[keep]] = True
    return mask, f_u[codes][keep], b_u[codes][keep]


def copy_bytes(gpu: pd.DataFrame, floor_bytes: np.ndarray) -> np.ndarray:
    """``floor_bytes``, with memcpy/memset rows that have none given the HBM bytes their own byte
    count implies (any trace format records it): a copy within the device reads and writes it, a
    host or peer copy and a memset move it once through this GPU's HBM (``copy_costs``)."""
    routes = copy_routes(gpu)
    size = routes["size"].to_numpy(np.float64)
    sel = (floor_bytes < 0) & np.isfinite(size)
    if not sel.any():
        return floor_bytes
    out = floor_bytes.copy()
    twice = (routes["route"].to_numpy(object) == DEVICE) & ~routes["memset"].to_numpy(bool)
    out[sel] = size[sel] * np.where(twice[sel], 2, 1)
    return out


def has_kernel_costs(events: pd.DataFrame) -> bool:
    """Whether the bundle carries per-kernel work (imported from a trace with shapes, or older
    bundles without the columns: False)."""
    return "floor_bytes" in events.columns and bool(((_col(events, "floor_bytes", -1) >= 0) | (_col(events, "flops", -1) >= 0)).any())


def _col(df: pd.DataFrame, name: str, missing: Any) -> pd.Series:
    return df[name] if name in df.columns else pd.Series([missing] * len(df), index=df.index)


def _peak(hw: HardwareSpec, dtype: str) -> float:
    """Peak FLOP/s of ``dtype`` on ``hw``; an AMD GPU (no TF32) runs fp32 GEMMs at its fp32 rate;
    NaN when the spec has no peak for it (a calibration that measured no TF32 GEMM: falling back to
    its fp32 CUDA-core rate would put the floor above a TF32 GEMM's true minimum)."""
    if not dtype:
        return np.nan
    for key in (dtype, "fp32" if dtype == "tf32" and hw.vendor == "amd" else None):
        if key and key in hw.peak_flops:
            return float(hw.peak_flops[key])
    return np.nan


#: form factors whose peaks differ from another's of the same GPU (a PCIe H100 runs below an SXM one)
_FORM_FACTORS = frozenset(("pcie", "nvl", "sxm", "sxm2", "sxm4", "sxm5", "oam"))


def hardware_mismatch(meta: Mapping[str, Any], hw: HardwareSpec | None) -> str | None:
    """A sentence when the spec in use is not the GPU the trace recorded (``--hardware`` given
    for another device), or was chosen by the device's architecture alone; None when they agree,
    the trace names no GPU, or the spec is an estimate (whose own caveat says what it is)."""
    if hw is None or hw.source == "estimated":
        return None
    rec = (meta or {}).get("hardware") or {}
    if not isinstance(rec, Mapping):
        return None
    name = rec.get("name") if isinstance(rec.get("name"), str) else ""
    part, by_arch = match_device(rec)
    same = part is not None and (hw == part or any(same_name(hw, a) for a in (part.name, *part.aliases)))
    if by_arch and same:
        return (f"hardware: the trace's device '{name or '(unnamed)'}' is no preset; {hw.label} was chosen{by_arch[1:]} "
                "(pass --hardware if that is not the part)")
    if not name:
        return None
    if same:  # the device's own preset, unless it was matched through a sibling's alias or another form factor
        words = set(normalized_name(name).split())
        forms = words & _FORM_FACTORS - set(" ".join(normalized_name(a) for a in (part.name, *part.aliases)).split())
        if normalized_name(part.name).split()[0] in words and not forms:
            return None
        return (f"hardware: the trace's device '{name}' has no preset of its own; the floors use {hw.label}, a related part "
                f"(its notes say how they differ); pass --hardware FILE.json with this part's numbers if they matter")
    if part is None and normalized_name(hw.name).split()[0] in normalized_name(name):
        return None
    return (f"hardware: the trace ran on '{name}' but the floors use {hw.label}; pass the matching "
            "--hardware (or none, to use the trace's own device) unless this is a what-if")
