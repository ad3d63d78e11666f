"""taxmodel scaling: per world size, the bsp variant's taxes and the fine-grained speedup."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from taxmodel.cli import cli
from taxmodel.model import scaling
from taxmodel.model.analytic.fitted import fitted_for
from taxmodel.model.case_store import find_cases
from taxmodel.model.cases import predict_case

from model_bundles import AG, model_bundle


@pytest.fixture(scope="module")
def two_world_sizes(tmp_path_factory):
    root = tmp_path_factory.mktemp("scaling")
    for world in (2, 4):
        for variant in ("bsp", "push"):
            model_bundle(root / f"w{world}" / variant, variant, AG, world)
    model_bundle(root / "alone" / "bsp", "bsp", {**AG, "M": 1024}, 2)  # one world size only: no row
    return root


def test_one_row_per_world_size_with_the_measured_and_predicted_speedup(two_world_sizes):
    rows = scaling.scaling_rows([str(two_world_sizes)])
    assert [r["world"] for r in rows] == [2, 4]
    cases = {(c.world_size, c.variant): c for c in find_cases(two_world_sizes)[0] if c.shape["M"] == AG["M"]}
    fitted, _ = fitted_for(cases[2, "bsp"].hardware.name)
    for r in rows:
        bsp, push = cases[r["world"], "bsp"], cases[r["world"], "push"]
        assert r["fine"] == "push" and r["mode"] == "eager"
        assert r["speedup"] == pytest.approx(bsp.measured["latency"] / push.measured["latency"])
        assert r["bsp_us"] == pytest.approx(bsp.measured["latency"] / 1e3)
        assert r["bsp_tax"] == pytest.approx(100 * bsp.measured["bsp_tax"] / bsp.measured["latency"])
        pred = predict_case(bsp, fitted).window_ns / predict_case(push, fitted).window_ns
        assert r["predicted_speedup"] == pytest.approx(pred)


def test_cli_writes_the_table_and_fails_without_a_group(two_world_sizes, tmp_path):
    out = tmp_path / "scaling.md"
    r = CliRunner().invoke(cli, ["scaling", str(two_world_sizes), "--markdown", str(out)])
    assert r.exit_code == 0, r.output
    assert out.read_text().count("| ag_gemm |") == 2 and "predicted speedup" in out.read_text()
    r = CliRunner().invoke(cli, ["scaling", str(two_world_sizes / "alone")])
    assert r.exit_code == 1 and "no (workload, shape, launch mode)" in r.output
