"""One bundle, one prediction: the CLI, ``taxmodel.predict``, ``Profile.predict`` and ``validate``
build the model's parameters through one function (``analytic.model_params``), so they agree."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import taxmodel
from taxmodel.cli import cli
from taxmodel.model import analytic
from taxmodel.model.analytic.fitted import fitted_for
from taxmodel.model.cases import Case, load_case, predict_case
from taxmodel.trace.capture_meta import CaptureSettings

ROOT = Path(__file__).resolve().parents[2]
#: A gated CUDA-graph capture of the fine-grained AG+GEMM (transport 'sm'): every capture setting
#: the model reads differs from its default here, which is what the doors used to disagree on.
BUNDLE = ROOT / "profiles" / "h200x4-graph-gate" / "ag_gemm" / "pull-M1024xN8192xK8192xtp0"


def _cli_prediction(case: Case) -> dict:
    st = case.settings
    args = ["predict", case.workload, "--variant", case.variant, "-n", str(case.world_size),
            "--shape", ",".join(f"{k}={v}" for k, v in case.shape.items()), "--json", "--align", st.align]
    if st.graph_launch:
        args.append("--graph")
    if st.transport:
        args += ["--transport", st.transport]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    return json.loads(res.output)[0]


def test_every_door_gives_the_same_prediction_for_one_bundle():
    case = load_case(BUNDLE)
    assert isinstance(case, Case), case
    st = case.settings
    assert st.graph_launch and st.transport == "sm" and st.align == "device" and not st.instrumented
    shipped, _ = fitted_for(case.hardware.name)
    assert shipped, "the shipped fitted.json has parameters for this bundle's hardware"

    by_validate = predict_case(case, shipped).taxes_ns()
    by_profile = taxmodel.load(BUNDLE).predict().taxes_ns()
    by_api = taxmodel.predict(case.workload, case.variant, case.shape, case.world_size, case.hardware.name,
                              graph_launch=st.graph_launch, transport=st.transport, align=st.align).taxes_ns()
    by_cli = _cli_prediction(case)
    assert by_profile == pytest.approx(by_validate, rel=1e-12)
    assert by_api == pytest.approx(by_validate, rel=1e-12)
    assert by_cli["predicted_window_ns"] == pytest.approx(by_validate["window"], rel=1e-9)


def test_the_api_and_the_cli_give_the_same_prediction_with_their_defaults():
    """taxmodel.predict promises taxmodel predict's parameters; its start alignment defaulted to
    'host' while the command's is 'back-to-back' (as `taxmodel profile` captures on GPUs), so the
    same call gave other numbers from Python than from the shell."""
    shape = {"M": 4096, "N": 8192, "K": 8192, "tp": 0}
    for variant in ("bsp", "pull"):
        res = CliRunner().invoke(cli, ["predict", "ag_gemm", "--variant", variant, "--shape",
                                       ",".join(f"{k}={v}" for k, v in shape.items()), "--json"])
        assert res.exit_code == 0, res.output
        by_cli = json.loads(res.output)[0]["predicted_window_ns"]
        by_api = taxmodel.predict("ag_gemm", variant, shape).window_ns
        assert by_api == pytest.approx(by_cli, rel=1e-9), variant


def test_fitted_parameters_change_the_prediction_and_can_be_left_out():
    hw, _ = analytic.resolve_model_hardware("h200-calibrated")
    settings = CaptureSettings(graph_launch=True, transport="sm", align="device")
    with_fits, note = analytic.model_params(hw, settings)
    without, none_note = analytic.model_params(hw, settings, {})
    fitted, _ = fitted_for(hw.name)
    assert note and none_note is None
    assert all(getattr(with_fits, k) == pytest.approx(v) for k, v in fitted.items())
    assert any(getattr(without, k) != pytest.approx(v) for k, v in fitted.items())
    assert with_fits.sources[next(iter(fitted))].startswith("fitted")


def test_settings_read_from_meta_and_explicit_overrides_win():
    st = CaptureSettings.from_meta({"capture": {"graph": True, "align": "device", "gate_hold_us": 5.0},
                                    "workload_config": {"transport": "ce"}}, instrumented=True)
    assert (st.instrumented, st.graph_launch, st.transport, st.align) == (True, True, "ce", "device")
    assert st.gate_hold_s == pytest.approx(5e-6)
    assert CaptureSettings.from_meta({}) == CaptureSettings(graph_launch=False)
    hw, _ = analytic.resolve_model_hardware("h200-calibrated")
    p, _ = analytic.model_params(hw, st, {}, triton_gemm_efficiency=0.5)
    assert p.triton_gemm_efficiency == 0.5 and p.sources["triton_gemm_efficiency"] == "given"
    assert p.graph_launch and p.ag_transport == "ce" and p.start_alignment == "device"
    assert p.gate_hold_s == pytest.approx(5e-6)


@pytest.mark.parametrize("workload,shape", [
    ("ag_gemm", {"M": 0, "N": 8192, "K": 8192}),
    ("gemm_rs", {"M": 1024, "N": 0, "K": 8192}),
    ("flash_decode", {"batch": 0, "q_heads": 32, "kv_heads": 4, "head_dim": 128, "kv_len": 1024}),
    ("flash_decode", {"batch": 1, "q_heads": 32, "kv_heads": 4, "head_dim": 128, "kv_len": 0}),
])
def test_a_zero_dimension_is_bad_input_not_a_crash(workload, shape):
    from taxmodel.errors import InputError
    from taxmodel.model.analytic import predict

    with pytest.raises(InputError, match="positive|at least 1"):
        predict(workload, "bsp", shape, 2, "h200")


def test_copy_engine_pull_plans_a_slab_in_several_copies_from_kernel_revision_3():
    """Kernel revision 3 moves a peer's slab in max(W, 4) copies (one flag each), earlier revisions
    one copy per 128-row block: the model's host calls, first arrival and drain follow the bundle's
    revision. M=16384 on 2 ranks: 64 blocks per slab, 4 copies since revision 3."""
    from dataclasses import replace

    from taxmodel.model import analytic

    shape = {"M": 16384, "N": 8192, "K": 8192, "tp": 1}
    hw, _ = analytic.resolve_model_hardware("h200-calibrated")
    base = replace(analytic.ModelParams.from_hardware(hw), ag_transport="ce")
    new = analytic.predict("ag_gemm", "pull", shape, 2, hw, params=replace(base, kernel_revision=3))
    old = analytic.predict("ag_gemm", "pull", shape, 2, hw, params=replace(base, kernel_revision=2))
    assert any("in 4 copies, 8 calls" in a for a in new.assumptions)
    assert any("in 64 copies, 128 calls" in a for a in old.assumptions)
    # the same transfer either way; fewer pieces: a later first arrival, a longer drain after the last
    assert new.details["transfer"] == pytest.approx(old.details["transfer"])
    assert new.details["pipeline"] >= old.details["pipeline"]


def test_pull_goes_peer_by_peer_where_the_gemm_is_narrow_from_kernel_revision_4():
    """Kernel revision 4 pulls peer by peer on one stream where the GEMM has at most 4096 columns
    per rank (the 4-rank tensor-parallel M=16384: 2048), one wave's blocks a copy (132 SMs / 8
    N-tiles = 16 of the slab's 32 blocks): the model moves the 6 copies one after another at the P2P
    copy rate plus the fixed cost of each, on one stream, and the GEMM ends at least one tile time
    after the last one lands. Revision 3 and a GEMM of N=8192 per rank keep one stream per peer."""
    from dataclasses import replace

    from taxmodel.model import analytic
    from taxmodel.model.analytic.costs import persistent_drain

    shape = {"M": 16384, "N": 8192, "K": 8192, "tp": 1}
    hw, _ = analytic.resolve_model_hardware("h200-calibrated")
    base = replace(analytic.ModelParams.from_hardware(hw), ag_transport="ce", graph_launch=True)
    new = analytic.predict("ag_gemm", "pull", shape, 4, hw, params=replace(base, kernel_revision=4))
    old = analytic.predict("ag_gemm", "pull", shape, 4, hw, params=replace(base, kernel_revision=3))
    wide = analytic.predict("ag_gemm", "pull", {**shape, "tp": 0}, 4, hw, params=replace(base, kernel_revision=4))
    p2p = hw.extra["p2p_copy_bytes_per_s"]
    shard = 4096 * 8192 * 2
    assert any("peer by peer" in a and "6 copies" in a and "9 us fixed each (a 4x H200 trace; not calibrated)" in a
               for a in new.assumptions)
    assert new.details["transfer"] == pytest.approx(3 * shard / p2p + 6 * base.ce_copy_fixed_s)
    assert not any("peer by peer" in a for a in old.assumptions + wide.assumptions)
    copies = [k for k in new.plans[0] if k.name.startswith("Memcpy")]
    assert len(copies) == 1 and len([k for k in old.plans[0] if k.name.startswith("Memcpy")]) == 3
    # the last copy's tiles start when it lands: one tile time after the transfer at least
    tile = persistent_drain(new.details["triton_gemm"], base.kernel_overhead_s, 4 * 32 * 8, 132)
    assert new.details["pipeline"] >= new.details["transfer"] + tile


def test_the_fine_grained_gemm_of_a_small_own_slab_has_shorter_tiles_from_kernel_revision_5():
    """Revision 5 gives pull/push 128x128 tiles at M=1024 on 4 ranks (``gemm_tiles.first_wave_tiles``),
    and pull goes peer by peer there: the model's tiles and copies follow."""
    from dataclasses import replace

    from taxmodel.model import analytic
    from taxmodel.model.analytic.ag_gemm import pull_tiles_and_order

    assert pull_tiles_and_order(256, 8192, 4, 132, 5) == (128, True)  # M=1024 on 4 ranks
    assert pull_tiles_and_order(256, 8192, 4, 132, 4) == (256, False)
    assert pull_tiles_and_order(512, 8192, 2, 132, 5) == (256, False)
    assert pull_tiles_and_order(4096, 2048, 4, 132, 4) == (256, True)  # the 4-rank tensor-parallel M=16384
    assert pull_tiles_and_order(4096, 2048, 4, 132, 3) == (256, False)
    shape = {"M": 1024, "N": 8192, "K": 8192, "tp": 0}
    hw, _ = analytic.resolve_model_hardware("h200-calibrated")
    base = replace(analytic.ModelParams.from_hardware(hw), ag_transport="ce", graph_launch=True)
    new = analytic.predict("ag_gemm", "pull", shape, 4, hw, params=replace(base, kernel_revision=5))
    old = analytic.predict("ag_gemm", "pull", shape, 4, hw, params=replace(base, kernel_revision=4))
    # and pulls peer by peer: one copy of the 2-block slab a peer (a wave takes 132 // 64 = 2 blocks)
    shard = 256 * 8192 * 2
    assert any("peer by peer" in a and "3 copies" in a for a in new.assumptions)
    assert not any("peer by peer" in a for a in old.assumptions)
    assert new.details["transfer"] == pytest.approx(3 * shard / hw.extra["p2p_copy_bytes_per_s"] + 3 * base.ce_copy_fixed_s)
