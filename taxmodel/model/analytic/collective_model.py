"""Time of a collective: the calibrated curve of the hardware file at the nearest measured world
size, else ring/tree alpha-beta over the topology."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from taxmodel.hardware.specs import HardwareSpec
from taxmodel.vocabulary import ALLGATHER, ALLREDUCE, COLLECTIVES, normalize_collective

from .params import ModelParams
from .topology import Topology


def _op(name: str) -> str:
    """The trace's spelling of a collective (``all_gather`` -> ``allgather``); other keys unchanged."""
    op = normalize_collective(name)
    return op if op in COLLECTIVES else name


#: How a calibrated curve was timed (the hardware file's ``collectives.timing``, per op): "graph" is
#: the collective's own device time (N calls replayed in one CUDA graph: no host launch cost, no rank
#: skew), what the timeline needs, since it adds launch costs and the ranks' skew itself; "eager" is
#: back-to-back host calls, which include both, so small collectives come out too slow. Files
#: without ``timing`` have eager curves.
CURVE_TIMINGS = ("graph", "eager")


def _read_curve(raw: Mapping[str, Any]) -> tuple[int, dict[str, tuple[tuple[float, float], ...]], dict[str, str]]:
    """(world size, op -> sorted points, op -> timing) of one curve in hardware-file form (``collectives``
    or an entry of ``collectives_by_world``); ops with fewer than two good points are left out."""
    world = int(raw.get("world_size", 0) or 0)
    declared = raw.get("timing")
    curves, timing = {}, {}
    for op, pts in raw.items():
        if op in ("world_size", "timing") or not isinstance(pts, list):
            continue
        key = _op(op)
        good = sorted((float(b), float(s)) for b, s in pts if float(b) > 0 and float(s) > 0)
        if len(good) >= 2:
            curves[key] = tuple(good)
            how = declared.get(op) if isinstance(declared, Mapping) else declared
            timing[key] = how if how in CURVE_TIMINGS else "eager"
    return world, curves, timing


