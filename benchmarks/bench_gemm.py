"""The project's tile GEMM against cuBLAS, one GPU, every operand local (issue 25, items 2 and 4).

Why: the fine-grained AG+GEMM and GEMM+RS variants all run the same persistent tile GEMM
(``kernels/ag_gemm/gemm_tiles.py``); whatever it loses to cuBLAS they lose on every tile. This
script measures that gap alone: ``torch.matmul`` (impl ``cublas``) against ``launch_ag_gemm`` in
``A_LOCAL`` mode on one rank (impl ``taxmodel``, the configuration ``config_for_shape`` gives:
the committed per-shape table, as the variants get it), bf16 in and out.

Shapes: M in ``--ms`` with N=K=``--n``/``--k`` (8192), plus the tensor-parallel shapes the
workloads profile on ``--world`` ranks: AG+GEMM's B is [K, N/world], GEMM+RS's is [K/world, N].

Method, per shape:
- correctness first: fresh random inputs, a NaN-poisoned output, the result against an fp32
  reference (``max |C - ref| / max |ref|`` at most ``TOLERANCE``); a failing impl is not timed;
- timing: after warm-up, ``--samples`` samples per impl, interleaved (the impls alternate sample
  by sample, the first one alternating too), each sample one replay of a CUDA graph of
  ``--calls`` back-to-back calls between two CUDA events (``--eager``: launched from Python; at
  the small shapes a Python launch of the tile GEMM costs as much as the GEMM), the same input
  and output tensors for both impls; the L2 is not flushed, for either; ``times_ms`` holds each
  sample's time per call.

``--tune`` first times candidate tile configurations per shape (``CANDIDATES``, interleaved with
each other and cuBLAS, fewer samples), writes the fastest per shape class as a table JSON
(``--table-out``; ``gemm_table.py`` holds the committed copy) after every shape, and then runs the
benchmark with that table (``TAXMODEL_GEMM_TABLE``).

Output: ``<out-dir>/gemm_<device>.json`` (records ``{"M","N","K","dtype","impl","config",
"times_ms","calls_per_sample"}``), ``gemm_<device>.md`` (medians, speed ratio cuBLAS time /
taxmodel time: above 1 means the tile GEMM is faster), and with ``--tune``
``gemm_tune_<device>.json`` (the same records for every candidate).

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
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import torch

#: Largest accepted ``max |C - ref| / max |ref|`` (bf16 output rounding is 2^-8 of each element).
TOLERANCE = 1e-2
#: Dynamic shared memory an sm_90 block may use (bytes): candidates whose pipeline needs more are skipped.
SMEM_LIMIT = 232_448

#: Tile candidates tried by ``--tune`` (fields of GemmConfig; the rest stays GPU_CONFIG's).
CANDIDATES: list[dict[str, Any]] = [
    dict(block_m=128, block_n=256, block_k=64, num_stages=3, num_warps=8, group_m=8),
    dict(block_m=128, block_n=256, block_k=64, num_stages=3, num_warps=8, group_m=8, warp_specialize=True),
    dict(block_m=128, block_n=256, block_k=64, num_stages=3, num_warps=8, group_m=8, tma_store=True, epi_split=2),
    dict(block_m=128, block_n=256, block_k=64, num_stages=3, num_warps=8, group_m=8, tma_store=True, epi_split=2,
         warp_specialize=True),
    dict(block_m=128, block_n=256, block_k=64, num_stages=3, num_warps=8, group_m=16),
    dict(block_m=128, block_n=256, block_k=64, num_stages=3, num_warps=8, group_m=16, tma_store=True, epi_split=2),
    dict(block_m=128, block_n=256, block_k=64, num_stages=4, num_warps=8, group_m=8),
    dict(block_m=128, block_n=256, block_k=64, num_stages=4, num_warps=8, group_m=8, tma_store=True, epi_split=2),
    dict(block_m=256, block_n=128, block_k=64, num_stages=3, num_warps=8, group_m=8),
    dict(block_m=128, block_n=128, block_k=64, num_stages=4, num_warps=4, group_m=8),
    dict(block_m=128, block_n=128, block_k=64, num_stages=5, num_warps=8, group_m=8),
    dict(block_m=128, block_n=128, block_k=64, num_stages=5, num_warps=8, group_m=8, tma_store=True, epi_split=1),
]


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
    p.add_argument("--no-ws", action="store_true", help="with --tune: leave out the warp-specialized candidates")
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


def cublas_fn(ops: Operands) -> Callable[[], None]:
    return lambda: torch.matmul(ops.a, ops.b, out=ops.c)


def taxmodel_fn(ops: Operands, cfg: Any) -> Callable[[], None]:
    """The tile GEMM as the variants launch it, A_LOCAL on one rank (descriptors built once)."""
    from taxmodel.kernels.ag_gemm import gemm_tiles
    from taxmodel.kernels.device.sync import new_error_buffer, sync_mode

    device = ops.c.device
    err, sync = new_error_buffer(device), sync_mode(device)
    descs: dict[str, Any] = {}
    if cfg.use_tma and gemm_tiles.tma_available():
        descs = dict(a_desc=gemm_tiles.make_descriptor(ops.a, [cfg.block_m, cfg.block_k]),
                     b_desc=gemm_tiles.make_descriptor(ops.b, [cfg.block_k, cfg.block_n]))
    m = ops.a.shape[0]

    def run() -> None:
        gemm_tiles.launch_ag_gemm(ops.a, ops.b, ops.c, mode=gemm_tiles.A_LOCAL, rank=0, world=1, m_loc=m, cfg=cfg,
                                  err=err, sync=sync, **descs)
    return run


def relative_error(m: int, n: int, k: int, dtype: torch.dtype, device: torch.device, make: Callable[[Operands], Callable[[], None]],
                   seed: int) -> float:
    """``max |C - ref| / max |ref|`` of one call on fresh random inputs into a NaN-poisoned output
    (inf when any output element is not finite, e.g. left unwritten)."""
    ops = Operands(m, n, k, dtype, device, seed)
    make(ops)()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    ref = ops.a.float() @ ops.b.float()
    c = ops.c.float()
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
    ``calls`` times from Python (what an eager caller sees)."""
    names = list(fns)
    cuda = device.type == "cuda"
    for _ in range(max(1, warmup)):  # compiles, and fills the descriptor caches before any capture
        for name in names:
            for _ in range(calls):
                fns[name]()
    runs: dict[str, Callable[[], None]] = {}
    for name in names:
        if cuda and graph:
            torch.cuda.synchronize(device)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _ in range(calls):
                    fns[name]()
            g.replay()
            runs[name] = g.replay
        else:
            def eager(fn: Callable[[], None] = fns[name]) -> None:
                for _ in range(calls):
                    fn()
            runs[name] = eager
    if cuda:
        torch.cuda.synchronize(device)
    marks: dict[str, list[Any]] = {name: [] for name in names}
    for s in range(samples):
        order = names[s % len(names):] + names[:s % len(names)]
        for name in order:
            if cuda:
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                runs[name]()
                e1.record()
                marks[name].append((e0, e1))
            else:
                t0 = time.perf_counter()
                runs[name]()
                marks[name].append((time.perf_counter() - t0) * 1e3)
    if cuda:
        torch.cuda.synchronize(device)
        return {name: [e0.elapsed_time(e1) / calls for e0, e1 in marks[name]] for name in names}
    return {name: [t / calls for t in marks[name]] for name in names}


