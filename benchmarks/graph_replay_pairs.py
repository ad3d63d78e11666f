"""One small model traced eagerly and as CUDA graphs, for matching replayed kernels to the eager
step of the same program (docs/ledger.md 5a, "CUDA-graph replays"; issue 39).

Why: a trace of a CUDA-graph replay names its kernels and their launch dims but no op and no
shapes; taxmodel takes them from an eager step of the same program, in the same trace or in
another (``taxmodel import GRAPH --shapes-from EAGER``). These captures test that on one GPU,
with the cases the rule must get right and the ones it must refuse. The model is
``benchmarks/train_step.py``'s decoder, made small (4 layers, d 512, sequence 512, vocabulary
8192, bf16); AdamW with ``capturable=True`` wherever a graph holds the optimizer, and in the
eager step it is compared with, so both run the same kernels.

Cases (one gzipped torch.profiler trace each: CPU + CUDA, record_shapes, with_flops; one
ProfilerStep per step, after one untraced profiler warm-up step):

  eager_b2              3 eager training steps at batch 2
  graph_b2              the whole step captured in one graph before profiling; 3 replays only.
                        ``import graph_b2 --shapes-from eager_b2``: every kernel should match
  graph_b4              the same at batch 4. ``--shapes-from eager_b2``: refused (another batch)
  graph_warmup_b2       2 eager steps, the side-stream warm-up, the capture and 3 replays in one
                        trace: the trace's own eager steps give the shapes
  graphed_callables_b2  torch.cuda.make_graphed_callables on the model (its warm-up and capture
                        in step 1), then 3 steps each replaying a forward and a backward graph
                        around the eager loss and AdamW: two graphs per step
  reduce_overhead_b2    torch.compile(mode="reduce-overhead"), AdamW eager (foreach): compiled
                        before profiling, then Dynamo and the CUDA-graph trees reset so that
                        the recompile (from Inductor's caches), the trees' eager warm-up, the
                        recording and 3 replays are traced (Inductor's kernels)
  serve_b2_b4           inference: an eager forward at batch 2 and at 4, both captured as
                        graphs, then 3 steps each replaying both: replays of different graphs

plus ``info.json``: versions, the device, per case what ran, its wall time and any error (a case
that fails is reported and the others still run). At most 8 files, each well under 16 MiB.

    python benchmarks/graph_replay_pairs.py --out "$OUT"

Without CUDA only ``eager_b2`` runs (on the CPU, to check the script).
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import sys
import time
import traceback
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_step import LM, make_step, sync  # noqa: E402  (the model and step of the training benchmark)

CASES = ("eager_b2", "graph_b2", "graph_b4", "graph_warmup_b2", "graphed_callables_b2", "reduce_overhead_b2",
         "serve_b2_b4")


def config(args: argparse.Namespace, batch: int, device: torch.device) -> SimpleNamespace:
    return SimpleNamespace(batch=batch, seq=args.seq, d=args.d, layers=args.layers, heads=args.heads, vocab=args.vocab,
                           dtype=torch.bfloat16 if device.type == "cuda" else torch.float32)


def model_and_data(cfg: SimpleNamespace, device: torch.device, capturable: bool):
    """The model, its AdamW and one batch of tokens and labels (the same for every case)."""
    torch.manual_seed(0)
    model = LM(cfg.vocab, cfg.d, cfg.layers, cfg.heads, cfg.seq).to(device=device, dtype=cfg.dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, capturable=capturable, foreach=True)
    g = torch.Generator(device="cpu").manual_seed(1)
    ids = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq), generator=g).to(device)
    labels = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq), generator=g).to(device)
    return model, opt, ids, labels


def side_stream_warmup(fn: Callable[[], object], times: int) -> None:
    """What torch.cuda.graph asks before a capture: run the work on a side stream first."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(times):
            fn()
    torch.cuda.current_stream().wait_stream(side)


