"""Injected taxes: known extra costs added to a real run, so the ledger can be checked against them.

``taxmodel profile --inject`` takes any of

- ``sleep_rank=R:US``: rank R is late by US microseconds at the start of every iteration (a
  GPU busy-wait enqueued before its first kernel; on CPU the host sleeps). The other ranks
  should show about that much more skew wait at the first collective or flag.
- ``extra_launches=K``: K empty kernels launched between consecutive kernels of an iteration
  (before every kernel but the first): more launch tax.
- ``extra_copy=1``: one extra device copy of every declared intermediate before its consumer
  kernel first runs in an iteration: more data-locality tax (the copy reads and writes the
  intermediate's bytes once more).

and, to check that a failed run ends cleanly (CI on CPU does), faults that end the run:

- ``kill_rank=R@PHASE``: rank R kills itself with SIGKILL on entering PHASE (as the OOM killer
  or a crashed driver would end it);
- ``hang_rank=R@PHASE``: rank R stops itself with SIGSTOP on entering PHASE (as a rank stuck in a
  GPU kernel behaves: no Python runs there, its own watchdog included).

PHASE is one of the phases a failure message names (``FAULT_PHASES``). Faults are ``Fault``,
apart from ``Injection``: a run with a fault writes no bundle, so they never reach its meta.

Injection points are ``RankContext.kernel`` (workloads wrap every launch in it) and the
harness's start of an iteration. What was injected is recorded in ``meta["capture"]["inject"]``.
"""
from __future__ import annotations

import os
import re
import dataclasses
import signal
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Iterator, Sequence

import torch

from taxmodel.errors import InputError
from taxmodel.runtime.timing import gpu_sleep

INJECTED_KERNEL_PREFIX = "taxmodel_inject_"
INJECTED_ROLES: dict[str, str] = {
    r"spin_kernel": "other",  # torch.cuda._sleep's kernel (sleep and empty launches on GPU)
    INJECTED_KERNEL_PREFIX + "copy": "copy",
    INJECTED_KERNEL_PREFIX: "other",
}
"""Roles of the kernels the harness adds; checked before the variant's own roles."""

FAULT_PHASES = ("setup", "compile", "check", "graph", "capture", "gather", "write")
"""Phases of a rank a fault can hit (``worker.PHASES`` less start and end): ``compile`` is the
warm-up, ``capture`` the traced loop; only rank 0 enters ``write``."""
FAULT_KEYS = {"kill_rank": signal.SIGKILL, "hang_rank": signal.SIGSTOP}
USAGE = "use sleep_rank=R:US, extra_launches=K, extra_copy=1, kill_rank=R@PHASE or hang_rank=R@PHASE"


def _parts(items: Iterable[str]) -> Iterator[tuple[str, str, str]]:
    """(key, value, text) of every ``KEY=VALUE`` in ``--inject`` values (several may be comma-separated)."""
    for item in items:
        for part in filter(None, (p.strip() for p in str(item).split(","))):
            key, sep, value = part.partition("=")
            if not sep:
                raise InputError(f"--inject: cannot read '{part}'; {USAGE}")
            yield key.strip().replace("-", "_"), value.strip(), part


