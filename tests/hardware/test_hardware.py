from __future__ import annotations

import pytest

from taxmodel.errors import InputError
from taxmodel.hardware.specs import find_preset, load_hardware, presets, resolve_hardware, save_hardware


def test_presets_are_datasheet():
    ps = presets()
    gpus = {"H100 SXM", "H200 SXM", "MI300X", "B200"}
    assert gpus <= set(ps)
    for spec in (ps[n] for n in gpus):
        assert spec.source == "datasheet"
        assert spec.flops_per_s("bf16") > spec.flops_per_s("fp32") > 0
    assert ps["H200 SXM"].hbm_bytes_per_s == 4.8e12 and ps["H100 SXM"].hbm_bytes_per_s == 3.35e12
    assert ps["H200 SXM"].flops_per_s("bfloat16") == 989.4e12


@pytest.mark.parametrize("name,want", [("NVIDIA H200", "H200 SXM (calibrated)"), ("H200 SXM", "H200 SXM"), ("NVIDIA H100 80GB HBM3", "H100 SXM"),
                                       ("AMD Instinct MI300X", "MI300X"), ("b200", "B200")])
def test_resolve_from_meta(name, want):
    assert resolve_hardware({"hardware": {"name": name}}).name == want


def test_explicit_wins_and_errors():
    assert resolve_hardware({"hardware": {"name": "NVIDIA H200"}}, "mi300x").name == "MI300X"
    with pytest.raises(InputError, match="--hardware"):
        resolve_hardware({"hardware": {"name": "Unknown 1"}})
    with pytest.raises(InputError, match="does not say"):
        resolve_hardware({})
    with pytest.raises(InputError, match="dtype 'int3'"):
        find_preset("H100").flops_per_s("int3")


def test_json_roundtrip(tmp_path):
    spec = find_preset("B200")
    p = save_hardware(spec, tmp_path / "b.json")
    assert load_hardware(p) == spec
    assert resolve_hardware({}, str(p)) == spec
    (tmp_path / "bad.json").write_text('{"name": "x"}')
    with pytest.raises(InputError, match="field 'vendor' is missing"):
        load_hardware(tmp_path / "bad.json")