def capture(fn: Callable[[], object]) -> torch.cuda.CUDAGraph:
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def trace(out: Path, name: str, steps: list[Callable[[], object]], device: torch.device) -> dict:
    """Run ``steps`` under torch.profiler, one ProfilerStep each (after an untraced warm-up
    step of the profiler's own), and write ``<name>.json.gz``."""
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    sched = torch.profiler.schedule(wait=0, warmup=1, active=len(steps), repeat=1)
    with torch.profiler.profile(activities=acts, schedule=sched, record_shapes=True, with_flops=True) as prof:
        sync(device)
        prof.step()  # the profiler's warm-up step: nothing of the program runs in it
        for fn in steps:
            fn()
            sync(device)
            prof.step()
    raw = out / f"{name}.json"
    prof.export_chrome_trace(str(raw))
    gz = out / f"{name}.json.gz"
    with open(raw, "rb") as src, gzip.open(gz, "wb", compresslevel=9) as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()
    return {"file": gz.name, "bytes": gz.stat().st_size, "steps": len(steps)}


# --- the cases --------------------------------------------------------------------------------

def case_eager(args, device, out, batch=2):
    model, opt, ids, labels = model_and_data(config(args, batch, device), device, capturable=device.type == "cuda")
    step = make_step(model, opt, ids, labels)
    for _ in range(args.warmup):
        step()
    sync(device)
    return trace(out, f"eager_b{batch}", [step] * args.steps, device)


def case_graph(args, device, out, batch):
    """The whole step in one graph, captured before profiling: a trace of replays only."""
    model, opt, ids, labels = model_and_data(config(args, batch, device), device, capturable=True)
    step = make_step(model, opt, ids, labels)
    side_stream_warmup(step, args.warmup)
    graph = capture(step)
    sync(device)
    return trace(out, f"graph_b{batch}", [graph.replay] * args.steps, device)


def case_graph_warmup(args, device, out, batch=2):
    """Eager steps, the warm-up, the capture and the replays, all in one trace."""
    model, opt, ids, labels = model_and_data(config(args, batch, device), device, capturable=True)
    step = make_step(model, opt, ids, labels)
    held: dict = {}

    def warm_and_capture():
        side_stream_warmup(step, 1)
        held["graph"] = capture(step)

    def replay():
        held["graph"].replay()
    return trace(out, f"graph_warmup_b{batch}", [step, step, warm_and_capture] + [replay] * args.steps, device)


