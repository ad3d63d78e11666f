"""Time of one kernel's work from shapes and hardware: GEMMs (roofline with tile and wave
quantization, vendor vs Triton efficiency), streams through HBM, pushes, serial steps, and the
fill/drain of a fine-grained pipeline."""
from __future__ import annotations

from typing import Mapping

from taxmodel.model.hardware import HardwareSpec

from .params import ModelParams


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


