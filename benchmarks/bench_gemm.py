"""The project's GEMM engine against cuBLAS on one GPU (issues 25, 34).

Why: the fine-grained AG+GEMM and GEMM+RS variants all compute with one persistent tile GEMM
(``kernels/device/tile_gemm.py``); whatever it loses to cuBLAS they lose on every tile. This script
measures that gap alone, ``torch.matmul`` (impl ``cublas``) against the engine as each variant
launches it, with the configuration ``config_for_shape`` gives (the committed per-family table):

- ``taxmodel``: ``launch_ag_gemm`` in ``A_LOCAL`` mode, every row of A local (the GEMM alone);
- ``taxmodel_wait``: ``A_WAIT``, as pull (either transport) runs it on ``--world`` ranks (push
  adds its double buffer, ``DOUBLE_BUFFER``), here rank 0 on one GPU with every remote block's
  flag already set: each remote tile's wait (acquire, fence) runs and passes, so the time is the
  fused GEMM's without the link;
- ``taxmodel_wait_spin``: ``taxmodel_wait`` as it waited before the horizon and the vote (a bounded
  spin per remote tile: ``wait_horizon`` and ``wait_vote`` off): what they save;
- ``taxmodel_epoch``: ``A_WAIT`` on one rank: every tile is its own, so nothing waits, but every
  program reads its device epoch slot and stores it back at its end (``kernels/device/epochs.py``)
  as the AG variants' launches do: with ``taxmodel`` and ``taxmodel_wait`` it splits the AG
  kernel's gap to the engine alone into the epoch's share and the remote tiles' (waits, horizon
  scans);
- ``taxmodel_rs``: GEMM+RS's ``gemm_rs_kernel`` on ``--world`` ranks, here rank 0 on one GPU whose
  peers' heaps are other parts of this GPU's memory: every tile is pushed to its owner's receive
  slot and flagged as on the real ranks, without the link. Its shape is the shard GEMM's
  (M x N x K/world on the workload's ranks).

bf16 in and out, fp32 accumulate.

Shapes: M in ``--ms`` with N=K=``--n``/``--k`` (8192), plus the tensor-parallel shapes the
workloads profile on ``--world`` ranks: AG+GEMM's B is [K, N/world], GEMM+RS's is [K/world, N].

Method, per shape:
- correctness first: fresh random inputs, a NaN-poisoned output (every owner's receive slot for
  ``taxmodel_rs``), the result against an fp32 reference (``max |C - ref| / max |ref|`` at most
  ``TOLERANCE``); a failing impl is not timed;
- timing: after warm-up, ``--samples`` samples per impl, interleaved (the impls alternate sample
  by sample, the first one alternating too), each sample one replay of a CUDA graph of
  ``--calls`` back-to-back calls between two CUDA events (``--eager``: launched from Python; at
  the small shapes a Python launch of the tile GEMM costs as much as the GEMM), the same input
  and output tensors for both impls; the L2 is not flushed, for either; ``times_ms`` holds each
  sample's time per call.

``--tune`` first times candidate tile configurations per shape (``CANDIDATES``, interleaved with
each other and cuBLAS, fewer samples) with the impl that ships at that shape (``taxmodel_rs`` at
GEMM+RS's K/world shapes, ``taxmodel_wait`` elsewhere), writes the fastest per shape class as a
table JSON (``--table-out``; ``gemm_table.py`` holds the committed copies) after every shape, and
then runs the benchmark with that table (``TAXMODEL_GEMM_TABLE``).

Output: ``<out-dir>/gemm_<device>.json`` (records ``{"M","N","K","dtype","impl","config",
"times_ms","calls_per_sample"}``), ``gemm_<device>.md`` (medians, speed ratio cuBLAS time /
impl time: above 1 means the engine is faster), and with ``--tune`` ``gemm_tune_<device>.json``
(the same records for every candidate).

    python benchmarks/bench_gemm.py --tune --table-out /tmp/table.json      # on a GPU
    python benchmarks/bench_gemm.py --cpu --ms 33 --n 40 --k 48 --samples 2 # interpreter smoke
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import torch

from taxmodel.runtime import timing

#: Largest accepted ``max |C - ref| / max |ref|`` (bf16 output rounding is 2^-8 of each element).
TOLERANCE = 1e-2
#: Dynamic shared memory an sm_90 block may use (bytes): candidates whose pipeline needs more are skipped.
SMEM_LIMIT = 232_448

#: Tile candidates tried by ``--tune`` (fields of GemmConfig; the rest stays GPU_CONFIG's). The
#: flattened tile loop (``flatten``) against the nested one, TMA store or not, pipeline depth,
#: grouping, and tiles for the small-N / small-M shapes.
CANDIDATES: list[dict[str, Any]] = [
    dict(block_m=128, block_n=256, block_k=64, num_stages=3, num_warps=8, group_m=8, tma_store=True, epi_split=2, flatten=True),
    dict(block_m=128, block_n=256, block_k=64, num_stages=3, num_warps=8, group_m=8, tma_store=True, epi_split=2, flatten=False),
    dict(block_m=128, block_n=256, block_k=64, num_stages=4, num_warps=8, group_m=8, tma_store=True, epi_split=2, flatten=True),
    dict(block_m=128, block_n=256, block_k=64, num_stages=3, num_warps=8, group_m=16, tma_store=True, epi_split=2, flatten=True),
    dict(block_m=128, block_n=256, block_k=64, num_stages=3, num_warps=8, group_m=8, tma_store=False, flatten=True),
    dict(block_m=128, block_n=128, block_k=64, num_stages=4, num_warps=4, group_m=8, tma_store=True, epi_split=1, flatten=True),
    dict(block_m=128, block_n=128, block_k=64, num_stages=6, num_warps=4, group_m=8, tma_store=True, epi_split=1, flatten=True),
    dict(block_m=128, block_n=128, block_k=128, num_stages=3, num_warps=4, group_m=8, tma_store=True, epi_split=1, flatten=True),
    dict(block_m=128, block_n=128, block_k=64, num_stages=4, num_warps=4, group_m=8, tma_store=False, flatten=True),
    dict(block_m=64, block_n=256, block_k=64, num_stages=4, num_warps=4, group_m=16, tma_store=True, epi_split=2, flatten=True),
]

#: Impls beside ``cublas`` (see the module docstring).
ENGINE_IMPLS = ("taxmodel", "taxmodel_wait", "taxmodel_rs", "taxmodel_wait_spin", "taxmodel_epoch")
#: The impls timed unless ``--impls`` says otherwise.
DEFAULT_IMPLS = ("taxmodel", "taxmodel_wait", "taxmodel_rs")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ms", default="1024,4096,8192", help="comma-separated M values (rows of A and C)")
    p.add_argument("--n", type=int, default=8192, help="N of the full shape")
    p.add_argument("--k", type=int, default=8192, help="K of the full shape")
    p.add_argument("--world", type=int, default=4,
                   help="ranks of the tensor-parallel shapes (N/world and K/world); 1 for the full shapes only")
    p.add_argument("--dtype", default=None, choices=["bfloat16", "float16", "float32"],
                   help="operand and output dtype (default: bfloat16; float32 with --cpu, whose bf16 dot products are wrong)")
    p.add_argument("--samples", type=int, default=40, help="timed samples per impl and shape (>= 30 for a report)")
    p.add_argument("--calls", type=int, default=10, help="back-to-back calls per sample")
    p.add_argument("--warmup", type=int, default=3, help="untimed samples per impl before timing")
    p.add_argument("--eager", action="store_true",
                   help="launch from Python in every sample instead of replaying a CUDA graph of the calls")
    p.add_argument("--tune", action="store_true", help="time CANDIDATES per shape first and use the winners")
    p.add_argument("--tune-samples", type=int, default=16, help="samples per candidate with --tune")
    p.add_argument("--candidate-set", choices=["all", "table"], default="all",
                   help="with --tune: 'all' times CANDIDATES; 'table' the distinct entries of the committed family "
                        "tables (a shorter tuning for a new GPU of a known architecture), plus at the AG shapes the "
                        "device's own entry with a spinning wait per tile (wait_vote, wait_horizon off)")
    p.add_argument("--impls", default=",".join(DEFAULT_IMPLS),
                   help=f"comma-separated engine impls to time beside cuBLAS (of {', '.join(ENGINE_IMPLS)})")
    p.add_argument("--table-out", type=Path, default=None, help="with --tune: where the table JSON goes")
    p.add_argument("--out-dir", type=Path, default=Path(__file__).resolve().parent / "results")
    p.add_argument("--device-name", default=None, help="suffix of the output files (default: from the GPU's name)")
    p.add_argument("--cpu", action="store_true", help="Triton's interpreter on the CPU (tiny shapes only: a smoke run)")
    args = p.parse_args(argv)
    if args.dtype is None:
        args.dtype = "float32" if args.cpu else "bfloat16"
    args.ms = [int(x) for x in str(args.ms).split(",") if x.strip()]
    if not args.ms or min(args.ms) < 1:
        p.error("--ms needs positive integers")
    if args.samples < 1 or args.calls < 1 or args.warmup < 0:
        p.error("--samples and --calls must be positive, --warmup not negative")
    if args.tune and args.table_out is None:
        p.error("--tune needs --table-out (the table JSON it writes)")
    args.impls = [x.strip() for x in str(args.impls).split(",") if x.strip()]
    unknown = sorted(set(args.impls) - set(ENGINE_IMPLS))
    if unknown or not args.impls:
        p.error(f"--impls: unknown {unknown} (use {', '.join(ENGINE_IMPLS)})")
    return args


def shapes(args: argparse.Namespace) -> list[tuple[int, int, int]]:
    """(M, N, K) per shape: the full shapes, then AG+GEMM's N/world and GEMM+RS's K/world."""
    out: list[tuple[int, int, int]] = []
    for m in args.ms:
        out.append((m, args.n, args.k))
        if args.world > 1:
            out.append((m, args.n // args.world, args.k))
            out.append((m, args.n, args.k // args.world))
    return list(dict.fromkeys(out))


def device_label(device: torch.device) -> str:
    """A short file-name label of the device: ``h200``, ``h100``, ``cpu`` or the GPU's name, sanitized."""
    if device.type != "cuda":
        return "cpu"
    name = torch.cuda.get_device_name(device)
    m = re.search(r"\b([HABL]\d{2,3})\b", name)
    return (m.group(1) if m else re.sub(r"[^A-Za-z0-9]+", "_", name)).lower()


