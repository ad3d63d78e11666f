"""Thresholds and statistics settings of a comparison, read from ``regress.toml``.

The file lives next to the baselines (``profiles/regress.toml`` for baselines under
``profiles/<dir>``) so that the people who own a baseline also own what counts as a regression
of it. ``find_config`` looks in BASELINE and then in each parent directory up to the project
root (a directory holding ``.git`` or ``pyproject.toml``) that holds BASELINE; outside any
project only in BASELINE itself, so that a ``regress.toml`` someone left in ``/tmp`` or a home
directory never decides a comparison. Without a file the built-in ``DEFAULTS`` below apply.
Every comparison says which applied (``RegressConfig.source``). ``profiles/regress.toml`` spells the same defaults out with their
justification, and a test keeps the two equal.

TOML is read with ``tomllib`` (standard library from Python 3.11) or, on 3.10, ``tomli`` when
installed; a ``.json`` file with the same structure works everywhere.

Structure::

    [statistics]             resamples, confidence, seed, statistic ("median" | "mean"), min_samples
    [thresholds.default]     every metric without a table of its own
    [thresholds.<metric>]    latency, a category (bsp_tax, ...) or a sub-category (kernel_gap, ...);
                             a sub-category inherits its category's table, which inherits default.

Per metric: ``relative`` (the bootstrap CI of the relative change must lie entirely beyond it),
``absolute_us`` (and the change of the point estimates must exceed it), ``relative_to``
("self": change over the baseline value of the metric; "window": change over the baseline
latency, i.e. "this tax grew by x% of the iteration"), ``gate`` (false: reported, never a verdict).
"""
from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from taxmodel.errors import InputError, UnavailableError
from taxmodel.limits import read_small_text
from taxmodel.ledger.categories import CATEGORIES, PARENT

CONFIG_NAME = "regress.toml"
LATENCY = "latency"
STATISTICS = ("median", "mean")
RELATIVE_TO = ("self", "window")

# Kept equal to profiles/regress.toml (tests/test_regress_config.py checks it); the reasons for
# each number are written there, beside the values a user edits.
DEFAULTS: dict[str, Any] = {
    "statistics": {"resamples": 2000, "confidence": 0.95, "seed": 0, "statistic": "median", "min_samples": 3},
    "thresholds": {
        "default": {"relative": 0.02, "absolute_us": 2.0, "relative_to": "window", "gate": True},
        "latency": {"relative": 0.03, "absolute_us": 2.0, "relative_to": "self"},
        "useful": {"gate": False},
    },
}

MIN_RESAMPLES, MAX_RESAMPLES = 100, 100_000
"""Bootstrap resamples: below 100 the interval's ends are noise; above 100,000 each side's
[resamples x metrics] array and the time to fill it grow for no visible gain in the CI."""

_THRESHOLD_KEYS = {"relative": float, "absolute_us": float, "relative_to": str, "gate": bool}
_STAT_KEYS = {"resamples": int, "confidence": float, "seed": int, "statistic": str, "min_samples": int}


@dataclass(frozen=True)
class Threshold:
    """When a metric's change counts: see the module docstring."""

    relative: float
    absolute_us: float
    relative_to: str
    gate: bool = True

    @property
    def absolute_ns(self) -> float:
        return self.absolute_us * 1e3


@dataclass(frozen=True)
class StatisticsSettings:
    resamples: int = 2000
    confidence: float = 0.95
    seed: int = 0
    statistic: str = "median"
    min_samples: int = 3


@dataclass
class RegressConfig:
    statistics: StatisticsSettings
    tables: dict[str, dict[str, Any]] = field(default_factory=dict)
    source: str = "built-in defaults"

    def threshold(self, metric: str) -> Threshold:
        """The threshold of ``metric``: its own table over its category's over ``default``."""
        chain = ["default"]
        if metric in PARENT and PARENT[metric] != metric:
            chain.append(PARENT[metric])
        chain.append(metric)
        merged: dict[str, Any] = {}
        for name in chain:
            merged.update(self.tables.get(name, {}))
        return Threshold(**merged)

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "statistics": vars(self.statistics).copy(),
                "thresholds": copy.deepcopy(self.tables)}


def default_config() -> RegressConfig:
    return config_from_dict(DEFAULTS, source="built-in defaults")


