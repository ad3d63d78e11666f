"""The flash decode kernels compile for an H100/H200 (sm_90) without a GPU, and the code is what
a memory-bound decode kernel needs: 16-byte cp.async loads of K/V in a software pipeline, bf16
tensor-core MMAs, no register spills, shared memory within an SM's 227 KB, and (fused) waits
bounded by the global timer; with LL words (the default) no system-scope fence at all, with the
flag protocol the system-scope release of the peer flags.

Triton compiles ahead of time for a named target; this runs in a subprocess because the test
session imports the kernels under ``TRITON_INTERPRET=1``. Arguments are specialized as a real
launch specializes them (16-byte-aligned pointers, integers divisible by 16 marked so).
"""
from __future__ import annotations

import pytest

from aot import assert_fits_an_sm, compile_report

SCRIPT = r'''
from taxmodel.kernels.flash_decode import combine as cb, fused as fu, split_kv as sk

PATTERNS = {"cp_async_16": r"cp\.async\.cg\.shared\.global[^\n]*0x10", "mma_bf16": r"mma\.sync[\w.]*bf16",
            "cg_v4": r"ld\.global\.cg\.v4", "sys_release": r"atom\.global\.sys\.release", "globaltimer": r"%globaltimer",
            "scalar_b16": r"ld\.global\.b16", "sys_scope": r"\.sys\b", "volatile_b64": r"ld\.volatile\.global[\w.]*\.b64",
            "nanosleep": r"nanosleep"}
BODY_PATTERNS = {}


D, L, HKV, HQ = 128, 262144, 4, 32
split_args = [("q_ptr", "*bf16", 0), ("k_ptr", "*bf16", 0), ("v_ptr", "*bf16", 0), ("part_out_ptr", "*fp32", 0),
              ("part_lse_ptr", "*fp32", 0), ("kv_len", "i32", L), ("chunk", "i32", 4032), ("num_splits", "i32", 66),
              ("kv_heads", "i32", HKV), ("qk_scale", "fp32", 0.1), ("stride_qb", "i32", HQ * D), ("stride_qh", "i32", D),
              ("stride_kb", "i32", HKV * L * D), ("stride_kh", "i32", L * D), ("stride_kn", "i32", D),
              ("stride_vb", "i32", HKV * L * D), ("stride_vh", "i32", L * D), ("stride_vn", "i32", D)]
consts = dict(G=8, G_DOT=16, D=D, BLOCK_N=64, NUM_STAGES=3, DOT_F32=False)
fused_args = (split_args[:3] + [("out_ptr", "*bf16", 0)] + split_args[3:5]
              + [("counter_ptr", "*i32", 0), ("recv_ptr", "*i64", 0), ("flag_ptr", "*i32", 0), ("epoch_ptr", "*i32", 0),
                 ("done_ptr", "*i32", 0), ("ready_ptr", "*i32", 0), ("err_ptr", "*i64", 0), ("heap_bases", "*i64", 0)]
              + split_args[5:] + [("rank", "i32", 3), ("world_size", "i32", 4), ("rows_total", "i32", HQ),
                                  ("num_combiners", "i32", HKV), ("budget", "i64", 30_000_000_001),
                                  ("rec_ptr", "*i64", 0)])
report = dict(
    split=build(sk.flash_decode_split_kv, split_args, consts, 4, 3, "split"),
    fused=build(fu.flash_decode_fused, fused_args, dict(consts, G_P2=8, NB=4, W_P2=4, MODE=1, KERNEL_ID=1, INSTRUMENT=False,
                                                        LL=True, SLICES=0, RS=1, RS_P2=1), 4, 3, "fused"),
    fused_flags=build(fu.flash_decode_fused, fused_args, dict(consts, G_P2=8, NB=4, W_P2=4, MODE=1, KERNEL_ID=1,
                                                              INSTRUMENT=False, LL=False, SLICES=0, RS=1, RS_P2=1),
                          4, 3, "fused_flags"),
    fused_spread=build(fu.flash_decode_fused, fused_args, dict(consts, G_P2=8, NB=32, W_P2=4, MODE=1, KERNEL_ID=1,
                                                               INSTRUMENT=False, LL=True, SLICES=8, RS=1, RS_P2=1),
                       4, 3, "fused_spread"),
    combine_local=build(cb.flash_decode_combine_local, [("part_out_ptr", "*fp32", 0), ("part_lse_ptr", "*fp32", 0),
                        ("send_ptr", "*fp32", 0), ("num_splits", "i32", 66), ("rows_total", "i32", HQ)],
                        dict(G=8, R=8, R_P2=8, D=D, NB=4), 4, 3, "combine_local"),
    combine_local_r1=build(cb.flash_decode_combine_local, [("part_out_ptr", "*fp32", 0), ("part_lse_ptr", "*fp32", 0),
                           ("send_ptr", "*fp32", 0), ("num_splits", "i32", 66), ("rows_total", "i32", HQ)],
                           dict(G=8, R=1, R_P2=1, D=D, NB=32), 4, 3, "combine_local_r1"),
    combine_global=build(cb.flash_decode_combine_global, [("gathered_ptr", "*fp32", 0), ("out_ptr", "*bf16", 0),
                         ("world_size", "i32", 4), ("rows_total", "i32", HQ)], dict(R=8, R_P2=8, D=D, NB=4), 4, 3,
                         "combine_global"),
)
print(json.dumps(report))
'''



