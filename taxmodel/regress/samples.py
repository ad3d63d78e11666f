"""From bundles to the samples a comparison resamples: one table per row, one line per iteration.

A *row* is one configuration, keyed by (workload, variant, shape). Its samples are, for every
(repetition, iteration) of the ledger, the latency (the global iteration window) and every
category and sub-category, each averaged over ranks as ``Ledger.summary`` does. Several bundles
of the same row on one side (e.g. two captures) are pooled as independent repetitions only when
the caller says so (``pool``): in a candidate directory a second bundle of a row is as likely a
stale copy of an earlier run as a deliberate repetition, and pooling it would widen the interval
until a regression passes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from taxmodel.errors import BundleError, InputError, TaxmodelError
from taxmodel.ledger.categories import CATEGORIES, CATEGORY_ORDER, PARENT, SUBCATEGORY_ORDER
from taxmodel.regress.config import LATENCY
from taxmodel.trace.bundle import Bundle, find_bundles, load_bundle

# latency, then each category followed by its sub-parts (when it has several)
METRICS: tuple[str, ...] = (LATENCY,) + tuple(
    name for cat in CATEGORY_ORDER for name in ((cat,) if CATEGORIES[cat] == (cat,) else (cat, *CATEGORIES[cat]))
)


def metric_kind(metric: str) -> str:
    if metric == LATENCY:
        return "latency"
    if metric in CATEGORIES:
        return "category"
    return "subcategory"


@dataclass(frozen=True)
class RowKey:
    workload: str
    variant: str
    shape: str  # canonical "k=v,k=v" in the order the bundle gives

    @property
    def label(self) -> str:
        return "/".join(p for p in (self.workload, self.variant, self.shape) if p)

    @staticmethod
    def of(meta: dict[str, Any]) -> "RowKey":
        shape = meta.get("shape") or {}
        if isinstance(shape, dict):
            shape_text = ",".join(f"{k}={v}" for k, v in sorted(shape.items()))
        else:
            shape_text = str(shape)
        return RowKey(str(meta.get("workload") or "unknown"), str(meta.get("variant") or "unknown"), shape_text)


@dataclass
class RowSamples:
    """One row on one side: per-iteration metric values (ns) and the bundles they came from."""

    key: RowKey
    table: pd.DataFrame  # repetition, iteration, then one float column per METRICS entry
    paths: list[str] = field(default_factory=list)
    metas: list[dict[str, Any]] = field(default_factory=list)
    caveats: list[str] = field(default_factory=list)

    @property
    def values(self) -> np.ndarray:
        return self.table[list(METRICS)].to_numpy(dtype=np.float64)

    @property
    def groups(self) -> np.ndarray:
        return self.table["repetition"].to_numpy()


def samples_from_ledger(ledger: Any) -> pd.DataFrame:
    """repetition, iteration and one column per metric (ns, mean over ranks) from a Ledger.

    Uses only ``ledger.parts`` (columns ``LEDGER_COLUMNS``) and ``ledger.windows`` (``window_ns``
    per iteration), so any object with those two frames will do.
    """
    parts = ledger.parts
    unknown = set(parts["subcategory"].unique()) - set(PARENT)
    if unknown:
        raise BundleError(f"ledger: unknown sub-category {sorted(unknown)[0]!r}; expected one of {SUBCATEGORY_ORDER}")
    keys = ["repetition", "iteration"]
    per_rank = (parts.groupby(keys + ["rank", "subcategory"], sort=False)["ns"].sum()
                .unstack("subcategory", fill_value=0)
                .reindex(columns=list(SUBCATEGORY_ORDER), fill_value=0)
                .astype(np.float64))
    per_iter = per_rank.groupby(level=keys).mean()
    for cat, subs in CATEGORIES.items():
        if subs != (cat,):
            per_iter[cat] = per_iter[list(subs)].sum(axis=1)
    windows = ledger.windows.set_index(keys)["window_ns"].astype(np.float64).rename(LATENCY)
    table = per_iter.join(windows, how="inner")
    return table[list(METRICS)].reset_index()


def bundle_paths(path: str | Path) -> list[Path]:
    """A bundle archive, a bundle directory, or every bundle below a directory."""
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.exists():
        raise InputError(f"{path}: no such bundle or directory")
    found = find_bundles(path)
    if not found:
        raise BundleError(f"{path}: no profile bundles found (expected directories with meta.json)")
    return found


def load_side(path: str | Path, side: str, ledger_fn: Callable[[Bundle], Any] | None = None, *,
              pool: bool = False) -> dict[RowKey, RowSamples]:
    """Load every bundle of one side, compute its ledger and group the samples by row.

    ``side`` ("baseline" or "candidate") only goes into error messages. ``ledger_fn`` defaults
    to ``taxmodel.ledger.compute_ledger``. Without ``pool`` a second bundle of a row is an
    InputError naming both (see the module docstring); with it they are pooled, with a caveat.
    """
    if ledger_fn is None:
        from taxmodel.ledger.compute import compute_ledger as ledger_fn  # imported late: heavy
    rows: dict[RowKey, RowSamples] = {}
    for p in bundle_paths(path):
        try:
            bundle = load_bundle(p)
        except TaxmodelError as exc:
            raise type(exc)(f"{side}: {exc}") from exc
        try:
            table = samples_from_ledger(ledger_fn(bundle))
        except TaxmodelError as exc:
            raise type(exc)(f"{side} bundle {p}: {exc}") from exc
        key = RowKey.of(bundle.meta)
        if key in rows and not pool:
            raise InputError(f"{side}: {len(rows[key].paths) + 1} bundles of {key.label} ({rows[key].paths[0]} and {p}); "
                             "is one a stale copy of an earlier run? Remove it, or pass --pool to pool them as "
                             "independent repetitions")
        if key in rows:
            row = rows[key]
            offset = int(row.table["repetition"].max()) + 1
            table = table.assign(repetition=table["repetition"] + offset)
            row.table = pd.concat([row.table, table], ignore_index=True)
            row.paths.append(str(p))
            row.metas.append(bundle.meta)
            row.caveats = [f"{side}: {len(row.paths)} bundles of {key.label} pooled as independent repetitions"]
        else:
            rows[key] = RowSamples(key, table, [str(p)], [bundle.meta])
    return rows


def describe_meta(meta: dict[str, Any]) -> dict[str, Any]:
    """The setup fields that must agree between the two sides of a row."""
    hardware = meta.get("hardware") or {}
    ranks = meta.get("ranks") or []
    return {
        "schema_version": meta.get("schema_version"),
        "device": hardware.get("name") or None,
        "world_size": meta.get("world_size"),
        # CUDA-graph replays and eager launches have different launch taxes by construction
        "launches": "CUDA graph" if (meta.get("capture") or {}).get("graph") else "eager",
        # the ranks that have events: a capture of some ranks only is not the same measurement
        "ranks": ",".join(str(int(r)) for r in sorted(ranks)) if isinstance(ranks, list) else str(ranks),
    }
