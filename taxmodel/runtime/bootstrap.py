"""Joining the ranks' process group: the one place that picks backend, device and rendezvous.

Every way taxmodel starts ranks ends here: the profile worker (started by ``launch_workers`` or
by a user's ``torchrun``), the calibration ranks, the benchmark harness and the
``multiprocessing`` ranks of tests. Why one place: the choices must agree (NCCL with the rank's
GPU bound before the group exists, gloo on CPU; a timeout the run's watchdog outlives) and a
rendezvous that cannot collide with another run on the host.

Rendezvous, first that applies: an explicit ``init_method``; ``TAXMODEL_RENDEZVOUS_FILE`` (a file
in the run's own directory, set by ``launch_workers``: no TCP port to race for); torchrun's
``MASTER_ADDR``/``MASTER_PORT``; for a process run by hand alone, a free local port.
"""
from __future__ import annotations

import datetime as _dt
import os
import socket
from dataclasses import dataclass
from typing import Any

from taxmodel.errors import RunError

RENDEZVOUS_FILE_ENV = "TAXMODEL_RENDEZVOUS_FILE"


@dataclass(frozen=True)
class Membership:
    """This process's place in the group it joined."""

    rank: int
    world_size: int
    local_rank: int
    device: Any  # torch.device
    backend: str  # "nccl" or "gloo"


def rank_device(device_kind: str, local_rank: int) -> tuple[Any, str]:
    """(device, backend) of a rank: ``LOCAL_RANK``'s GPU (made current) with NCCL, or the CPU with gloo."""
    import torch

    if device_kind == "cuda":
        if not torch.cuda.is_available():
            raise RunError(f"local rank {local_rank}: --device cuda but no GPU is visible to this process")
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        return torch.device("cuda", torch.cuda.current_device()), "nccl"
    return torch.device("cpu"), "gloo"


def join_process_group(device_kind: str, *, rank: int | None = None, world_size: int | None = None,
                       local_rank: int | None = None, init_method: str | None = None,
                       timeout_s: float | None = None) -> Membership:
    """Bind this rank's device and join the default process group; rank, world size and local rank
    default to torchrun's ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` (0, 1, the rank)."""
    import torch.distributed as dist

    rank = int(os.environ.get("RANK", "0")) if rank is None else rank
    world_size = int(os.environ.get("WORLD_SIZE", "1")) if world_size is None else world_size
    local_rank = int(os.environ.get("LOCAL_RANK", str(rank))) if local_rank is None else local_rank
    device, backend = rank_device(device_kind, local_rank)
    if init_method is None:
        if os.environ.get(RENDEZVOUS_FILE_ENV):
            init_method = f"file://{os.environ[RENDEZVOUS_FILE_ENV]}"
        else:
            if "MASTER_ADDR" not in os.environ:  # run by hand as a single process
                os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
                os.environ.setdefault("MASTER_PORT", str(_free_port()))
            init_method = "env://"
    kwargs: dict[str, Any] = {"backend": backend, "init_method": init_method, "rank": rank, "world_size": world_size}
    if timeout_s is not None:
        kwargs["timeout"] = _dt.timedelta(seconds=timeout_s)
    if backend == "nccl":
        kwargs["device_id"] = device
    dist.init_process_group(**kwargs)
    return Membership(dist.get_rank(), dist.get_world_size(), local_rank, device, backend)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
