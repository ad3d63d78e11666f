"""The numbers of a GPU that has no preset, estimated from what its trace recorded.

A trace names its device ("NVIDIA GeForce RTX 3060 Laptop GPU", "AMD Instinct MI300A") and
records some of its properties: the SM (compute unit) count and compute capability or gfx target
(Kineto's ``deviceProperties``, Nsight Systems' ``TARGET_INFO_GPU``, rocprofv3's agents), and
for Nsight Systems also the memory bandwidth and L2 size. A trace without any of them may still
name the architecture in its kernels' names (``sm90_xmma_gemm_...``). The estimate scales the
datasheet presets of the same architecture (its *relatives*) by SM count:

    peak[dtype] = max over its kin of (peak[dtype] / SMs)  x  the device's SMs
                  (per SM and clock, x the trace's clock, where both the trace and its kin give one)
    HBM bandwidth = the trace's, else the highest of the relatives'
    peer and host links = the fastest of the relatives'

where its *kin* are the relatives its name names ('GeForce RTX 3080 Ti' -> the RTX 3080), else
those of its product line (GeForce cards accumulate FP16 in FP32 at half the rate of data-center
and workstation parts), else all of them. Every choice takes the larger number where the trace
leaves it open, so the floors stay lower bounds (a kernel cannot beat an upper-bound peak), at
the price of a smaller ``useful``. The spec says so: ``source="estimated"``, its basis in
``notes``, shown in every ledger that uses it (``specs.estimate_spec`` builds it). A device
whose architecture no preset shares (a Pascal card, an RDNA GPU) gets no estimate: the ledger
then says that it has no spec, never a silent 0.
"""
from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

from taxmodel.hardware.gpu_names import normalized_name


def _positive(hw: Mapping[str, Any], key: str) -> float:
    v = hw.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 else 0.0


def estimate_fields(hw: Mapping[str, Any], arch: str, arch_from: str, relatives: Sequence[Any]) -> dict[str, Any]:
    """The fields of the estimated spec (``HardwareSpec``'s) of the recorded device ``hw`` of
    architecture ``arch`` (found from ``arch_from``), from its ``relatives`` (the datasheet
    presets of that architecture, at least one)."""
    name = str(hw.get("name") or "").strip()
    kin = _kin(name, relatives)
    sms = int(_positive(hw, "num_sms"))
    dtypes = sorted({d for s in kin for d in s.peak_flops})
    clock = _positive(hw, "clock_hz")
    clocked = [s for s in kin if s.num_sms and s.boost_clock_hz]
    if sms and clock and clocked:
        peaks = {d: max(s.peak_flops[d] / (s.num_sms * s.boost_clock_hz) for s in clocked if d in s.peak_flops) * sms * clock
                 for d in dtypes if any(d in s.peak_flops for s in clocked)}
        how = (f"{sms} SMs at the trace's clock of {clock / 1e9:.2f} GHz x the highest per-SM, per-clock peak of "
               f"{', '.join(s.key for s in clocked)}")
    elif sms and any(s.num_sms for s in kin):
        peaks = {d: max(s.peak_flops[d] / s.num_sms * sms for s in kin if d in s.peak_flops and s.num_sms)
                 for d in dtypes if any(d in s.peak_flops and s.num_sms for s in kin)}
        how = f"{sms} SMs x the highest per-SM peak of {', '.join(s.key for s in kin)}"
    else:
        peaks = {d: max(s.peak_flops[d] for s in kin if d in s.peak_flops) for d in dtypes}
        how = f"{'no SM count in the trace' if not sms else 'no SM count in its relatives'}: the highest peak of " \
              f"{', '.join(s.key for s in kin)}"
    bandwidth = _positive(hw, "memory_bandwidth_bytes_per_s")
    hbm = bandwidth or max(s.hbm_bytes_per_s for s in relatives)
    hbm_how = "memory bandwidth from the trace" if bandwidth else "memory bandwidth: the highest of its relatives'"
    fastest_link = max(relatives, key=lambda s: s.link_bytes_per_s)
    integrated = hw.get("integrated") is True
    host = max(relatives, key=lambda s: s.host_bytes_per_s)
    label = name or f"unnamed {arch} GPU"
    notes = (f"estimated for '{label}' (no preset): architecture {arch} from {arch_from}; peaks {how}; "
             f"{hbm_how}; links: the fastest of its relatives'"
             + ("; integrated GPU: host copies move through its own memory" if integrated else "")
             + ". Upper bounds where the trace is silent, so floors stay lower bounds; pass --hardware FILE.json "
               "with the part's data-sheet numbers to replace them")
    return dict(
        name=f"{label} (estimated)", vendor=str(hw.get("vendor") or relatives[0].vendor), source="estimated",
        peak_flops=peaks, hbm_bytes_per_s=hbm, link_bytes_per_s=fastest_link.link_bytes_per_s, num_sms=sms,
        l2_bytes=int(_positive(hw, "l2_bytes")), notes=notes, key="", arch=arch, peer_link=fastest_link.peer_link,
        host_link="integrated" if integrated else host.host_link, pcie_gen=0 if integrated else host.pcie_gen,
        pcie_lanes=0 if integrated else host.pcie_lanes,
        host_link_bytes_per_s=hbm if integrated else host.host_link_bytes_per_s)


def _kin(name: str, relatives: Sequence[Any]) -> list[Any]:
    """The relatives whose per-SM rates the device shares (module docstring)."""
    low = normalized_name(name)
    named = [s for s in relatives if any(re.search(rf"\b{re.escape(normalized_name(a))}\b", low) for a in s.aliases)]
    if named:
        return named
    geforce = [s for s in relatives if "geforce" in " ".join(s.aliases)]
    if "geforce" in low and geforce:
        return geforce
    return [s for s in relatives if s not in geforce] or list(relatives)
