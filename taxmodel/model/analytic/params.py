"""The analytic model's parameters beyond a datasheet: documented defaults, replaced by a
calibrated hardware file's values, fitted values and explicit ones; ``sources`` says which."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Mapping

from taxmodel.kernels.revisions import KERNEL_REVISION, RS_SPREAD_REVISION
from taxmodel.hardware.specs import HardwareSpec
from taxmodel.trace.capture_meta import DEFAULT_GATE_HOLD_US


@dataclass(frozen=True)
class ModelParams:
    """Numbers the model needs beyond a datasheet. Each has a documented default (docs/model.md);
    ``from_hardware`` takes the calibrated value where the hardware file has one, and ``sources``
    says for every field where its value came from."""

    #: Triton tile GEMM rate / vendor (cuBLAS, hipBLASLt) rate on the same shape. Default from
    #: the H200 measurements (plain Triton 0.84 at 8192^3 .. 0.97 at 1024 rows); fit from bundles with
    #: ``fit_params`` (model/fitting.py) on a documented subset.
    triton_gemm_efficiency: float = 0.90
    #: The tile GEMM's speed relative to the vendor GEMM on the same shape, by its rows M: pairs
    #: (M, vendor time / tile time), measured alone on this GPU (``taxmodel calibrate``'s tile_gemm
    #: step, N = K = 8192). Where given, a Triton GEMM of M rows takes the vendor GEMM's modeled time
    #: divided by the speed at M (interpolated in log2 M, the end values beyond the ends) in place of
    #: ``triton_gemm_efficiency``: the efficiency depends on M (0.95 at M=1024 to 0.82 at 8192 for the
    #: 4x H200 captures' GEMM). Empty: ``triton_gemm_efficiency``.
    triton_gemm_speed_by_m: tuple[tuple[float, float], ...] = ()
    #: The same for the GEMM+RS fused kernel's GEMM (its own tile configuration and K split), when
    #: fitted (``fit_params``, on that kernel's duration); None: ``triton_gemm_efficiency``.
    rs_gemm_efficiency: float | None = None
    #: GEMM+RS's GEMM kernel's speed relative to the vendor GEMM on the same shard, by M: pairs
    #: (M, vendor time / kernel time), measured on this machine with every rank pushing its peers'
    #: tiles into their owners at once (``taxmodel calibrate``'s rs_gemm step, N = K = 8192, each
    #: rank K/W). Where given it sets that kernel's time (its pushes included) in place of
    #: ``rs_gemm_efficiency``. Empty: not measured.
    rs_gemm_speed_by_m: tuple[tuple[float, float], ...] = ()
    #: What the pushes cost GEMM+RS's GEMM kernel, by M: pairs (M, seconds per pushed byte), the
    #: rs_gemm step's kernel time beyond the vendor GEMM on the same shard over the bytes each rank
    #: pushed ((W-1)/W of its M x N partial product), measured at the calibrating machine's world
    #: size. Where given (rows of two or more ranks) the kernel takes the vendor GEMM's time plus
    #: that cost per byte it pushes at the world size predicted, in place of ``rs_gemm_speed_by_m``
    #: (a speed holds only at the world size it was measured at: at W = 2 a rank computes twice the
    #: products of W = 4 and pushes two thirds of the bytes). Empty: not measured.
    rs_push_s_per_byte_by_m: tuple[tuple[float, float], ...] = ()
    #: The two above for GEMM+RS's GEMM with every peer's tile first (kernel revisions before 6),
    #: which bundles of those revisions are predicted with; a calibration of the spread order's
    #: kernel (revision 6 on) is never applied to them, nor these to it.
    rs_gemm_speed_by_m_peers_first: tuple[tuple[float, float], ...] = ()
    rs_push_s_per_byte_by_m_peers_first: tuple[tuple[float, float], ...] = ()
    #: Vendor GEMM rate as a fraction of a *datasheet* peak (cuBLAS reached ~0.8 of the H200's
    #: 989 TFLOP/s); 1.0 for calibrated peaks, which are measured cuBLAS rates.
    vendor_fraction_of_datasheet: float = 0.80
    #: Vendor GEMM tile (nvjet 256x128 in the H200 traces) and the Triton kernels' tile (GPU_CONFIG).
    vendor_tile: tuple[int, int] = (256, 128)
    triton_tile: tuple[int, int] = (128, 256)
    #: Fixed time every kernel pays (ramp-up, tail, prologue): a few microseconds.
    kernel_overhead_s: float = 2e-6
    #: Memory-bound Triton kernels stream at this fraction of the HBM copy bandwidth.
    triton_stream_efficiency: float = 0.80
    #: Fixed time of the split-KV kernel (and of the fused flash decode's split phase) beyond its
    #: streaming: the intercept of its time against its bytes (``taxmodel calibrate``'s combine rows,
    #: batch 1 and 16, KV 1K-256K). None: ``kernel_overhead_s``.
    split_kv_fixed_s: float | None = None
    #: The split-KV kernel's line where its bytes fit the L2 (``costs.RESIDENT_FRACTION`` of it): the
    #: workloads read one layer's K/V every step, which then stays in the L2 between steps and streams
    #: far faster than from HBM (one H100: 33.5 MB in 9.3 us, 134 MB in 49 us). Rate and intercept
    #: from calibrate's combine rows of that size; 0 / None: not measured, the HBM line serves.
    split_kv_resident_bytes_per_s: float = 0.0
    split_kv_resident_fixed_s: float | None = None
    #: One step of a flash decode combine program: load a [rows, NB, D] fp32 tile of partials
    #: (16 KB) and merge it. The steps of one program are serial (each waits for its loads), so a
    #: combine with few programs and many partials is latency-bound, not bandwidth-bound: about one
    #: loaded-memory latency plus the merge. Calibrated (`taxmodel calibrate`'s combine step: the
    #: local combine kernel queued after the split-KV kernel, as the bsp variant runs them).
    combine_step_s: float = 1.0e-6
    #: The fused flash decode kernel's in-kernel local combine (the pair's last worker folding its S
    #: split partials, ceil(S / NB) serial steps) and what follows it at one rank (the push to its own
    #: rank, the merge of its own partial, the output rows): fixed + steps x step. Calibrated
    #: (`taxmodel calibrate`'s fused_combine step: the fused kernel at world size 1 less the split-KV
    #: kernel alone on the same inputs and plan, over batch 1-16 and KV 512-128K; a line over the
    #: steps). None: not measured; the local combine takes ``combine_step_s`` per step (the separate
    #: combine kernel's step) and the merge steps as at any world size.
    fused_local_combine_step_s: float | None = None
    fused_local_combine_fixed_s: float | None = None
    #: One step of that fold alone, on several ranks (where the push, the waits and the merges
    #: replace the one-rank tail): the slope of the same calibration through its rows whose split
    #: work stays L2-resident (``calibration.fused_combine_fit``). None: ``fused_local_combine_step_s``.
    fused_fold_step_s: float | None = None
    #: One step of the fused flash decode kernel's merge of the ranks' partials with LL words: poll
    #: one source rank's words until they all carry this launch's epoch, then merge them. Fitted from
    #: the fused bundles' in-kernel records (fitting.FIT_RULES).
    ll_merge_step_s: float = 1.0e-6
    #: Host time of one Triton launch and of one torch op / NCCL call (15 us, 10 us on the H200 host).
    host_launch_triton_s: float = 15e-6
    host_launch_torch_s: float = 10e-6
    #: GPU idle between a launch call's end and the kernel's start on an idle GPU; GPU-side gap
    #: between back-to-back queued kernels (both as the profiler sees them).
    launch_latency_s: float = 4e-6
    kernel_gap_s: float = 1.1e-6
    #: GPU-side gap between consecutive kernels of one replayed CUDA graph, where the GPU already
    #: holds the next kernel (one H100: 0.3 us, against 1.2 us between eagerly queued kernels).
    #: Used between the kernels of one rank when ``graph_launch``; 0: not measured, ``kernel_gap_s``
    #: serves (``queued_gap_s``).
    graph_kernel_gap_s: float = 0.0
    #: Scale of the ranks' release times after a host barrier (exponential order statistics).
    barrier_skew_s: float = 5e-6
    #: How ranks start an iteration: "host" (they leave a host barrier, spread by barrier_skew_s) or
    #: "device" (``taxmodel profile --align device``: a device gate releases every GPU together) or
    #: "back-to-back" (one gate, then the steps back to back; the same spread): see
    #: ``release_offsets``; with the gate, each host enqueues for ``gate_hold_s`` before its GPU starts.
    start_alignment: str = "host"
    gate_hold_s: float = DEFAULT_GATE_HOLD_US * 1e-6
    #: Fixed cost of one NCCL/RCCL collective beyond alpha-beta (kernel setup, protocol handshake).
    collective_base_s: float = 8e-6
    #: Flag round trip between two GPUs (release-set on one, acquire-wait on the other, and back).
    flag_roundtrip_s: float = 2e-6
    #: What one ``sync.wait_geq`` costs a program when the flag is already set (poll, barriers, an
    #: acquire atomic): system scope, and GPU scope. Calibrated (`taxmodel calibrate`'s sync step;
    #: 0.41-0.43 us on one H200); the default, for uncalibrated hardware, is that rounded up.
    flag_wait_s: float = 0.5e-6
    flag_wait_gpu_s: float = 0.5e-6
    #: The GPU's bandwidth for the fused flash decode's LL pushes (8-byte words, every pair's pushing
    #: CTA storing into every peer at once): 0 uses the peer-store bandwidth (``peer_store_bytes_per_s``,
    #: calibrated with wide stores to one peer). Fitted from the push records (fitting.FIT_RULES).
    ll_push_bytes_per_s: float = 0.0
    #: Rate at which one program of GEMM+RS's reduction kernel (one output tile: W received slots
    #: read, the tile written) moves bytes. The kernel runs one program per own output tile, so
    #: with few tiles (small M, many ranks) it is this rate, not HBM, that bounds it: 32 programs
    #: on 8 H200s at M=1024. Fitted from the reduction's ``combine`` records (fitting.FIT_RULES);
    #: the default is the middle of the records' 19-35 GB/s on 2, 4 and 8 H200s.
    reduce_program_bytes_per_s: float = 26e9
    #: Bandwidth with which one GPU's SMs load from its peers' memory while every rank does the
    #: same (Triton ``iris.load`` through the symmetric heap), and the latency of one such load.
    peer_load_bytes_per_s: float = 0.0  # 0: use the link bandwidth
    peer_load_latency_s: float = 1.5e-6
    #: Store bandwidth to peers with all SMs, and per SM (the push kernel runs on a few SMs).
    peer_store_bytes_per_s: float = 0.0  # 0: use the link bandwidth
    peer_store_bytes_per_s_per_sm: float = 25e9
    #: Rate of one program of the All-Gather copy kernel (``transport.copy_blocks_kernel``, the ``sm``
    #: transport) while the persistent GEMM shares its SMs: a work item (one K piece of one M-block,
    #: for one peer) takes item bytes / this rate, the programs take the items in rounds. On 4 H200s
    #: the copy kernel ran 1.2-1.8x the bandwidth model beside the GEMM, at 8.5-9 GB/s per program at
    #: every M. Measured by ``taxmodel calibrate``'s copy_share step (the copy kernel beside the tile
    #: GEMM); 0: the peer-store bandwidth model (no sharing).
    copy_program_bytes_per_s: float = 0.0
    #: The same rate in push mode (each rank stores its own blocks into the peers' buffers, the push
    #: variant), which the traces show faster per byte than pull where the copy is not link-bound: on
    #: 2 H200s at M=1024 the push copy took 33 us, the pull copy 55.6 us (the same 8 MiB); at M=8192
    #: both took ~230 us. Measured by the copy_share step's push rows (``taxmodel calibrate`` since it
    #: measures both modes); never fitted, so never borrowed. 0 (a file from before, or without the
    #: step): the push variant takes ``copy_program_bytes_per_s`` and its prediction says so
    #: (``copy_program_rate``).
    copy_program_push_bytes_per_s: float = 0.0
    #: Time the persistent GEMM loses while the copy kernel shares its SMs, as a fraction of the copy
    #: kernel's time (copy_share step: the GEMM beside the copy minus the GEMM alone, over the copy).
    gemm_share_loss: float = 0.0
    #: How the fine-grained AG+GEMM variants move remote rows (kernels/ag_gemm GemmConfig.transport):
    #: "ce" copy engines (the default there), "sm" a Triton copy kernel, "direct" (pull only) loads
    #: from the peers inside the GEMM. Host time of one copy-engine call (cuMemcpyAsync or a stream
    #: flag write): the host enqueues 2 per block and peer before it launches the GEMM.
    ag_transport: str = "ce"
    host_copy_call_s: float = 3e-6
    #: GPU time a copy-engine copy costs beyond its bytes at the P2P copy rate, when copies run one
    #: after another on one stream (pull peer by peer): in a 4x H200 trace (2026-11-28, AG+GEMM
    #: m4096_tp-m16384_tp, copies of 4-16 MiB each followed by a flag write) 5-6 us from one copy's
    #: end to the next one's start plus 3-4 us more per copy than its bytes at 377 GB/s. Not
    #: calibrated per machine (``taxmodel calibrate`` times one 1 GiB copy).
    ce_copy_fixed_s: float = 9e-6
    #: How much longer the fine-grained AG GEMM runs with 128x128 tiles (kernel revision 5, small own
    #: slabs: ``gemm_tiles.first_wave_tiles``) than with 128x256. Calibrated: the tile_gemm step's
    #: ``narrow`` row (the tile GEMM alone at the step's smallest M, N = K = 8192, both tilings);
    #: default: on one H200 of a 4x H200 machine, 0.231-0.238 against 0.186-0.194 ms (3 runs, 2026-11-28).
    narrow_tile_gemm_factor: float = 1.23
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
    #: The built-in kernels' revision to predict (``kernels/revisions.py``): a bundle's own (what it
    #: ran), else the current one. Revision 1's GEMM+RS programs wait for each pushed tile's stores.
    kernel_revision: int = KERNEL_REVISION
    sources: Mapping[str, str] = field(default_factory=dict)

    @staticmethod
    def from_hardware(hw: HardwareSpec, **overrides: Any) -> "ModelParams":
        """Defaults, replaced by what ``hw`` (a preset or a calibrated file) measured. A field of the
        file that does not read as its parameter (a wrong type, a negative rate) is left out: the
        default stays, and ``hardware_caveats(hw)`` says so."""
        base = ModelParams()
        values: dict[str, Any] = {}
        src: dict[str, str] = {f: "default" for f in _PARAM_FIELDS}
        direct = {"host_launch_triton_s": hw.host_launch_s, "launch_latency_s": hw.launch_latency_s,
                  "kernel_gap_s": hw.kernel_gap_s, "graph_kernel_gap_s": hw.graph_kernel_gap_s,
                  "flag_roundtrip_s": hw.flag_roundtrip_s}
        for name, val in direct.items():
            if val and float(val) > 0:
                values[name] = float(val)
                src[name] = f"hardware ({hw.source})"
        entered = entered_by_hand(hw)
        for name, val in hardware_values(hw)[0].items():
            values[name] = val
            src[name] = f"hardware extra ({hw.source})" if name not in entered else \
                f"hardware extra ({hw.source}; its raw rows entered by hand: {entered[name]})"
        if hw.vendor == "amd":
            values.setdefault("domain_size", 8)
            src["domain_size"] = "MI300X: 8 GPUs fully connected by xGMI"
        for name, val in overrides.items():
            if val is not None:
                values[name] = val
                src[name] = "given"
        return replace(base, **values, sources=src)

    def with_fitted(self, fitted: Mapping[str, float], borrowed_from: str | None = None) -> "ModelParams":
        """These parameters with ``fitted`` values (``taxmodel validate``'s fits) in place, each
        sourced as fitted, or as borrowed from the GPU ``borrowed_from`` they were fitted on."""
        if not fitted:
            return self
        how = f"borrowed from {borrowed_from} (fitted there by taxmodel validate)" if borrowed_from \
            else "fitted (taxmodel validate)"
        return replace(self, **dict(fitted), sources={**dict(self.sources), **{k: how for k in fitted}})

    @property
    def queued_gap_s(self) -> float:
        """The GPU-side gap between two kernels of one rank queued one after the other: in a CUDA
        graph (``graph_launch``) ``graph_kernel_gap_s`` where measured, else ``kernel_gap_s``."""
        return self.graph_kernel_gap_s if self.graph_launch and self.graph_kernel_gap_s > 0 else self.kernel_gap_s

    def triton_gemm_speed(self, m: int) -> float | None:
        """The tile GEMM's speed relative to the vendor GEMM at ``m`` rows (``speed_at_m`` of
        ``triton_gemm_speed_by_m``); None when no speed was measured."""
        return speed_at_m(self.triton_gemm_speed_by_m, m)

    @property
    def rs_spread(self) -> bool:
        """Whether GEMM+RS's GEMM of this kernel revision takes its tiles in the spread order (6 on)."""
        return self.kernel_revision >= RS_SPREAD_REVISION

    def rs_gemm_speed(self, m: int) -> float | None:
        """GEMM+RS's GEMM kernel's measured speed relative to the vendor GEMM at ``m`` rows, for this
        revision's tile order; None when the rs_gemm step did not measure that order on this hardware."""
        return speed_at_m(self.rs_gemm_speed_by_m if self.rs_spread else self.rs_gemm_speed_by_m_peers_first, m)

    def rs_push_cost(self, m: int) -> float | None:
        """Seconds per byte GEMM+RS's pushes add to its GEMM kernel at ``m`` rows (``rs_push_s_per_byte_by_m``,
        or its ``_peers_first`` twin before revision 6, interpolated as ``speed_at_m``); None when the
        rs_gemm step did not run that order on two or more ranks here."""
        pts = self.rs_push_s_per_byte_by_m if self.rs_spread else self.rs_push_s_per_byte_by_m_peers_first
        return speed_at_m(pts, m, positive=False)

    def rs_measured_keys(self) -> tuple[str, str]:
        """The names of the two rs_gemm parameters this revision's tile order reads (notes name them)."""
        tail = "" if self.rs_spread else "_peers_first"
        return f"rs_push_s_per_byte_by_m{tail}", f"rs_gemm_speed_by_m{tail}"

    def copy_program_rate(self, variant: str) -> tuple[float, str, str | None]:
        """(one copy program's rate beside the GEMM for ``variant``'s copy kernel, the parameter it
        came from, a caveat when the push variant falls back to the pull rate: None otherwise).
        Push takes ``copy_program_push_bytes_per_s`` where measured; pull, and push without it,
        ``copy_program_bytes_per_s`` (0: not known, the peer-store bandwidth model serves)."""
        if variant == "push" and self.copy_program_push_bytes_per_s > 0:
            return self.copy_program_push_bytes_per_s, "copy_program_push_bytes_per_s", None
        caveat = None
        if variant == "push" and self.copy_program_bytes_per_s > 0:
            caveat = ("push/sm: no push-mode copy rate (copy_program_push_bytes_per_s: `taxmodel calibrate --only "
                      "copy_share` measures it; this hardware's file lacks it): the push copy kernel takes the pull-mode "
                      f"rate, copy_program_bytes_per_s ({self.sources.get('copy_program_bytes_per_s', 'given')}), though "
                      "the traces show push faster per byte where the copy is not link-bound (2x H200, M=1024: 33 "
                      "against 55.6 us)")
        return self.copy_program_bytes_per_s, "copy_program_bytes_per_s", caveat

    def borrowed(self) -> dict[str, str]:
        """Parameter -> the GPU its value was borrowed from (fitted there, not measured here)."""
        out = {}
        for name, how in self.sources.items():
            if how.startswith("borrowed from "):
                out[name] = how.removeprefix("borrowed from ").split(" (fitted there")[0]
        return out

    def with_given(self, given: Mapping[str, Any]) -> "ModelParams":
        """These parameters with ``given`` values in place, each sourced as given."""
        return replace(self, **dict(given), sources={**dict(self.sources), **{k: "given" for k in given}})

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["sources"] = dict(self.sources)
        return d


