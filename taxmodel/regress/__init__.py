"""Baseline comparison for CI: is the candidate slower, or does it pay a new tax?

``taxmodel compare BASELINE CANDIDATE`` matches rows (workload, variant, shape) of two sets of
profile bundles, computes each side's ledger, and for the latency and every category and
sub-category gives a bootstrap confidence interval of the relative change and a verdict
(improved, unchanged, regressed); see ``stats`` for the method, ``config`` for the thresholds
(``regress.toml`` beside the baselines), ``outputs`` for the terminal/Markdown/JUnit/JSON
reports and ``baseline`` for updating baselines. Modules: samples (bundles -> per-iteration
samples per row), stats, config, compare (matching, setup checks, exit codes), outputs, baseline.
"""
from taxmodel.regress.compare import (EXIT_CANNOT_COMPARE, EXIT_OK, EXIT_REGRESSED, CompareResult, MismatchError,
                                      compare_paths, compare_rows)
from taxmodel.regress.config import RegressConfig, default_config, load_config, resolve_config

__all__ = ["CompareResult", "MismatchError", "compare_paths", "compare_rows", "RegressConfig", "default_config",
           "load_config", "resolve_config", "EXIT_OK", "EXIT_REGRESSED", "EXIT_CANNOT_COMPARE"]
