"""Match rows of a baseline and a candidate, refuse comparisons that mean nothing, and judge the rest.

Exit codes (``CompareResult.exit_code``): 0 no regression, 1 at least one regressed metric,
2 cannot compare. Mismatched setups (devices, world sizes, schema versions, disjoint workloads)
raise ``MismatchError`` before any statistics run; rows present on one side only are reported
and give 2 unless ``allow_missing``.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from taxmodel.errors import InputError
from taxmodel.regress.config import LATENCY, RegressConfig, resolve_config
from taxmodel.regress.samples import METRICS, RowKey, RowSamples, describe_meta, load_side, metric_kind
from taxmodel.regress.stats import (IMPROVED, REGRESSED, UNCHANGED, Side, TooFewSamples, compare_sides, row_verdict,
                                   shortfall)

EXIT_OK, EXIT_REGRESSED, EXIT_CANNOT_COMPARE = 0, 1, 2


class MismatchError(InputError):
    """The two sides cannot be compared (different devices, world sizes, schema versions, workloads)."""


@dataclass
class CompareResult:
    """Everything the outputs need. ``metrics``: one line per (row, metric); ``rows``: one per row."""

    metrics: pd.DataFrame
    rows: pd.DataFrame
    missing: list[dict[str, Any]]
    caveats: list[str]
    config: RegressConfig
    baseline: str
    candidate: str
    allow_missing: bool = False
    setup: dict[str, Any] = field(default_factory=dict)

    @property
    def regressed_rows(self) -> pd.DataFrame:
        return self.rows[self.rows["verdict"] == REGRESSED]

    @property
    def exit_code(self) -> int:
        if self.missing and not self.allow_missing:
            return EXIT_CANNOT_COMPARE
        return EXIT_REGRESSED if len(self.regressed_rows) else EXIT_OK

    @property
    def verdict(self) -> str:
        """regressed, incomplete (rows missing on one side), improved, or unchanged."""
        if len(self.regressed_rows):
            return REGRESSED
        if self.missing and not self.allow_missing:
            return "incomplete"
        return row_verdict(list(self.rows["verdict"]))


def compare_paths(baseline: str | Path, candidate: str | Path, config: str | Path | RegressConfig | None = None,
                  allow_missing: bool = False, ledger_fn: Callable[[Any], Any] | None = None,
                  pool: bool = False) -> CompareResult:
    """Load both sides (bundles or directories of bundles) and compare them row by row.

    The config is ``config`` (a RegressConfig or a path), else ``regress.toml`` found beside
    BASELINE (``config.find_config``), else the defaults. Several candidate bundles of one row
    are refused unless ``pool`` (``samples.load_side``).
    """
    cfg = config if isinstance(config, RegressConfig) else resolve_config(baseline, config)
    base = load_side(baseline, "baseline", ledger_fn, pool=True)  # baselines are curated: pooled ones are logged
    cand = load_side(candidate, "candidate", ledger_fn, pool=pool)
    return compare_rows(base, cand, cfg, str(baseline), str(candidate), allow_missing)


def compare_rows(base: dict[RowKey, RowSamples], cand: dict[RowKey, RowSamples], cfg: RegressConfig,
                 baseline_name: str = "baseline", candidate_name: str = "candidate",
                 allow_missing: bool = False) -> CompareResult:
    """Compare already loaded rows (see ``samples.load_side``)."""
    common = [k for k in base if k in cand]
    if not common:
        raise MismatchError(_nothing_in_common(base, cand))
    check_setups(base, cand, common)
    check_samples(base, cand, common, cfg)
    missing = [{"row": k.label, "only_in": "baseline", "paths": base[k].paths} for k in base if k not in cand]
    missing += [{"row": k.label, "only_in": "candidate", "paths": cand[k].paths} for k in cand if k not in base]
    thresholds = [cfg.threshold(m) for m in METRICS]
    window = METRICS.index(LATENCY)
    metric_lines, row_lines, caveats = [], [], []
    for key in common:
        b, c = base[key], cand[key]
        caveats += b.caveats + c.caveats
        side_b, side_c = Side(b.values, b.groups), Side(c.values, c.groups)
        rng = np.random.default_rng([cfg.statistics.seed, zlib.crc32(key.label.encode())])
        changes = compare_sides(side_b, side_c, thresholds, window, cfg.statistics, rng)
        for metric, th, ch in zip(METRICS, thresholds, changes):
            metric_lines.append({
                "row": key.label, "workload": key.workload, "variant": key.variant, "shape": key.shape,
                "metric": metric, "kind": metric_kind(metric),
                "baseline_us": ch.baseline_ns / 1e3, "candidate_us": ch.candidate_ns / 1e3,
                "change_us": ch.change_ns / 1e3, "rel_change": ch.rel_change,
                "ci_low": ch.ci_low, "ci_high": ch.ci_high, "relative_to": th.relative_to,
                "threshold_rel": th.relative, "threshold_abs_us": th.absolute_us, "gated": th.gate,
                "verdict": ch.verdict, "note": ch.note,
            })
        lat = changes[window]
        verdicts = [ch.verdict for ch in changes]
        row_lines.append({
            "row": key.label, "workload": key.workload, "variant": key.variant, "shape": key.shape,
            "verdict": row_verdict(verdicts),
            "latency_baseline_us": lat.baseline_ns / 1e3, "latency_candidate_us": lat.candidate_ns / 1e3,
            "latency_rel_change": lat.rel_change, "latency_ci_low": lat.ci_low, "latency_ci_high": lat.ci_high,
            "regressed": [m for m, v in zip(METRICS, verdicts) if v == REGRESSED],
            "improved": [m for m, v in zip(METRICS, verdicts) if v == IMPROVED],
            "n_baseline": side_b.n_samples, "n_candidate": side_c.n_samples,
            "unit_baseline": side_b.unit, "unit_candidate": side_c.unit,
            "repetitions_baseline": side_b.n_repetitions, "repetitions_candidate": side_c.n_repetitions,
        })
    caveats += _software_differences(base, cand, common)
    return CompareResult(pd.DataFrame(metric_lines), pd.DataFrame(row_lines), missing, _unique(caveats), cfg,
                         baseline_name, candidate_name, allow_missing,
                         setup={"baseline": describe_meta(base[common[0]].metas[0]),
                                "candidate": describe_meta(cand[common[0]].metas[0])})


def check_samples(base: dict[RowKey, RowSamples], cand: dict[RowKey, RowSamples], common: list[RowKey],
                  cfg: RegressConfig) -> None:
    """TooFewSamples (exit 2, one line naming every such row) when a side of a common row is too
    thin to judge (``stats.shortfall``): a gate that cannot judge says so instead of passing."""
    problems = []
    for key in common:
        for side, rows in (("baseline", base), ("candidate", cand)):
            short = shortfall(len(rows[key].table), cfg.statistics)
            if short:
                problems.append(f"{key.label}: the {side} has {short}")
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise TooFewSamples("cannot judge, too few samples: " + "; ".join(problems[:5]) + more +
                            f" (min_samples from {cfg.source}). Profile more iterations (--iterations) or repetitions "
                            "(--repeat); for the baseline, `taxmodel baseline update` with such a capture")


def check_setups(base: dict[RowKey, RowSamples], cand: dict[RowKey, RowSamples], common: list[RowKey]) -> None:
    """Raise MismatchError naming every field that differs between the sides of a common row."""
    problems = []
    for key in common:
        for fieldname in ("schema_version", "device", "world_size", "launches", "ranks"):
            left = {describe_meta(m)[fieldname] for m in base[key].metas}
            right = {describe_meta(m)[fieldname] for m in cand[key].metas}
            if fieldname == "ranks" and len(left) == 1 and len(right) == 1 and left != right:
                lacks = sorted(set(_ranks(left)) - set(_ranks(right)))
                extra = sorted(set(_ranks(right)) - set(_ranks(left)))
                what = (f"the candidate lacks rank(s) {_rank_list(lacks)} that the baseline has (a capture of some "
                        "ranks only, e.g. imported with --allow-missing-ranks)" if lacks else
                        f"the candidate has rank(s) {_rank_list(extra)} that the baseline lacks")
                problems.append(f"{key.label}: {what}")
                continue
            if len(left) > 1 or len(right) > 1:
                side = "baseline" if len(left) > 1 else "candidate"
                problems.append(f"{key.label}: the {side} bundles disagree on {fieldname} ({_fmt(left if side == 'baseline' else right)})")
            elif left != right:
                problems.append(f"{key.label}: {fieldname} differs (baseline {_fmt(left)}, candidate {_fmt(right)})")
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise MismatchError("cannot compare, mismatched setups: " + "; ".join(problems[:5]) + more +
                            ". Compare captures of the same device, world size, launch mode and schema version, or record a new "
                            "baseline with `taxmodel baseline update`")


def _nothing_in_common(base: dict[RowKey, RowSamples], cand: dict[RowKey, RowSamples]) -> str:
    wb, wc = sorted({k.workload for k in base}), sorted({k.workload for k in cand})
    if not set(wb) & set(wc):
        return (f"cannot compare, mismatched workloads: baseline has {', '.join(wb)}, candidate has {', '.join(wc)}. "
                "Point BASELINE at the baselines of the same workload")
    return ("cannot compare, no row (workload/variant/shape) is on both sides: baseline has "
            f"{', '.join(sorted(k.label for k in base))}; candidate has {', '.join(sorted(k.label for k in cand))}")


def _software_differences(base: dict[RowKey, RowSamples], cand: dict[RowKey, RowSamples], common: list[RowKey]) -> list[str]:
    """Software versions that changed: not a reason to refuse, but worth a line in the report."""
    sb = base[common[0]].metas[0].get("software") or {}
    sc = cand[common[0]].metas[0].get("software") or {}
    return [f"software {name}: baseline {sb.get(name)}, candidate {sc.get(name)}"
            for name in sorted(set(sb) | set(sc)) if sb.get(name) != sc.get(name)]


def _ranks(values: set) -> list[int]:
    return [int(r) for r in next(iter(values)).split(",") if r]


def _rank_list(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks[:16]) + (", ..." if len(ranks) > 16 else "")


def _fmt(values: set) -> str:
    return " / ".join(sorted(str(v) for v in values))


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


__all__ = ["CompareResult", "MismatchError", "TooFewSamples", "compare_paths", "compare_rows", "check_setups",
           "EXIT_OK", "EXIT_REGRESSED", "EXIT_CANNOT_COMPARE", "IMPROVED", "REGRESSED", "UNCHANGED"]