@dataclass(frozen=True)
class CollectiveModel:
    """Collective time: ring (and tree for all-reduce) alpha-beta, or a calibrated curve.

    ``curves``: op -> sorted (bytes per rank, seconds) measured at ``curve_world`` ranks (the
    hardware file's ``collectives``); ``by_world``: world size -> (curves, timing) of the curves
    measured on other numbers of ranks (``collectives_by_world``, from ``taxmodel calibrate --only
    collectives --update FILE -n W``). At a world size with a curve of its own, inside that curve's
    sizes, the curve is interpolated in log-log space. Elsewhere alpha and beta are fitted to the
    curve of the *nearest* measured world size (through its smallest and largest message,
    ``_alpha_beta_of``; ties go to the file's own curve, then to the larger world) and the formula
    is evaluated at the asked world size: the nearest curve has the closest ring length and protocol
    choice.
    The time is the collective's own, after its last member arrived: the timeline (``simulate``)
    places it after the host launch, launch latency and the ranks' start skew, for graph and eager
    launches alike. Only the hardware file's ``collectives`` and ``collectives_by_world`` curves are
    read, never ``collectives_eager`` (kept for reference); ``timing`` says per op how each was measured."""

    topo: Topology
    base_s: float
    curves: Mapping[str, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    curve_world: int = 0
    timing: Mapping[str, str] = field(default_factory=dict)
    by_world: Mapping[int, tuple[Mapping[str, tuple[tuple[float, float], ...]], Mapping[str, str]]] = \
        field(default_factory=dict)

    @staticmethod
    def from_hardware(hw: HardwareSpec, topo: Topology, params: ModelParams) -> "CollectiveModel":
        extra = hw.extra or {}
        world, curves, timing = _read_curve(extra.get("collectives") or {})
        by_world: dict[int, tuple[dict, dict]] = {}
        for key, raw in (extra.get("collectives_by_world") or {}).items():
            if not isinstance(raw, Mapping):
                continue
            other, other_curves, other_timing = _read_curve({"world_size": key, **raw})
            if other > 1 and other_curves and not (curves and other == world):  # the file's own curve wins
                by_world[other] = (other_curves, other_timing)
        if not topo.single_domain:  # a curve measured inside one domain says nothing about the network
            curves, world, timing, by_world = {}, 0, {}, {}
        return CollectiveModel(topo, params.collective_base_s, curves, world, timing, by_world)

    def _curve_sets(self) -> dict[int, tuple[Mapping[str, tuple[tuple[float, float], ...]], Mapping[str, str]]]:
        """World size -> (curves, timing) of every calibrated curve, the file's own included."""
        sets = dict(self.by_world)
        if self.curves and self.curve_world > 1:
            sets[self.curve_world] = (self.curves, self.timing)
        return sets

    def _nearest(self, world: int, worlds: Sequence[int]) -> int:
        """The measured world size closest to ``world``; ties: the file's own, then the larger."""
        return min(worlds, key=lambda w: (abs(w - world), w != self.curve_world, -w))

    def _fit_source(self, op: str, world: int | None) -> tuple[int, tuple[tuple[float, float], ...], str] | None:
        """(world size, points, op of the points) that ``op``'s alpha-beta is fitted to at ``world``:
        the nearest world's curve of ``op``, else the nearest world's all-gather curve; ``world``
        None: the file's own curve (as ``alpha_beta`` always did)."""
        sets = self._curve_sets()
        if world is None:
            sets = {w: v for w, v in sets.items() if w == self.curve_world}
        for fit_op in (op, ALLGATHER):
            worlds = [w for w, (curves, _) in sets.items() if fit_op in curves]
            if worlds:
                w = self._nearest(world if world is not None else self.curve_world, worlds)
                return w, sets[w][0][fit_op], fit_op
        return None

    def curve_note(self, world: int) -> str:
        """The assumption line of a prediction: which curve (or formula) gave the collective times."""
        sets = self._curve_sets()
        if not sets:
            a, b = self.alpha_beta(ALLGATHER)
            return (f"collectives: ring alpha-beta, alpha {a * 1e6:.1f} us per step, beta {b / 1e9:.0f} GB/s, plus "
                    f"{self.base_s * 1e6:.0f} us per call (no calibrated curve)")
        used = world if world in sets else self._nearest(world, list(sets))
        timing = sets[used][1]
        label = f"{used} ranks" if used == self.curve_world else f"{used} ranks (collectives_by_world)"
        where = ""
        if used != world:
            where = ", alpha-beta fitted to it for this world size"
            if len(sets) > 1:
                where += f" (the nearest of the curves at {', '.join(str(w) for w in sorted(sets))} ranks)"
        eager = sorted(op for op, t in timing.items() if t == "eager")
        if not eager:
            return (f"collectives: calibrated curve at {label}{where}, graph-timed (each collective's own "
                    "device time; launch costs and the ranks' skew are added by the timeline)")
        rerun = "" if used == self.curve_world else f" -n {used}"
        return (f"collectives: calibrated curve at {label}{where}; {', '.join(eager)} eager-timed: "
                "those times include host launch cost and rank skew, which the timeline adds again, so small "
                f"collectives come out too slow (re-run `taxmodel calibrate --only collectives --update FILE{rerun}`)")

    def _steps(self, op: str, world: int) -> float:
        """Bytes received per byte-per-rank (ring): all_gather / reduce_scatter W-1, all_reduce 2(W-1)."""
        return (2.0 if op == ALLREDUCE else 1.0) * (world - 1)

    def alpha_beta(self, op: str, world: int | None = None) -> tuple[float, float]:
        """(alpha seconds per step, beta bytes/s) for ``op``: fitted to the curve of the measured world
        size nearest ``world`` when there is one (``world`` None: the file's own curve)."""
        op = _op(op)
        return self._alpha_beta_of(self._fit_source(op, world))

    def _alpha_beta_of(self, source: tuple[int, tuple[tuple[float, float], ...], str] | None) -> tuple[float, float]:
        """(alpha, beta) of the ring formula through ``source``'s (``_fit_source``) smallest and largest
        message, or the topology's own.

        Each term comes from the regime that measures it: alpha from the latency-bound end, beta from
        the bandwidth-bound end. A least-squares fit over the whole curve would be
        ruled by the largest messages, whose times are 100-1000x the smallest, and puts their protocol
        overhead into alpha: fitted to the 4-rank H200 all-gather it gave alpha 5.1 us a step and
        36 us for an 8 KB all-gather on 8 ranks, which took 12.5 us there (17 us with this fit; the
        large messages come out 9% slow either way)."""
        if source is not None:
            curve_world, pts, fit_op = source
            steps = self._steps(fit_op, curve_world)
            (b_lo, t_lo), (b_hi, t_hi) = min(pts), max(pts)
            inv_beta = (t_hi - t_lo) / (steps * (b_hi - b_lo)) if b_hi > b_lo else 0.0
            if inv_beta <= 0:
                inv_beta = 1.0 / self.topo.link_bytes_per_s
            alpha = max(t_lo / steps - b_lo * inv_beta, 0.0)
            return alpha, 1.0 / inv_beta
        return self.topo.latency_s, self.topo.link_bytes_per_s

    def time(self, op: str, bytes_per_rank: float, world: int | None = None) -> float:
        """Seconds of one collective on ``world`` ranks, ``bytes_per_rank`` being each rank's
        contribution (all_gather input, reduce_scatter output, all_reduce buffer / W)."""
        op = _op(op)
        world = self.topo.world if world is None else world
        if world <= 1 or bytes_per_rank <= 0:
            return 0.0
        exact = self._curve_sets().get(world, ({}, {}))[0].get(op)
        if exact and exact[0][0] <= bytes_per_rank <= exact[-1][0]:
            xs = np.log([b for b, _ in exact])
            ys = np.log([s for _, s in exact])
            return float(np.exp(np.interp(math.log(bytes_per_rank), xs, ys)))
        source = self._fit_source(op, world)
        alpha, beta = self._alpha_beta_of(source)
        steps = self._steps(op, world)
        ring = alpha * steps + steps * bytes_per_rank / beta
        base = 0.0 if source is not None and source[2] == op else self.base_s  # a fit to op's own curve has its fixed cost
        if op == ALLREDUCE:  # a tree halves the latency term for small messages
            tree = 2 * alpha * math.ceil(math.log2(world)) + 2 * bytes_per_rank * world / beta
            ring = min(ring, tree)
        return ring + base


