"""A plain training loop, one GPU or DDP under torchrun, as a user writes it: the job that
`taxmodel profile -- COMMAND` traces unchanged (issue 40).

Why beside train_step.py: that script's steps sit inside its own timing and tracing harness; a
job to run under `taxmodel profile --` must be an ordinary loop (zero_grad, forward, loss,
backward, optimizer.step) with nothing of taxmodel in it. The model is train_step.py's decoder
(``LM``), bf16 on GPUs, AdamW.

``--trace-dir DIR`` is the hand-written capture of the same loop that the command form must equal:
``torch.profiler`` with a schedule (skip ``--trace-skip - 1`` steps, one warm-up step, then
``--trace-steps`` active), ``record_shapes=True``, no stacks, ``prof.step()`` after each
``optimizer.step()``, one ``rank<R>.json.gz`` per rank.

    python benchmarks/train_loop.py --loop 20                                   # the job
    taxmodel profile --skip 5 --steps 5 -o job -- python benchmarks/train_loop.py --loop 20
    python benchmarks/train_loop.py --loop 20 --trace-dir hand --trace-skip 5 --trace-steps 5
    torchrun --nproc-per-node 2 benchmarks/train_loop.py --loop 20              # DDP, NCCL
"""
from __future__ import annotations

import argparse
import gzip
import os
import shutil
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_step import LM, add_model_args  # noqa: E402  (the same decoder as the traced training step)


def trace_writer(directory: Path, rank: int):
    """on_trace_ready: the trace as ``rank<R>.json.gz`` in ``directory``."""
    def write(prof) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        raw = directory / f"rank{rank}.json"
        prof.export_chrome_trace(str(raw))
        with open(raw, "rb") as src, gzip.open(directory / f"rank{rank}.json.gz", "wb", compresslevel=3) as dst:
            shutil.copyfileobj(src, dst)
        raw.unlink()
    return write


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--loop", type=int, default=20, help="training steps to run")
    add_model_args(ap, batch=4, seq=512, layers=4)
    ap.add_argument("--trace-dir", type=Path, default=None, help="the hand-written torch.profiler capture goes here")
    ap.add_argument("--trace-skip", type=int, default=5)
    ap.add_argument("--trace-steps", type=int, default=5)
    args = ap.parse_args()

    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if world > 1:
        dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank() if world > 1 else 0
    torch.manual_seed(0)
    model = LM(args.vocab, args.d, args.layers, args.heads, args.seq).to(device=device,
                                                                          dtype=torch.bfloat16 if cuda else torch.float32)
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local] if cuda else None)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator(device="cpu").manual_seed(1 + rank)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g).to(device)
    labels = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g).to(device)

    prof = None
    if args.trace_dir is not None:
        acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
        prof = torch.profiler.profile(
            activities=acts, record_shapes=True, with_stack=False,
            schedule=torch.profiler.schedule(skip_first=args.trace_skip - 1, wait=0, warmup=1,
                                             active=args.trace_steps, repeat=1),
            on_trace_ready=trace_writer(args.trace_dir, rank))
        prof.start()
    for _ in range(args.loop):
        opt.zero_grad(set_to_none=False)
        logits = model(ids)
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), labels.view(-1))
        loss.backward()
        opt.step()
        if prof is not None:
            prof.step()
    if prof is not None:
        prof.stop()
    if cuda:
        torch.cuda.synchronize()
    print(f"train_loop: rank {rank} of {world} ran {args.loop} steps, last loss {loss.item():.4f}", flush=True)
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
