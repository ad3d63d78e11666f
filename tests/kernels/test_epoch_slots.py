"""The fine-grained kernels' per-program epoch slots (kernels/device/epochs.py), without a GPU.

Every program of a launch reads its own slot and stores the next epoch back, so every launch on
one slots buffer must use the same grid (a program that did not run before would hold a stale
epoch): the launch functions refuse another grid on the host. The push variant's double buffer
is a constexpr (``DOUBLE_BUFFER``), on for push only, so that pull, the copy engines and the GEMM
alone have no load address that depends on the epoch.
"""
from __future__ import annotations

import os
import threading
from dataclasses import replace

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported

import pytest
import torch

from taxmodel.kernels.ag_gemm import gemm_tiles, transport
from taxmodel.kernels.ag_gemm.workload import AgGemm
from taxmodel.kernels.device.epochs import EPOCH_SLOTS, check_grid, new_epoch_slots
from taxmodel.kernels.device.sync import SYNC_POLL, check_errors, new_error_buffer, spin_budget
from taxmodel.kernels.gemm_rs import tiles
from taxmodel.runtime.context import RankContext, run_in_threads

from launch_tape import Recorder

pytestmark = pytest.mark.skipif(type(gemm_tiles.ag_gemm_kernel).__name__ != "InterpretedFunction",
                                reason="kernels were imported without TRITON_INTERPRET=1")

CFG = gemm_tiles.CPU_CONFIG  # 16x16x16 tiles, 3 programs
M, N, K = 32, 32, 16  # 2 x 2 tiles: a grid of 3 programs


def _ag_launch(epochs: torch.Tensor, cfg=CFG) -> torch.Tensor:
    """``ag_gemm_kernel`` in ``A_WAIT`` on one rank (every tile its own: nothing waits); its C."""
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
    c = torch.full((M, N), float("nan"))
    bpr, _ = gemm_tiles.tile_counts(M, N, 1, cfg)
    gemm_tiles.launch_ag_gemm(a, b, c, mode=gemm_tiles.A_WAIT, rank=0, world=1, m_loc=M, cfg=cfg,
                              err=new_error_buffer("cpu"), sync=SYNC_POLL, flags=torch.zeros(bpr, dtype=torch.int32),
                              epochs=epochs, budget=spin_budget(30, SYNC_POLL))
    torch.testing.assert_close(c, a @ b, rtol=1e-4, atol=1e-4)
    return c


def test_every_program_counts_its_launches_in_its_own_slot():
    slots = new_epoch_slots("cpu")
    assert slots.shape == (EPOCH_SLOTS,) and slots.dtype == torch.int32
    grid = gemm_tiles.num_programs(CFG, torch.device("cpu"), 4)
    for _ in range(3):
        _ag_launch(slots)
    assert slots.tolist() == [3] * grid + [0] * (EPOCH_SLOTS - grid)


def test_a_launch_with_another_grid_on_the_same_slots_is_refused():
    slots = new_epoch_slots("cpu")
    _ag_launch(slots)
    with pytest.raises(ValueError, match="same grid"):
        _ag_launch(slots, replace(CFG, num_progs=2))
    assert slots.tolist()[:4] == [1, 1, 1, 0]  # refused before it launched
    _ag_launch(slots)  # the grid it was bound to still launches
    assert slots.tolist()[:4] == [2, 2, 2, 0]
    _ag_launch(new_epoch_slots("cpu"), replace(CFG, num_progs=2))  # new slots: any grid


def test_gemm_rs_refuses_another_grid_on_its_slots():
    """GEMM+RS's GEMM: under the interpreter the tail reduction runs one program, the separate
    reduction ``CFG``'s 3; both on one slots buffer would leave stale slots."""
    m, n, k = 32, 32, 16
    a, b = torch.randn(m, k), torch.randn(k, n)
    recv = torch.full((2, 1, m, n), float("nan"))
    flags = torch.zeros(tiles.flag_rows(m, n, CFG), 1, dtype=torch.int32)
    slots, err = new_epoch_slots("cpu"), new_error_buffer("cpu")
    common = dict(rank=0, world=1, m_loc=m, epochs=slots, budget=spin_budget(30, SYNC_POLL), sync=SYNC_POLL, cfg=CFG,
                  rows=8)
    tiles.launch_gemm_rs(a, b, recv, torch.empty(m, n), flags, torch.zeros(1, dtype=torch.int64), err, tail=False,
                         **common)
    torch.testing.assert_close(recv[1, 0], a @ b, rtol=1e-4, atol=1e-4)  # epoch 1: the odd half
    with pytest.raises(ValueError, match="same grid"):
        tiles.launch_gemm_rs(a, b, recv, torch.empty(m, n), flags, torch.zeros(1, dtype=torch.int64), err, tail=True,
                             **common)
    assert slots.tolist()[:4] == [1, 1, 1, 0]


def test_slots_are_checked_for_size_and_fresh_ones_are_bound_to_no_grid():
    with pytest.raises(ValueError, match="epoch slots"):
        check_grid(torch.zeros(2, dtype=torch.int32), 3, "k")
    slots = new_epoch_slots("cpu", kernels=2)
    assert slots.shape == (2, EPOCH_SLOTS)
    check_grid(slots[0], 3, "k")
    check_grid(slots[1], 2, "k")  # each kernel's row is its own buffer
    with pytest.raises(ValueError, match="with 3"):
        check_grid(slots[0], 4, "k")
    del slots
    check_grid(new_epoch_slots("cpu", kernels=2)[0], 4, "k")  # even at a freed buffer's address


@pytest.mark.parametrize("variant,transport_name,double", [("push", "sm", True), ("push", "ce", True),
                                                           ("pull", "sm", False), ("pull", "ce", False)])
def test_only_the_push_variant_compiles_the_double_buffer(variant, transport_name, double, monkeypatch):
    tape = threading.local()
    monkeypatch.setattr(gemm_tiles, "ag_gemm_kernel", Recorder(gemm_tiles.ag_gemm_kernel, tape))
    monkeypatch.setattr(transport, "copy_blocks_kernel", Recorder(transport.copy_blocks_kernel, tape))
    wl = AgGemm(replace(CFG, transport=transport_name))
    shape = {"M": 64, "N": 40, "K": 40, "tp": 0, "seed": 1}

    def body(ctx: RankContext) -> list[bool]:
        v = wl.variants()[variant]
        st = wl.setup(ctx, shape, v)
        tape.log = []
        v.run(st)
        log, tape.log = tape.log, None
        check_errors(st.err, variant, ctx)
        ctx.barrier()
        return [kwargs["DOUBLE_BUFFER"] for _, _, _, kwargs in log]

    for flags in run_in_threads(2, body, heap_bytes=1 << 20, timeout_s=300, spin_timeout_s=60):
        assert len(flags) == (2 if transport_name == "sm" else 1)  # the copy kernel, the GEMM
        assert flags == [double] * len(flags)
