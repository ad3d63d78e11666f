"""One hardware resolver (``hardware.choose_hardware``) for the ledger and for predictions (issue
29 item 3): the same bundle gets the same spec from ``analyze`` and from ``predict`` unless the
calibrated preference (predictions only) finds a calibrated file for that GPU; an AMD device that
the trace calls "AMD Radeon Graphics" is found by its architecture on both sides."""
from __future__ import annotations

import json

import pytest

from taxmodel.api import Profile
from taxmodel.model.analytic import resolve_model_hardware
from taxmodel.hardware.specs import choose_hardware, find_preset, normalized_name, resolve_hardware
from taxmodel.testing.synthetic import synthetic_bundle

RADEON = {"name": "AMD Radeon Graphics", "vendor": "amd", "arch": "gfx942:sramecc+:xnack-"}
RADEON_CC = {"name": "AMD Radeon Graphics", "vendor": "amd", "compute_capability": "9.4"}  # Kineto's deviceProperties
METAS = [{"hardware": hw} for hw in (
    RADEON, RADEON_CC, {"name": "NVIDIA H200"}, {"name": "NVIDIA H100 80GB HBM3"}, {"name": "H200 SXM"},
    {"name": "AMD Instinct MI300X", "vendor": "amd"}, {"name": "NVIDIA B200"}, {"name": "NVIDIA A100-SXM4-80GB"},
    {"name": "AMD Instinct MI250X", "vendor": "amd", "arch": "gfx90a"})]


@pytest.mark.parametrize("hw", [RADEON, RADEON_CC])
def test_an_amd_radeon_graphics_bundle_resolves_for_the_ledger_and_predictions(hw):
    meta = {"hardware": hw}
    assert resolve_hardware(meta).name == "MI300X"
    spec, note = resolve_model_hardware(None, meta)
    assert spec.name == "MI300X" and "architecture gfx942" in note and "AMD Radeon Graphics" in note


def test_an_unknown_device_without_a_known_architecture_is_still_one_clear_error():
    from taxmodel.errors import InputError

    meta = {"hardware": {"name": "AMD Radeon Graphics", "vendor": "amd", "arch": "gfx1100"}}
    for resolve in (lambda: resolve_hardware(meta), lambda: resolve_model_hardware(None, meta)):
        with pytest.raises(InputError, match=r"'AMD Radeon Graphics' is no preset and cannot be estimated \(no preset shares its architecture gfx1100\).*--hardware"):
            resolve()


def _same_gpu(calibrated, preset) -> bool:
    names = {normalized_name(n) for n in (preset.name, *preset.aliases)}
    return bool(names & {normalized_name(n) for n in (calibrated.name, *calibrated.aliases)})


@pytest.mark.parametrize("meta", METAS, ids=lambda m: m["hardware"]["name"] + "/" + str(m["hardware"].get("arch", "")))
def test_analyze_and_predict_pick_the_same_spec_unless_a_calibrated_file_wins(meta):
    ledger = resolve_hardware(meta)
    predicted, note = resolve_model_hardware(None, meta)
    assert choose_hardware(None, meta, prefer_calibrated=False)[0] == ledger
    if predicted != ledger:  # only the preference may part them, for a calibration of the same GPU
        assert predicted.source == "calibrated" and "in preference" in note and _same_gpu(predicted, ledger)


def test_a_calibrated_file_parts_them_only_for_its_gpu(tmp_path):
    """A calibration of an H100 beside the profiles: predictions use it for an H100 bundle, the
    ledger keeps the datasheet preset; other GPUs are untouched."""
    h100 = find_preset("H100").to_dict()
    h100.update(name="H100 SXM (calibrated)", source="calibrated", hbm_bytes_per_s=3.0e12)
    (tmp_path / "h100-calibrated.json").write_text(json.dumps(h100))
    meta = {"hardware": {"name": "NVIDIA H100 80GB HBM3"}}
    predicted, note = choose_hardware(None, meta, prefer_calibrated=True, search=(tmp_path,))
    assert predicted.name == "H100 SXM (calibrated)" and "h100-calibrated.json" in note
    assert resolve_hardware(meta, search=(tmp_path,)).name == "H100 SXM"
    assert resolve_hardware(meta, prefer_calibrated=True, search=(tmp_path,)) == predicted  # the parameter, explicit
    b200 = {"hardware": {"name": "NVIDIA B200"}}
    assert choose_hardware(None, b200, prefer_calibrated=True, search=(tmp_path,))[0] == resolve_hardware(b200)


def test_the_doors_of_a_radeon_bundle_agree():
    """`analyze` (Profile.analysis, the ledger) and `predict` (Profile.predict) of one bundle that
    says "AMD Radeon Graphics", gfx942: both on the MI300X preset."""
    case = synthetic_bundle(variant="bsp", workload="ag_gemm", shape={"M": 1024, "N": 256, "K": 512}, hardware="mi300x")
    bundle = case.bundle
    bundle.meta["hardware"] = dict(RADEON)
    p = Profile(bundle)
    assert p.analysis.hardware.name == "MI300X"
    assert p.predict().hardware.name == "MI300X"
