"""The fused GEMM + Reduce-Scatter kernels compile for an H100/H200 (sm_90) without a GPU, plain and
with in-kernel records, with both reduction placements: the GPU run of the first version failed
with "CompilationError at 7:4" in ``rs_reduce_kernel`` (a name bound to a tensor before a loop and to
a constexpr inside it, which Triton's interpreter accepts and its compiler rejects).

Checked on the compiled code: no register spills, shared memory within an SM's 227 KB, TMA loads
and bf16 tensor-core MMAs in the GEMM, the peers' flags released system-wide and the waits
bounded by %globaltimer, and the plain build holding no record code (the record pointer unused,
no extra clock reads).

Ahead-of-time compilation: tests/kernels/aot.py (``TAXMODEL_COMPILE_TRITON_PATHS`` adds a run with
another Triton, e.g. 3.6.0, the GPU machines' version).
"""
from __future__ import annotations

import pytest

from aot import assert_fits_an_sm, compile_report, tritons

SCRIPT = r'''
from taxmodel.kernels.gemm_rs import tiles as t

PATTERNS = {"tma": r"cp\.async\.bulk\.tensor", "mma": r"wgmma[\w.]*bf16|mma\.sync[\w.]*bf16",
            "sys_release": r"atom[\w.]*\.sys\.release|atom\.release\.sys|atom\.global\.sys\.release",
            "globaltimer": r"%globaltimer",
            "gpu_release": r"atom[\w.]*\.release\.gpu|atom\.release\.gpu|atom\.global\.gpu\.release"}
BODY_PATTERNS = {"rec_uses": r"%rec_ptr\b", "epoch_uses": r"%epoch_ptr\b"}


W, M_LOC, N, K_LOC = 4, 2048, 8192, 2048
common = [("recv_ptr", "*bf16", 0), ("out_ptr", "*bf16", 0), ("flags_ptr", "*i32", 0)]
ints = [("rank", "i32", 3), ("epoch_ptr", "*i32", 0), ("budget", "i64", 30_000_000_001), ("rec_ptr", "*i64", 0)]

def gemm_args(tma):
    desc = ([("a_desc", "tensordesc<bf16[128, 64]>", 0), ("b_desc", "tensordesc<bf16[64, 256]>", 0)] if tma
            else [("a_desc", "none", 0), ("b_desc", "none", 0)])
    return ([("a_ptr", "*bf16", 0), ("b_ptr", "*bf16", 0)] + desc + common
            + [("heap_bases", "*i64", 0), ("err_ptr", "*i64", 0), ("count_ptr", "*i64", 0), ("seen_ptr", "*i64", 0),
               ("M_loc", "i32", M_LOC), ("N", "i32", N), ("K", "i32", K_LOC), ("stride_am", "i32", K_LOC),
               ("stride_ak", "i32", 1), ("stride_bk", "i32", N), ("stride_bn", "i32", 1), ("stride_om", "i32", N),
               ("ldr", "i32", N)]
            + ints + [("lag", "i32", 1)])

reduce_args = common + [("err_ptr", "*i64", 0), ("count_ptr", "*i64", 0), ("seen_ptr", "*i64", 0),
                        ("M_loc", "i32", M_LOC), ("N", "i32", N), ("ldr", "i32", N), ("stride_om", "i32", N)] + ints
report = {"triton": triton.__version__}
for inst in (False, True):
    for tail in (False, True):
        consts = dict(WORLD=W, BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, NUM_PROGS=132, NUM_STAGES=3,
                      USE_TMA=True, VEC_HINT=True, TAIL_REDUCE=tail, ROWS=32, SYNC_MODE=1, COUNT=False, INSTRUMENT=inst,
                      FLATTEN=not inst, SPREAD=True)  # the spread tile order (the default, kernel revision 6)
        report[f"gemm_{'tail' if tail else 'kernel'}_{inst}"] = build(t.gemm_rs_kernel, gemm_args(True), consts, 8, 3,
                                                                      f"gemm_{tail}_{inst}")
    report[f"reduce_{inst}"] = build(t.rs_reduce_kernel, reduce_args,
                                     dict(WORLD=W, BLOCK_M=128, BLOCK_N=256, ROWS=32, SYNC_MODE=1, COUNT=False,
                                          INSTRUMENT=inst), 4, 3, f"reduce_{inst}")
# The pointer path (no TMA: what a GPU without host descriptors runs), plain only.
report["gemm_ptr"] = build(t.gemm_rs_kernel, gemm_args(False),
                           dict(WORLD=W, BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, NUM_PROGS=132, NUM_STAGES=3,
                                USE_TMA=False, VEC_HINT=True, TAIL_REDUCE=False, ROWS=32, SYNC_MODE=1, COUNT=False,
                                INSTRUMENT=False, FLATTEN=False, SPREAD=True), 8, 3, "gemm_ptr")
print(json.dumps(report))
'''

KERNELS = [f"{k}_{inst}" for k in ("gemm_kernel", "gemm_tail", "reduce") for inst in (False, True)] + ["gemm_ptr"]


@pytest.fixture(scope="module", params=tritons())
def report(request, tmp_path_factory):
    return compile_report(SCRIPT, tmp_path_factory, request.param)


@pytest.mark.slow
@pytest.mark.parametrize("kernel", KERNELS)
def test_compiles_without_spills_within_shared_memory(report, kernel):
    assert_fits_an_sm(report, kernel)


@pytest.mark.slow
@pytest.mark.parametrize("inst", [False, True])
def test_gemm_uses_tma_and_tensor_cores_and_releases_flags(report, inst):
    for kernel in ("gemm_kernel", "gemm_tail"):
        r = report[f"{kernel}_{inst}"]
        assert r["tma"] > 0 and r["mma"] > 0, r
        assert r["sys_release"] >= 1, r  # sync.signal to the owner, system scope
    assert report["gemm_ptr"]["mma"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("kernel", KERNELS)
def test_the_device_epoch_is_one_slot_per_program_without_atomics(report, kernel):
    # The epoch lives in device memory (graph replays): each GEMM program loads its own slot and
    # stores it back (kernels/device/epochs.py), one address, no GPU-scope release or shared
    # counter; the reduce kernel only loads slot 0.
    assert report[kernel]["epoch_uses"] == 1, report[kernel]
    assert report[kernel]["gpu_release"] == 0, report[kernel]


@pytest.mark.slow
def test_waits_are_bounded_by_the_global_timer(report):
    assert report["reduce_False"]["globaltimer"] >= 1
    assert report["gemm_tail_False"]["globaltimer"] >= 1
    assert report["gemm_kernel_False"]["globaltimer"] == 0  # the GEMM alone never waits


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["gemm_kernel", "gemm_tail", "reduce"])
def test_plain_build_holds_no_record_code(report, kernel):
    off, on = report[f"{kernel}_False"], report[f"{kernel}_True"]
    assert off["rec_uses"] == 0  # the record pointer is never touched
    assert on["rec_uses"] > 0
    assert on["globaltimer"] > off["globaltimer"]  # records read the clock at every phase boundary
