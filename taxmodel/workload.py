"""The workload protocol: what a workload (built-in or a user's own) tells taxmodel.

A workload has named shape presets (one of them tiny enough for the CPU interpreter), builds
its inputs (on the symmetric heap where a variant needs it), has a reference implementation for
correctness, declares its cost, and offers variants. A variant enqueues one iteration's kernels
and says which kernel names play which role; the ledger then never needs to import the
workload: the declared cost and roles travel in the bundle's metadata and events.

This module sits below everything that uses it (the runtime runs variants, the capture reads roles,
the model reads costs and presets) and imports nothing of taxmodel but its errors; only
``load_builtin_workloads`` imports the built-ins (``taxmodel.kernels``), on demand.

Register a workload with ``@register`` (built-ins live in ``taxmodel.kernels``; a user's module
can be loaded with ``taxmodel profile --workload-module my_module``).
"""
from __future__ import annotations

import inspect
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, ClassVar, Mapping

from taxmodel.errors import InputError


@dataclass(frozen=True)
class Intermediate:
    """A tensor written to HBM by one kernel and read back by the next (a locality-tax source).

    ``producer``/``consumer`` are regular expressions over kernel names (or roles prefixed with
    'role:'); ``bytes`` is the size written once and read once, per rank and iteration.
    """

    name: str
    bytes: int
    producer: str
    consumer: str


@dataclass(frozen=True)
class Cost:
    """Declared cost of one iteration on one rank: the physical floor of the work."""

    flops: int
    hbm_bytes: int  # bytes that must cross HBM at least once (inputs read, outputs written)
    link_bytes: int  # bytes this rank must receive over GPU-GPU links
    intermediates: tuple[Intermediate, ...] = ()
    dtype: str = "bf16"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["intermediates"] = [asdict(i) for i in self.intermediates]
        return d

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> "Cost":
        inter = tuple(Intermediate(**i) for i in d.get("intermediates", ()))
        return Cost(int(d["flops"]), int(d["hbm_bytes"]), int(d["link_bytes"]), inter, d.get("dtype", "bf16"))


class RankBound:
    """Mixin for a workload's per-rank state that keeps its ``RankContext`` as ``ctx``: the rank
    and world size kernels launch with (not a dataclass field: subclasses declare ``ctx``)."""

    ctx: Any

    @property
    def rank(self) -> int:
        return self.ctx.rank

    @property
    def world(self) -> int:
        return self.ctx.world_size


@dataclass
class Variant:
    """One way of computing the workload.

    ``run(state)`` enqueues one iteration's kernels (no host sync inside); ``roles`` maps a
    kernel-name regex to a role (compute/comm/fused/copy); ``needs_heap`` says whether inputs
    must live on the symmetric heap; ``fine_grained`` marks in-kernel communication variants.
    ``graph_safe``: the variant's ``run`` reads all per-iteration state from device memory, so
    one captured iteration can be replayed (``taxmodel profile --graph`` captures it).
    """

    name: str
    run: Callable[[Any], Any]
    roles: Mapping[str, str] = field(default_factory=dict)
    needs_heap: bool = False
    fine_grained: bool = False
    description: str = ""
    available: Callable[[Any], str | None] = lambda ctx: None  # returns why not, or None
    graph_safe: bool = False


class Workload:
    """Base class of a workload. Subclasses set the class attributes and implement the methods."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    presets: ClassVar[dict[str, dict[str, int]]] = {}
    default_preset: ClassVar[str] = ""
    cpu_preset: ClassVar[str] = "tiny"
    #: Shape keys a user may set (``--shape K=V``) beyond the preset's own: tuning and structure
    #: switches the workload reads with a default when absent.
    option_keys: ClassVar[tuple[str, ...]] = ()

    def variants(self) -> dict[str, Variant]:
        raise NotImplementedError

    def shape(self, preset: str | None = None, **overrides: int) -> dict[str, int]:
        preset = preset or self.default_preset
        if preset not in self.presets:
            raise InputError(f"{self.name}: unknown preset '{preset}'; choose one of {', '.join(self.presets)}")
        shape = dict(self.presets[preset])
        shape.update({k: int(v) for k, v in overrides.items() if v is not None})
        return shape

    def setup(self, ctx: Any, shape: Mapping[str, int], variant: Variant) -> Any:
        """Build inputs and outputs for one rank; return the state passed to ``variant.run``."""
        raise NotImplementedError

    def reference(self, ctx: Any, shape: Mapping[str, int], state: Any) -> Any:
        """The expected output of this rank, in higher precision."""
        raise NotImplementedError

    def output(self, state: Any) -> Any:
        """The output tensor that ``reference`` is compared with."""
        raise NotImplementedError

    def tolerance(self, shape: Mapping[str, int], world_size: int = 1) -> tuple[float, float]:
        """(rtol, atol) for the reference check of one rank's output on ``world_size`` ranks (an
        output summed over ranks in 16-bit arithmetic rounds once per rank, so its tolerance may
        grow with them). A workload may define ``tolerance(self, shape)`` without the world size."""
        return (2e-2, 2e-2)

    def cost(self, shape: Mapping[str, int], world_size: int, variant: str) -> Cost:
        raise NotImplementedError


_REGISTRY: dict[str, type[Workload]] = {}


def register(cls: type[Workload]) -> type[Workload]:
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    _REGISTRY[cls.name] = cls
    return cls


def get_workload(name: str) -> Workload:
    load_builtin_workloads()
    if name not in _REGISTRY:
        raise InputError(f"unknown workload '{name}'; built-in and registered: {', '.join(sorted(_REGISTRY)) or 'none'}")
    return _REGISTRY[name]()


def all_workloads() -> dict[str, type[Workload]]:
    load_builtin_workloads()
    return dict(_REGISTRY)


def load_builtin_workloads() -> None:
    """Import the built-in workload packages (``taxmodel.kernels.BUILTIN``): importing one registers it."""
    import importlib

    for name in importlib.import_module("taxmodel.kernels").BUILTIN:
        importlib.import_module(f"taxmodel.kernels.{name}")


def classify_role(name: str, roles: Mapping[str, str], default: str = "compute") -> str:
    """Role of a kernel named ``name``: the first matching regex in ``roles``, else ``default``
    (the capture passes ``comm`` for a communication library's kernels: ``taxmodel.vocabulary``)."""
    for pattern, role in roles.items():
        if re.search(pattern, name):
            return role
    return default


def tolerance_of(workload: Any, shape: Mapping[str, int], world_size: int) -> tuple[float, float]:
    """``workload.tolerance`` at ``world_size``; a user's workload whose ``tolerance`` takes only the
    shape gets its shape-only answer."""
    if "world_size" in inspect.signature(workload.tolerance).parameters:
        return workload.tolerance(shape, world_size=world_size)
    return workload.tolerance(shape)