def config_from_dict(data: Mapping[str, Any], source: str = "<dict>") -> RegressConfig:
    """Validate ``data`` (the parsed file) over the defaults; raise InputError naming the bad key."""
    unknown = set(data) - {"statistics", "thresholds"}
    if unknown:
        raise InputError(f"{source}: unknown section [{sorted(unknown)[0]}]; expected [statistics] and [thresholds.<metric>]")
    stats = dict(DEFAULTS["statistics"])
    stats.update(_checked(data.get("statistics", {}), _STAT_KEYS, f"{source} [statistics]"))
    if stats["statistic"] not in STATISTICS:
        raise InputError(f"{source} [statistics]: statistic must be one of {STATISTICS}, not {stats['statistic']!r}")
    if not 0.5 <= stats["confidence"] < 1:
        raise InputError(f"{source} [statistics]: confidence must be in [0.5, 1), not {stats['confidence']}")
    if not MIN_RESAMPLES <= stats["resamples"] <= MAX_RESAMPLES:
        raise InputError(f"{source} [statistics]: resamples must be between {MIN_RESAMPLES} and {MAX_RESAMPLES:,} "
                         f"(more costs memory and minutes, not precision), not {stats['resamples']}")
    if stats["seed"] < 0:
        raise InputError(f"{source} [statistics]: seed must not be negative, not {stats['seed']}")
    if stats["min_samples"] < 1:
        raise InputError(f"{source} [statistics]: min_samples must be at least 1, not {stats['min_samples']}")
    tables = copy.deepcopy(DEFAULTS["thresholds"])
    known = {"default", LATENCY, *CATEGORIES, *PARENT}
    for name, table in (data.get("thresholds") or {}).items():
        if name not in known:
            raise InputError(f"{source}: unknown metric [thresholds.{name}]; expected one of {sorted(known)}")
        checked = _checked(table, _THRESHOLD_KEYS, f"{source} [thresholds.{name}]")
        if "relative_to" in checked and checked["relative_to"] not in RELATIVE_TO:
            raise InputError(f"{source} [thresholds.{name}]: relative_to must be one of {RELATIVE_TO}")
        for key in ("relative", "absolute_us"):
            if not 0 <= checked.get(key, 0) < math.inf:
                raise InputError(f"{source} [thresholds.{name}]: {key} must be a finite number, not negative")
        tables.setdefault(name, {}).update(checked)
    return RegressConfig(statistics=StatisticsSettings(**stats), tables=tables, source=source)


def _checked(table: Any, keys: Mapping[str, type], where: str) -> dict[str, Any]:
    if not isinstance(table, Mapping):
        raise InputError(f"{where}: expected a table of settings")
    out = {}
    for key, value in table.items():
        if key not in keys:
            raise InputError(f"{where}: unknown key '{key}'; expected one of {sorted(keys)}")
        want = keys[key]
        if want is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, want) or (want is not bool and isinstance(value, bool)):
            raise InputError(f"{where}: '{key}' must be a {want.__name__}, not {value!r}")
        out[key] = value
    return out


def load_config(path: str | Path) -> RegressConfig:
    """Read a ``.toml`` (or ``.json``) thresholds file."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such config file (pass --config with a regress.toml, or omit it for the defaults)")
    text = read_small_text(path, "thresholds file")
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}: not valid JSON ({exc})") from exc
        except RecursionError as exc:
            raise InputError(f"{path}: nested too deeply to be a thresholds file") from exc
    else:
        toml = _toml_module()
        try:
            data = toml.loads(text)
        except toml.TOMLDecodeError as exc:
            raise InputError(f"{path}: not valid TOML ({exc})") from exc
        except RecursionError as exc:
            raise InputError(f"{path}: nested too deeply to be a thresholds file") from exc
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a table of settings")
    return config_from_dict(data, source=str(path))


def _toml_module():
    try:
        import tomllib  # python >= 3.11
    except ModuleNotFoundError:
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError as exc:
            raise UnavailableError("reading regress.toml needs Python 3.11+ or `pip install tomli` "
                                   "(or pass --config with a .json file of the same structure)") from exc
    return tomllib


def config_places(baseline: str | Path) -> list[Path]:
    """Where ``regress.toml`` may be for BASELINE, nearest first: BASELINE (an archive: its
    directory) and each parent up to the project root holding it; outside a project, BASELINE
    alone (see the module docstring)."""
    here = Path(baseline).resolve()
    if not here.is_dir():
        here = here.parent
    chain = [here, *here.parents]
    root = next((i for i, d in enumerate(chain) if (d / ".git").exists() or (d / "pyproject.toml").exists()), None)
    return chain[:root + 1] if root is not None else chain[:1]


def find_config(baseline: str | Path) -> Path | None:
    """The nearest ``regress.toml`` of ``config_places``, else None."""
    return next((d / CONFIG_NAME for d in config_places(baseline) if (d / CONFIG_NAME).is_file()), None)


def resolve_config(baseline: str | Path, config: str | Path | None = None) -> RegressConfig:
    """The config given with --config, else the one found beside BASELINE, else the defaults."""
    if config is not None:
        return load_config(config)
    found = find_config(baseline)
    if found:
        return load_config(found)
    cfg = default_config()
    places = config_places(baseline)
    cfg.source = (f"built-in defaults (no {CONFIG_NAME} in {places[0]}" +
                  (f" or above it up to {places[-1]})" if len(places) > 1 else ", which is in no project)"))
    return cfg
