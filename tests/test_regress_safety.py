"""Baselines and comparison outputs never leak, hide or clobber files (issue 28): links inside a
candidate bundle are refused, a baseline name never starts with '.', absurd settings are one line."""
from __future__ import annotations

import os

import pytest

from taxmodel.cli import cli
from taxmodel.errors import InputError
from taxmodel.regress.baseline import bundle_dirname
from taxmodel.regress.config import config_from_dict
from taxmodel.regress.samples import RowKey

from test_regress_compare import write_side
from cli_runner import stderr_runner


def test_a_link_inside_a_candidate_bundle_is_refused_before_anything_is_written(tmp_path):
    secret = tmp_path / "runner-secret"
    secret.write_text("token=hunter2")
    cand = write_side(tmp_path / "runs", seed=2, repetitions=3, variants=("bsp",))
    bundle = next(cand.rglob("meta.json")).parent
    (bundle / "raw").mkdir(exist_ok=True)
    (bundle / "raw" / "trace.json").symlink_to(secret)
    baseline = tmp_path / "profiles" / "h200"
    res = stderr_runner().invoke(cli, ["baseline", "update", str(cand), "--baseline", str(baseline), "--yes"])
    assert res.exit_code == 2, (res.output, res.stderr)
    assert "raw/trace.json: is a symbolic link; a baseline bundle may hold only regular files" in res.stderr
    assert not baseline.exists()
    assert not any("hunter2" in p.read_text(errors="ignore") for p in tmp_path.rglob("*")
                   if p.is_file() and not p.is_symlink() and p != secret)


def test_a_baseline_name_never_starts_with_a_dot():
    assert bundle_dirname(RowKey("..hidden", "v", "")) == "_hidden__v"
    assert bundle_dirname(RowKey(".", "", "")) == "_"
    assert bundle_dirname(RowKey("ag_gemm", "bsp", "M=1,N=2")) == "ag_gemm__bsp__M=1_N=2"


@pytest.mark.parametrize("stats,want", [
    ({"resamples": 10 ** 12}, "resamples must be between 100 and 100,000"),
    ({"resamples": 5}, "resamples must be between"),
    ({"seed": -1}, "seed must not be negative"),
    ({"min_samples": 0}, "min_samples must be at least 1"),
])
def test_absurd_statistics_settings_are_refused(stats, want):
    with pytest.raises(InputError, match=want):
        config_from_dict({"statistics": stats}, source="regress.toml")


def test_a_non_finite_threshold_is_refused():
    with pytest.raises(InputError, match="relative must be a finite number"):
        config_from_dict({"thresholds": {"latency": {"relative": float("nan")}}}, source="regress.toml")


def test_absurd_resamples_in_regress_toml_is_one_line_from_compare(tmp_path):
    side = write_side(tmp_path / "b", seed=1, variants=("bsp",))
    (tmp_path / "regress.toml").write_text("[statistics]\nresamples = 1000000000000\n")
    res = stderr_runner().invoke(cli, ["compare", str(side), str(side), "--config", str(tmp_path / "regress.toml")])
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1
    assert "resamples must be between" in res.stderr


def test_comparison_outputs_refuse_a_fifo(tmp_path):
    side = write_side(tmp_path / "b", seed=1, variants=("bsp",))
    fifo = tmp_path / "summary.md"
    os.mkfifo(fifo)
    res = stderr_runner().invoke(cli, ["compare", str(side), str(side), "--markdown", str(fifo)])
    assert res.exit_code == 2 and "is a FIFO" in res.stderr and "Traceback" not in res.stderr
