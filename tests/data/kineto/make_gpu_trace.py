"""Record a one-GPU torch.profiler trace exercising what the 4-rank AG+GEMM traces lack:
CUDA-graph replays (``graph id`` args, one ``cudaGraphLaunch`` per replay), work on a second
stream, host<->device copies (memcpy rows, a blocking copy), and explicit synchronization.
Single process, so the trace has no ``distributedInfo`` (the file-order rank path).

Run on a GPU machine:  python tests/data/kineto/make_gpu_trace.py OUT_DIR
It writes OUT_DIR/gpu_graph_streams.json.gz (a test fixture for tests/data/kineto/).
"""
from __future__ import annotations

import gzip
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule


def main(out_dir: Path) -> Path:
    assert torch.cuda.is_available(), "needs a GPU"
    dev = torch.device("cuda")
    a = torch.randn(1024, 1024, device=dev)
    side = torch.cuda.Stream()

    # A captured graph: matmul, relu, sum (three kernels per replay).
    static_in = torch.randn(1024, 1024, device=dev)
    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):
        for _ in range(3):
            (static_in @ static_in).relu().sum()
    torch.cuda.current_stream().wait_stream(warm)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = (static_in @ static_in).relu().sum()
    host_buf = torch.randn(1024, 1024).pin_memory()

    def step() -> None:
        graph.replay()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            (a @ a).add_(1.0)
        torch.cuda.current_stream().wait_stream(side)
        a.copy_(host_buf, non_blocking=True)  # HtoD memcpy
        _ = static_out.item()  # DtoH memcpy + stream sync
        torch.cuda.synchronize()

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                 schedule=schedule(wait=1, warmup=1, active=3, repeat=1)) as prof:
        for _ in range(5):
            step()
            prof.step()
    out_dir.mkdir(parents=True, exist_ok=True)
    raw = out_dir / "gpu_graph_streams.json"
    prof.export_chrome_trace(str(raw))
    dest = out_dir / "gpu_graph_streams.json.gz"
    dest.write_bytes(gzip.compress(raw.read_bytes()))
    raw.unlink()
    return dest


if __name__ == "__main__":
    print(main(Path(sys.argv[1] if len(sys.argv) > 1 else ".")))