def record(m: int, n: int, k: int, dtype: torch.dtype, impl: str, config: str, times_ms: list[float],
           calls: int) -> dict[str, Any]:
    """One result record (the issue's format, plus how many calls each sample averaged)."""
    return {"M": m, "N": n, "K": k, "dtype": str(dtype).replace("torch.", ""), "impl": impl, "config": config,
            "times_ms": [float(t) for t in times_ms], "calls_per_sample": calls}


class Operands:
    """The tensors one shape's timing shares between impls (same inputs, same output buffer)."""

    def __init__(self, m: int, n: int, k: int, dtype: torch.dtype, device: torch.device, seed: int) -> None:
        g = torch.Generator(device="cpu").manual_seed(seed)
        self.a = torch.randn(m, k, generator=g).to(dtype=dtype, device=device)
        self.b = torch.randn(k, n, generator=g).to(dtype=dtype, device=device)
        self.c = torch.full((m, n), float("nan"), dtype=dtype, device=device)
        #: Where an impl leaves its product when not in ``c`` (``rs_fn``): a callable returning it.
        self.result: Callable[[], torch.Tensor] | None = None


def cublas_fn(ops: Operands) -> Callable[[], None]:
    return lambda: torch.matmul(ops.a, ops.b, out=ops.c)


def taxmodel_fn(ops: Operands, cfg: Any) -> Callable[[], None]:
    """The engine as the AG variants launch it, A_LOCAL on one rank (descriptors built once)."""
    from taxmodel.kernels.ag_gemm import gemm_tiles
    from taxmodel.kernels.device.sync import new_error_buffer, sync_mode

    device = ops.c.device
    err, sync = new_error_buffer(device), sync_mode(device)
    descs = _descriptors(ops, cfg)
    m = ops.a.shape[0]

    def run() -> None:
        gemm_tiles.launch_ag_gemm(ops.a, ops.b, ops.c, mode=gemm_tiles.A_LOCAL, rank=0, world=1, m_loc=m, cfg=cfg,
                                  err=err, sync=sync, **descs)
    return run


