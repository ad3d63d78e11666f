"""A tiny training job for `taxmodel profile -- COMMAND` tests, written as a user would (no taxmodel).

Its "kernels" are ``record_function("kernel::NAME")`` ranges (what a CPU capture turns into kernel
rows); under torchrun it joins a gloo group and all-reduces its gradients (collectives). Options
make it misbehave on purpose: exit with a status, crash or kill itself at a step, never step.
"""
import argparse
import os
import signal
import sys
import time

import torch
from torch.profiler import record_function

from command_steps import Trainer  # the --step-fn module of the tests (beside this file)

ap = argparse.ArgumentParser()
ap.add_argument("--loop", type=int, default=8, help="optimizer steps to run")
ap.add_argument("--exit", type=int, default=0, help="exit status at the end")
ap.add_argument("--crash-at", type=int, default=0, help="raise in this step (1-based), on --bad-rank")
ap.add_argument("--kill-at", type=int, default=0, help="SIGKILL itself in this step, on --bad-rank")
ap.add_argument("--bad-rank", type=int, default=0)
ap.add_argument("--no-step", action="store_true", help="never call optimizer.step()")
ap.add_argument("--trainer", action="store_true", help="run steps through command_steps.Trainer.step")
ap.add_argument("--sleep", type=float, default=0.0, help="seconds each step sleeps")
ap.add_argument("--print-step", action="store_true", help="print each step to stdout (tests watch it)")
args = ap.parse_args()

print(f"command_train: pid {os.getpid()}", file=sys.stderr, flush=True)
world = int(os.environ.get("WORLD_SIZE", "1"))
if world > 1:
    torch.distributed.init_process_group("gloo")
rank = torch.distributed.get_rank() if world > 1 else 0
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(8, 16)


def train_step(i):
    with record_function(f"step_{i}"):  # which of the loop's steps a traced step is
        body(i)


def body(i):
    with record_function("kernel::fwd"):
        loss = model(x).square().mean()
    with record_function("kernel::bwd"):
        loss.backward()
    if world > 1:
        for p in model.parameters():
            torch.distributed.all_reduce(p.grad)
    if rank == args.bad_rank and i == args.crash_at:
        raise RuntimeError(f"rank {rank} crashed on purpose in step {i}")
    if rank == args.bad_rank and i == args.kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
    if args.sleep:
        time.sleep(args.sleep)
    if not args.no_step:
        opt.step()
    opt.zero_grad()
    if args.print_step:
        print(f"step {i}", flush=True)


trainer = Trainer(lambda i: train_step(i))
for i in range(1, args.loop + 1):
    if args.trainer:
        trainer.step(i)
    else:
        train_step(i)
print(f"command_train: rank {rank} done", file=sys.stderr, flush=True)
if world > 1:
    torch.distributed.destroy_process_group()
sys.exit(args.exit)
