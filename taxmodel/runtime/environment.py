"""Where a capture ran: software versions, the hardware, and the ranks' clock offsets (bundle meta)."""
from __future__ import annotations

import os
import platform
import socket
import time
from typing import Any


def versions() -> dict[str, Any]:
    import importlib.metadata as md

    import torch

    from taxmodel.version import __version__

    def version(dist_name: str) -> str | None:
        try:
            return md.version(dist_name)
        except md.PackageNotFoundError:
            return None

    sw: dict[str, Any] = {"torch": torch.__version__, "python": platform.python_version(), "taxmodel": __version__,
                          "triton": version("triton") or version("pytorch-triton") or version("pytorch-triton-rocm"),
                          "iris": version("tokenspeed-iris"), "cuda": torch.version.cuda, "hip": getattr(torch.version, "hip", None)}
    try:
        if torch.cuda.is_available() and not getattr(torch.version, "hip", None):
            sw["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:  # noqa: BLE001 - an optional detail
        pass
    return {k: v for k, v in sw.items() if v is not None}


def hardware(device: Any, world: int) -> dict[str, Any]:
    import torch

    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        return {"name": p.name, "vendor": "amd" if getattr(torch.version, "hip", None) else "nvidia",
                "num_sms": int(p.multi_processor_count), "memory_bytes": int(p.total_memory),
                "gpus_per_rank": 1, "world_size": world}
    return emulated_hardware()


def emulated_hardware() -> dict[str, Any]:
    """The hardware of a CPU run (kernels emulated on the host)."""
    mem = None
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        pass
    return {"name": f"CPU ({platform.processor() or platform.machine()}), emulated GPUs", "vendor": "cpu",
            "num_sms": os.cpu_count(), "memory_bytes": mem, "emulated": True}


def measure_clock_offsets(rank: int, world: int, device: Any, group: Any = None, rounds: int = 8) -> dict[str, Any]:
    """Offsets (ns to add to each rank's times to match rank 0's clock) from ping-pongs with
    rank 0, keeping the round trip of least delay; on one host every rank shares one clock."""
    import torch
    import torch.distributed as dist

    hosts: list[Any] = [None] * world
    dist.all_gather_object(hosts, socket.gethostname(), group=group)
    if len(set(hosts)) == 1:
        return {"offsets_ns": {str(r): 0 for r in range(world)}, "uncertainty_ns": 0, "method": "same-host", "hosts": hosts}
    offsets, uncertainty = {"0": 0}, 0
    buf = torch.zeros(1, dtype=torch.int64, device=device)
    for peer in range(1, world):
        if rank not in (0, peer):
            dist.barrier(group=group)
            continue
        best: tuple[int, int] | None = None
        for _ in range(rounds):
            if rank == 0:
                t0 = time.time_ns()
                dist.send(buf, peer, group=group)
                dist.recv(buf, peer, group=group)
                t1 = time.time_ns()
                rtt, offset = t1 - t0, (t0 + t1) // 2 - int(buf.item())
                if best is None or rtt < best[0]:
                    best = (rtt, offset)
            else:
                dist.recv(buf, 0, group=group)
                buf.fill_(time.time_ns())
                dist.send(buf, 0, group=group)
        if rank == 0 and best is not None:
            offsets[str(peer)] = best[1]
            uncertainty = max(uncertainty, best[0] // 2)
        dist.barrier(group=group)
    result = [{"offsets_ns": offsets, "uncertainty_ns": uncertainty}]
    dist.broadcast_object_list(result, src=0, group=group)
    return {**result[0], "method": "ping-pong (min round trip)", "hosts": hosts}
