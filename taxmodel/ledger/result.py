"""The measured ledger of one bundle: its parts (every rank's window split into sub-categories),
windows, intervals, caveats and per-kernel table, and the tables read from them (definitions:
docs/ledger.md). ``compute.compute_ledger`` makes one.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from taxmodel.hardware.specs import HardwareSpec
from taxmodel.ledger import per_kernel
from taxmodel.ledger.categories import CATEGORY_ORDER, PARENT, SUBCATEGORY_ORDER
from taxmodel.ledger.clock import ClockAlignment
from taxmodel.ledger.coverage import missing_ranks


@dataclass
class Ledger:
    """Measured time of one bundle split into the ledger's parts (docs/ledger.md)."""

    parts: pd.DataFrame
    windows: pd.DataFrame
    intervals: pd.DataFrame
    clock: ClockAlignment
    caveats: list[str]
    skipped: list[str]
    meta: dict
    label: str
    hardware: HardwareSpec | None = None
    ranks: list[int] = field(default_factory=list)
    #: how locality_tax was obtained: "measured" (DRAM counters), "estimated" (the workload's
    #: declared intermediates), "not measured" (NaN in summaries; its time is in compute_inefficiency)
    locality: str = "estimated"
    #: per distinct (kernel, op): launches, time, floor, useful, locality, inefficiency, launch tax, costed
    kernels: pd.DataFrame | None = None
    #: per GPU row (``bundle.events`` index) the locality tax the ledger measured from its DRAM
    #: counters, in ns; None unless ``locality`` is "measured" (what ``advise`` sums per candidate)
    kernel_locality_ns: pd.Series | None = None
    #: the launch tax may be the profiler's own host overhead (a heavy eager capture; see caveats)
    launch_tax_inflated: bool = False

    def summary(self) -> pd.DataFrame:
        """One row per sub-category: mean ns over repetitions, iterations and ranks, and % of
        the mean window; the rows sum to the mean window."""
        n = max(len(self.windows) * max(len(self.ranks), 1), 1)
        total = self.parts.groupby("subcategory")["ns"].sum()
        mean = np.array([float(total.get(s, 0)) / n for s in SUBCATEGORY_ORDER])
        mean_window = float(self.windows["window_ns"].mean()) if len(self.windows) else 0.0
        out = pd.DataFrame({
            "category": [PARENT[s] for s in SUBCATEGORY_ORDER],
            "subcategory": list(SUBCATEGORY_ORDER),
            "mean_ns": mean,
            "pct": mean / mean_window * 100.0 if mean_window else np.zeros(len(mean)),
        })
        if self.locality == per_kernel.LOCALITY_ABSENT:  # not a measured 0: its time stays in compute_inefficiency
            out.loc[out["subcategory"] == "locality_tax", ["mean_ns", "pct"]] = np.nan
        return out

    def category_summary(self) -> pd.DataFrame:
        """Like ``summary`` but one row per category."""
        s = self.summary().groupby("category", sort=False)[["mean_ns", "pct"]].sum()
        return s.reindex(list(CATEGORY_ORDER)).reset_index()

    def per_iteration(self) -> pd.DataFrame:
        """One row per (repetition, iteration): window_ns and each category's mean over ranks."""
        nr = max(len(self.ranks), 1)
        wide = (self.parts.groupby(["repetition", "iteration", "category"])["ns"].sum() / nr).unstack("category")
        wide = wide.reindex(columns=list(CATEGORY_ORDER)).fillna(0.0).reset_index()
        wide.columns.name = None
        return self.windows[["repetition", "iteration", "window_ns"]].merge(wide, on=["repetition", "iteration"], how="left")

    def per_rank(self) -> pd.DataFrame:
        """Mean ns per (rank, sub-category) over repetitions and iterations (wide)."""
        n = max(len(self.windows), 1)
        wide = (self.parts.groupby(["rank", "subcategory"])["ns"].sum() / n).unstack("subcategory")
        return wide.reindex(columns=list(SUBCATEGORY_ORDER)).fillna(0.0)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready document (what `taxmodel analyze --json` prints)."""
        return {
            "label": self.label,
            "workload": self.meta.get("workload"), "variant": self.meta.get("variant"), "shape": self.meta.get("shape"),
            "world_size": self.meta.get("world_size"), "ranks": self.ranks,
            "missing_ranks": missing_ranks(self.meta, self.ranks),
            "hardware": None if self.hardware is None else {"name": self.hardware.name, "source": self.hardware.source},
            "clock": self.clock.to_dict(),
            "mean_window_ns": float(self.windows["window_ns"].mean()) if len(self.windows) else 0.0,
            "summary": self.summary().astype(object).where(self.summary().notna(), None).to_dict(orient="records"),  # NaN -> null
            "per_iteration": self.per_iteration().to_dict(orient="records"),
            "caveats": list(self.caveats), "skipped": list(self.skipped),
            "locality": self.locality, "launch_tax_inflated": self.launch_tax_inflated,
            "kernels": [] if self.kernels is None else
            self.kernels.astype(object).where(self.kernels.notna(), None).to_dict(orient="records"),
        }
