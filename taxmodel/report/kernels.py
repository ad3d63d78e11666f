"""The per-kernel lines of `taxmodel analyze`: which kernels (and the ops that launched them)
carry the most of each tax, from ``Ledger.kernels`` (ledger/per_kernel.py)."""
from __future__ import annotations

import math

import pandas as pd

#: (column of Ledger.kernels, what the line calls it)
TAX_COLUMNS = (("inefficiency_ns", "compute inefficiency"), ("launch_tax_ns", "launch tax before them"),
               ("locality_ns", "locality tax"), ("bsp_ns", "bulk-synchronous tax inside them"))


def top_kernel_lines(kernels: pd.DataFrame | None, n_per_rank_iteration: int, top: int = 3) -> list[str]:
    """Up to ``top`` kernels per tax, with op, share and mean us per iteration and rank; a tax
    that is not measured (NaN) or zero everywhere gets no line."""
    if kernels is None or kernels.empty:
        return []
    per = max(n_per_rank_iteration, 1)
    out = []
    for col, label in TAX_COLUMNS:
        vals = kernels[col]
        if vals.isna().all() or float(vals.fillna(0).sum()) <= 0:
            continue
        total = float(vals.sum())
        best = kernels.assign(value=vals).nlargest(top, "value")
        items = []
        for r in best.itertuples(index=False):
            if not r.value > 0 or math.isnan(r.value):
                continue
            op = f" [{r.op}]" if r.op else ""
            items.append(f"{_short(r.name)}{op} {r.value / per / 1e3:,.1f} us ({100 * r.value / total:.0f}%)")
        if items:
            out.append(f"  {label}: " + "; ".join(items))
    return (["top kernels (mean us per iteration and rank; share of the tax):"] + out) if out else []


def _short(name: str, width: int = 60) -> str:
    """A kernel name cut to its head (C++ template names run to hundreds of characters)."""
    head = name.replace("(anonymous namespace)::", "").replace("void ", "").split("<")[0].split("(")[0] or name
    return head if len(head) <= width else head[: width - 1] + "…"
