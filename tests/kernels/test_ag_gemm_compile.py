"""The All-Gather+GEMM Triton kernels compile for an H100/H200 (sm_90) without a GPU, plain and with
in-kernel records, and the plain build holds no record code.

Why: a kernel can run in Triton's interpreter and still fail to compile for the GPU (it happened
with Triton 3.6 last time); compiling ahead of time for a named target catches that here. Runs in
a subprocess because the test session imports the kernels under ``TRITON_INTERPRET=1``. Arguments
are specialized as a real launch specializes them (16-byte-aligned pointers, integers divisible
by 16 marked so, tensor descriptors for the TMA loads) at the GPU configs the benchmark uses.
"""
from __future__ import annotations

import pytest

from aot import assert_fits_an_sm, compile_report, tritons

SCRIPT = r'''
from taxmodel.kernels.ag_gemm import gemm_tiles as gt, transport

PATTERNS = {"globaltimer": r"%globaltimer", "tma_loads": r"cp\.async\.bulk\.tensor", "wgmma": r"wgmma\.mma_async",
            "sys_release": r"atom[\w.]*\.sys[\w.]*\.release|atom[\w.]*\.release[\w.]*\.sys",
            "st_v4": r"st\.global[\w.]*\.v4", "ld_v4": r"ld\.global[\w.]*\.v4", "scalar_b16_st": r"st\.global\.b16",
            "acquire": r"(ld|atom)\.global[\w.]*\.acquire", "vote": r"bar\.red\.and\.pred",
            "acquire_load": r"ld\.acquire\.sys\.global\.b32"}
BODY_PATTERNS = {"rec_uses": r"%rec_ptr\b", "volatile_loads": r"isVolatile = true",
                 "parity_uses": r"%(parity_rows|flag_parity_stride)\b", "epoch_uses": r"%epoch_ptr\b"}


M_LOC, N, K = 256, 8192, 8192
def gemm_args(block_m, block_n, block_k, tma_store, epi):
    a_desc = f"tensordesc<bf16[{block_m}, {block_k}]>"
    b_desc = f"tensordesc<bf16[{block_k}, {block_n}]>"
    c_desc = f"tensordesc<bf16[{block_m}, {block_n // epi}]>" if tma_store else "none"
    return [("a_ptr", "*bf16", 0), ("b_ptr", "*bf16", 0), ("c_ptr", "*bf16", 0), ("a_desc", a_desc, 0),
            ("b_desc", b_desc, 0), ("c_desc", c_desc, 0), ("flags_ptr", "*i32", 0), ("heap_bases", "*i64", 0),
            ("err_ptr", "*i64", 0), ("count_ptr", "*i64", 0), ("seen_ptr", "*i64", 0), ("epoch_ptr", "*i32", 0),
            ("rec_ptr", "*i64", 0), ("M_loc", "i32", M_LOC), ("N", "i32", N), ("K", "i32", K),
            ("stride_am", "i32", K), ("stride_ak", "i32", 1), ("stride_bk", "i32", N), ("stride_bn", "i32", 1),
            ("stride_cm", "i32", N), ("stride_cn", "i32", 1), ("parity_rows", "i32", 1024),
            ("flag_parity_stride", "i32", 32), ("rank", "i32", 3), ("budget", "i64", 30_000_000_001),
            ("kernel_id", "i32", 0)]

def gemm(tag, block_m=128, block_n=256, block_k=64, stages=3, warps=8, tma_store=False, epi=1, pieces=4,
         inst=False, flatten=False, vote=False, horizon=False, double=True, chunk=1, order=1):
    consts = dict(WORLD=4, A_MODE=2, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=8, NUM_PROGS=132,
                  NUM_STAGES=stages, USE_TMA=True, SYNC_MODE=1, COUNT=False, TMA_STORE=tma_store,
                  EPI_SPLIT=epi, K_PIECES=pieces, KT_PER_PIECE=K // pieces // block_k, INSTRUMENT=inst,
                  FLATTEN=flatten, WAIT_VOTE=vote, WAIT_HORIZON=horizon, HORIZON_SCAN=64, DOUBLE_BUFFER=double,
                  FLAG_CHUNK=chunk, ORDER_CHUNK=order)
    return build(gt.ag_gemm_kernel, gemm_args(block_m, block_n, block_k, tma_store, epi), consts, warps, stages, tag)

copy_args = [("gathered_ptr", "*bf16", 0), ("flags_ptr", "*i32", 0), ("heap_bases", "*i64", 0),
             ("epoch_ptr", "*i32", 0), ("rec_ptr", "*i64", 0), ("M_loc", "i32", M_LOC), ("K", "i32", K),
             ("stride_m", "i32", K), ("parity_rows", "i32", 1024), ("flag_parity_stride", "i32", 32),
             ("rank", "i32", 3)]
def copy(tag, pull, inst):
    consts = dict(WORLD=4, PULL=pull, BLOCK_M=128, ROWS=32, BLOCK_K=256, CHUNK_K=2048, NUM_PROGS=32, EVEN=True,
                  MODE=1, INSTRUMENT=inst, DOUBLE_BUFFER=not pull)
    return build(transport.copy_blocks_kernel, copy_args, consts, 4, 1, tag)

report = dict(
    gemm=gemm("gemm"),
    gemm_inst=gemm("gemm_inst", inst=True),
    gemm_n128_st=gemm("gemm_n128_st", block_n=128, stages=4, tma_store=True, epi=2, pieces=1),
    gemm_flat=gemm("gemm_flat", tma_store=True, epi=2, pieces=1, flatten=True),
    gemm_flat_vote=gemm("gemm_flat_vote", tma_store=True, epi=2, pieces=1, flatten=True, vote=True),
    gemm_flat_horizon=gemm("gemm_flat_horizon", tma_store=True, epi=2, pieces=1, flatten=True, vote=True,
                           horizon=True),
    gemm_flat_single=gemm("gemm_flat_single", tma_store=True, epi=2, pieces=1, flatten=True, vote=True,
                          horizon=True, double=False),
    gemm_flat_chunk=gemm("gemm_flat_chunk", tma_store=True, epi=2, pieces=1, flatten=True, vote=True,
                         horizon=True, double=False, chunk=8, order=8),
    copy_push=copy("copy_push", False, False),
    copy_push_inst=copy("copy_push_inst", False, True),
    copy_pull=copy("copy_pull", True, False),
    copy_pull_inst=copy("copy_pull_inst", True, True),
)
print(json.dumps(report))
'''