def entered_by_hand(hw: HardwareSpec) -> dict[str, str]:
    """Parameter -> the source of the raw rows it was fitted from, for the rows of ``hw``'s file that
    carry a ``source`` of their own (entered by hand, not measured by ``taxmodel calibrate``)."""
    raw = ((hw.extra or {}).get("measured") or {}).get("raw") or {}
    out = {}
    for step, fields in RAW_FEEDS.items():
        rows = raw.get(step) if isinstance(raw, dict) else None
        if isinstance(rows, dict) and rows.get("source"):
            text = str(rows["source"])
            for name in fields:
                out[name] = text if len(text) <= 120 else text[:117] + "..."
    return out


def speed_at_m(points: tuple[tuple[float, float], ...], m: int, positive: bool = True) -> float | None:
    """A speed measured at a few M (pairs (M, speed)) at ``m`` rows: linear in log2 M between the
    measured points, the end values beyond them; None without points. ``positive``: values of 0
    are not points (a speed); else they are (a cost that may be nil)."""
    pts = sorted((float(a), float(b)) for a, b in points if float(a) > 0 and (float(b) > 0 if positive else float(b) >= 0))
    if not pts:
        return None
    x = math.log2(max(float(m), 1.0))
    xs = [math.log2(a) for a, _ in pts]
    if x <= xs[0]:
        return pts[0][1]
    if x >= xs[-1]:
        return pts[-1][1]
    i = next(j for j in range(1, len(xs)) if x <= xs[j])
    f = (x - xs[i - 1]) / (xs[i] - xs[i - 1]) if xs[i] > xs[i - 1] else 1.0
    return pts[i - 1][1] + f * (pts[i][1] - pts[i - 1][1])