def smem_bytes(fields: dict[str, Any], elt: int = 2) -> int:
    """Shared memory of a candidate's load pipeline (stages of A and B tiles) plus a TMA store's staging."""
    bm, bn, bk = fields["block_m"], fields["block_n"], fields["block_k"]
    pipe = fields["num_stages"] * (bm * bk + bk * bn) * elt
    store = bm * bn * elt // fields.get("epi_split", 1) if fields.get("tma_store") else 0
    return pipe + store


def tune_shape(m: int, n: int, k: int, dtype: torch.dtype, device: torch.device, args: argparse.Namespace,
               log: Callable[[str], None]) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """Time every fitting, correct candidate against each other and cuBLAS; (winner's fields, records)."""
    from taxmodel.kernels.ag_gemm.gemm_tiles import GPU_CONFIG

    ops = Operands(m, n, k, dtype, device, seed=1)
    fns: dict[str, Callable[[], None]] = {"cublas": cublas_fn(ops)}
    fields_of: dict[str, dict[str, Any]] = {}
    for fields in CANDIDATES:
        if args.no_ws and fields.get("warp_specialize"):
            continue
        cfg = replace(GPU_CONFIG, **fields)
        if smem_bytes(fields) > SMEM_LIMIT:
            log(f"  tune {m}x{n}x{k} {cfg.tile_label()}: skipped, needs {smem_bytes(fields)} B of shared memory")
            continue
        try:
            err = relative_error(m, n, k, dtype, device, lambda o, cfg=cfg: taxmodel_fn(o, cfg), seed=7)
        except Exception as e:  # a candidate that does not compile on this Triton: skipped, said why
            log(f"  tune {m}x{n}x{k} {cfg.tile_label()}: skipped, {type(e).__name__}: {str(e).splitlines()[0][:160]}")
            continue
        if not err <= TOLERANCE:
            log(f"  tune {m}x{n}x{k} {cfg.tile_label()}: skipped, relative error {err:.3g}")
            continue
        fns[cfg.tile_label()] = taxmodel_fn(ops, cfg)
        fields_of[cfg.tile_label()] = fields
    times = time_interleaved(fns, args.tune_samples, args.calls, 1, device, graph=not args.eager)
    recs = [record(m, n, k, dtype, "cublas" if name == "cublas" else "taxmodel", name if name != "cublas" else "torch.matmul",
                   ts, args.calls) for name, ts in times.items()]
    med = {name: statistics.median(ts) for name, ts in times.items()}
    for name in times:
        log(f"  tune {m}x{n}x{k} {name:44s} {med[name]:8.4f} ms  x{med['cublas'] / med[name]:.3f} of cuBLAS speed")
    cands = [name for name in med if name != "cublas"]
    if not cands:
        return None, recs
    best = min(cands, key=med.__getitem__)
    return fields_of[best], recs