def case_graphed_callables(args, device, out, batch=2):
    """make_graphed_callables: a forward and a backward graph per step, loss and AdamW eager."""
    cfg = config(args, batch, device)
    model, opt, ids, labels = model_and_data(cfg, device, capturable=False)
    held: dict = {}

    def make():
        held["fn"] = torch.cuda.make_graphed_callables(model, (ids,))  # warms up on a side stream, captures

    def step():
        logits = held["fn"](ids)
        loss = F.cross_entropy(logits.view(-1, cfg.vocab).float(), labels.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
    return trace(out, f"graphed_callables_b{batch}", [make] + [step] * args.steps, device)


def case_reduce_overhead(args, device, out, batch=2):
    """torch.compile(mode="reduce-overhead"): compiled once before profiling (Inductor's caches
    filled), then Dynamo reset so that the traced steps recompile from those caches and the new
    CUDA-graph trees' eager warm-up, recording and replays come into the trace."""
    cfg = config(args, batch, device)
    model, opt, ids, labels = model_and_data(cfg, device, capturable=False)
    make_step(model, opt, ids, labels)()  # gradients exist before the graphs: AdamW adds into them, never aliases a graph's output
    compiled = torch.compile(model, mode="reduce-overhead")

    def step():
        torch.compiler.cudagraph_mark_step_begin()
        logits = compiled(ids)
        loss = F.cross_entropy(logits.view(-1, cfg.vocab).float(), labels.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
    for _ in range(3):  # compile, warm up, record, replay
        step()
    sync(device)
    # Resetting the CUDA-graph trees alone shuts their graphs down under the compiled callables,
    # which still hold them ("AssertionError: Running CUDAGraph after shutdown" on the next call):
    # Dynamo's reset drops the compiled code with them, so the next call compiles again (from
    # Inductor's on-disk caches, filled above) onto new trees.
    torch._dynamo.reset()
    from torch._inductor import cudagraph_trees

    cudagraph_trees.reset_cudagraph_trees()  # what Dynamo's reset does in recent torch; a no-op then
    return {**trace(out, f"reduce_overhead_b{batch}", [step] * (args.steps + 2), device), "recompiled_in_trace": True}


def case_serve(args, device, out, batches=(2, 4)):
    """Inference at two batch sizes: eager forwards, both captured, then every step replays both."""
    cfg = config(args, batches[0], device)
    model, _, _, _ = model_and_data(cfg, device, capturable=False)
    model.eval()
    g = torch.Generator(device="cpu").manual_seed(2)
    inputs = {b: torch.randint(0, cfg.vocab, (b, cfg.seq), generator=g).to(device) for b in batches}
    held: dict = {}

    def eager(b):
        def run():
            with torch.no_grad():
                model(inputs[b])
        return run

    def warm_and_capture():
        for b in batches:
            side_stream_warmup(eager(b), 1)
            held[b] = capture(eager(b))

    def replay_all():
        for b in batches:
            held[b].replay()
    return trace(out, f"serve_b{batches[0]}_b{batches[1]}", [eager(b) for b in batches] + [warm_and_capture]
                 + [replay_all] * args.steps, device)


RUN = {
    "eager_b2": lambda a, d, o: case_eager(a, d, o, 2),
    "graph_b2": lambda a, d, o: case_graph(a, d, o, 2),
    "graph_b4": lambda a, d, o: case_graph(a, d, o, 4),
    "graph_warmup_b2": case_graph_warmup,
    "graphed_callables_b2": case_graphed_callables,
    "reduce_overhead_b2": case_reduce_overhead,
    "serve_b2_b4": case_serve,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "graph_replay_pairs_out")))
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated, from: " + ", ".join(CASES))
    ap.add_argument("--steps", type=int, default=3, help="traced replay (or eager) steps per case")
    ap.add_argument("--warmup", type=int, default=3, help="untraced warm-up steps before a capture or eager trace")
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--d", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=8192)
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cases = [c for c in args.cases.split(",") if c]
    unknown = [c for c in cases if c not in RUN]
    if unknown:
        ap.error(f"unknown case(s) {unknown}; known: {', '.join(CASES)}")
    if device.type != "cuda":
        args.seq, args.d, args.layers, args.vocab, args.warmup = 64, 64, 1, 256, 1
        cases = [c for c in cases if c == "eager_b2"]
        print("graph_replay_pairs: no CUDA; only eager_b2 runs, on the CPU with a tiny model", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    if device.type == "cuda":
        # the profiler must be set up before the first graph is captured (pytorch/pytorch#75504, #100441)
        try:
            from torch.profiler._utils import _init_for_cuda_graphs
        except ImportError:
            _init_for_cuda_graphs = None
        if _init_for_cuda_graphs is not None:
            _init_for_cuda_graphs()
    info = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__,
            "cuda": torch.version.cuda, "model": {k: getattr(args, k) for k in ("seq", "d", "layers", "heads", "vocab")},
            "dtype": "bfloat16" if device.type == "cuda" else "float32", "steps": args.steps, "warmup": args.warmup,
            "cases": {}}
    try:
        import triton
        info["triton"] = triton.__version__
    except ImportError:
        pass
    for name in cases:
        t = time.perf_counter()
        try:
            got = RUN[name](args, device, args.out)
            got["ok"] = True
        except Exception as exc:  # one failing case must not lose the others: reported in info.json
            got = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
        got["wall_s"] = round(time.perf_counter() - t, 1)
        info["cases"][name] = got
        print(f"graph_replay_pairs: {name}: {'ok' if got['ok'] else got['error']} ({got['wall_s']} s"
              f"{', %d bytes' % got['bytes'] if got.get('bytes') else ''})", flush=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    (args.out / "info.json").write_text(json.dumps(info, indent=1) + "\n")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
