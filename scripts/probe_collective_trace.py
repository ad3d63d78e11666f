"""What a calibrated collective curve point contains: NCCL all-gathers back to back in one CUDA
graph (as `taxmodel calibrate` times them), replayed once under torch.profiler: the per-call wall
time (CUDA events over the replay / calls) against each kernel's own duration and the gaps between
them; and the same all-gather alone after a GPU sleep, as it runs inside a workload.

GPU (2 ranks, under a minute):
    torchrun --standalone --nproc-per-node 2 scripts/probe_collective_trace.py
Results: printed by rank 0 and written to $OUT/coll_trace.json (or /tmp)."""
import os, json, torch, torch.distributed as dist
from torch.profiler import profile, ProfilerActivity
from taxmodel.runtime import timing
dist.init_process_group("nccl")
r = dist.get_rank(); w = dist.get_world_size()
torch.cuda.set_device(r); dev = torch.device("cuda", r)
out = {}
for nbytes in (8192, 524288, 4194304):
    x = torch.ones(nbytes // 2, dtype=torch.bfloat16, device=dev)
    y = torch.empty(w * x.numel(), dtype=torch.bfloat16, device=dev)
    for _ in range(3):
        dist.all_gather_into_tensor(y, x)
    torch.cuda.synchronize(); dist.barrier()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        for _ in range(2):
            dist.all_gather_into_tensor(y, x)
    torch.cuda.synchronize()
    with torch.cuda.graph(g, capture_error_mode="thread_local"):
        for _ in range(20):
            dist.all_gather_into_tensor(y, x)
    torch.cuda.synchronize(); dist.barrier()
    g.replay(); torch.cuda.synchronize(); dist.barrier()
    wall = timing.time_ms(g.replay, dev, calls=20) * 1e3  # us per call
    dist.barrier()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        g.replay(); torch.cuda.synchronize()
    ks = sorted([(e.time_range.start, e.time_range.end, e.name) for e in prof.events() if e.device_type.name == "CUDA"], key=lambda t: t[0])
    nccl = [k for k in ks if "nccl" in k[2].lower() or "AllGather" in k[2]]
    durs = [k[1] - k[0] for k in nccl]
    gaps = [b[0] - a[1] for a, b in zip(nccl, nccl[1:])]
    import statistics as st
    out[nbytes] = {"wall_per_call_us": round(wall, 2), "n_kernels": len(nccl), "names": sorted({k[2][:40] for k in ks}),
                   "kernel_median_us": round(st.median(durs), 2) if durs else None,
                   "gap_median_us": round(st.median(gaps), 2) if gaps else None, "all_cuda": len(ks)}
    # single call between two spin waits (in-situ-like): kernel duration
    dist.barrier(); torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof2:
        for _ in range(5):
            torch.cuda._sleep(20000)
            dist.all_gather_into_tensor(y, x)
        torch.cuda.synchronize()
    one = [e.time_range.end - e.time_range.start for e in prof2.events() if e.device_type.name == "CUDA" and "AllGather" in e.name]
    out[nbytes]["single_after_sleep_median_us"] = round(st.median(one), 2) if one else None
if r == 0:
    print(json.dumps(out, indent=1))
    open(os.path.join(os.environ.get("OUT", "/tmp"), "coll_trace.json"), "w").write(json.dumps(out, indent=1))
dist.barrier()
torch.cuda.synchronize()
