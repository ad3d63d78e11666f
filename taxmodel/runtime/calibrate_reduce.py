"""`taxmodel calibrate`'s reduce step: GEMM+RS's reduction program (``gemm_rs/tiles.rs_reduce_kernel``)
measured on its own, where the model took a rate fitted on the 4x H200 bundles' records before.

The kernel runs one program per own output tile; each waits on its tile's W flags and sums the W
received slots. On one GPU, with every flag already holding the epoch and the slots filled, one
M-block of rows (one program per N-tile: a few dozen programs, one wave) makes the kernel as long
as one program: ``model.calibration.reduce_fit`` turns its time into the rate of one program
(``reduce_program_bytes_per_s``), the way the model charges it. W: the machine's ranks, and 8.
"""
from __future__ import annotations

import torch

from taxmodel.kernels.names import RS_REDUCE_KERNEL
from taxmodel.runtime.timing import kernel_seconds, median_seconds, on_gpu, synchronize

#: Columns of the reduced rows (the workloads' N) and how many launches are traced per point.
N_COLS = 8192
REPEATS = 10


def measure(device: torch.device, worlds: tuple[int, ...]) -> dict:
    """Per W: the reduction kernel's median time (s) over one M-block of rows, flags all set."""
    from taxmodel.kernels.device import sync
    from taxmodel.kernels.device.epochs import new_epoch_slots
    from taxmodel.kernels.gemm_rs.state import default_rs_config
    from taxmodel.kernels.gemm_rs.tiles import flag_rows, launch_rs_reduce, own_tiles

    gpu = on_gpu(device)
    cfg = default_rs_config(device)
    g = cfg.gemm
    n = N_COLS if gpu else 2 * g.block_n
    m_loc = g.block_m
    dtype = torch.bfloat16 if gpu else torch.float32
    mode = sync.sync_mode(device)
    budget = sync.spin_budget(5.0, mode)
    err = sync.new_error_buffer(device)
    runs = REPEATS if gpu else 1
    rows = []
    for world in sorted(set(int(w) for w in worlds if int(w) >= 1)):
        recv = torch.randn(2, world, m_loc, n, device=device).to(dtype)
        out = torch.empty(m_loc, n, device=device, dtype=dtype)
        flags = torch.ones(flag_rows(m_loc, n, g), world, dtype=torch.int32, device=device)
        epochs = new_epoch_slots(device).fill_(1)  # a GEMM finished epoch 1: every flag holds it

        def launch(world: int = world, recv: torch.Tensor = recv, out: torch.Tensor = out,
                   flags: torch.Tensor = flags, epochs: torch.Tensor = epochs) -> None:
            launch_rs_reduce(recv, out, flags, err, rank=0, world=world, m_loc=m_loc, epochs=epochs, budget=budget,
                             sync=mode, cfg=g, rows=cfg.reduce_rows, warps=cfg.reduce_warps)

        launch()
        synchronize(device)
        ref = recv[1].float().sum(0)
        if not torch.allclose(out.float(), ref, rtol=2e-2, atol=2e-2):
            raise RuntimeError(f"the reduction kernel's sum of {world} slots is wrong")
        t = kernel_seconds(device, lambda launch=launch: [launch() for _ in range(runs)], {"reduce": RS_REDUCE_KERNEL})
        rows.append({"world": world, "programs": own_tiles(m_loc, n, g), "block_m": g.block_m, "block_n": g.block_n,
                     "element_bytes": out.element_size(), "reduce_s": median_seconds(t, "reduce", "reduction")})
    sync.check_errors(err, "calibration reduction", None, mode)
    return {"n": n, "m_loc": m_loc, "rows": rows}
