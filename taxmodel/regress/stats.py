"""Confidence intervals for the change of a metric between two captures, and verdicts.

Method: a seeded percentile bootstrap of the median (or mean) per iteration, resampling the
baseline and the candidate independently, with every metric of a side drawn from the same
resampled iterations so that a tax and the latency it is divided by stay paired.

The unit of resampling is the *repetition* (one independent timed loop, ``taxmodel profile
--repeat N``) when a side has several: iterations inside one loop share its warm state, clocks
and neighbours, so they are correlated and resampling them as if independent would make the
interval too narrow. The bootstrap is two-stage (Davison & Hinkley 1997, section 3.8):
repetitions are drawn with replacement, then iterations with replacement inside each drawn
repetition. Resampling at both stages slightly overstates the variance, which errs towards
"unchanged", the safe side for a CI gate; with a single repetition it reduces to the plain
bootstrap over iterations. The median is the default statistic because real traces have
one-off slow iterations (the first all-gather of a run on the H200s took 380 us, later ones
183-199 us) that a mean would carry into the verdict.

The relative change of resample b is ``(stat_c[b] - stat_b[b]) / denom_b[b]`` where the
denominator is the baseline's own statistic (``relative_to="self"``) or the baseline's latency
on the same resample (``"window"``). Its (1-confidence)/2 and (1+confidence)/2 quantiles are
the interval. A metric regresses when the whole interval lies above its relative threshold AND
the change of the point estimates exceeds its absolute threshold: the interval guards against
noise inside the captures, the thresholds against drift between captures that no interval
computed from one capture can see (other GPUs of the same model, clocks, driver state).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from taxmodel.errors import InputError
from taxmodel.regress.config import StatisticsSettings, Threshold

IMPROVED, UNCHANGED, REGRESSED = "improved", "unchanged", "regressed"
VERDICTS = (IMPROVED, UNCHANGED, REGRESSED)

_MAX_ELEMENTS = 4_000_000  # resampled values held at once (32 MB of float64)
_REL_CLIP = 1e6  # a relative change over a zero baseline is reported as +-1e6


@dataclass(frozen=True)
class Side:
    """One side's samples of one row: ``values`` [n, metrics] (ns), ``groups`` [n] repetition codes."""

    values: np.ndarray
    groups: np.ndarray

    @property
    def n_samples(self) -> int:
        return int(self.values.shape[0])

    @property
    def n_repetitions(self) -> int:
        return int(np.unique(self.groups).size)

    @property
    def unit(self) -> str:
        return "repetition" if self.n_repetitions > 1 else "iteration"


class TooFewSamples(InputError):
    """A side has fewer samples than ``min_samples``: nothing can be judged from it (exit 2)."""


def shortfall(n_samples: int, settings: StatisticsSettings) -> str | None:
    """The one rule for "too few samples", shared by ``compare`` and ``baseline update``: a side
    with fewer than ``min_samples`` iterations can neither be judged nor gate anything (a
    1-iteration baseline would pass every candidate; a bootstrap of 1-2 values has no spread,
    so its interval says nothing about noise). None when there are enough."""
    if n_samples >= settings.min_samples:
        return None
    return f"{n_samples} iteration(s), at least {settings.min_samples} needed"


def point_statistic(values: np.ndarray, statistic: str) -> np.ndarray:
    """The statistic of every column of ``values`` over all samples."""
    return np.median(values, axis=0) if statistic == "median" else np.mean(values, axis=0)


