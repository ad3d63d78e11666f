"""Floors of copies and memsets: their bytes over the link they cross.

Every importer names a copy by its direction and, where the tracer says, its memory kinds
(``Memcpy HtoD (Pageable -> Device)`` from Kineto and Nsight Systems, ``Memcpy HtoD`` from
rocprof, ``Memcpy PtoP`` between two GPUs), and records its size in ``bytes``. The floor is the
time the slower resource needs for those bytes (docs/ledger.md, 5a):

    host <-> device (HtoD, DtoH, to/from arrays, unified-memory migrations):
                     max(bytes / host link, bytes / HBM)        the host link: PCIe or NVLink-C2C
    peer (PtoP):     max(bytes / peer link, bytes / HBM)        NVLink, Infinity Fabric or PCIe
    device (DtoD, arrays, memsets): read + write (2 x bytes; a memset 1 x) / HBM

A pageable host copy stages through a driver buffer and cannot reach the pinned rate; its floor
is still the link's (what pinning the buffer would allow), and the ledger says how much copy
time was pageable. A host-to-host copy crosses no GPU link, and a copy whose direction or size
the trace does not give, or whose host link the spec does not know, stays uncosted with the
reason said.
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from taxmodel.hardware.specs import HardwareSpec, host_link_of

#: the route a copy takes (``copy_routes``'s ``route``)
HOST, PEER, DEVICE, HOST_ONLY, UNKNOWN = "host", "peer", "device", "host-host", "unknown"
#: ``bound`` of a copy's floor
BOUND_HOST, BOUND_PEER, BOUND_MEMORY = "host link", "peer link", "memory"

_DIRECTION = re.compile(r"\b(HtoD|DtoH|DtoD|PtoP|HtoH|HtoA|AtoH|AtoA|AtoD|DtoA)\b")
_ROUTE = {"HtoD": HOST, "DtoH": HOST, "HtoA": HOST, "AtoH": HOST, "PtoP": PEER, "DtoD": DEVICE, "AtoA": DEVICE,
          "AtoD": DEVICE, "DtoA": DEVICE, "HtoH": HOST_ONLY}
_HOST_MEMORY = re.compile(r"(?i)\b(pageable|pinned)\b")


def _route_of(kind: str, name: str) -> tuple[str, str]:
    """(route, host memory kind: 'pageable', 'pinned' or '') of one distinct copy name."""
    mem = _HOST_MEMORY.search(name)
    memory = mem.group(1).lower() if mem else ""
    if kind == "memset":
        return (HOST if memory else DEVICE), memory
    d = _DIRECTION.search(name)
    return (_ROUTE[d.group(1)] if d else UNKNOWN), memory


def copy_routes(gpu: pd.DataFrame) -> pd.DataFrame:
    """Per row of ``gpu`` (same index): ``route`` ("" for rows that are not copies or memsets),
    ``host_memory`` ("pageable", "pinned", "" when not said), ``size`` (bytes, NaN unknown) and
    ``memset``.
    Names are parsed once per distinct (kind, name)."""
    kind = gpu["kind"].astype(str).to_numpy(object) if "kind" in gpu else np.full(len(gpu), "", dtype=object)
    names = gpu["name"].astype(str).to_numpy(object) if "name" in gpu else np.full(len(gpu), "", dtype=object)
    is_copy = np.isin(kind, ("memcpy", "memset"))
    route = np.full(len(gpu), "", dtype=object)
    memory = np.full(len(gpu), "", dtype=object)
    if is_copy.any():
        keys = pd.MultiIndex.from_arrays([kind[is_copy], names[is_copy]])
        codes, uniq = pd.factorize(keys)
        parsed = [_route_of(k, n) for k, n in uniq]
        route[is_copy] = np.array([p[0] for p in parsed], dtype=object)[codes]
        memory[is_copy] = np.array([p[1] for p in parsed], dtype=object)[codes]
    size = gpu["bytes"].to_numpy(np.float64) if "bytes" in gpu else np.full(len(gpu), -1.0)
    size = np.where(is_copy & (size >= 0), size, np.nan)
    return pd.DataFrame({"route": route, "host_memory": memory, "size": size, "memset": kind == "memset"}, index=gpu.index)


def copy_floors(routes: pd.DataFrame, hw: HardwareSpec) -> pd.DataFrame:
    """``floor_ns`` (NaN uncosted), ``bound`` and ``reason`` of the copy rows of ``routes``
    (``copy_routes``); rows that are not copies get NaN and empty strings."""
    route = routes["route"].to_numpy(object)
    size = routes["size"].to_numpy(np.float64)
    n = len(routes)
    floor = np.full(n, np.nan)
    bound = np.full(n, "", dtype=object)
    reason = np.full(n, "", dtype=object)
    copies = route != ""
    hbm = size / hw.hbm_bytes_per_s * 1e9
    host_bw, _ = host_link_of(hw)
    dev = copies & (route == DEVICE)
    floor[dev] = (hbm * np.where(routes["memset"].to_numpy(bool), 1.0, 2.0))[dev]
    bound[dev] = BOUND_MEMORY
    for r, bw, label in ((HOST, host_bw, BOUND_HOST), (PEER, hw.link_bytes_per_s, BOUND_PEER)):
        sel = copies & (route == r)
        if bw > 0:
            t = size / bw * 1e9
            floor[sel] = np.fmax(t, hbm)[sel]
            bound[sel] = np.where(t[sel] >= hbm[sel], label, BOUND_MEMORY)
        else:
            reason[sel] = f"the host link of {hw.name} is unknown (pass --hardware FILE.json with host_link_bytes_per_s)"
    reason[copies & (route == HOST_ONLY)] = "a host-to-host copy crosses no GPU link"
    reason[copies & (route == UNKNOWN)] = "copy direction not recorded"
    reason[copies & np.isnan(size)] = "copy size not recorded"
    floor[copies & np.isnan(size)] = np.nan
    bound[~np.isfinite(floor)] = ""
    return pd.DataFrame({"floor_ns": floor, "bound": bound, "reason": reason}, index=routes.index)