@dataclass(frozen=True)
class Injection:
    sleep_rank: int | None = None
    sleep_us: float = 0.0
    extra_launches: int = 0
    extra_copy: bool = False

    @classmethod
    def parse(cls, items: Iterable[str]) -> "Injection":
        """Parse ``--inject`` values (each ``KEY=VALUE``; several may be comma-separated)."""
        values: dict[str, Any] = {}
        for key, value, part in _parts(items):
            try:
                if key in FAULT_KEYS:
                    continue  # a Fault (Fault.parse)
                if key == "sleep_rank":
                    rank, _, us = value.partition(":")
                    values["sleep_rank"], values["sleep_us"] = int(rank), float(us)
                    if values["sleep_rank"] < 0 or values["sleep_us"] <= 0:
                        raise ValueError
                elif key == "extra_launches":
                    values["extra_launches"] = int(value)
                    if values["extra_launches"] < 0:
                        raise ValueError
                elif key == "extra_copy":
                    values["extra_copy"] = value.strip().lower() in ("1", "true", "yes", "on")
                else:
                    raise InputError(f"--inject: unknown tax '{key}'; {USAGE}")
            except ValueError:
                raise InputError(f"--inject: cannot read '{part}'; {USAGE} (US > 0)") from None
        return cls(**values)

    @property
    def active(self) -> bool:
        return self.sleep_rank is not None or self.extra_launches > 0 or self.extra_copy

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Fault:
    """A rank that kills or freezes itself on entering a phase (``kill_rank=R@PHASE``, ``hang_rank=R@PHASE``)."""

    kind: str  # a key of FAULT_KEYS
    rank: int
    phase: str

    @classmethod
    def parse(cls, items: Iterable[str]) -> list["Fault"]:
        """The faults among ``--inject`` values (taxes are ``Injection.parse``'s)."""
        faults = []
        for key, value, part in _parts(items):
            if key not in FAULT_KEYS:
                continue
            rank, at, phase = value.partition("@")
            try:
                r = int(rank)
                if r < 0:
                    raise ValueError
            except ValueError:
                raise InputError(f"--inject: cannot read '{part}'; use {key}=R@PHASE (R a rank, 0 or more)") from None
            if not at or phase not in FAULT_PHASES:
                raise InputError(f"--inject {part}: PHASE must be one of {', '.join(FAULT_PHASES)} (e.g. {key}=1@capture)")
            faults.append(cls(key, r, phase))
        return faults

    def check(self, world_size: int) -> None:
        """InputError for a fault no rank of this run could hit."""
        if self.rank >= world_size:
            raise InputError(f"--inject {self.kind}={self.rank}@{self.phase}: there are only {world_size} ranks")
        if self.phase == "write" and self.rank != 0:
            raise InputError(f"--inject {self.kind}={self.rank}@write: only rank 0 writes bundles; use {self.kind}=0@write")

    def fire(self, rank: int, phase: str) -> None:
        """Kill or freeze this process if the fault is for ``rank`` in ``phase``."""
        if rank == self.rank and phase == self.phase:
            os.kill(os.getpid(), FAULT_KEYS[self.kind])


class Injector:
    """Applies an Injection on one rank. The harness calls ``start_iteration``; ``RankContext.kernel``
    calls ``before_kernel`` for every kernel the variant launches."""

    def __init__(self, injection: Injection, ctx: Any, intermediates: Sequence[Any] = ()) -> None:
        self.injection = injection
        self.ctx = ctx
        self._kernels_this_iteration = 0
        self._copied: set[str] = set()
        self._copies = []
        if injection.extra_copy:
            for inter in intermediates:
                n = max(int(inter.bytes), 1)
                src = torch.ones(n, dtype=torch.uint8, device=ctx.device)
                self._copies.append((inter.name, re.compile(inter.consumer), src, torch.empty_like(src)))
        self.notes: list[str] = []
        if injection.extra_copy and not self._copies:
            self.notes.append("extra_copy: this variant declares no intermediate, nothing was copied")

    def _emulated(self, name: str):
        return torch.profiler.record_function(f"kernel::{INJECTED_KERNEL_PREFIX}{name}")

    def start_iteration(self) -> None:
        self._kernels_this_iteration = 0
        self._copied.clear()
        inj = self.injection
        if inj.sleep_rank is not None and inj.sleep_rank == self.ctx.rank:
            if self.ctx.is_cuda:
                gpu_sleep(inj.sleep_us, self.ctx.device)
            else:
                with self._emulated("sleep"):
                    gpu_sleep(inj.sleep_us, self.ctx.device)

    def before_kernel(self, name: str) -> None:
        inj = self.injection
        if inj.extra_launches and self._kernels_this_iteration > 0:
            for _ in range(inj.extra_launches):
                if self.ctx.is_cuda:
                    torch.cuda._sleep(0)
                else:
                    with self._emulated("empty"):
                        pass
        for inter_name, consumer, src, dst in self._copies:
            if inter_name not in self._copied and consumer.search(name):
                self._copied.add(inter_name)
                if self.ctx.is_cuda:
                    dst.copy_(src)
                else:
                    with self._emulated("copy"):
                        dst.copy_(src)
        self._kernels_this_iteration += 1


def declare_injected_copies(cost: Any, injection: Injection) -> Any:
    """The cost with each injected extra copy declared as an intermediate of its own.

    An extra copy is exactly the round trip a user would declare for their own code: the bytes
    are written to HBM by the copy and read back by it (the copy engine or copy kernel is both
    producer and consumer). Declaring it lets the ledger attribute it to locality_tax.
    """
    if not injection.extra_copy or not cost.intermediates:
        return cost
    extra = tuple(dataclasses.replace(i, name=f"injected copy of {i.name}", producer="role:copy", consumer="role:copy")
                  for i in cost.intermediates)
    return dataclasses.replace(cost, intermediates=tuple(cost.intermediates) + extra)
