"""The bootstrap and the verdict rule of taxmodel.regress.stats, on data whose answer is known."""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taxmodel.regress.compare import compare_rows
from taxmodel.regress.config import StatisticsSettings, Threshold, default_config
from taxmodel.regress.samples import METRICS, RowKey, RowSamples
from taxmodel.regress.stats import (TooFewSamples, shortfall, IMPROVED, REGRESSED, UNCHANGED, Side, bootstrap_statistic, compare_sides,
                                    relative, row_verdict, verdict_for)

SELF = Threshold(relative=0.03, absolute_us=2.0, relative_to="self")


def _side(values, groups=None) -> Side:
    values = np.asarray(values, dtype=float).reshape(len(values), -1)
    groups = np.zeros(len(values), dtype=int) if groups is None else np.asarray(groups)
    return Side(values, groups)


def test_constant_samples_give_a_zero_width_interval():
    rng = np.random.default_rng(0)
    out = bootstrap_statistic(_side([5.0] * 7), 500, rng)
    assert out.shape == (500, 1)
    assert (out == 5.0).all()


def test_resampling_repetitions_draws_whole_repetitions():
    # every repetition is constant inside, so a resample is 3 drawn repetitions of 4 equal values;
    # its median (6th and 7th of 12 sorted values) is always the middle drawn repetition's value
    values = np.repeat([10.0, 20.0, 40.0], 4)
    groups = np.repeat([0, 1, 2], 4)
    out = bootstrap_statistic(_side(values, groups), 3000, np.random.default_rng(1))[:, 0]
    assert set(np.unique(out)) == {10.0, 20.0, 40.0}
    # 40 is the median when at least 2 of the 3 draws are 40: 3*(1/3)^2*(2/3) + (1/3)^3 = 7/27
    assert np.mean(out == 40.0) == pytest.approx(7 / 27, abs=0.03)


def test_uneven_repetitions_only_draw_their_own_iterations():
    # repetition 0 has 2 iterations at 1.0, repetition 1 has 5 at 3.0: resamples mix them but never
    # invent values, and the mean statistic stays between the two
    values = np.array([1.0, 1.0, 3.0, 3.0, 3.0, 3.0, 3.0])
    groups = np.array([0, 0, 1, 1, 1, 1, 1])
    out = bootstrap_statistic(_side(values, groups), 2000, np.random.default_rng(2), statistic="mean")[:, 0]
    assert out.min() >= 1.0 and out.max() <= 3.0
    # resamples made only of repetition 0 (p = 1/4) have mean exactly 1
    assert 0.2 < np.mean(out == 1.0) < 0.3


def test_chunked_and_unchunked_bootstraps_agree(monkeypatch):
    from taxmodel.regress import stats

    side = _side(np.random.default_rng(3).normal(100, 5, size=(40, 3)), np.repeat(np.arange(8), 5))
    whole = bootstrap_statistic(side, 300, np.random.default_rng(4))
    monkeypatch.setattr(stats, "_MAX_ELEMENTS", 1)  # one resample per chunk
    chunked = bootstrap_statistic(side, 300, np.random.default_rng(4))
    assert whole.shape == chunked.shape == (300, 3)
    # same generator, same draws in a different batching: same distribution, not same numbers
    assert abs(np.median(whole) - np.median(chunked)) < 1.0


def test_correlated_iterations_widen_the_interval_when_repetitions_are_resampled():
    """Iterations inside a repetition share an offset: resampling them as independent would
    understate the uncertainty; the two-stage bootstrap must not."""
    rng = np.random.default_rng(5)
    offsets = rng.normal(0, 5.0, size=6)
    values = (100 + offsets[:, None] + rng.normal(0, 0.5, size=(6, 20))).ravel()
    groups = np.repeat(np.arange(6), 20)
    by_rep = bootstrap_statistic(_side(values, groups), 2000, np.random.default_rng(6))[:, 0]
    naive = bootstrap_statistic(_side(values), 2000, np.random.default_rng(6))[:, 0]
    assert np.std(by_rep) > 3 * np.std(naive)


def test_relative_change_handles_zero_baselines():
    rel = relative(np.array([5.0, -5.0, 0.0, 3.0]), np.array([0.0, 0.0, 0.0, 2.0]))
    assert rel.tolist() == [1e6, -1e6, 0.0, 1.5]


@pytest.mark.parametrize("low, high, change_ns, expected", [
    (0.031, 0.05, 2001.0, REGRESSED),
    (0.029, 0.05, 5000.0, UNCHANGED),   # interval touches the threshold
    (0.04, 0.05, 2000.0, UNCHANGED),    # change not beyond the absolute threshold
    (-0.05, -0.031, -2001.0, IMPROVED),
    (-0.05, -0.031, -1999.0, UNCHANGED),
    (-0.01, 0.01, 0.0, UNCHANGED),
])
def test_verdict_needs_both_thresholds(low, high, change_ns, expected):
    assert verdict_for(low, high, change_ns, SELF) == expected


