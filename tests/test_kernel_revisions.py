"""Which kernel revision a bundle ran (kernels/revisions.py), and the model predicting it."""
from __future__ import annotations

import pytest

from taxmodel.kernels.revisions import KERNEL_REVISION, REVISIONS, revision_at
from taxmodel.model.analytic import model_params, predict
from taxmodel.hardware.specs import find_preset
from taxmodel.trace.capture_meta import CaptureSettings, kernel_revision


def test_a_capture_time_maps_to_the_revision_current_then():
    since = REVISIONS[1][1]
    assert revision_at("2026-11-22T06:37:08+00:00") == 1
    assert revision_at(since) == 2
    assert revision_at("2026-11-27T23:59:53+00:00") == 2
    assert revision_at("2026-11-27T23:10:02Z") == 1
    assert revision_at("2026-11-26") == 1 and revision_at("2026-11-28") == 2
    for missing in (None, "", "yesterday", 17):
        assert revision_at(missing) == KERNEL_REVISION


def test_a_recorded_revision_wins_over_the_capture_time():
    old = {"created": "2026-11-22T06:37:08+00:00", "capture": {"graph": True}}
    assert kernel_revision(old) == 1
    assert kernel_revision({**old, "capture": {"kernel_revision": 2}}) == 2
    assert kernel_revision({**old, "capture": {"kernel_revision": "junk"}}) == 1  # unreadable: the date decides
    assert CaptureSettings.from_meta(old).kernel_revision == 1
    assert CaptureSettings.from_meta({}).kernel_revision == KERNEL_REVISION


@pytest.mark.parametrize("m", [1024, 8192])
def test_revision_one_gemm_rs_programs_wait_for_their_pushes_and_revision_two_does_not(m):
    hw = find_preset("H200 SXM")
    shape = {"M": m, "N": 8192, "K": 8192}
    got = {}
    for rev in (1, 2):
        params, _ = model_params(hw, CaptureSettings(graph_launch=True, kernel_revision=rev), {})
        got[rev] = predict("gemm_rs", "fused", shape, 4, hw, params).details
    old, new = got[1], got[2]
    assert old["triton_gemm"] == pytest.approx(new["triton_gemm"])
    assert old["gemm_kernel"] == pytest.approx(max(old["triton_gemm"] + old["push_per_program"],
                                                   old["push_done"]))
    assert new["gemm_kernel"] < old["gemm_kernel"]