_PARAM_FIELDS = [f for f in ModelParams.__dataclass_fields__ if f != "sources"]

#: The parameters ``taxmodel calibrate`` measures with microbenchmarks of the workloads' own kernels
#: (issue 33), each with the fitted parameters its measurement stands in for: a hardware file that
#: has it takes neither the fit of another GPU nor (``fitting``) a fit of its own for them.
CALIBRATED_MECHANISMS: dict[str, tuple[str, ...]] = {
    "triton_gemm_speed_by_m": ("triton_gemm_efficiency",),
    "narrow_tile_gemm_factor": (),
    "rs_gemm_speed_by_m": ("rs_gemm_efficiency",),
    "rs_push_s_per_byte_by_m": ("rs_gemm_efficiency",),
    "rs_gemm_speed_by_m_peers_first": ("rs_gemm_efficiency",),
    "rs_push_s_per_byte_by_m_peers_first": ("rs_gemm_efficiency",),
    "copy_program_bytes_per_s": (),
    # no fit stands in for it (never borrowed either); without it push takes copy_program_bytes_per_s
    "copy_program_push_bytes_per_s": (),
    "gemm_share_loss": (),
    "triton_stream_efficiency": (),
    "split_kv_fixed_s": (),
    "split_kv_resident_bytes_per_s": (),
    "ll_push_bytes_per_s": (),
    "ll_merge_step_s": (),
    "reduce_program_bytes_per_s": (),
    "combine_step_s": (),
    "fused_local_combine_step_s": (),
    "fused_local_combine_fixed_s": (),
    "fused_fold_step_s": (),
}


