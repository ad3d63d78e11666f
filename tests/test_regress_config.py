"""regress.toml: the shipped file equals the built-in defaults, lookup beside the baseline, validation."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from taxmodel.errors import InputError
from taxmodel.regress.config import (DEFAULTS, Threshold, config_from_dict, default_config, find_config, load_config,
                                     resolve_config)

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "profiles" / "regress.toml"


def test_shipped_config_equals_the_built_in_defaults():
    shipped = load_config(SHIPPED)
    assert shipped.to_dict()["statistics"] == default_config().to_dict()["statistics"]
    assert shipped.tables == default_config().tables


def test_thresholds_inherit_category_then_default():
    cfg = config_from_dict({"thresholds": {"launch_tax": {"relative": 0.05}, "kernel_gap": {"absolute_us": 7}}})
    assert cfg.threshold("kernel_gap") == Threshold(relative=0.05, absolute_us=7.0, relative_to="window", gate=True)
    assert cfg.threshold("host_starved") == Threshold(relative=0.05, absolute_us=2.0, relative_to="window", gate=True)
    assert cfg.threshold("skew_wait") == Threshold(relative=0.02, absolute_us=2.0, relative_to="window", gate=True)
    assert cfg.threshold("latency") == Threshold(relative=0.03, absolute_us=2.0, relative_to="self", gate=True)
    assert cfg.threshold("useful").gate is False
    assert DEFAULTS["thresholds"]["default"]["relative"] == 0.02  # the module constant is not mutated


def test_config_is_found_beside_the_baselines(tmp_path):
    (tmp_path / "pyproject.toml").write_text("")
    base = tmp_path / "profiles" / "h200" / "bundle_a"
    base.mkdir(parents=True)
    assert find_config(base) is None
    (tmp_path / "profiles" / "regress.toml").write_text("[thresholds.latency]\nrelative = 0.1\n")
    assert find_config(base) == (tmp_path / "profiles" / "regress.toml").resolve()
    assert resolve_config(base).threshold("latency").relative == 0.1
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"thresholds": {"latency": {"relative": 0.2}}}))
    assert resolve_config(base, other).threshold("latency").relative == 0.2


def test_lookup_stops_at_the_project_root(tmp_path):
    (tmp_path / "regress.toml").write_text("")
    project = tmp_path / "project"
    (project / "profiles").mkdir(parents=True)
    (project / ".git").mkdir()
    assert find_config(project / "profiles") is None


@pytest.mark.parametrize("text, needle", [
    ("[thresholds.kernel_gapp]\nrelative = 0.1\n", "kernel_gapp"),
    ("[thresholds.latency]\nrelativ = 0.1\n", "relativ"),
    ("[thresholds.latency]\nrelative = 'high'\n", "relative"),
    ("[thresholds.latency]\nrelative_to = 'iteration'\n", "relative_to"),
    ("[statistics]\nstatistic = 'mode'\n", "statistic"),
    ("[statistics]\nconfidence = 1.5\n", "confidence"),
    ("[stats]\n", "stats"),
    ("[thresholds.latency\n", "not valid TOML"),
])
def test_bad_configs_name_the_problem(tmp_path, text, needle):
    path = tmp_path / "regress.toml"
    path.write_text(text)
    with pytest.raises(InputError, match=needle):
        load_config(path)