@pytest.fixture(scope="module", params=tritons())
def report(request, tmp_path_factory):
    return compile_report(SCRIPT, tmp_path_factory, request.param)


KERNELS = ["gemm", "gemm_inst", "gemm_n128_st", "gemm_flat", "gemm_flat_vote", "gemm_flat_horizon", "gemm_flat_single",
           "copy_push", "copy_push_inst", "copy_pull", "copy_pull_inst"]


@pytest.mark.slow
@pytest.mark.parametrize("kernel", KERNELS)
def test_no_spills_and_shared_memory_fits(report, kernel):
    assert_fits_an_sm(report, kernel)


@pytest.mark.slow
@pytest.mark.parametrize("plain,inst", [("gemm", "gemm_inst"), ("copy_push", "copy_push_inst"),
                                        ("copy_pull", "copy_pull_inst")])
def test_plain_build_holds_no_record_code(report, plain, inst):
    off, on = report[plain], report[inst]
    assert off["rec_uses"] == 0, off  # the record pointer is never touched
    assert on["rec_uses"] > 0, on
    assert on["globaltimer"] > off["globaltimer"], (off, on)  # records read the clock; the plain build fewer times


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["gemm", "gemm_inst", "gemm_n128_st", "gemm_flat", "gemm_flat_vote",
                                    "gemm_flat_horizon", "gemm_flat_single"])
