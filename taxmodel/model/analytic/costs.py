"""Time of one kernel's work from shapes and hardware: GEMMs (roofline with tile and wave
quantization, vendor vs Triton efficiency), streams through HBM, pushes, serial steps, and the
fill/drain of a fine-grained pipeline; and the DRAM bytes a kernel moves (a GEMM's operand
re-reads, an intermediate that the L2 keeps between its producer and its consumer), from which the
ledger's own code predicts the locality tax (docs/model.md, "Locality")."""
from __future__ import annotations

from functools import lru_cache
from typing import Mapping

import numpy as np

from taxmodel.hardware.specs import HardwareSpec, normalized_name, presets

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
    the fixed kernel overhead. ``kind`` "triton": the vendor GEMM's compute time divided by the tile
    GEMM's measured speed relative to it at ``m`` rows (``ModelParams.triton_gemm_speed_by_m``), or
    where none was measured the Triton efficiency factor with the Triton tile's quantization;
    ``sms`` (fewer than the GPU has) scales the rate down and changes the wave size."""
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
    speed = params.triton_gemm_speed(m) if kind == "triton" else None
    if kind == "triton" and speed is not None:
        rate *= speed  # the vendor GEMM's quantization and rate, slowed by the measured ratio at this M
    elif kind == "triton":
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


#: Bytes of a split-KV kernel that stay in the L2 from one step to the next: up to this fraction of
#: the L2 (the rest of the step's traffic needs room too); from ``STREAMED_FRACTION`` of it on, the
#: K/V comes from HBM; in between, the time goes linearly from one line to the other.
RESIDENT_FRACTION, STREAMED_FRACTION = 0.75, 1.5


def split_kv_time(nbytes: float, hw: HardwareSpec, params: ModelParams) -> float:
    """The split-KV work streaming ``nbytes`` (K and V read, partials written): at the Triton
    streaming efficiency of the HBM bandwidth plus its own fixed cost where calibrated
    (``split_kv_fixed_s``, else the kernel overhead); where its bytes stay in the L2 between steps
    (at most ``RESIDENT_FRACTION`` of it) and the L2-resident line was calibrated, on that line."""
    fixed = params.kernel_overhead_s if params.split_kv_fixed_s is None else params.split_kv_fixed_s

    def streamed(n: float) -> float:
        return float(n) / (hw.hbm_bytes_per_s * params.triton_stream_efficiency) + fixed

    l2 = l2_bytes(hw)
    rate = params.split_kv_resident_bytes_per_s
    if rate <= 0 or l2 <= 0 or nbytes >= STREAMED_FRACTION * l2:
        return streamed(nbytes)
    res_fixed = fixed if params.split_kv_resident_fixed_s is None else params.split_kv_resident_fixed_s

    def resident(n: float) -> float:
        return float(n) / rate + res_fixed

    lo, hi = RESIDENT_FRACTION * l2, STREAMED_FRACTION * l2
    if nbytes <= lo:
        return resident(nbytes)
    f = (nbytes - lo) / (hi - lo)
    return (1 - f) * resident(lo) + f * streamed(hi)


def arrival_waves_time(gemm_s: float, overhead_s: float, tiles: int, slots: int, own_tiles: int, rounds: int,
                       round_s: float, flag_s: float, *, late_programs: int = 0, late_start_s: float = 0.0) -> float:
    """A persistent GEMM of ``tiles`` tiles on ``slots`` programs, its ``own_tiles`` first, whose
    remote rows arrive in ``rounds`` rounds of ``round_s`` each (a copy kernel's programs moving one
    item each per round, in the GEMM's consumption order) plus ``flag_s``.

    Program p takes tiles p, p + slots, p + 2 slots, ... one after another (the kernels'
    ``tl.range(pid, num_tiles, NUM_PROGS)``), each tile ``(gemm_s - overhead_s) / waves``; a remote
    tile cannot start before its round landed. The GEMM ends with its slowest program. At M=1024 on
    4 GPUs (64 own tiles of 256 on 132 programs) programs 64-131 wait for the copy's single round
    before their first tile and the GEMM ends that much after its two waves' work; on 2 GPUs (128
    own tiles) only programs 128-131 wait, for one tile each, and the others' second tiles find
    their rows landed: the GEMM ends with its own work.

    ``late_programs``: the last programs of the grid (the block scheduler places a grid's programs
    in order) cannot start before ``late_start_s``: their SMs are held by another kernel's programs
    until then (``ag_gemm``: the copy kernel's, when they were placed first). Such a program ends at
    ``late_start_s`` + its tiles' work, or later where a remote tile of it arrives later still."""
    slots = max(1, slots)
    waves = cdiv(tiles, slots)
    remote = tiles - own_tiles
    per_tile = max(gemm_s - overhead_s, 0.0) / max(waves, 1)
    late = max(0, min(int(late_programs), slots, tiles))
    late_end = 0.0
    if late and waves > 0:
        first_late = min(slots, tiles) - late  # the earliest late program has the most tiles of them
        late_end = overhead_s + late_start_s + cdiv(tiles - first_late, slots) * per_tile
    if remote <= 0 or rounds <= 0 or waves <= 0:
        return max(gemm_s, late_end)
    # A program's chain t_k = max(t_(k-1), arrival_k) + per_tile ends at the largest
    # arrival_k + (tiles from its k-th on) x per_tile (its own work alone when nothing waits),
    # so the slowest program ends at that maximum over every remote tile.
    idx = np.arange(own_tiles, tiles)
    arrival = -(-(idx - own_tiles + 1) * rounds // remote) * round_s + flag_s
    program, position = idx % slots, idx // slots
    left = -(-(tiles - program) // slots) - position  # this tile and those after it, in its program
    return max(gemm_s, late_end, overhead_s + float(np.max(arrival + left * per_tile)))


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


# --- DRAM bytes: what the ledger's locality tax is measured from (docs/ledger.md 5b) ------------------

#: M-blocks per group in the tile order the GEMM traffic model assumes: consecutive tiles run down
#: ``GEMM_GROUP_M`` M-blocks, then move to the next N-tile (``kernels/ag_gemm`` GPU_CONFIG's GROUP_M,
#: which the one-GPU counter bundles ran with). cuBLAS's own order is not known; the same is assumed.
GEMM_GROUP_M = 8


def l2_bytes(hw: HardwareSpec) -> int:
    """The L2 capacity the model assumes for ``hw``: its own ``l2_bytes``, or for a file that does
    not give it (``taxmodel calibrate`` does not measure it) the datasheet preset of the same GPU's
    (matched by the file's name and aliases); 0 when neither says."""
    if hw.l2_bytes:
        return int(hw.l2_bytes)
    return _datasheet_l2(hw.vendor, (hw.name, *hw.aliases))


@lru_cache(maxsize=64)
def _datasheet_l2(vendor: str, names: tuple[str, ...]) -> int:
    want = {normalized_name(n) for n in names}
    for spec in presets().values():
        if spec.source == "datasheet" and spec.l2_bytes and spec.vendor == vendor and \
                want & {normalized_name(n) for n in (spec.name, *spec.aliases)}:
            return int(spec.l2_bytes)
    return 0


def l2_kept_fraction(nbytes: float, producer_bytes: float, consumer_bytes: float, l2: float) -> float:
    """Fraction of an intermediate of ``nbytes`` that is still in the L2 when its consumer reads it.

    Both kernels stream: a byte written at fraction u of the producer's traffic ``producer_bytes``
    (every byte it moves through the L2, the intermediate included) is read at fraction u of the
    consumer's ``consumer_bytes``, so (1-u) P + u C bytes pass through the L2 in between; with
    least-recently-used replacement it is still there when that is below the capacity ``l2``. The
    kept fraction is the share of u for which it is: 1 when both kernels' traffic fits the L2,
    0 when neither does (an intermediate larger than the L2, or beside a GEMM streaming its operands
    through it), linear in between. ``l2`` 0 (unknown): 0, every byte round-trips through DRAM."""
    if l2 <= 0 or nbytes <= 0:
        return 0.0
    p, c = max(float(producer_bytes), float(nbytes)), max(float(consumer_bytes), float(nbytes))
    if p < l2 and c < l2:
        return 1.0
    if p >= l2 and c >= l2:
        return 0.0
    lo, hi = min(p, c), max(p, c)
    return (l2 - lo) / (hi - lo)


@lru_cache(maxsize=1024)
def _wave_panels(m: int, n: int, tm: int, tn: int, slots: int, group_m: int) -> tuple[int, int]:
    """Sum over the waves of ``slots`` tiles of the rows of A and the columns of B each wave needs."""
    nm, nn = cdiv(m, tm), cdiv(n, tn)
    t = np.arange(nm * nn, dtype=np.int64)
    per_group = group_m * nn
    first = (t // per_group) * group_m
    size = np.minimum(nm - first, group_m)
    within = t % per_group
    mi, ni = first + within % size, within // size
    wave = t // max(1, slots)
    um = np.unique(wave * nm + mi) % nm
    un = np.unique(wave * nn + ni) % nn
    return int(np.minimum(tm, m - um * tm).sum()), int(np.minimum(tn, n - un * tn).sum())


def gemm_dram_bytes(m: int, n: int, k: int, elt: int, tile: tuple[int, int], slots: int, l2: float,
                    group_m: int = GEMM_GROUP_M) -> tuple[float, float, float]:
    """DRAM bytes one tiled GEMM [m,k] x [k,n] moves: (A read, B read, C written).

    Tiles run in waves of ``slots`` (one per SM, or a persistent kernel's programs) in the grouped
    order above. A wave's tiles stream K together, so the L2 serves each A row-panel and B
    column-panel the wave shares from one DRAM read; between waves nothing is kept (a wave streams
    more than the L2 holds). So A is read once per wave whose tiles touch its rows, B once per wave
    touching its columns; C is written once. When A, B and C together fit the L2, each operand is
    read once."""
    if min(m, n, k) <= 0:
        return 0.0, 0.0, 0.0
    a, b, c = float(m) * k * elt, float(k) * n * elt, float(m) * n * elt
    if 0 < l2 and a + b + c <= l2:
        return a, b, c
    rows, cols = _wave_panels(int(m), int(n), int(tile[0]), int(tile[1]), int(slots), int(group_m))
    return float(rows) * k * elt, float(cols) * k * elt, c


def gemm_dram(m: int, n: int, k: int, elt: int, tile: tuple[int, int], hw: HardwareSpec, *, a_local: float = 1.0,
              a_kept: float = 0.0, c_local: float = 1.0) -> tuple[float, float]:
    """(read, written) DRAM bytes of one GEMM on ``hw`` (``gemm_dram_bytes`` with its L2, a wave per
    SM): only ``a_local`` of A's reads come from this GPU's DRAM (the rest are loads from peers'
    memory), ``a_kept`` bytes of A are still in the L2 from the kernel that wrote them (their first
    read is saved), and ``c_local`` of C is written here (the rest is stored into peers)."""
    a, b, c = gemm_dram_bytes(m, n, k, elt, tile, sm_count(hw), l2_bytes(hw))
    return max(a * a_local - a_kept, 0.0) + b, c * c_local


def persistent_drain(compute_s: float, overhead_s: float, tiles: int, grid: int) -> float:
    """One tile's time in a persistent GEMM of ``tiles`` tiles over ``grid`` programs that runs
    ``compute_s`` (``overhead_s`` of it fixed): each program's tiles one after another, so a tile
    takes the GEMM's time over its waves."""
    return max(compute_s - overhead_s, 0.0) / max(1, cdiv(tiles, max(1, grid)))


def pipeline_time(compute_s: float, chunks: int, transfer_s: float, first_latency_s: float,
                  per_chunk_flag_s: float = 0.0, local_fraction: float = 0.0, min_drain_s: float = 0.0) -> float:
    """Time of a producer/consumer tile pipeline: ``chunks`` pieces arrive one after another
    (``transfer_s`` for all of them, after ``first_latency_s``), each followed by its flag, and
    the consumer computes each piece after it arrives. A ``local_fraction`` of the compute needs
    no transfer and runs first. Result: max(compute, fill + transfers + drain), where fill is the
    first piece's latency and drain the compute of the last piece, at least ``min_drain_s`` (a
    persistent GEMM's tile time: the last piece's tiles start when it lands and each takes that
    long, however few they are; ``persistent_drain``)."""
    if chunks <= 0 or transfer_s <= 0:
        return compute_s
    remote_compute = compute_s * (1.0 - local_fraction)
    drain = max(remote_compute / chunks, min_drain_s)
    arrive_all = first_latency_s + transfer_s + chunks * per_chunk_flag_s
    return max(compute_s, compute_s * local_fraction + first_latency_s + drain, arrive_all + drain)