#: The hardware-file fields each raw step feeds (what a step's provenance note names).
RAW_FEEDS: dict[str, tuple[str, ...]] = {
    "hbm": ("hbm_bytes_per_s",), "gemm": ("peak_flops",),
    "collectives": ("collectives", "link_bytes_per_s", "link_latency_s"), "peer_copy": ("p2p_copy_bytes_per_s",),
    "launch": ("launch_latency_s", "kernel_gap_s", "graph_kernel_gap_s", "host_launch_s", "host_launch_torch_s"),
    "barrier": ("barrier_skew_s",), "flag": ("flag_roundtrip_s",), "sync": ("flag_wait_s", "flag_wait_gpu_s"),
    "peer": ("peer_load_bytes_per_s", "peer_load_latency_s", "peer_store_bytes_per_s", "peer_store_bytes_per_s_per_sm"),
    "combine": ("combine_step_s", "triton_stream_efficiency", "split_kv_fixed_s", "split_kv_resident_bytes_per_s",
                "split_kv_resident_fixed_s"),
    "tile_gemm": ("triton_gemm_speed_by_m", "narrow_tile_gemm_factor"), "rs_gemm": ("rs_gemm_speed_by_m", "rs_push_s_per_byte_by_m",
                                                           "rs_gemm_speed_by_m_peers_first",
                                                           "rs_push_s_per_byte_by_m_peers_first"),
    "copy_share": ("copy_program_bytes_per_s", "gemm_share_loss", "copy_program_push_bytes_per_s"),
    "ll_push": ("ll_push_bytes_per_s",), "ll_merge": ("ll_merge_step_s",), "reduce": ("reduce_program_bytes_per_s",),
    "fused_combine": ("fused_local_combine_step_s", "fused_local_combine_fixed_s", "fused_fold_step_s"),
}