def bootstrap_statistic(side: Side, resamples: int, rng: np.random.Generator, statistic: str = "median") -> np.ndarray:
    """[resamples, metrics]: the statistic of each two-stage bootstrap resample of ``side``."""
    values = np.asarray(side.values, dtype=np.float64)
    n, m = values.shape
    codes, group_of = np.unique(side.groups, return_inverse=True)
    order = np.argsort(group_of, kind="stable")
    counts = np.bincount(group_of, minlength=codes.size)
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]])
    sorted_values = values[order]
    g, longest = codes.size, int(counts.max())
    per_resample = g * longest * m
    chunk = max(1, _MAX_ELEMENTS // max(per_resample, 1))
    out = np.empty((resamples, m))
    uneven = bool((counts != longest).any())
    for start in range(0, resamples, chunk):
        b = min(chunk, resamples - start)
        if g > 1:
            drawn = rng.integers(0, g, size=(b, g))  # repetitions, with replacement
        else:
            drawn = np.zeros((b, 1), dtype=np.int64)
        size = counts[drawn][..., None]  # [b, g, 1]
        within = np.floor(rng.random((b, g, longest)) * size).astype(np.int64)
        idx = offsets[drawn][..., None] + within  # [b, g, longest]
        sample = sorted_values[idx.reshape(b, -1)]  # [b, g*longest, m]
        if uneven:  # a shorter repetition fills only its first `size` slots
            valid = (np.arange(longest)[None, None, :] < size).reshape(b, -1)
            sample = np.where(valid[..., None], sample, np.nan)
            reduce = np.nanmedian if statistic == "median" else np.nanmean
        else:
            reduce = np.median if statistic == "median" else np.mean
        out[start:start + b] = reduce(sample, axis=1)
    return out


def relative(change: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """change / denominator, with a zero denominator giving +-_REL_CLIP (or 0 for no change)."""
    change = np.asarray(change, dtype=np.float64)
    denominator = np.asarray(denominator, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = change / denominator
    rel = np.where(denominator == 0, np.sign(change) * _REL_CLIP, rel)
    return np.clip(rel, -_REL_CLIP, _REL_CLIP)


@dataclass(frozen=True)
class MetricChange:
    """Point estimates (ns), the relative change and its interval, and the verdict."""

    baseline_ns: float
    candidate_ns: float
    change_ns: float
    rel_change: float
    ci_low: float
    ci_high: float
    verdict: str
    note: str = ""


def compare_sides(base: Side, cand: Side, thresholds: list[Threshold], window_column: int,
                  settings: StatisticsSettings, rng: np.random.Generator) -> list[MetricChange]:
    """Compare every metric (column) of two sides; ``window_column`` holds the latency. Both
    sides hold at least ``min_samples`` (``shortfall``): ``compare.check_samples`` refuses the
    rows that do not, all in one message, before any is compared."""
    stat = settings.statistic
    pb, pc = point_statistic(base.values, stat), point_statistic(cand.values, stat)
    bb = bootstrap_statistic(base, settings.resamples, rng, stat)
    bc = bootstrap_statistic(cand, settings.resamples, rng, stat)
    alpha = (1.0 - settings.confidence) / 2.0
    results = []
    for j, th in enumerate(thresholds):
        denom_point = pb[j] if th.relative_to == "self" else pb[window_column]
        denom_boot = bb[:, j] if th.relative_to == "self" else bb[:, window_column]
        change = pc[j] - pb[j]
        rel_point = float(relative(change, denom_point))
        rel_boot = relative(bc[:, j] - bb[:, j], denom_boot)
        low, high = (float(q) for q in np.quantile(rel_boot, [alpha, 1.0 - alpha]))
        note = ""
        if not th.gate:
            verdict = UNCHANGED
            note = "not gated"
        else:
            verdict = verdict_for(low, high, change, th)
        results.append(MetricChange(float(pb[j]), float(pc[j]), float(change), rel_point, low, high, verdict, note))
    return results


def verdict_for(ci_low: float, ci_high: float, change_ns: float, th: Threshold) -> str:
    """Regressed (improved) only when the whole interval is beyond the relative threshold and
    the change is beyond the absolute one; anything else is unchanged."""
    if ci_low > th.relative and change_ns > th.absolute_ns:
        return REGRESSED
    if ci_high < -th.relative and change_ns < -th.absolute_ns:
        return IMPROVED
    return UNCHANGED


def row_verdict(verdicts: list[str]) -> str:
    """A row regressed if any metric did; improved if any did and none regressed."""
    if REGRESSED in verdicts:
        return REGRESSED
    if IMPROVED in verdicts:
        return IMPROVED
    return UNCHANGED
