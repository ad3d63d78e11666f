"""A rank whose output differs from the workload's reference ends the run with a RunError naming it."""
from __future__ import annotations

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


