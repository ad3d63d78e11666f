"""Two ranks started by torch.multiprocessing.spawn (not torchrun: no RANK in their environment),
each destroying its process group before it exits, for `taxmodel profile -- COMMAND` tests."""
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.profiler import record_function


def rank_main(rank: int, world: int, init_file: str, loop: int) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(loop):
        with record_function("kernel::fwd"):
            loss = model(torch.randn(4, 8)).sum()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(rank_main, args=(2, sys.argv[1], int(sys.argv[2])), nprocs=2)