#: Fitted parameters that a calibrated mechanism keeps another GPU's fit of from being borrowed,
#: though this GPU may fit them on its own bundles (more specific than the measurement): GEMM+RS's
#: own GEMM efficiency, fitted on its kernel, beats the tile GEMM's speed by M measured alone, which
#: beats another GPU's fit of it.
NOT_BORROWED_WITH: dict[str, tuple[str, ...]] = {"triton_gemm_speed_by_m": ("rs_gemm_efficiency",)}


def _read_value(default: Any, value: Any) -> Any:
    """``value`` as the type of the parameter whose default is ``default``; ValueError when it is not one."""
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ValueError("not true/false")
        return value
    if isinstance(default, tuple):
        if not isinstance(value, (list, tuple)):
            raise ValueError("not a list")
        if default == () or isinstance(default[0], (list, tuple)) or not default:
            pairs = tuple(tuple(float(x) for x in p) for p in value)
            if any(len(p) != 2 or not all(math.isfinite(x) and x > 0 for x in p) for p in pairs):
                raise ValueError("not a list of [M, positive number] pairs")
            return pairs
        return tuple(type(default[0])(x) for x in value)
    if isinstance(default, str):
        if not isinstance(value, str):
            raise ValueError("not text")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError("not a number")
    out = type(default)(value) if default is not None else float(value)
    if not math.isfinite(float(out)) or float(out) < 0:
        raise ValueError("not a finite number >= 0")
    return out


