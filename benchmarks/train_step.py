"""A plain transformer training step, written without taxmodel, to trace like a user's job.

Why: taxmodel's ledger, floors and advisor must work on a job nobody tuned for them. This is
such a job: an 8-layer pre-norm transformer (d=1024, 16 heads, MLP 4d, vocabulary 32000) in
bf16, AdamW, causal-LM cross-entropy over random tokens, written with plain ``torch.nn``.

Modes (one process can run several; their un-profiled timings are interleaved):
  eager    the step as written;
  graph    the whole step (forward, backward, AdamW with ``capturable=True``) captured in one
           CUDA graph and replayed;
  compile  the model under ``torch.compile`` (default mode), optimizer eager.

What it writes (``--out DIR``):
  trace_<mode>_b<batch>.json.gz  torch.profiler trace (CPU+CUDA, record_shapes, with_flops) of
                                 ``--traced`` steps after warm-up, one ProfilerStep each;
  timing_b<batch>.json           un-profiled step times (CUDA events, median of interleaved
                                 rounds) per mode.
``--ncu-step`` instead runs ``--warmup`` steps and then exactly one eager step between
``torch.cuda.profiler.start()`` / ``stop()``, for ``ncu --profile-from-start off``.

    python benchmarks/train_step.py --batch 1 --modes eager,graph,compile --out profiles/x
    ncu --csv --profile-from-start off --metrics dram__bytes_read.sum,... \
        python benchmarks/train_step.py --batch 1 --ncu-step > counters.csv
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    """Pre-norm decoder block: causal self-attention (SDPA) then a GELU MLP."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class LM(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int, seq: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def add_model_args(ap: argparse.ArgumentParser, batch: int = 1, seq: int = 1024, layers: int = 8) -> None:
    """The model's and batch's sizes (train_loop.py's job uses the same decoder, smaller)."""
    ap.add_argument("--batch", type=int, default=batch)
    ap.add_argument("--seq", type=int, default=seq)
    ap.add_argument("--hidden", "--model-dim", dest="d", type=int, default=1024,
                    help="model width (not --d: torchrun takes a bare --d for its own --duplicate-* options)")
    ap.add_argument("--layers", type=int, default=layers)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=32000)


def build(args: argparse.Namespace, device: torch.device, capturable: bool):
    torch.manual_seed(0)
    model = LM(args.vocab, args.d, args.layers, args.heads, args.seq).to(device=device, dtype=args.dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, capturable=capturable)
    return model, opt


def make_step(model, opt, ids, labels):
    def step():
        logits = model(ids)
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), labels.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
        return loss
    return step


def prepare(mode: str, args: argparse.Namespace, device: torch.device):
    """The mode's step callable after warm-up (compiles and captures happen here)."""
    from taxmodel.runtime import timing  # the harness's, not the job's: train_loop.py imports this file

    model, opt = build(args, device, capturable=(mode == "graph"))
    g = torch.Generator(device="cpu").manual_seed(1)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g).to(device)
    labels = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g).to(device)
    if mode == "compile":
        model = torch.compile(model)
    step = make_step(model, opt, ids, labels)
    if mode != "graph":
        timing.warm_up(step, args.warmup)
        timing.synchronize(device)
        return step
    timing.side_stream_warm_up(step, args.warmup, device=device)
    graph = timing.capture_graph(step, device=device)
    graph.replay()
    timing.synchronize(device)
    keep = (model, opt, ids, labels, step, graph)  # the graph reads these tensors' memory: keep them alive

    def replay() -> None:
        keep[-1].replay()
    return replay


def trace(mode: str, step, args: argparse.Namespace, device: torch.device, out: Path) -> Path:
    from taxmodel.runtime import timing

    acts = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    sched = torch.profiler.schedule(wait=0, warmup=1, active=args.traced, repeat=1)
    with torch.profiler.profile(activities=acts, schedule=sched, record_shapes=True, with_flops=True) as prof:
        for _ in range(1 + args.traced):
            step()
            timing.synchronize(device)
            prof.step()
    raw = out / f"trace_{mode}_b{args.batch}.json"
    prof.export_chrome_trace(str(raw))
    gz = raw.with_suffix(".json.gz")
    with open(raw, "rb") as src, gzip.open(gz, "wb", compresslevel=9) as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()
    return gz


def time_steps(steps: dict, args: argparse.Namespace, device: torch.device) -> dict:
    """Median per-step ms per mode over ``--rounds`` interleaved rounds of ``--per-round`` steps."""
    from taxmodel.runtime import timing

    per = timing.time_interleaved({m: timing.repeat(step, args.per_round) for m, step in steps.items()}, args.rounds,
                                  device=device, calls=args.per_round)
    return {m: timing.spread(v, "ms") | {"rounds": len(v), "steps_per_round": args.per_round} for m, v in per.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_args(ap)
    ap.add_argument("--modes", default="eager,graph")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--traced", type=int, default=4, help="profiled steps per trace")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--per-round", type=int, default=5)
    ap.add_argument("--no-trace", action="store_true")
    ap.add_argument("--ncu-step", action="store_true", help="one eager step between cudaProfilerStart/Stop")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", type=Path, default=Path("train_step_out"))
    args = ap.parse_args()
    device = torch.device(args.device)
    args.dtype = torch.bfloat16 if device.type == "cuda" else torch.float32

    if args.ncu_step:
        step = prepare("eager", args, device)
        if device.type == "cuda":
            torch.cuda.profiler.start()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
        print(f"train_step: one eager step profiled (batch {args.batch}, seq {args.seq})", flush=True)
        return

    args.out.mkdir(parents=True, exist_ok=True)
    modes = [m for m in args.modes.split(",") if m]
    if device.type != "cuda" and "graph" in modes:
        modes.remove("graph")
        print("train_step: no CUDA graphs on CPU; graph mode skipped", flush=True)
    steps, setup_s = {}, {}
    for mode in modes:
        t = time.perf_counter()
        steps[mode] = prepare(mode, args, device)
        setup_s[mode] = round(time.perf_counter() - t, 2)
        print(f"train_step: {mode} b{args.batch} ready in {setup_s[mode]} s", flush=True)
    unprofiled = time_steps(steps, args, device)
    traces = {}
    if not args.no_trace:
        for mode, step in steps.items():
            gz = trace(mode, step, args, device, args.out)
            traces[mode] = {"file": gz.name, "bytes": gz.stat().st_size}
    info = {"batch": args.batch, "seq": args.seq, "d": args.d, "layers": args.layers, "heads": args.heads,
            "vocab": args.vocab, "dtype": str(args.dtype), "warmup": args.warmup, "traced_steps": args.traced,
            "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "setup_s": setup_s, "unprofiled": unprofiled, "traces": traces}
    try:
        import triton
        info["triton"] = triton.__version__
    except ImportError:
        pass
    (args.out / f"timing_b{args.batch}.json").write_text(json.dumps(info, indent=1) + "\n")
    for mode, t in unprofiled.items():
        print(f"train_step: {mode:8s} b{args.batch}: {t['median_ms']:.3f} ms/step (min {t['min_ms']:.3f}, "
              f"max {t['max_ms']:.3f}, {t['rounds']} rounds)", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
