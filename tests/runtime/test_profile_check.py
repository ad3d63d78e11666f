"""A rank whose output differs from the workload's reference ends the run with a RunError naming it."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from taxmodel.errors import RunError
from taxmodel.runtime.profile import ProfileRequest, profile

TOY = str(Path(__file__).with_name("toy_workload.py"))


def _request(tmp_path, **shape):
    return ProfileRequest(workload="toy", workload_modules=[TOY], device="cpu", world_size=2, iterations=2, warmup=1,
                          out=str(tmp_path), timeout_s=240, variants=["bsp"], progress=False, shape=shape)


@pytest.mark.slow
def test_wrong_result_is_a_run_error(tmp_path):
    with pytest.raises(RunError, match=r"toy/bsp gives wrong results \(rank 0: 8 of 8 elements outside"):
        profile(_request(tmp_path, wrong_rank=0), quiet=True)
    assert not any(tmp_path.rglob("meta.json"))




class _ShapeOnlyTolerance:
    """A user workload written before the check passed the world size."""

    def tolerance(self, shape):
        return (0.0, float(shape["N"]))


def test_tolerance_of_passes_the_world_size_only_where_it_is_taken():
    from taxmodel.workload import get_workload, tolerance_of

    assert tolerance_of(_ShapeOnlyTolerance(), {"N": 3}, 8) == (0.0, 3.0)
    rs = get_workload("gemm_rs")
    atol = {w: tolerance_of(rs, {"M": 1024}, w)[1] for w in (2, 4, 8)}
    assert atol[2] < atol[4] < atol[8]  # bf16 sums of W partials round W times
    # 8x H200 measured a bf16 NCCL reduce-scatter's rounding up to 0.047; a dropped partial (N(0, 1/W)
    # per element) errs by far more than the tolerance on most elements
    assert 0.047 < atol[8] < 0.5 * (1 / 8) ** 0.5
    assert tolerance_of(rs, {"M": 1024, "dtype": 32}, 8) == (2e-2, 2e-2)  # fp32 sums: no growth


# --- shapes sized for GPUs on a CPU run -------------------------------------------------------


def test_a_gpu_preset_on_cpu_is_refused_at_once_with_what_it_would_cost(tmp_path):
    """The README's `taxmodel profile ag_gemm -n 4 --preset m1024,m8192` on a CPU machine: refused
    before any rank starts, saying how much more work than the CPU preset it is and how long the
    interpreter would take (pull hung for minutes in compile, with an ETA of hours, before)."""
    import time

    from click.testing import CliRunner

    from taxmodel.cli import cli

    t0 = time.monotonic()
    res = CliRunner().invoke(cli, ["profile", "ag_gemm", "-n", "4", "--preset", "m1024,m8192", "--device", "cpu",
                                   "-o", str(tmp_path)])
    assert res.exit_code == 2, res.output
    assert time.monotonic() - t0 < 60  # checks only (imports of torch and the kernels): no rank started
    # 1024 x 8192 x 8192 against 96 x 40 x 40 (FLOPs); push's 0.32 s per iteration at tiny, scaled
    assert re.match(r"taxmodel: error: ag_gemm preset m1024 is 447,392x the work per iteration of the CPU preset "
                    r"'tiny': about 40 hours per iteration in Triton's interpreter, 13 days for the 8 iterations each "
                    r"variant runs \(scaled from benchmarks/results/cpu_interpreter.md", res.output), res.output
    assert "sized for GPUs" in res.output and "--preset tiny" in res.output and "--allow-gpu-sizes" in res.output
    assert not list(tmp_path.iterdir())


def test_what_a_cpu_run_costs_and_which_it_refuses():
    from taxmodel.errors import InputError
    from taxmodel.runtime.profile import CPU_RUN_LIMIT_S, check_cpu_size, cpu_costs
    from taxmodel.runtime.spec import import_workload_modules
    from taxmodel.workload import get_workload

    fd, rs = get_workload("flash_decode"), get_workload("gemm_rs")
    (kv1k,) = cpu_costs(fd, "b1-kv1k", {}, ["bsp", "fused"], 2, runs=8)
    assert kv1k.ratio > 100 and kv1k.seconds > CPU_RUN_LIMIT_S and kv1k.refused  # interpreter time: 14 minutes
    (m4096,) = cpu_costs(rs, "tiny", {"M": 4096}, ["bsp", "fused"], 2, runs=8)
    assert 30 < m4096.ratio < 40 and m4096.seconds < CPU_RUN_LIMIT_S and not m4096.refused
    assert "34x the work per iteration of the CPU preset 'tiny': about 32 s per iteration" in m4096.sentence()
    (bsp_only,) = cpu_costs(rs, "tiny", {"M": 4096}, ["bsp"], 2, runs=8)  # torch ops: no interpreter time to scale
    assert bsp_only.seconds is None and not bsp_only.refused
    (tiny,) = cpu_costs(rs, "tiny", {}, ["bsp", "fused"], 2, runs=8)
    assert tiny.ratio == 1.0 and not tiny.refused
    import_workload_modules([TOY])  # a user's workload: no measured time, refused beyond 100x its CPU preset's work
    toy = get_workload("toy")
    assert not cpu_costs(toy, "tiny", {"N": 800}, ["bsp"], 2, runs=4)[0].refused
    (big,) = cpu_costs(toy, "tiny", {"N": 8000}, ["bsp"], 2, runs=4)
    with pytest.raises(InputError, match=r"toy preset tiny with N8000 is 1,000x the work .* it is sized for GPUs"):
        check_cpu_size([big])


@pytest.mark.slow
def test_a_cpu_run_well_beyond_its_preset_says_its_cost_first_and_allow_gpu_sizes_runs_one_refused(tmp_path):
    said: list[str] = []
    out = profile(_request(tmp_path, N=800), quiet=True, say=said.append)
    assert said == ["toy preset tiny with N800 is 100x the work per iteration of the CPU preset 'tiny'; the CPU preset "
                    "is --preset tiny"]
    assert len(out.bundles) == 1
    with pytest.raises(Exception, match="sized for GPUs"):
        profile(_request(tmp_path / "big", N=8000), quiet=True)
    req = _request(tmp_path / "big", N=8000)
    req.allow_gpu_sizes = True
    assert len(profile(req, quiet=True).bundles) == 1
