"""Shared building blocks of the analytic model (formulas and assumptions: docs/model.md).

The model predicts a *timeline*, not the taxes directly: for every rank it places each kernel of
one iteration (host launch calls, GPU start and end, collectives that wait for their last member,
fused kernels that wait on their peers' flags) from shapes and hardware numbers. The timeline is
then written as bundle events and split by the very ledger that splits measured bundles
(``taxmodel.model.ledger.compute_ledger``), so a predicted ``skew_wait`` or ``locality_tax``
means exactly what a measured one means, and the parts sum to the predicted window by the
ledger's own invariant.

Building blocks here: model parameters (documented defaults, calibrated values when the hardware
file has them), the topology assumption, GEMM time (roofline with tile/wave quantization, vendor
vs Triton efficiency), collective time (calibrated curve, else ring/tree alpha-beta), HBM time,
launch pipeline (host cost per launch, launch latency, GPU kernel gap), the spread of the ranks'
start times after a host barrier, the fill/drain of a fine-grained pipeline, and the timeline
simulator itself.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from taxmodel.errors import InputError
from taxmodel.model.hardware import HardwareSpec
from taxmodel.trace.capture_meta import DEFAULT_GATE_HOLD_US, START_ALIGNMENTS

# --- parameters ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelParams:
    """Numbers the model needs beyond a datasheet. Each has a documented default (docs/model.md);
    ``from_hardware`` takes the calibrated value where the hardware file has one, and ``sources``
    says for every field where its value came from."""

    #: Triton tile GEMM rate / vendor (cuBLAS, hipBLASLt) rate on the same shape. Default from
    #: DEVICE_NOTES (plain Triton 0.84 at 8192^3 .. 0.97 at 1024 rows); fit from bundles with
    #: ``fit_params`` (validate.py) on a documented subset.
    triton_gemm_efficiency: float = 0.90
    #: The same for the GEMM+RS fused kernel's GEMM (its own tile configuration and K split), when
    #: fitted (``fit_params``, on that kernel's duration); None: ``triton_gemm_efficiency``.
    rs_gemm_efficiency: float | None = None
    #: Vendor GEMM rate as a fraction of a *datasheet* peak (cuBLAS reached ~0.8 of the H200's
    #: 989 TFLOP/s, DEVICE_NOTES); 1.0 for calibrated peaks, which are measured cuBLAS rates.
    vendor_fraction_of_datasheet: float = 0.80
    #: Vendor GEMM tile (nvjet 256x128 in the H200 traces) and the Triton kernels' tile (GPU_CONFIG).
    vendor_tile: tuple[int, int] = (256, 128)
    triton_tile: tuple[int, int] = (128, 256)
    #: Fixed time every kernel pays (ramp-up, tail, prologue): a few microseconds.
    kernel_overhead_s: float = 2e-6
    #: Memory-bound Triton kernels stream at this fraction of the HBM copy bandwidth.
    triton_stream_efficiency: float = 0.80
    #: One step of a flash decode combine program: load a [rows, NB, D] fp32 tile of partials
    #: (16 KB) and merge it. The steps of one program are serial (each waits for its loads), so a
    #: combine with few programs and many partials is latency-bound, not bandwidth-bound: about one
    #: loaded-memory latency plus the merge. Calibrated (`taxmodel calibrate`'s combine step: the
    #: local combine kernel queued after the split-KV kernel, as the bsp variant runs them).
    combine_step_s: float = 1.0e-6
    #: One step of the fused flash decode kernel's merge of the ranks' partials with LL words: poll
    #: one source rank's words until they all carry this launch's epoch, then merge them. Fitted from
    #: the fused bundles' in-kernel records (validate.FIT_RULES).
    ll_merge_step_s: float = 1.0e-6
    #: Host time of one Triton launch and of one torch op / NCCL call (DEVICE_NOTES: 15 us, 10 us).
    host_launch_triton_s: float = 15e-6
    host_launch_torch_s: float = 10e-6
    #: GPU idle between a launch call's end and the kernel's start on an idle GPU; GPU-side gap
    #: between back-to-back queued kernels (both as the profiler sees them).
    launch_latency_s: float = 4e-6
    kernel_gap_s: float = 1.1e-6
    #: Scale of the ranks' release times after a host barrier (exponential order statistics).
    barrier_skew_s: float = 5e-6
    #: How ranks start an iteration: "host" (they leave a host barrier, spread by barrier_skew_s) or
    #: "device" (``taxmodel profile --align device``: a device gate releases every GPU together; see
    #: ``release_offsets``); with the gate, each host enqueues for ``gate_hold_s`` before its GPU starts.
    start_alignment: str = "host"
    gate_hold_s: float = DEFAULT_GATE_HOLD_US * 1e-6
    #: Fixed cost of one NCCL/RCCL collective beyond alpha-beta (kernel setup, protocol handshake).
    collective_base_s: float = 8e-6
    #: Flag round trip between two GPUs (release-set on one, acquire-wait on the other, and back).
    flag_roundtrip_s: float = 2e-6
    #: What one ``_sync.wait_geq`` costs a program when the flag is already set (poll, barriers, an
    #: acquire atomic): system scope, and GPU scope. Calibrated (`taxmodel calibrate`'s sync step;
    #: 0.41-0.43 us on one H200); the default, for uncalibrated hardware, is that rounded up.
    flag_wait_s: float = 0.5e-6
    flag_wait_gpu_s: float = 0.5e-6
    #: The GPU's bandwidth for the fused flash decode's LL pushes (8-byte words, every pair's pushing
    #: CTA storing into every peer at once): 0 uses the peer-store bandwidth (``peer_store_bytes_per_s``,
    #: calibrated with wide stores to one peer). Fitted from the push records (validate.FIT_RULES).
    ll_push_bytes_per_s: float = 0.0
    #: Rate at which one program of GEMM+RS's reduction kernel (one output tile: W received slots
    #: read, the tile written) moves bytes. The kernel runs one program per own output tile, so
    #: with few tiles (small M, many ranks) it is this rate, not HBM, that bounds it: 32 programs
    #: on 8 H200s at M=1024. Fitted from the reduction's ``combine`` records (validate.FIT_RULES);
    #: the default is the middle of the records' 19-35 GB/s on 2, 4 and 8 H200s.
    reduce_program_bytes_per_s: float = 26e9
    #: Bandwidth with which one GPU's SMs load from its peers' memory while every rank does the
    #: same (Triton ``iris.load`` through the symmetric heap), and the latency of one such load.
    peer_load_bytes_per_s: float = 0.0  # 0: use the link bandwidth
    peer_load_latency_s: float = 1.5e-6
    #: Store bandwidth to peers with all SMs, and per SM (the push kernel runs on a few SMs).
    peer_store_bytes_per_s: float = 0.0  # 0: use the link bandwidth
    peer_store_bytes_per_s_per_sm: float = 25e9
    #: How the fine-grained AG+GEMM variants move remote rows (kernels/ag_gemm GemmConfig.transport):
    #: "ce" copy engines (the default there), "sm" a Triton copy kernel, "direct" (pull only) loads
    #: from the peers inside the GEMM. Host time of one copy-engine call (cuMemcpyAsync or a stream
    #: flag write): the host enqueues 2 per block and peer before it launches the GEMM.
    ag_transport: str = "ce"
    host_copy_call_s: float = 3e-6
    #: GPUs that one NVLink/xGMI domain connects all-to-all (NVL72 switch; MI300X 8 fully connected).
    domain_size: int = 72
    #: Beyond one domain: bandwidth and latency per GPU of the scale-out network (400 Gb/s NIC per GPU).
    internode_bytes_per_s: float = 50e9
    internode_latency_s: float = 10e-6
    #: Whether fused kernels write in-kernel trace records (then their waits are flag_wait; without
    #: records the ledger cannot see them and counts them as compute time).
    instrumented: bool = False
    #: What the records add to one instrumented fused kernel launch. Measured instrumented against
    #: plain in the same run (CUDA graphs, 4 H200s, fused flash decode; docs/records.md): about
    #: 1.1 us at batch 1 KV 1K (+8.0 % of ~14 us), 0.7 us at batch 16 KV 1K (+2.9 % of ~23.5 us),
    #: 0-1 us at batch 1 KV 16K (-0.2 to +3.0 % of ~33 us); the middle one is the default. Measured
    #: on that kernel only; the GEMM+RS fused kernels get the same value, unmeasured for them.
    record_overhead_s: float = 0.7e-6
    #: Whether each iteration is one CUDA/HIP graph launch (``taxmodel profile --graph``): one host
    #: launch call (``host_launch_torch_s``) per iteration, every kernel queued behind it.
    graph_launch: bool = False
    sources: Mapping[str, str] = field(default_factory=dict)

    @staticmethod
    def from_hardware(hw: HardwareSpec, **overrides: Any) -> "ModelParams":
        """Defaults, replaced by what ``hw`` (a preset or a calibrated file) measured."""
        base = ModelParams()
        values: dict[str, Any] = {}
        src: dict[str, str] = {f: "default" for f in _PARAM_FIELDS}
        direct = {"host_launch_triton_s": hw.host_launch_s, "launch_latency_s": hw.launch_latency_s,
                  "kernel_gap_s": hw.kernel_gap_s, "flag_roundtrip_s": hw.flag_roundtrip_s}
        for name, val in direct.items():
            if val and float(val) > 0:
                values[name] = float(val)
                src[name] = f"hardware ({hw.source})"
        extra = dict(hw.extra or {})
        for name in _PARAM_FIELDS:
            if name in extra and extra[name] is not None and name not in ("sources",):
                values[name] = type(getattr(base, name))(extra[name]) if not isinstance(getattr(base, name), tuple) \
                    else tuple(extra[name])
                src[name] = f"hardware extra ({hw.source})"
        if hw.vendor == "amd":
            values.setdefault("domain_size", 8)
            src["domain_size"] = "MI300X: 8 GPUs fully connected by xGMI"
        for name, val in overrides.items():
            if val is not None:
                values[name] = val
                src[name] = "given"
        return replace(base, **values, sources=src)

    def with_fitted(self, fitted: Mapping[str, float]) -> "ModelParams":
        """These parameters with ``fitted`` values (``taxmodel validate``'s fits) in place, each
        sourced as fitted."""
        if not fitted:
            return self
        return replace(self, **dict(fitted), sources={**dict(self.sources), **{k: "fitted (taxmodel validate)"
                                                                                for k in fitted}})

    def with_given(self, given: Mapping[str, Any]) -> "ModelParams":
        """These parameters with ``given`` values in place, each sourced as given."""
        return replace(self, **dict(given), sources={**dict(self.sources), **{k: "given" for k in given}})

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["sources"] = dict(self.sources)
        return d


_PARAM_FIELDS = [f for f in ModelParams.__dataclass_fields__ if f != "sources"]


# --- topology -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Topology:
    """How ``world`` GPUs are connected, as the model assumes it (stated in every prediction)."""

    world: int
    domain_size: int
    link_bytes_per_s: float  # per GPU, receive, for collectives
    latency_s: float
    description: str

    @property
    def single_domain(self) -> bool:
        return self.world <= self.domain_size


def topology(hw: HardwareSpec, world: int, params: ModelParams) -> Topology:
    if world < 1:
        raise InputError(f"world size must be at least 1, got {world}")
    dom = params.domain_size
    fabric = "xGMI, fully connected" if hw.vendor == "amd" else "NVLink through an all-to-all switch (NVL72-style)"
    if world <= dom:
        desc = f"{world} GPU(s) in one {fabric} domain (up to {dom}); every pair at {hw.link_bytes_per_s / 1e9:.0f} GB/s per direction"
        return Topology(world, dom, hw.link_bytes_per_s, max(hw.link_latency_s, 0.0), desc)
    desc = (f"{world} GPUs = {math.ceil(world / dom)} domains of {dom} ({fabric}); collectives bottlenecked by the "
            f"scale-out network at {params.internode_bytes_per_s / 1e9:.0f} GB/s per GPU, "
            f"{params.internode_latency_s * 1e6:.0f} us latency (an assumption, not a measurement)")
    return Topology(world, dom, min(hw.link_bytes_per_s, params.internode_bytes_per_s),
                    max(hw.link_latency_s, params.internode_latency_s), desc)


# --- compute and memory ---------------------------------------------------------------------------


def cdiv(a: int, b: int) -> int:
    return -(-int(a) // int(b))


#: Shape ``dtype`` codes (as the GEMM workloads take them) -> (element bytes, dtype name); bf16 by default.
DTYPE_CODES: dict[int, tuple[int, str]] = {16: (2, "bf16"), 15: (2, "fp16"), 32: (4, "fp32")}


def shape_dtype(shape: Mapping[str, int]) -> tuple[int, str]:
    """(element bytes, dtype name) of a GEMM workload's shape (its optional ``dtype`` code)."""
    return DTYPE_CODES.get(int(shape.get("dtype", 16)), DTYPE_CODES[16])


def wave_inflation(m: int, n: int, tile: tuple[int, int], slots: int) -> float:
    """Tile and wave quantization: time of whole waves of whole tiles over the ideal time (>= 1).

    ``ceil(M/TM) * ceil(N/TN)`` tiles run in waves of ``slots`` (one tile per SM at a time); the
    last wave and the edge tiles are paid in full."""
    tiles = cdiv(m, tile[0]) * cdiv(n, tile[1])
    waves = cdiv(tiles, max(1, slots))
    return waves * max(1, slots) * tile[0] * tile[1] / float(max(1, m) * max(1, n))


#: The shape a calibrated GEMM rate was measured on (calibrate.gemm_rate): its rate already
#: includes that shape's quantization, which is divided out before applying another shape's.
CALIBRATION_GEMM = (8192, 8192, 8192)


#: SMs assumed for hardware whose spec does not say (an H100/H200 SXM has 132).
DEFAULT_SMS = 132


def sm_count(hw: HardwareSpec) -> int:
    """The GPU's SMs (CUs), or ``DEFAULT_SMS`` when its spec does not say."""
    return hw.num_sms or DEFAULT_SMS


def gemm_time(m: int, n: int, k: int, dtype: str, hw: HardwareSpec, params: ModelParams, *, kind: str = "vendor",
              sms: int | None = None, elt: int = 2) -> float:
    """Seconds for one GEMM [m,k] x [k,n]: max(compute with wave quantization, HBM traffic) plus
    the fixed kernel overhead. ``kind`` "triton" applies the Triton efficiency factor; ``sms``
    (fewer than the GPU has) scales the rate down and changes the wave size."""
    if min(m, n, k) <= 0:
        return 0.0
    num_sms = sm_count(hw)
    use = num_sms if sms is None else max(1, min(int(sms), num_sms))
    rate = hw.flops_per_s(dtype)
    tile = params.vendor_tile
    if hw.source == "datasheet":
        rate *= params.vendor_fraction_of_datasheet
        ref = 1.0
    else:
        ref = wave_inflation(CALIBRATION_GEMM[0], CALIBRATION_GEMM[1], params.vendor_tile, num_sms)
    if kind == "triton":
        rate *= params.triton_gemm_efficiency
        tile = params.triton_tile
    elif kind != "vendor":
        raise ValueError(f"gemm kind {kind!r}")
    rate *= use / num_sms
    t_compute = 2.0 * m * n * k / rate * wave_inflation(m, n, tile, use) / ref
    t_memory = (m * k + k * n + m * n) * elt / hw.hbm_bytes_per_s
    return max(t_compute, t_memory) + params.kernel_overhead_s


def stream_time(nbytes: float, hw: HardwareSpec, params: ModelParams, *, triton: bool = True) -> float:
    """A memory-bound kernel moving ``nbytes`` through HBM (reads + writes), plus the overhead."""
    eff = params.triton_stream_efficiency if triton else 1.0
    return float(nbytes) / (hw.hbm_bytes_per_s * eff) + params.kernel_overhead_s


def push_wave_time(bytes_per_program: float, programs: int, per_sm_bytes_per_s: float, store_bytes_per_s: float,
                   latency_s: float) -> float:
    """``programs`` programs that each store ``bytes_per_program`` into peers' memory at the same
    time: the slower of one SM's peer-store rate and the GPU's peer-store bandwidth shared by all of
    them, plus the latency until the last store lands (or the release that waits for them)."""
    if bytes_per_program <= 0 or programs <= 0:
        return 0.0
    return max(bytes_per_program / per_sm_bytes_per_s, programs * bytes_per_program / store_bytes_per_s) + latency_s


def serial_steps_time(steps: int, params: ModelParams, step_s: float | None = None) -> float:
    """A program's ``steps`` latency-bound steps in a row (``step_s`` each; ``combine_step_s`` unless given)."""
    return max(int(steps), 0) * (params.combine_step_s if step_s is None else step_s)


def hbm_round_trip(nbytes: float, hw: HardwareSpec) -> float:
    """An intermediate written once and read once at HBM bandwidth (the locality tax's unit)."""
    return 2.0 * float(nbytes) / hw.hbm_bytes_per_s


# --- collectives ----------------------------------------------------------------------------------

_OP_ALIASES = {"all_gather": "allgather", "allgather": "allgather", "all_reduce": "allreduce", "allreduce": "allreduce",
               "reduce_scatter": "reduce_scatter", "reducescatter": "reduce_scatter"}


#: How a calibrated curve was timed (the hardware file's ``collectives.timing``, per op): "graph" is
#: the collective's own device time (N calls replayed in one CUDA graph: no host launch cost, no rank
#: skew), what the timeline needs, since it adds launch costs and the ranks' skew itself; "eager" is
#: back-to-back host calls, which include both, so small collectives come out too slow. Files
#: written before the graph timing existed have no ``timing``: their curves are eager.
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
        key = _OP_ALIASES.get(op, op)
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
    curve of the *nearest* measured world size (least squares on the ring formula; ties go to the
    file's own curve, then to the larger world) and the formula is evaluated at the asked world
    size: the nearest curve has the closest ring length and protocol choice, and with only the
    file's own curve this is the fit to it, as before ``collectives_by_world`` existed.
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
        for fit_op in (op, "allgather"):
            worlds = [w for w, (curves, _) in sets.items() if fit_op in curves]
            if worlds:
                w = self._nearest(world if world is not None else self.curve_world, worlds)
                return w, sets[w][0][fit_op], fit_op
        return None

    def curve_note(self, world: int) -> str:
        """The assumption line of a prediction: which curve (or formula) gave the collective times."""
        sets = self._curve_sets()
        if not sets:
            a, b = self.alpha_beta("allgather")
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
        return (2.0 if op == "allreduce" else 1.0) * (world - 1)

    def alpha_beta(self, op: str, world: int | None = None) -> tuple[float, float]:
        """(alpha seconds per step, beta bytes/s) for ``op``: fitted to the curve of the measured world
        size nearest ``world`` when there is one (``world`` None: the file's own curve)."""
        op = _OP_ALIASES.get(op, op)
        return self._alpha_beta_of(self._fit_source(op, world))

    def _alpha_beta_of(self, source: tuple[int, tuple[tuple[float, float], ...], str] | None) -> tuple[float, float]:
        """(alpha, beta) of the ring formula through ``source``'s (``_fit_source``) smallest and largest
        message, or the topology's own.

        Each term comes from the regime that measures it: alpha from the latency-bound end, beta from
        the bandwidth-bound end. A least-squares fit over the whole curve (what this was before) is
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
        op = _OP_ALIASES.get(op, op)
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
        if op == "allreduce":  # a tree halves the latency term for small messages
            tree = 2 * alpha * math.ceil(math.log2(world)) + 2 * bytes_per_rank * world / beta
            ring = min(ring, tree)
        return ring + base


# --- ranks' start spread ---------------------------------------------------------------------------


def release_offsets(world: int, params: "ModelParams") -> list[float]:
    """When each rank's GPU may start the iteration, from the earliest.

    Host barrier: ``start_offsets(world, barrier_skew_s)``. Device gate (kernels/_gate.py): every
    rank adds to every counter, so the last rank to arrive sees the count complete at once (its own
    add is local) and every other rank one flag latency later, when that rank's add lands: one
    rank at 0, the others at half the calibrated flag round trip."""
    if params.start_alignment not in START_ALIGNMENTS:
        raise ValueError(f"start_alignment {params.start_alignment!r}: expected one of {START_ALIGNMENTS}")
    if params.start_alignment == "device":
        return [0.0] + [params.flag_roundtrip_s / 2] * (world - 1)
    return start_offsets(world, params.barrier_skew_s)


def start_offsets(world: int, scale_s: float) -> list[float]:
    """Expected release times of ``world`` ranks after a host barrier, earliest first: the order
    statistics of i.i.d. exponential delays of mean ``scale_s``, measured from the earliest:
    E[X_(k+1) - X_(1)] = scale * sum_{i=1}^{k} 1/(W-i). Their spread, scale * H_{W-1}, grows with
    the world size: one source of the bulk-synchronous tax that no kernel can remove."""
    out, acc = [], 0.0
    for k in range(world):
        if k:
            acc += scale_s / (world - k)
        out.append(acc)
    return out


# --- fine-grained pipeline -------------------------------------------------------------------------


def pipeline_time(compute_s: float, chunks: int, transfer_s: float, first_latency_s: float,
                  per_chunk_flag_s: float = 0.0, local_fraction: float = 0.0) -> float:
    """Time of a producer/consumer tile pipeline: ``chunks`` pieces arrive one after another
    (``transfer_s`` for all of them, after ``first_latency_s``), each followed by its flag, and
    the consumer computes each piece after it arrives. A ``local_fraction`` of the compute needs
    no transfer and runs first. Result: max(compute, fill + transfers + drain), where fill is the
    first piece's latency and drain the compute of the last piece."""
    if chunks <= 0 or transfer_s <= 0:
        return compute_s
    remote_compute = compute_s * (1.0 - local_fraction)
    drain = remote_compute / chunks
    arrive_all = first_latency_s + transfer_s + chunks * per_chunk_flag_s
    return max(compute_s, compute_s * local_fraction + first_latency_s + drain, arrive_all + drain)


# --- the timeline -----------------------------------------------------------------------------------

ROLES = ("compute", "comm", "fused", "copy", "other")


@dataclass
class KernelPlan:
    """One kernel of one iteration on one rank.

    ``duration_s``: for a collective, the transfer after the last member arrived; for a fused
    kernel with ``sync``, the local work before its wait (``post_s`` after it); else its length.
    ``host_s``: host time spent before its launch call returns (Python, runtime). ``stream`` 0 is
    the main stream; kernels on other streams run concurrently with it. ``sync_after_s``: for a
    fused kernel with ``sync``, when (after its start) the work that peers wait for is done on
    this rank (default ``duration_s``). ``after``: the index (in this rank's plan) of an earlier
    kernel on another stream that must end before this one starts (a CUDA event wait between
    streams, e.g. a copy that needs the GEMM which produced its data)."""

    name: str
    role: str
    duration_s: float
    host_s: float
    stream: int = 0
    collective: str = ""  # op name when this kernel is a collective of all ranks
    sync: bool = False
    post_s: float = 0.0
    sync_after_s: float | None = None
    flag_latency_s: float = 0.0
    after: int | None = None
    #: For a fused kernel: the mean time a CTA of it spends in communication-only phases (moving
    #: data between GPUs; in-kernel records ``store_push``/``remote_load``), within its duration.
    comm_s: float = 0.0


def as_graph_launch(plans: Sequence[Sequence[KernelPlan]], params: ModelParams) -> list[list[KernelPlan]]:
    """The plans as one captured graph per iteration: the host spends one launch call (a graph
    launch costs about a torch launch) before the first kernel and nothing before the others, so
    every later kernel is queued (the ledger's kernel_gap, never host_starved)."""
    return [[replace(p, host_s=params.host_launch_torch_s if k == 0 else 0.0) for k, p in enumerate(rank)]
            for rank in plans]


@dataclass
class PredictedTimeline:
    """Per rank, the kernels as placed, plus host launch ends (seconds from the earliest release)."""

    rows: list[dict]  # rank, name, role, stream, start, end, launch_end, collective_id, wait (flag wait inside)


def simulate(plans: Sequence[Sequence[KernelPlan]], params: ModelParams) -> PredictedTimeline:
    """Place every rank's kernels of one iteration (``plans[r]``, the same sequence on every rank
    up to durations).

    Host: rank r is released from the barrier at ``start_offsets(W)[r]`` and returns from kernel
    k's launch call ``host_s`` later than from kernel k-1's. GPU: a kernel starts at
    max(its stream free + kernel gap, launch end + launch latency, its ``after`` kernel's end +
    kernel gap); a collective ends ``duration``
    after its last member started; a synced fused kernel ends at
    max(start + work, last peer's work done + flag latency) + post.
    """
    world = len(plans)
    if world == 0:
        return PredictedTimeline([])
    n = len(plans[0])
    if any(len(p) != n for p in plans):
        raise ValueError("every rank must run the same number of kernels")
    offs = release_offsets(world, params)
    gated = params.start_alignment == "device"
    host = [o - params.gate_hold_s for o in offs] if gated else list(offs)
    free: list[dict[int, float]] = [{} for _ in range(world)]
    ends: list[list[float]] = [[] for _ in range(world)]  # per rank, every placed kernel's end
    rows: list[dict] = []
    seq = 0
    for k in range(n):
        starts, launch_end = [], []
        for r in range(world):
            p = plans[r][k]
            host[r] += p.host_s
            launch_end.append(host[r])
            f = free[r].get(p.stream)
            s = host[r] + params.launch_latency_s
            if gated:  # queued behind the gate: not before its release
                s = max(s, offs[r] + params.kernel_gap_s)
            if f is not None:
                s = max(s, f + params.kernel_gap_s)
            if p.after is not None:
                if not 0 <= p.after < k:
                    raise ValueError(f"kernel {k} ({p.name}) waits on kernel {p.after}, which is not an earlier one")
                s = max(s, ends[r][p.after] + params.kernel_gap_s)
            starts.append(s)
        coll_id = ""
        if plans[0][k].collective:
            coll_id = f"0:{seq}"
            seq += 1
        last = max(starts)
        ready = max(st + (plans[r][k].sync_after_s if plans[r][k].sync_after_s is not None else plans[r][k].duration_s)
                    for r, st in enumerate(starts))
        for r in range(world):
            p, s = plans[r][k], starts[r]
            wait = 0.0
            if p.collective:
                e = last + p.duration_s
            elif p.sync and world > 1:
                own = s + p.duration_s
                e0 = max(own, ready + p.flag_latency_s)
                wait = e0 - own
                e = e0 + p.post_s
            else:
                e = s + p.duration_s + p.post_s
            if params.instrumented and p.role == "fused":  # its records' own cost, at its end
                e += params.record_overhead_s
            e = max(e, s + 1e-9)
            free[r][p.stream] = e
            ends[r].append(e)
            rows.append({"rank": r, "name": p.name, "role": p.role, "stream": p.stream, "start": s, "end": e,
                         "launch_end": launch_end[r], "collective_id": coll_id, "collective_op": p.collective,
                         "wait": wait, "comm": p.comm_s, "host_s": p.host_s})
    return PredictedTimeline(rows)


def timeline_events(tl: PredictedTimeline, *, instrumented: bool = False, iterations: int = 1) -> pd.DataFrame:
    """The timeline as bundle events (kernels, their launch calls, iteration markers and, when
    ``instrumented``, per fused kernel one flag_wait record for its wait and one store_push record
    for its communication-only time, on one CTA), ``iterations`` times over
    with a quiet gap in between, integer ns on one clock."""
    from taxmodel.trace import schema

    rows: list[dict] = []
    base = 1_000_000_000
    span = max((r["end"] for r in tl.rows), default=0.0) + 1e-3
    corr = 0
    for it in range(iterations):
        t0 = base + int(round(it * span * 1e9))
        first: dict[int, int] = {}
        last: dict[int, int] = {}
        for row in tl.rows:
            corr += 1
            s = t0 + int(round(row["start"] * 1e9))
            e = max(s + 1, t0 + int(round(row["end"] * 1e9)))
            le = t0 + int(round(row["launch_end"] * 1e9))
            r = int(row["rank"])
            cid = f"{row['collective_id']}.{it}" if row["collective_id"] else ""
            rows.append({"rank": r, "device": r, "stream": 7 + int(row["stream"]), "kind": "kernel", "role": row["role"],
                         "name": row["name"], "start_ns": s, "end_ns": e, "correlation": corr, "iteration": it,
                         "collective_id": cid, "collective_op": row["collective_op"]})
            host = max(1, min(int(round(row["host_s"] * 1e9)), 3000))
            rows.append({"rank": r, "stream": 1, "kind": "launch", "role": "other", "name": "cudaLaunchKernel",
                         "start_ns": le - host, "end_ns": le, "correlation": corr, "iteration": it})
            if instrumented and row["role"] == "fused":
                at = s + 1
                for phase, secs in (("flag_wait", row["wait"]), ("store_push", row.get("comm", 0.0))):
                    length = int(round(secs * 1e9))
                    if length > 0 and at < e:
                        rows.append({"rank": r, "device": r, "stream": 7, "kind": "record", "role": "fused",
                                     "name": row["name"], "start_ns": at, "end_ns": min(e, at + length), "cta": 0,
                                     "phase": phase})
                        at = min(e, at + length)
            first[r] = min(first.get(r, le), le - host - 1000)
            last[r] = max(last.get(r, e), e)
        for r in first:
            rows.append({"rank": r, "stream": 1, "kind": "marker", "role": "other", "name": f"ProfilerStep#{it}",
                         "start_ns": first[r], "end_ns": last[r] + 1000, "iteration": it})
    return schema.normalize_events(pd.DataFrame(rows))


# --- the prediction ------------------------------------------------------------------------------


@dataclass
class Prediction:
    """A predicted ledger: the ledger of the predicted timeline, with what it assumed.

    ``summary()`` has the columns of ``Ledger.summary()`` (category, subcategory, mean_ns, pct),
    so reports and ``validate`` put predicted and measured side by side."""

    workload: str
    variant: str
    shape: dict[str, int]
    world_size: int
    hardware: HardwareSpec
    params: ModelParams
    ledger: Any  # taxmodel.model.ledger.Ledger
    assumptions: list[str]
    details: dict[str, float]  # named component times (seconds), for the docs and debugging

    @property
    def window_ns(self) -> float:
        return float(self.ledger.windows["window_ns"].mean())

    def summary(self) -> pd.DataFrame:
        return self.ledger.summary()

    def category_summary(self) -> pd.DataFrame:
        return self.ledger.category_summary()

    def taxes_ns(self) -> dict[str, float]:
        """Window, each category and each sub-category, mean ns per rank-iteration."""
        s = self.summary()
        out = {"window": self.window_ns}
        out.update({c: float(v) for c, v in s.groupby("category", sort=False)["mean_ns"].sum().items()})
        out.update({sc: float(v) for sc, v in zip(s["subcategory"], s["mean_ns"]) if sc not in out})
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "workload": self.workload, "variant": self.variant, "shape": dict(self.shape), "world_size": self.world_size,
            "hardware": {"name": self.hardware.name, "source": self.hardware.source},
            "predicted_window_ns": self.window_ns,
            "summary": self.summary().to_dict(orient="records"),
            "components_us": {k: v * 1e6 for k, v in self.details.items()},
            "params": self.params.to_dict(),
            "assumptions": list(self.assumptions),
        }


def predicted_ledger(plans: Sequence[Sequence[KernelPlan]], cost: Mapping[str, Any], hw: HardwareSpec,
                     params: ModelParams, *, workload: str, variant: str, shape: Mapping[str, int]) -> Any:
    """Simulate ``plans`` and split the timeline with the measured ledger's own code."""
    from taxmodel.model.ledger import compute_ledger
    from taxmodel.trace.bundle import Bundle, make_meta

    tl = simulate(plans, params)
    events = timeline_events(tl, instrumented=params.instrumented)
    world = len(plans)
    meta = make_meta(source="model", workload=workload, variant=variant, shape=dict(shape), world_size=world,
                     ranks=list(range(world)), hardware={"name": hw.name, "vendor": hw.vendor},
                     clock_offsets_ns={str(r): 0 for r in range(world)},
                     capture={"tracer": "analytic model", "clock_offsets_source": "measured"}, cost=dict(cost))
    return compute_ledger(Bundle(events=events, meta=meta), hardware=hw), tl


def standard_assumptions(hw: HardwareSpec, topo: Topology, params: ModelParams) -> list[str]:
    scaled = (f"; datasheet peaks scaled by {params.vendor_fraction_of_datasheet:.2f} for vendor GEMMs"
              if hw.source == "datasheet" else "")
    named = f"({hw.source})" in hw.name  # a calibrated file's name says so already
    out = [
        f"hardware: {hw.name}" + ("" if named and not scaled else f" ({hw.source}{scaled})"),
        f"topology: {topo.description}",
        (f"ranks leave the per-iteration host barrier spread like exponential delays of mean {params.barrier_skew_s * 1e6:.1f} us "
         f"({params.sources.get('barrier_skew_s', 'default')})") if params.start_alignment == "host" else
        (f"a device gate releases the ranks (profile --align device): the last to arrive at once, the others one flag "
         f"latency later ({params.flag_roundtrip_s / 2 * 1e6:.1f} us, half the flag round trip); hosts enqueue "
         f"{params.gate_hold_s * 1e6:.0f} us before the release"),
        f"launch: {params.host_launch_triton_s * 1e6:.1f} us host per Triton launch, {params.host_launch_torch_s * 1e6:.1f} us per "
        f"torch/NCCL call, {params.launch_latency_s * 1e6:.1f} us launch latency, {params.kernel_gap_s * 1e6:.1f} us between queued kernels",
    ]
    if not params.instrumented:
        out.append("fused kernels without in-kernel trace records: their flag waits count as compute time (as the ledger "
                   "measures them)")
    return out
