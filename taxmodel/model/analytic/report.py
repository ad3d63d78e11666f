"""Text and figures of predictions (what `taxmodel predict` prints)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Sequence

import pandas as pd

from taxmodel.errors import InputError
from taxmodel.fsutil import atomic_path
from taxmodel.ledger.categories import CATEGORY_ORDER, LABELS

from .prediction import Prediction


def render_prediction(preds: Sequence[Prediction]) -> str:
    """One ledger table per prediction (us and % of the predicted window), then the assumptions."""
    out = []
    for p in preds:
        shape = ",".join(f"{k}={v}" for k, v in p.shape.items())
        hw = p.hardware.label
        out.append(f"{p.workload}/{p.variant}  {shape}  world size {p.world_size}  on {hw}")
        out.append(f"  predicted latency: {p.window_ns / 1e3:,.1f} us")
        s = p.summary()
        for row in s.itertuples(index=False):
            part = "" if row.subcategory == row.category else row.subcategory  # a category without parts: once
            out.append(f"  {row.category:<21} {part:<21} {row.mean_ns / 1e3:>12,.1f} us {row.pct:>6.1f}%")
        comp = ", ".join(f"{k} {v * 1e6:,.1f} us" for k, v in p.details.items())
        out.append(f"  components: {comp}")
        out.append("")
    seen: list[str] = []
    for p in preds:
        for a in p.assumptions:
            if a not in seen:
                seen.append(a)
    out.append("Assumptions:")
    out.extend(f"  - {a}" for a in seen)
    return "\n".join(out) + "\n"


def render_sweep(tables: Mapping[str, pd.DataFrame], key: str) -> str:
    out = []
    for variant, t in tables.items():
        out.append(f"variant {variant} (us per iteration)")
        show = t.copy()
        for col in ["window_ns", *CATEGORY_ORDER]:
            show[col] = (show[col] / 1e3).round(1)
        show = show.rename(columns={"window_ns": "latency"})
        out.append(show.to_string(index=False))
        out.append("")
    return "\n".join(out)


def plot_sweep(tables: Mapping[str, pd.DataFrame], key: str, path: str | os.PathLike, title: str = "") -> Path:
    """Predicted latency of each variant over the swept key, and the taxes as dashed lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from taxmodel.safetext import MATPLOTLIB_RC

    with matplotlib.rc_context(MATPLOTLIB_RC):  # a variant's name is literal text, never mathtext
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
        for variant, t in tables.items():
            axes[0].plot(t[key], t["window_ns"] / 1e3, marker="o", label=variant)
            for tax, style in (("bsp_tax", "--"), ("launch_tax", ":"), ("locality_tax", "-.")):
                axes[1].plot(t[key], t[tax] / 1e3, style, marker=".", label=f"{variant}: {LABELS[tax]}")
        for ax, ylabel in zip(axes, ("predicted latency (us)", "predicted tax (us)")):
            ax.set_xscale("log", base=2)
            ax.set_xlabel(key)
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=8)
        axes[1].legend(fontsize=6)
        if title:
            fig.suptitle(title)
        fig.tight_layout()
    path = Path(path)
    try:
        with atomic_path(path, "plot") as tmp:  # the format from the real name: the temporary's ends in .tmp
            fig.savefig(tmp, dpi=120, format=path.suffix.lstrip(".").lower() or "png")
    except ValueError as exc:  # matplotlib: an unknown format
        raise InputError(f"{path}: cannot write a plot in this format ({exc}); use .png, .svg or .pdf") from exc
    finally:
        plt.close(fig)
    return path