def hardware_values(hw: HardwareSpec) -> tuple[dict[str, Any], list[str]]:
    """(the model parameters ``hw``'s file gives, read as their types; one line per field it gives
    that does not read as one, which the model then leaves at its default)."""
    base = ModelParams()
    values: dict[str, Any] = {}
    bad: list[str] = []
    extra = dict(hw.extra or {})
    for name in _PARAM_FIELDS:
        if name in extra and extra[name] is not None:
            try:
                values[name] = _read_value(getattr(base, name), extra[name])
            except (TypeError, ValueError) as exc:
                bad.append(f"{name} ({exc}: {str(extra[name])[:40]!r})")
    if _rs_rows_all_peers_first(extra):
        # written before the spread order (kernel revision 6): its rs_gemm numbers measured peers first
        for name in ("rs_gemm_speed_by_m", "rs_push_s_per_byte_by_m"):
            if name in values:
                values.setdefault(f"{name}_peers_first", values.pop(name))
    return values, bad


def _rs_rows_all_peers_first(extra: Mapping[str, Any]) -> bool:
    """Whether a hardware file's rs_gemm rows exist and none names its tile order (a calibration
    from before the spread order, when every row measured the peers-first kernel)."""
    raw = ((extra.get("measured") or {}).get("raw") or {}) if isinstance(extra.get("measured"), dict) else {}
    rows = (raw.get("rs_gemm") or {}).get("rows") if isinstance(raw.get("rs_gemm"), dict) else None
    return bool(rows) and isinstance(rows, list) and not any(isinstance(r, dict) and r.get("order") for r in rows)


def calibrated_mechanisms(hw: HardwareSpec) -> set[str]:
    """The ``CALIBRATED_MECHANISMS`` that ``hw``'s file measured, with the fitted parameters they
    stand in for: what neither another GPU's fit nor a fit of this one replaces."""
    have = set(hardware_values(hw)[0]) if hw.source == "calibrated" else set()
    out: set[str] = set()
    for name, covers in CALIBRATED_MECHANISMS.items():
        if name in have:
            out |= {name, *covers}
    return out


def not_borrowed(hw: HardwareSpec) -> set[str]:
    """What ``hw`` may not borrow from another GPU's fits: ``calibrated_mechanisms`` and the
    ``NOT_BORROWED_WITH`` parameters of what its file measured."""
    have = calibrated_mechanisms(hw)
    return have | {p for name, params in NOT_BORROWED_WITH.items() if name in have for p in params}


