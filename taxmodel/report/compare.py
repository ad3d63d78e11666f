"""Which ledgers are compared with which: the grouping every report view shares.

Bundles are compared at one problem size by (workload, shape), with ``bsp`` as the reference
variant, and swept across sizes by (workload, variant). A ledger knows its workload, variant
and shape from its bundle's metadata (``Ledger.meta``), so nothing here needs the events.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Protocol, Sequence

import numpy as np
import pandas as pd

from taxmodel.ledger.categories import CATEGORY_ORDER, SUBCATEGORY_ORDER

REFERENCE_VARIANT = "bsp"


class LedgerLike(Protocol):
    """What the report reads of a ``taxmodel.ledger.Ledger`` (``parts``: the columns of
    ``taxmodel.ledger.categories.LEDGER_COLUMNS``; ``windows``: one row per iteration with ``window_ns``)."""

    parts: pd.DataFrame
    windows: pd.DataFrame
    intervals: pd.DataFrame
    caveats: list[str]
    skipped: list[str]
    meta: dict
    label: str

    def summary(self) -> pd.DataFrame: ...

    def per_iteration(self) -> pd.DataFrame: ...


@dataclass(frozen=True)
class Identity:
    """What a ledger measured: workload, variant and problem shape. The shape is sorted by key, so
    that one shape is one identity whichever order a bundle lists it in; ``order`` is the bundle's
    own (the workload's, as in the bundle's folder name), in which labels show it."""

    workload: str
    variant: str
    shape: tuple[tuple[str, Any], ...]
    order: tuple[str, ...] = field(default=(), compare=False)

    @property
    def shape_label(self) -> str:
        values = dict(self.shape)
        return shape_label({**{k: values[k] for k in self.order if k in values}, **values})


def shape_label(shape: Mapping[str, Any]) -> str:
    """``{"M": 4096, "N": 8192}`` -> ``"M=4096 N=8192"`` (``"default shape"`` when empty)."""
    if not shape:
        return "default shape"
    return " ".join(f"{k}={v}" for k, v in shape.items())


def identity(ledger: LedgerLike) -> Identity:
    meta = ledger.meta or {}
    shape = meta.get("shape") or {}
    return Identity(
        workload=str(meta.get("workload") or ledger.label),  # an imported job: its label (files, world size, GPU)
        variant=str(meta.get("variant") or ledger.label),
        shape=tuple(sorted((str(k), v) for k, v in shape.items())),
        order=tuple(str(k) for k in shape),
    )


def group_by_shape(ledgers: Iterable[LedgerLike]) -> dict[tuple[str, tuple], list[LedgerLike]]:
    """(workload, shape) -> ledgers of the variants measured there, reference variant first."""
    groups: dict[tuple[str, tuple], list[LedgerLike]] = {}
    for led in ledgers:
        ident = identity(led)
        groups.setdefault((ident.workload, ident.shape), []).append(led)
    return {k: sorted(v, key=_variant_order_key) for k, v in groups.items()}


def group_by_variant(ledgers: Iterable[LedgerLike]) -> dict[tuple[str, str], list[LedgerLike]]:
    """(workload, variant) -> ledgers across shapes, ordered by problem size."""
    groups: dict[tuple[str, str], list[LedgerLike]] = {}
    for led in ledgers:
        ident = identity(led)
        groups.setdefault((ident.workload, ident.variant), []).append(led)
    return {k: sorted(v, key=lambda led: _size_key(identity(led).shape)) for k, v in groups.items()}


def _variant_order_key(led: LedgerLike) -> tuple[int, str]:
    v = identity(led).variant
    return (0 if v == REFERENCE_VARIANT else 1, v)


def _size_key(shape: tuple[tuple[str, Any], ...]) -> tuple:
    numeric = [float(v) for _, v in shape if isinstance(v, (int, float, np.integer, np.floating))]
    return (float(np.prod(numeric)) if numeric else 0.0, tuple(str(v) for _, v in shape))


def reference_of(group: Sequence[LedgerLike]) -> LedgerLike | None:
    """The ``bsp`` ledger of a (workload, shape) group, or None when it was not measured."""
    for led in group:
        if identity(led).variant == REFERENCE_VARIANT:
            return led
    return None


def clock_offsets(ledger: LedgerLike) -> dict[int, int]:
    """rank -> ns to add to that rank's event times: the ledger's alignment (the bundle's if absent)."""
    offs = getattr(getattr(ledger, "clock", None), "offsets_ns", None)
    if offs is None:
        offs = (ledger.meta or {}).get("clock_offsets_ns") or {}
    return {int(k): int(v) for k, v in offs.items()}


def aligned_events(events: pd.DataFrame, ledger: LedgerLike) -> pd.DataFrame:
    """``events`` with start_ns/end_ns moved onto the ledger's aligned clock (the one its intervals use)."""
    offsets = clock_offsets(ledger)
    shift = events["rank"].astype("int64").map(offsets).fillna(0).astype("int64").to_numpy()
    return events.assign(start_ns=events["start_ns"].to_numpy().astype("int64") + shift,
                         end_ns=events["end_ns"].to_numpy().astype("int64") + shift)


def mean_window_ns(ledger: LedgerLike) -> float:
    """Mean iteration latency (global window) over repetitions and iterations."""
    return float(ledger.windows["window_ns"].mean())


def part_means_ns(ledger: LedgerLike) -> pd.Series:
    """Mean ns per iteration and rank of every sub-category (all of SUBCATEGORY_ORDER, 0 when absent)."""
    s = ledger.summary().set_index("subcategory")["mean_ns"].astype(float)
    return s.reindex(SUBCATEGORY_ORDER, fill_value=0.0)


def category_means_ns(ledger: LedgerLike) -> pd.Series:
    """Mean ns per iteration and rank of every category (CATEGORY_ORDER, 0 when absent)."""
    s = ledger.summary().groupby("category")["mean_ns"].sum().astype(float)
    return s.reindex(CATEGORY_ORDER, fill_value=0.0)


@dataclass(frozen=True)
class SizeAxis:
    """How problem sizes are placed on a sweep's x axis."""

    values: list[float]  # x position of each shape, in the order given
    label: str
    ticklabels: list[str]
    log: bool


def size_axis(shapes: Sequence[Mapping[str, Any]]) -> SizeAxis:
    """Numeric x when exactly one shape key varies (log scale over wide ranges), else categorical.

    Why: a sweep usually varies one dimension (M for AG+GEMM, context length for decode); when
    several vary together the product is not a meaningful axis, so the shapes are just listed.
    """
    keys = list(dict.fromkeys(k for s in shapes for k in s))
    varying = [k for k in keys if len({repr(s.get(k)) for s in shapes}) > 1]
    if len(varying) == 1 and all(isinstance(s.get(varying[0]), (int, float, np.integer, np.floating)) for s in shapes):
        k = varying[0]
        vals = [float(s[k]) for s in shapes]
        positive = min(vals) > 0
        log = positive and max(vals) / min(vals) >= 8
        fixed = [f"{kk}={shapes[0][kk]}" for kk in keys if kk != k and kk in shapes[0]]
        label = k + (f"  ({', '.join(fixed)})" if fixed else "")
        return SizeAxis(vals, label, [f"{int(v)}" if float(v).is_integer() else f"{v:g}" for v in vals], log)
    labels = [" ".join(f"{k}={s[k]}" for k in (varying or keys) if k in s) or "default" for s in shapes]
    return SizeAxis([float(i) for i in range(len(shapes))], "problem size", labels, False)