def markdown(records: list[dict[str, Any]], device: str, args: argparse.Namespace) -> str:
    """Medians per shape and impl, and the speed ratio (cuBLAS median time / taxmodel median time)."""
    lines = [f"# Tile GEMM vs cuBLAS on {device}", "",
             f"{args.dtype} in and out, fp32 accumulate; one GPU, every operand local (`A_LOCAL`). Per impl {args.samples} "
             f"samples of {args.calls} back-to-back calls ({'perf_counter, interpreter' if args.cpu else 'CUDA events'}"
             f"{'' if args.cpu or args.eager else ', one CUDA graph replay per sample: no host launch cost'}), interleaved, after {args.warmup} warm-up "
             "samples; same input and output tensors for both; L2 not flushed for either. Ratio = cuBLAS median / "
             "taxmodel median (above 1.00: the tile GEMM is faster). Config: the per-shape table entry "
             "(`kernels/ag_gemm/gemm_table.py`) or the default.", "",
             "| M | N | K | cuBLAS ms | taxmodel ms | ratio | taxmodel p10-p90 ms | config | rel. error |",
             "|---|---|---|---|---|---|---|---|---|"]
    by_shape: dict[tuple[int, int, int], dict[str, dict[str, Any]]] = {}
    for r in records:
        by_shape.setdefault((r["M"], r["N"], r["K"]), {})[r["impl"]] = r
    for (m, n, k), impls in by_shape.items():
        cb, tx = impls.get("cublas"), impls.get("taxmodel")
        if not cb or not tx or not cb["times_ms"] or not tx["times_ms"]:
            lines.append(f"| {m} | {n} | {k} | - | - | - | - | {tx['config'] if tx else '-'} | "
                         f"{tx.get('rel_error', '-') if tx else '-'} |")
            continue
        c_med, t_med = statistics.median(cb["times_ms"]), statistics.median(tx["times_ms"])
        q = statistics.quantiles(tx["times_ms"], n=10) if len(tx["times_ms"]) > 1 else [t_med] * 9
        lines.append(f"| {m} | {n} | {k} | {c_med:.4f} | {t_med:.4f} | {c_med / t_med:.3f}x | {q[0]:.4f}-{q[-1]:.4f} | "
                     f"`{tx['config']}` | {tx.get('rel_error', float('nan')):.2g} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.cpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from taxmodel.kernels.ag_gemm import gemm_table
    from taxmodel.kernels.ag_gemm.gemm_tiles import config_for_shape

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
        makers: dict[str, Callable[[Operands], Callable[[], None]]] = {
            "cublas": cublas_fn, "taxmodel": lambda o, cfg=cfg: taxmodel_fn(o, cfg)}
        configs = {"cublas": "torch.matmul", "taxmodel": cfg.tile_label()}
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
        if len(times) == 2:
            cm, tm = statistics.median(times["cublas"]), statistics.median(times["taxmodel"])
            log(f"{m}x{n}x{k}: cublas {cm:.4f} ms, taxmodel {tm:.4f} ms ({cfg.tile_label()}): x{cm / tm:.3f}")
        (args.out_dir / f"gemm_{label}.json").write_text(json.dumps(records, indent=1) + "\n")
    (args.out_dir / f"gemm_{label}.md").write_text(markdown(records, label, args))
    log(f"wrote {args.out_dir / f'gemm_{label}.json'} and .md")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
