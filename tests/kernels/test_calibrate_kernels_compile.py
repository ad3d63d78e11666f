"""The calibration's own microbenchmark kernels (``taxmodel/runtime/calibrate_decode.py``: the fused flash
decode's LL push and merge run on their own) compile for an H100/H200 (sm_90) without a GPU: the
interpreter runs code that the compiler rejects (a plain global read inside a jit function, last
seen in this module), and the compiled pushes must stay plain 8-byte stores with no system-scope fence."""
from __future__ import annotations

import pytest

from aot import assert_fits_an_sm, compile_report

SCRIPT = r'''
from taxmodel.runtime import calibrate_decode as cd

PATTERNS = {"sys_scope": r"\.sys\b", "st_b64": r"st\.global[\w.]*\.b64", "volatile_b64": r"ld\.volatile\.global[\w.]*\.b64"}
push_args = [("recv_ptr", "*i64", 0), ("flag_ptr", "*i32", 0), ("heap_bases", "*i64", 0), ("rank", "i32", 3),
             ("world_size", "i32", 4), ("rows_total", "i32", 512), ("reps", "i32", 36)]
merge_args = [("recv_ptr", "*i64", 0), ("out_ptr", "*bf16", 0), ("err_ptr", "*i64", 0), ("budget", "i64", 5_000_000_001),
              ("sources", "i32", 34), ("rows_total", "i32", 512)]
report = dict(push=build(cd.ll_push_kernel, push_args, dict(R=8, R_P2=8, D=128), 4, 3, "push"),
              merge=build(cd.ll_merge_kernel, merge_args, dict(R=8, R_P2=8, D=128, MODE=1), 4, 3, "merge"))
print(json.dumps(report))
'''


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    return compile_report(SCRIPT, tmp_path_factory)


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["push", "merge"])
def test_the_ll_microbenchmarks_compile_and_fit_an_sm(report, kernel):
    assert_fits_an_sm(report, kernel)


@pytest.mark.slow
def test_the_pushes_are_plain_8_byte_stores_and_the_merge_polls_its_words(report):
    assert report["push"]["st_b64"] > 0 and report["push"]["sys_scope"] == 0
    assert report["merge"]["volatile_b64"] > 0