@pytest.fixture(scope="module")
def report(tmp_path_factory):
    return compile_report(SCRIPT, tmp_path_factory)


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["split", "fused", "fused_flags", "fused_spread", "combine_local",
                                    "combine_local_r1", "combine_global"])
def test_no_spills_and_shared_memory_fits(report, kernel):
    assert_fits_an_sm(report, kernel)


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["split", "fused", "fused_flags", "fused_spread"])
def test_kv_streams_through_a_cp_async_pipeline_on_tensor_cores(report, kernel):
    r = report[kernel]
    assert r["cp_async_16"] >= 16, r  # K and V tiles as 16-byte async copies, several stages
    assert r["scalar_b16"] == 0, r  # no element-wise bf16 loads
    assert r["mma_bf16"] > 0, r


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["fused", "fused_spread"])
def test_fused_ll_pushes_need_no_system_scope_fence_and_waits_are_bounded(report, kernel):
    """LL words carry their epoch: no system-scope release or acquire anywhere in the kernel (the
    spread structure's wait for its own GPU's workers acquires at GPU scope); the receiver polls
    the 8-byte words with volatile loads, bounded by the global timer."""
    r = report[kernel]
    assert r["sys_scope"] == 0 and r["sys_release"] == 0, r
    assert r["volatile_b64"] > 0, r
    assert r["globaltimer"] >= 1 and r["nanosleep"] >= 1, r
    assert r["cg_v4"] > 0  # the split partials are read through L2 with vector loads


@pytest.mark.slow
def test_fused_flags_protocol_releases_flags_system_wide_and_bounds_waits(report):
    r = report["fused_flags"]
    assert r["sys_release"] >= 1  # sync.signal to peers
    assert r["globaltimer"] >= 1  # wait_geq's deadline on NVIDIA
    assert r["cg_v4"] > 0  # partials read through L2 with vector loads


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["fused", "fused_flags", "fused_spread"])
def test_fused_keeps_the_split_kernels_occupancy(report, kernel):
    """The workers of the fused kernel run the split kernel's loop; the extra combine/push code
    must not cost occupancy: three 128-thread programs per SM need <= 168 registers each, and the
    shared memory is the pipeline's, as in the split kernel."""
    r, split = report[kernel], report["split"]
    assert r["regs"] <= 168, r
    assert r["shared"] <= max(split["shared"], 227 * 1024 // 3), (r, split)


@pytest.mark.slow
def test_combines_load_partials_as_vectors(report):
    assert report["combine_local"]["cg_v4"] > 0
    assert report["combine_global"]["cg_v4"] > 0