def _descriptors(ops: Operands, cfg: Any) -> dict[str, Any]:
    from taxmodel.kernels.ag_gemm import gemm_tiles

    if not (cfg.use_tma and gemm_tiles.tma_available()):
        return {}
    if any((t.stride(0) * t.element_size()) % 16 for t in (ops.a, ops.b)):
        return {}  # TMA needs 16-byte aligned row strides: the pointer path, as the variants take it
    return dict(a_desc=gemm_tiles.make_descriptor(ops.a, [cfg.block_m, cfg.block_k]),
                b_desc=gemm_tiles.make_descriptor(ops.b, [cfg.block_k, cfg.block_n]))


def ranks_for(m: int, world: int) -> int:
    """Ranks the simulated variants split M over: ``world`` when it divides M, else 1."""
    return world if world > 1 and m % world == 0 else 1


def wait_fn(ops: Operands, cfg: Any, world: int) -> Callable[[], None]:
    """The engine as pull launches it (A_WAIT, a single buffer), rank 0 of ``world`` on one GPU: the
    gathered A is ``ops.a`` and every remote block's flag already holds an epoch no launch
    reaches, so every remote tile's wait runs its acquire and passes at once."""
    from taxmodel.kernels.ag_gemm import gemm_tiles
    from taxmodel.kernels.device.epochs import new_epoch_slots
    from taxmodel.kernels.device.sync import new_error_buffer, sync_mode

    device = ops.c.device
    err, sync = new_error_buffer(device), sync_mode(device)
    m = ops.a.shape[0]
    w = ranks_for(m, world)
    pieces = gemm_tiles.k_pieces(cfg, ops.a.shape[1])
    bpr, _ = gemm_tiles.tile_counts(m // w, ops.b.shape[1], w, cfg)
    flags = torch.full((w * bpr * pieces,), 2 ** 30, dtype=torch.int32, device=device)
    epochs = new_epoch_slots(device)  # this callable's own: one grid
    descs = _descriptors(ops, cfg)

    def run() -> None:
        gemm_tiles.launch_ag_gemm(ops.a, ops.b, ops.c, mode=gemm_tiles.A_WAIT, rank=0, world=w, m_loc=m // w,
                                  cfg=cfg, err=err, sync=sync, flags=flags, epochs=epochs, budget=10 ** 10,
                                  pieces=pieces, **descs)
    return run


def rs_fn(ops: Operands, cfg: Any, world: int) -> Callable[[], None]:
    """GEMM+RS's kernel as rank 0 of ``world`` launches it, on one GPU: the ``world`` heaps are
    slices of one buffer (``heap_bases``), so every tile goes to its owner's receive slot and
    flag as on the real ranks, without the link, in the tile order the workload ships
    (``launch_gemm_rs``'s default: spread, kernel revision 6; rows of this script's results before
    2026-11-28 19:00 UTC were peers first). ``ops.result`` reassembles the product from the owners'
    slots (for the correctness check)."""
    from taxmodel.kernels.device.epochs import new_epoch_slots
    from taxmodel.kernels.device.sync import new_error_buffer, sync_mode
    from taxmodel.kernels.gemm_rs import tiles

    device = ops.c.device
    err, sync = new_error_buffer(device), sync_mode(device)
    m, n = ops.c.shape
    w = ranks_for(m, world)
    m_loc = m // w
    elt = ops.c.element_size()
    recv_bytes = -(-2 * w * m_loc * n * elt // 256) * 256
    flag_count = tiles.flag_rows(m_loc, n, cfg) * w
    heap_bytes = recv_bytes + -(-flag_count * 4 // 256) * 256
    heap = torch.zeros(w, heap_bytes, dtype=torch.uint8, device=device)
    recv = [heap[o, :recv_bytes].view(ops.c.dtype)[:2 * w * m_loc * n].view(2, w, m_loc, n) for o in range(w)]
    flags = [heap[o, recv_bytes:recv_bytes + flag_count * 4].view(torch.int32) for o in range(w)]
    for r in recv:
        r.fill_(float("nan"))
    bases = torch.tensor([heap[o].data_ptr() for o in range(w)], dtype=torch.int64, device=device)
    epochs = new_epoch_slots(device)  # this callable's own: one grid
    out = torch.empty(m_loc, n, dtype=ops.c.dtype, device=device)

    def run() -> None:
        tiles.launch_gemm_rs(ops.a, ops.b, recv[0], out, flags[0], bases, err, rank=0, world=w, m_loc=m_loc,
                             epochs=epochs, budget=10 ** 10, sync=sync, cfg=cfg, tail=False, rows=32)

    def result() -> torch.Tensor:
        half = int(epochs[0].item()) % 2  # the half the last launch wrote (its epoch's parity; slot 0)
        return torch.cat([recv[o][half, 0] for o in range(w)])

    ops.result = result
    return run


def impl_fn(impl: str, cfg: Any, world: int) -> Callable[[Operands], Callable[[], None]]:
    """A maker of ``impl``'s timed callable for one shape's operands."""
    if impl == "cublas":
        return cublas_fn
    if impl == "taxmodel":
        return lambda o: taxmodel_fn(o, cfg)
    if impl == "taxmodel_wait":
        return lambda o: wait_fn(o, cfg, world)
    if impl == "taxmodel_epoch":
        return lambda o: wait_fn(o, cfg, 1)
    if impl == "taxmodel_wait_spin":
        return lambda o: wait_fn(o, replace(cfg, wait_vote=False, wait_horizon=False), world)
    if impl == "taxmodel_rs":
        return lambda o: rs_fn(o, cfg, world)
    raise ValueError(f"unknown impl {impl!r}")


def relative_error(m: int, n: int, k: int, dtype: torch.dtype, device: torch.device, make: Callable[[Operands], Callable[[], None]],
                   seed: int) -> float:
    """``max |C - ref| / max |ref|`` of one call on fresh random inputs into a NaN-poisoned output
    (inf when any output element is not finite, e.g. left unwritten)."""
    ops = Operands(m, n, k, dtype, device, seed)
    make(ops)()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    ref = ops.a.float() @ ops.b.float()
    c = (ops.result() if ops.result is not None else ops.c).float()
    if not torch.isfinite(c).all():
        return float("inf")
    scale = ref.abs().max().clamp_min(1e-30)
    return float((c - ref).abs().max() / scale)


def time_interleaved(fns: dict[str, Callable[[], None]], samples: int, calls: int, warmup: int,
                     device: torch.device, graph: bool = True) -> dict[str, list[float]]:
    """Per impl, ``samples`` times per call (ms), the impls alternating sample by sample.

    On a GPU with ``graph`` (the default) each impl's ``calls`` launches are captured once in a
    CUDA graph and a sample is one replay: the host's launch cost (tens of microseconds for a
    Triton launch from Python, as long as a whole GEMM at the small shapes) is out of both
    measurements, as in the variants' graph captures. Without ``graph`` a sample launches
    ``calls`` times from Python (what an eager caller sees). Samples are queued back to back and
    read at the end (``timing.time_interleaved``, rotating which impl goes first)."""
    batches = {name: timing.repeat(fn, calls) for name, fn in fns.items()}
    # compiles, and fills the descriptor caches before any capture
    timing.warm_up(list(batches.values()), max(1, warmup))
    runs: dict[str, Callable[[], None]] = dict(batches)
    if device.type == "cuda" and graph:
        for name, batch in batches.items():
            replay = timing.capture_graph(batch, device=device).replay
            replay()
            runs[name] = replay
    timing.synchronize(device)
    return timing.time_interleaved(runs, samples, device=device, calls=calls, rotate=True, deferred=True)


def smem_bytes(fields: dict[str, Any], elt: int = 2) -> int:
    """Shared memory of a candidate's load pipeline (stages of A and B tiles) plus a TMA store's staging."""
    bm, bn, bk = fields["block_m"], fields["block_n"], fields["block_k"]
    pipe = fields["num_stages"] * (bm * bk + bk * bn) * elt
    store = bm * bn * elt // fields.get("epi_split", 1) if fields.get("tma_store") else 0
    return pipe + store


def tune_impl(m: int, n: int, k: int, args: argparse.Namespace) -> str:
    """The impl a shape is tuned with: the one that ships there (GEMM+RS's kernel at its K/world
    shapes, the AG variants' A_WAIT elsewhere), if it is among ``--impls``."""
    want = "taxmodel_rs" if args.world > 1 and k == args.k // args.world and k != args.k else "taxmodel_wait"
    return want if want in args.impls else args.impls[0]


def candidates(m: int, n: int, k: int, impl: str, family: str | None, which: str) -> list[dict[str, Any]]:
    """The tile fields ``--tune`` times at one shape: ``CANDIDATES`` ("all"), or ("table") every
    distinct entry of the committed family tables and, where the shape's impl waits on flags, GPU
    family ``family``'s own entry for the shape with the spinning wait beside it."""
    from taxmodel.kernels.ag_gemm import gemm_table

    if which == "all":
        return [dict(f) for f in CANDIDATES]
    out: list[dict[str, Any]] = []
    for table in gemm_table.FAMILY_TABLES.values():
        for entry in table.values():
            if dict(entry) not in out:
                out.append(dict(entry))
    own = gemm_table.tile_fields(m, n, k, family)
    if impl == "taxmodel_wait" and own is not None:
        out.append({**own, "wait_vote": False, "wait_horizon": False})
    return out


def tune_shape(m: int, n: int, k: int, dtype: torch.dtype, device: torch.device, args: argparse.Namespace,
               log: Callable[[str], None]) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """Time every fitting, correct candidate against each other and cuBLAS; (winner's fields, records)."""
    from taxmodel.kernels.ag_gemm.gemm_tiles import GPU_CONFIG

    impl = tune_impl(m, n, k, args)
    ops = Operands(m, n, k, dtype, device, seed=1)
    fns: dict[str, Callable[[], None]] = {"cublas": cublas_fn(ops)}
    fields_of: dict[str, dict[str, Any]] = {}
    from taxmodel.kernels.ag_gemm import gemm_table

    family = gemm_table.device_family(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
    for fields in candidates(m, n, k, impl, family, args.candidate_set):
        cfg = replace(GPU_CONFIG, **fields)
        if smem_bytes(fields) > SMEM_LIMIT:
            log(f"  tune {m}x{n}x{k} {cfg.tile_label()}: skipped, needs {smem_bytes(fields)} B of shared memory")
            continue
        try:
            err = relative_error(m, n, k, dtype, device, impl_fn(impl, cfg, args.world), seed=7)
            fns[cfg.tile_label()] = impl_fn(impl, cfg, args.world)(ops)
        except Exception as e:  # a candidate that does not compile on this Triton: skipped, said why
            log(f"  tune {m}x{n}x{k} {cfg.tile_label()}: skipped, {type(e).__name__}: {str(e).splitlines()[0][:160]}")
            continue
        if not err <= TOLERANCE:
            fns.pop(cfg.tile_label())
            log(f"  tune {m}x{n}x{k} {cfg.tile_label()}: skipped, relative error {err:.3g}")
            continue
        fields_of[cfg.tile_label()] = fields
    times = time_interleaved(fns, args.tune_samples, args.calls, 1, device, graph=not args.eager)
    recs = [record(m, n, k, dtype, "cublas" if name == "cublas" else impl, name if name != "cublas" else "torch.matmul",
                   ts, args.calls) for name, ts in times.items()]
    med = {name: statistics.median(ts) for name, ts in times.items()}
    for name in times:
        log(f"  tune {m}x{n}x{k} {impl} {name:44s} {med[name]:8.4f} ms  x{med['cublas'] / med[name]:.3f} of cuBLAS speed")
    cands = [name for name in med if name != "cublas"]
    if not cands:
        return None, recs
    best = min(cands, key=med.__getitem__)
    return fields_of[best], recs


def markdown(records: list[dict[str, Any]], device: str, args: argparse.Namespace) -> str:
    """Medians per shape and impl, and the speed ratio (cuBLAS median time / impl median time)."""
    lines = [f"# GEMM engine vs cuBLAS on {device}", "",
             f"{args.dtype} in and out, fp32 accumulate; one GPU. Impls: `taxmodel` the engine alone (`A_LOCAL`), "
             f"`taxmodel_wait` as the AG variants run it (`A_WAIT`, rank 0 of {args.world}, every flag set), "
             f"`taxmodel_rs` GEMM+RS's kernel (rank 0 of {args.world}, the owners' heaps on this GPU)"
             f"{', `taxmodel_wait_spin` taxmodel_wait with a bounded spin per remote tile (wait_horizon, wait_vote off)' if 'taxmodel_wait_spin' in args.impls else ''}"
             f"{', `taxmodel_epoch` A_WAIT on one rank (the device epoch slots, no remote tile)' if 'taxmodel_epoch' in args.impls else ''}. Per impl "
             f"{args.samples} samples of {args.calls} back-to-back calls "
             f"({'perf_counter, interpreter' if args.cpu else 'CUDA events'}"
             f"{'' if args.cpu or args.eager else ', one CUDA graph replay per sample: no host launch cost'}), "
             f"interleaved, after {args.warmup} warm-up samples; the same inputs for every impl; L2 not flushed. "
             "Ratio = cuBLAS median / impl median (above 1.00: the engine is faster). Config: the per-family table "
             "entry (`kernels/ag_gemm/gemm_table.py`) or the default.", "",
             "| M | N | K | impl | cuBLAS ms | impl ms | ratio | impl p10-p90 ms | config | rel. error |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    by_shape: dict[tuple[int, int, int], dict[str, dict[str, Any]]] = {}
    for r in records:
        by_shape.setdefault((r["M"], r["N"], r["K"]), {})[r["impl"]] = r
    for (m, n, k), impls in by_shape.items():
        cb = impls.get("cublas")
        for impl, tx in impls.items():
            if impl == "cublas":
                continue
            if not cb or not cb["times_ms"] or not tx["times_ms"]:
                lines.append(f"| {m} | {n} | {k} | {impl} | - | - | - | - | `{tx['config']}` | "
                             f"{tx.get('rel_error', '-')} |")
                continue
            c_med, t_med = statistics.median(cb["times_ms"]), statistics.median(tx["times_ms"])
            p10, p90 = timing.decile_range(tx["times_ms"])
            lines.append(f"| {m} | {n} | {k} | {impl} | {c_med:.4f} | {t_med:.4f} | {c_med / t_med:.3f}x | "
                         f"{p10:.4f}-{p90:.4f} | `{tx['config']}` | {tx.get('rel_error', float('nan')):.2g} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.cpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from taxmodel.kernels.ag_gemm import gemm_table
    from taxmodel.kernels.ag_gemm.gemm_tiles import config_for_shape, table_choice

    device = torch.device("cpu" if args.cpu else "cuda")
    dtype = getattr(torch, args.dtype)
    label = args.device_name or device_label(device)
    args.out_dir.mkdir(parents=True, exist_ok=True)

    def log(msg: str) -> None:
        print(f"bench_gemm: {msg}", flush=True)

    if args.tune:
        table: dict[str, dict[str, Any]] = {}
        tune_recs: list[dict[str, Any]] = []
        for (m, n, k) in shapes(args):
            fields, recs = tune_shape(m, n, k, dtype, device, args, log)
            tune_recs += recs
            if fields is not None:
                table[gemm_table.shape_class(m, n, k)] = fields
            args.table_out.write_text(json.dumps(table, indent=1) + "\n")  # after every shape: partial runs keep it
            (args.out_dir / f"gemm_tune_{label}.json").write_text(json.dumps(tune_recs) + "\n")
        os.environ[gemm_table.TABLE_ENV] = str(args.table_out)
        log(f"table: {args.table_out} ({len(table)} shape classes)")

    records: list[dict[str, Any]] = []
    failed = 0
    for (m, n, k) in shapes(args):
        cfg = config_for_shape(m, n, k, device)
        makers = {impl: impl_fn(impl, cfg, args.world) for impl in ("cublas", *args.impls)}
        configs = {impl: f"{cfg.tile_label()} ({table_choice(m, n, k, device)})" for impl in args.impls}
        configs["cublas"] = "torch.matmul"
        errors = {impl: relative_error(m, n, k, dtype, device, make, seed=11) for impl, make in makers.items()}
        ok = {impl: e <= TOLERANCE for impl, e in errors.items()}
        ops = Operands(m, n, k, dtype, device, seed=3)
        timed = {impl: makers[impl](ops) for impl in makers if ok[impl]}
        times = time_interleaved(timed, args.samples, args.calls, args.warmup, device, graph=not args.eager) if timed else {}
        for impl in makers:
            rec = record(m, n, k, dtype, impl, configs[impl], times.get(impl, []), args.calls)
            rec["rel_error"] = errors[impl]
            records.append(rec)
            if not ok[impl]:
                failed += 1
                log(f"{m}x{n}x{k} {impl}: WRONG (relative error {errors[impl]:.3g} > {TOLERANCE}); not timed")
        if "cublas" in times:
            cm = statistics.median(times["cublas"])
            log(f"{m}x{n}x{k}: cublas {cm:.4f} ms; " + ", ".join(
                f"{impl} {statistics.median(times[impl]):.4f} ms x{cm / statistics.median(times[impl]):.3f}"
                for impl in args.impls if impl in times) + f" ({configs[args.impls[0]]})")
        (args.out_dir / f"gemm_{label}.json").write_text(json.dumps(records, indent=1) + "\n")
    (args.out_dir / f"gemm_{label}.md").write_text(markdown(records, label, args))
    log(f"wrote {args.out_dir / f'gemm_{label}.json'} and .md")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