def test_gemm_uses_tma_and_wgmma_and_bounded_waits(report, kernel):
    r = report[kernel]
    assert r["tma_loads"] > 0 and r["wgmma"] > 0, r
    assert r["globaltimer"] >= 1, r  # wait_geq's deadline


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["copy_push", "copy_pull"])
def test_copy_kernel_moves_16_byte_vectors_and_releases_flags_system_wide(report, kernel):
    r = report[kernel]
    assert r["st_v4"] > 0 and r["ld_v4"] > 0, r
    assert r["scalar_b16_st"] == 0, r  # no element-wise bf16 stores (the first version's 10 GB/s)
    assert r["sys_release"] >= 1, r


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["gemm", "gemm_inst", "gemm_n128_st", "gemm_flat", "gemm_flat_vote",
                                    "gemm_flat_horizon", "gemm_flat_single"])
def test_flag_wait_keeps_its_acquire(report, kernel):
    """Triton 3.6 dropped an acquire atomic whose result nobody used: the GEMM then read pushed rows
    after a relaxed poll only. wait_geq now uses the acquired value (its CTA-wide outcome)."""
    assert report[kernel]["acquire"] >= 1, report[kernel]


@pytest.mark.slow
def test_record_precheck_adds_no_per_thread_flag_load(report):
    """The instrumented GEMM's "will this wait spin?" check must give every thread the same answer
    (the records behind it hold CTA barriers): a scalar atomic, broadcast, not one more volatile load
    per thread (which could straddle the flag's arrival, split the CTA and hang it)."""
    assert report["gemm_inst"]["volatile_loads"] == report["gemm"]["volatile_loads"] > 0, report


@pytest.mark.slow
def test_voting_wait_keeps_the_flattened_pipeline(report):
    """``wait_vote``: the remote tile's wait reads its flag with one acquire load per thread and
    votes in one barrier (``bar.red.and``), the bounded spin behind it. A barrier written as
    ``tl.debug_barrier`` in this loop once left Triton's pipeliner with one stage of loads: the
    voting build must keep the plain flattened build's shared memory (every stage in flight)."""
    vote, plain = report["gemm_flat_vote"], report["gemm_flat"]
    assert vote["vote"] >= 1 and vote["acquire_load"] >= 1, vote
    assert plain["vote"] == 0 and plain["acquire_load"] == 0, plain
    assert vote["shared"] == plain["shared"], (vote, plain)


@pytest.mark.slow
def test_horizon_scan_keeps_the_flattened_pipeline(report):
    """``wait_horizon``: the scan of the remote blocks' flags (acquire loads, a CTA-wide minimum)
    sits in the flattened loop too; the load pipeline keeps every stage: the same shared memory as
    the plain flattened build (the reduction's scratch reuses it)."""
    hz, plain = report["gemm_flat_horizon"], report["gemm_flat"]
    assert hz["acquire_load"] >= 1, hz
    assert hz["shared"] == plain["shared"], (hz, plain)


@pytest.mark.slow
@pytest.mark.parametrize("single,double", [("gemm_flat_single", "gemm_flat_horizon"), ("copy_pull", "copy_push")])
def test_only_the_double_buffer_puts_the_epoch_into_addresses(report, single, double):
    """``DOUBLE_BUFFER`` off (pull, the copy engines, the GEMM alone): the parity offsets are not
    even read, so no load or store address depends on the epoch slot's load; on (push) they are."""
    assert report[single]["parity_uses"] == 0, report[single]
    assert report[double]["parity_uses"] > 0, report[double]


@pytest.mark.slow
@pytest.mark.parametrize("kernel", KERNELS)
def test_a_program_touches_only_its_own_epoch_slot(report, kernel):
    """Per-program epoch slots (kernels/device/epochs.py): the epoch words are used through one
    address, ``epoch_ptr + pid`` (its load and its plain store), no shared counter or exchange."""
    assert report[kernel]["epoch_uses"] == 1, report[kernel]
