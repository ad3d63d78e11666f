"""kernels/device/sync.py: bounded flag waits, release-sets, and the errors a give-up turns into."""
from __future__ import annotations

import os
import threading
import time

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported

import pytest
import torch
import triton
import triton.language as tl

from taxmodel.errors import RunError
from taxmodel.kernels.device import sync
from taxmodel.kernels.device.sync import signal, signal_add, wait_geq

interpreted = pytest.mark.skipif(type(wait_geq).__name__ != "InterpretedFunction",
                                 reason="kernels were imported without TRITON_INTERPRET=1")


@triton.jit
def _waiter(flag_ptr, out_ptr, target, budget, err_ptr, rank, peer, flag_index, MODE: tl.constexpr):
    ok = wait_geq(flag_ptr + flag_index, target, budget, err_ptr, rank, peer, flag_index, 5, MODE)
    tl.store(out_ptr, ok.to(tl.int32))


@triton.jit
def _setter(flag_ptr, value, from_rank, to_rank, heap_bases, ADD: tl.constexpr):
    if ADD:
        signal_add(flag_ptr, value, from_rank, to_rank, heap_bases)
    else:
        signal(flag_ptr, value, from_rank, to_rank, heap_bases)


def _heaps(world: int = 2) -> tuple[list[torch.Tensor], torch.Tensor]:
    heaps = [torch.zeros(8, dtype=torch.int32) for _ in range(world)]
    return heaps, torch.tensor([h.data_ptr() for h in heaps], dtype=torch.int64)


@interpreted
@pytest.mark.parametrize("add", [False, True])
def test_wait_sees_flag_set_later_by_peer(add: bool) -> None:
    heaps, bases = _heaps()
    err, out = sync.new_error_buffer("cpu"), torch.zeros(1, dtype=torch.int32)
    budget = sync.spin_budget(30.0, sync.SYNC_POLL)
    t = threading.Thread(target=lambda: _waiter[(1,)](heaps[0], out, 3, budget, err, 0, 1, 2, MODE=0))
    t.start()
    time.sleep(0.1)
    # rank 1 sets flag 2 of rank 0's heap (pointer given in rank 1's own heap).
    _setter[(1,)](heaps[1][2:], 3, 1, 0, bases, ADD=add)
    t.join(30)
    assert not t.is_alive()
    assert out.item() == 1
    assert heaps[0][2].item() == 3 and heaps[1][2].item() == 0
    sync.check_errors(err, "waiter")  # nothing recorded


@interpreted
def test_give_up_records_rank_peer_flag_and_raises() -> None:
    heaps, _ = _heaps()
    heaps[0][4] = 2
    err, out = sync.new_error_buffer("cpu"), torch.zeros(1, dtype=torch.int32)
    budget = sync.spin_budget(0.05, sync.SYNC_POLL)  # 50 ms of the host clock (the interpreter's)
    _waiter[(1,)](heaps[0], out, 7, budget, err, 3, 1, 4, MODE=0)
    assert out.item() == 0
    rec = dict(zip(sync.ERR_FIELDS, err.tolist()))
    waited = rec.pop("waited")
    assert rec == {"failed": 1, "rank": 3, "peer": 1, "flag_index": 4, "kernel_id": 5, "target": 7, "seen": 2}
    assert budget <= waited < budget + 10**9  # gave up at the bound, not long after it
    with pytest.raises(RunError, match=r"rank 3: kernel my_kernel gave up waiting on flag 4 from rank 1 after [0-9.e+-]+ s"):
        sync.check_errors(err, "my_kernel")
    with pytest.raises(RunError, match="kernel named_by_id"):
        sync.check_errors(err, {5: "named_by_id"})


@interpreted
def test_after_a_give_up_later_waits_return_at_once() -> None:
    heaps, _ = _heaps()
    err, out = sync.new_error_buffer("cpu"), torch.zeros(1, dtype=torch.int32)
    err[0] = 1  # an earlier wait of this launch gave up
    t0 = time.perf_counter()
    _waiter[(1,)](heaps[0], out, 1, 10**9, err, 0, 1, 0, MODE=0)
    assert time.perf_counter() - t0 < 5.0
    assert out.item() == 0
    assert err[1:].tolist() == [0] * (sync.ERR_LEN - 1)  # the first failure's record is kept


def test_spin_budget_units() -> None:
    assert sync.spin_budget(2.0, sync.SYNC_NVIDIA) == 2_000_000_000
    assert sync.spin_budget(2.0, sync.SYNC_AMD) == 200_000_000
    assert sync.spin_budget(2.0, sync.SYNC_POLL) == 2_000_000_000  # the host clock's ns
    assert sync.budget_seconds(sync.spin_budget(1.5, sync.SYNC_NVIDIA), sync.SYNC_NVIDIA) == 1.5
    with pytest.raises(ValueError):
        sync.spin_budget(0, sync.SYNC_POLL)
    assert sync.sync_mode("cpu") == sync.SYNC_POLL


def test_nvidia_path_compiles_to_globaltimer_and_system_scope_atomics(tmp_path) -> None:
    """The GPU branch (inline PTX) cannot run here; compile it for sm_90 to catch errors early."""
    import importlib
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent('''
        import os
        os.environ.pop("TRITON_INTERPRET", None)
        import triton, triton.language as tl
        from triton.backends.compiler import GPUTarget
        from taxmodel.kernels.device.sync import wait_geq, signal, fence_tma_after_acquire
        @triton.jit
        def k(flag_ptr, out_ptr, target, budget, err_ptr, rank, heap_bases, MODE: tl.constexpr):
            ok = wait_geq(flag_ptr, target, budget, err_ptr, rank, 1, 0, 7, MODE)
            fence_tma_after_acquire(MODE)
            signal(flag_ptr + 1, target, rank, 1, heap_bases)
            tl.store(out_ptr, ok.to(tl.int32))
        sig = {"flag_ptr": "*i32", "out_ptr": "*i32", "target": "i32", "budget": "i64", "err_ptr": "*i64",
               "rank": "i32", "heap_bases": "*i64", "MODE": "constexpr"}
        ptx = triton.compile(triton.compiler.ASTSource(fn=k, signature=sig, constexprs={"MODE": 1}),
                             target=GPUTarget("cuda", 90, 32)).asm["ptx"]
        print("globaltimer" in ptx, "fence.proxy.async" in ptx, "sys.release" in ptx, "sys.acquire" in ptx)
    ''')
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    script = tmp_path / "compile_sync.py"  # Triton needs kernel source in a file
    script.write_text(code)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    if proc.returncode != 0 and ("ptxas" in proc.stderr or "No such file" in proc.stderr):
        pytest.skip("no ptxas in this Triton install")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["True", "True", "True", "True"]
    assert importlib.import_module("taxmodel.kernels.device.sync") is sync
