"""The range a predicted saving carries: the model's own latency errors on out-of-sample
CUDA-graph captures (``validate.latency_error_band``), turned into the savings the measured
latencies could show (``advise_predict.saving_range``)."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from taxmodel.model import advise_predict
from taxmodel.model.analytic import fitted
from taxmodel.model.validate import latency_error_band
from taxmodel.trace.capture_meta import CaptureSettings


def _row(variant, err_pct, launches="graph+gate", sample="out", quantity="latency"):
    return {"workload": "ag_gemm", "variant": variant, "quantity": quantity, "validated": True, "sample": sample,
            "launches": launches, "error_pct": err_pct}


def test_the_band_takes_out_of_sample_graph_latencies_only():
    rows = [_row("bsp", e) for e in (-4.0, -2.0, 0.0, 2.0, 4.0)]
    rows += [_row("bsp", 90.0, launches="eager"), _row("bsp", -90.0, sample="in"), _row("bsp", 50.0, quantity="skew_wait")]
    rows += [_row("pull", 1.0), _row("pull", 2.0)]  # two cases: too few for a band
    band = latency_error_band(pd.DataFrame(rows))
    assert set(band) == {"ag_gemm/bsp"}
    assert band["ag_gemm/bsp"]["n"] == 5
    assert band["ag_gemm/bsp"]["p10"] == pytest.approx(-0.032) and band["ag_gemm/bsp"]["p90"] == pytest.approx(0.032)


def test_the_saving_range_by_hand(tmp_path, monkeypatch):
    """bsp predicted 100 us with errors in [-5%, +5%], the fused 90 us with [-10%, +10%]: measured
    bsp 100/1.05..100/0.95, fused 90/1.1..90/0.9, so the saving lies in [-4.76, 23.44] us."""
    f = tmp_path / "fitted.json"
    f.write_text(json.dumps({"fitted": {}, "hardware": ["GPU"], "how": "test",
                             "latency_error": {"ag_gemm/bsp": {"n": 9, "p10": -0.05, "p90": 0.05},
                                               "ag_gemm/pull": {"n": 9, "p10": -0.10, "p90": 0.10}}}))
    monkeypatch.setattr(fitted, "FITTED_FILE", f)
    lo, hi, lender = advise_predict.saving_range("ag_gemm", "pull", 100.0, 90.0, "GPU", CaptureSettings(graph_launch=True))
    assert lender is None
    assert lo == pytest.approx(100 / 1.05 - 90 / 0.9) and hi == pytest.approx(100 / 0.95 - 90 / 1.1)
    pred = advise_predict.FusionPrediction("ag_gemm/pull", 90.0, 100.0, 10.0, saving_lo_us=lo, saving_hi_us=hi)
    assert pred.sign_uncertain
    # an eager capture, another GPU, a variant without a band: no range
    for args in (("pull", "GPU", CaptureSettings(graph_launch=False)), ("pull", "Other", CaptureSettings(graph_launch=True)),
                 ("push", "GPU", CaptureSettings(graph_launch=True))):
        v, hw, st = args
        lo, hi, _ = advise_predict.saving_range("ag_gemm", v, 100.0, 90.0, hw, st)
        assert lo != lo and hi != hi  # NaN


def test_a_gpu_without_a_band_borrows_the_widest_covering_one_and_says_whose(tmp_path, monkeypatch):
    """A GPU the model was never validated on takes the band of the GPU whose bands cover the most
    workload/variants; the prediction names it. Its own band, once recorded, wins."""
    band = {"ag_gemm/bsp": {"n": 9, "p10": -0.05, "p90": 0.05}, "ag_gemm/pull": {"n": 9, "p10": -0.10, "p90": 0.10}}
    doc = {"by_hardware": {"Big": {"fitted": {}, "latency_error": band},
                           "Small": {"fitted": {}, "latency_error": {"ag_gemm/bsp": band["ag_gemm/bsp"]}}}}
    f = tmp_path / "fitted.json"
    f.write_text(json.dumps(doc))
    monkeypatch.setattr(fitted, "FITTED_FILE", f)
    graph = CaptureSettings(graph_launch=True)
    lo, hi, lender = advise_predict.saving_range("ag_gemm", "pull", 100.0, 90.0, "New GPU", graph)
    assert lender == "Big" and lo == pytest.approx(100 / 1.05 - 90 / 0.9) and hi == pytest.approx(100 / 0.95 - 90 / 1.1)
    assert advise_predict.saving_range("ag_gemm", "pull", 100.0, 90.0, "Big", graph)[2] is None
    doc["by_hardware"]["New GPU"] = {"fitted": {}, "latency_error": {k: {"n": 9, "p10": 0.0, "p90": 0.0} for k in band}}
    f.write_text(json.dumps(doc))
    lo, hi, lender = advise_predict.saving_range("ag_gemm", "pull", 100.0, 90.0, "New GPU", graph)
    assert lender is None and lo == pytest.approx(10.0) and hi == pytest.approx(10.0)