def test_row_verdict_is_regressed_if_any_metric_regressed():
    assert row_verdict([UNCHANGED, IMPROVED, REGRESSED]) == REGRESSED
    assert row_verdict([UNCHANGED, IMPROVED]) == IMPROVED
    assert row_verdict([UNCHANGED]) == UNCHANGED


def _two_metric_sides(seed: int, slowdown: float, reps: int = 8, iters: int = 10):
    """latency ~ 1000 +- 1.5% per iteration plus a per-repetition offset; a tax of 100 inside it."""
    rng = np.random.default_rng(seed)

    def one(factor):
        rep = rng.normal(0, 5.0, size=(reps, 1))
        lat = 1000 + rep + rng.normal(0, 15.0, size=(reps, iters))
        tax = 100 + rng.normal(0, 3.0, size=(reps, iters))
        lat = lat + factor * 1000
        tax = tax + factor * 1000
        return Side(np.stack([lat.ravel(), tax.ravel()], axis=1) * 1e3, np.repeat(np.arange(reps), iters))

    return one(0.0), one(slowdown)


def test_five_percent_slowdown_is_flagged_and_noise_is_not():
    stats = StatisticsSettings()
    ths = [SELF, Threshold(relative=0.02, absolute_us=2.0, relative_to="window")]
    for seed in range(5):
        base, same = _two_metric_sides(seed, 0.0)
        res = compare_sides(base, same, ths, 0, stats, np.random.default_rng(seed))
        assert [r.verdict for r in res] == [UNCHANGED, UNCHANGED]
        base, slow = _two_metric_sides(100 + seed, 0.05)
        res = compare_sides(base, slow, ths, 0, stats, np.random.default_rng(seed))
        assert [r.verdict for r in res] == [REGRESSED, REGRESSED]
        assert res[1].ci_low < 0.05 < res[1].ci_high  # the tax grew by 5% of the window


def test_false_alarm_rate_under_the_null_is_at_most_the_nominal_rate():
    """With a zero threshold the CI alone decides: equal distributions must regress in about
    2.5% of comparisons or fewer (the two-stage bootstrap is conservative)."""
    stats = StatisticsSettings(resamples=500)
    zero = [Threshold(relative=0.0, absolute_us=0.0, relative_to="self")] * 2
    flagged = 0
    for seed in range(120):
        base, same = _two_metric_sides(seed, 0.0, reps=6, iters=5)
        res = compare_sides(base, same, zero, 0, stats, np.random.default_rng(seed))
        flagged += res[0].verdict == REGRESSED
    assert flagged <= 6  # 5% of 120: generous for a 2.5% one-sided rate


def _rows(*latencies_ns: list[float]) -> dict[RowKey, RowSamples]:
    """One row per list of per-iteration latencies (every metric at that value)."""
    rows = {}
    for i, lat in enumerate(latencies_ns):
        key = RowKey("w", f"v{i}", "m=1")
        table = pd.DataFrame({"repetition": [0] * len(lat), "iteration": list(range(len(lat))),
                              **{m: lat for m in METRICS}}, dtype=float)
        rows[key] = RowSamples(key, table, metas=[{}])
    return rows


def test_too_few_samples_cannot_be_judged_never_pass():
    """Issue 38: 2 iterations per side of a 2x slower candidate used to be UNCHANGED (exit 0).
    Every row too thin is named in one message, before any row is compared."""
    cfg = dataclasses.replace(default_config(), statistics=StatisticsSettings(min_samples=3))
    base, cand = _rows([1e6] * 2, [], [1e6] * 5), _rows([2e6] * 2, [2e6] * 5, [2e6] * 5)
    with pytest.raises(TooFewSamples, match=r"w/v0/m=1: the baseline has 2 iteration.*; w/v0/m=1: the candidate has 2 "
                                            r"iteration.*; w/v1/m=1: the baseline has 0 iteration") as err:
        compare_rows(base, cand, cfg)
    assert "w/v2" not in str(err.value)
    assert compare_rows(_rows([1e6] * 3), _rows([1e6] * 3), cfg).exit_code == 0
    assert shortfall(3, cfg.statistics) is None and shortfall(2, cfg.statistics) == "2 iteration(s), at least 3 needed"


@settings(max_examples=25, deadline=None)
@given(scale=st.floats(min_value=1e-3, max_value=1e3), seed=st.integers(0, 2**16))
def test_relative_changes_do_not_depend_on_the_unit(scale, seed):
    base, cand = _two_metric_sides(seed, 0.02, reps=3, iters=4)
    stats = StatisticsSettings(resamples=200)
    ths = [SELF, Threshold(relative=0.02, absolute_us=0.0, relative_to="window")]
    a = compare_sides(base, cand, ths, 0, stats, np.random.default_rng(seed))
    scaled = [Side(s.values * scale, s.groups) for s in (base, cand)]
    b = compare_sides(*scaled, ths, 0, stats, np.random.default_rng(seed))
    for x, y in zip(a, b):
        assert x.rel_change == pytest.approx(y.rel_change, rel=1e-9, abs=1e-12)
        assert x.ci_low == pytest.approx(y.ci_low, rel=1e-9, abs=1e-12)
        assert x.ci_high == pytest.approx(y.ci_high, rel=1e-9, abs=1e-12)
