"""The report's figures. Each function takes ledgers (and bundles where events are drawn) and
returns a matplotlib Figure, so the same pictures serve the HTML/Markdown reports and notebooks.

Colours come from ``style``: one colour per ledger category, lightness + hatch per sub-part,
greys for kernels. Times are shown in microseconds.
"""
from __future__ import annotations

from typing import Sequence

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Patch, Rectangle  # noqa: E402

from taxmodel.errors import AnalysisError  # noqa: E402
from taxmodel.ledger.categories import LABELS, SUBCATEGORY_ORDER, TAXES  # noqa: E402
from taxmodel.report import compare, style  # noqa: E402
from taxmodel.report.compare import LedgerLike  # noqa: E402
from taxmodel.trace.bundle import Bundle  # noqa: E402
from taxmodel.trace.schema import GPU_KINDS  # noqa: E402

NS_PER_US = 1000.0
_STACK_ORDER = tuple(SUBCATEGORY_ORDER)  # bottom to top: useful first, unattributed last


def _new_figure(width: float, height: float) -> Figure:
    """A figure on an Agg canvas, independent of pyplot (no global state, safe in threads and notebooks)."""
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _legend_handles(parts: Sequence[str]) -> list[Patch]:
    handles = []
    for p in parts:
        st = style.part_style(p)
        handles.append(Patch(facecolor=st.color, hatch=st.hatch, edgecolor=style.EDGE_COLOR, linewidth=0.5, label=st.label))
    return handles


# --- 1. stacked ledger bars -------------------------------------------------------------------

def ledger_bars(ledgers: Sequence[LedgerLike], *, title: str | None = None) -> Figure:
    """Stacked bars of the mean ledger per variant, one panel per (workload, shape).

    The bar height is the mean iteration latency; the useful floor is marked by a black line
    across each bar so the distance from floor to top (everything that is not useful work)
    reads at a glance.
    """
    if not ledgers:
        raise AnalysisError("no ledgers to plot; give at least one bundle")
    with matplotlib.rc_context(style.RC_PARAMS):
        groups = compare.group_by_shape(ledgers)
        means = {id(led): compare.part_means_ns(led) / NS_PER_US for led in ledgers}
        present = [p for p in _STACK_ORDER if any(means[id(led)][p] > 0 for led in ledgers)]
        n = len(groups)
        ncols = min(n, 3)
        nrows = int(np.ceil(n / ncols))
        max_bars = max(len(g) for g in groups.values())
        fig = _new_figure(max(4.8, min(13.0, 1.6 + ncols * (1.0 + 0.85 * max_bars))) + 2.2, 3.4 * nrows + 0.4)
        axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
        varying = _varying_keys([dict(shape) for _, shape in groups])
        ordered = sorted(groups.items(), key=lambda kv: (kv[0][0], sorted(dict(kv[0][1]).items())))
        for ax, ((workload, shape), group) in zip(axes, ordered):
            x = np.arange(len(group))
            bottom = np.zeros(len(group))
            for p in present:
                vals = np.array([means[id(led)][p] for led in group])
                st = style.part_style(p)
                ax.bar(x, vals, bottom=bottom, width=0.62, color=st.color, hatch=st.hatch,
                       edgecolor=style.EDGE_COLOR, linewidth=0.5)
                bottom += vals
            floors = np.array([means[id(led)]["useful"] for led in group])
            ax.hlines(floors, x - 0.39, x + 0.39, colors="black", linewidth=2.0, zorder=5)
            top = bottom.max() if len(bottom) else 1.0
            for xi, total in zip(x, bottom):
                ax.text(xi, total + 0.015 * top, _fmt_us(total), ha="center", va="bottom", fontsize=8)
            ax.set_xticks(x, [compare.identity(led).variant for led in group],
                          rotation=20 if max(len(compare.identity(led).variant) for led in group) > 8 else 0)
            ax.set_ylim(0, top * 1.12)
            ax.set_ylabel("time per iteration (us)")
            shown = {k: v for k, v in dict(shape).items() if k in varying} or dict(shape)
            ax.set_title(f"{workload}\n{compare.shape_label(shown)}", fontsize=9)
            ax.grid(axis="x", visible=False)
        for ax in axes[n:]:
            ax.set_visible(False)
        handles = _legend_handles(list(reversed(present)))
        handles.append(matplotlib.lines.Line2D([], [], color="black", linewidth=2.0, label="Useful floor"))
        fig.legend(handles=handles, loc="outside right upper", title="Ledger (mean per rank)")
        if title:
            fig.suptitle(title)
        return fig


def _varying_keys(shapes: Sequence[dict]) -> set[str]:
    """Shape keys whose value differs between panels: the rest is the same everywhere and only
    makes titles long (it is in the report's metadata)."""
    keys = {k for s in shapes for k in s}
    return {k for k in keys if len({s.get(k) for s in shapes}) > 1}


def _fmt_us(v: float) -> str:
    if v >= 1000:
        return f"{v / 1000:.2f} ms"
    if v >= 100:
        return f"{v:.0f} us"
    return f"{v:.1f} us"


# --- 2. per-rank timeline of one iteration ------------------------------------------------------

def typical_iteration(ledger: LedgerLike, repetition: int = 0) -> int:
    """The iteration whose window is the median one of ``repetition`` (a representative iteration)."""
    w = ledger.windows[ledger.windows["repetition"] == repetition]
    if w.empty:
        raise AnalysisError(f"{ledger.label}: no iterations in repetition {repetition}")
    order = w.sort_values(["window_ns", "iteration"], kind="stable")
    return int(order["iteration"].iloc[(len(order) - 1) // 2])


def iteration_timeline(cases: Sequence[tuple[Bundle, LedgerLike]], *, iteration: int | None = None,
                       repetition: int = 0) -> Figure:
    """One iteration per case (e.g. bsp above fine-grained) on a shared time axis from the window start.

    Per rank: one lane per stream with its kernels (greys by role), and underneath a strip with
    the ledger's intervals in category colours, so a reader sees which idle gap is which tax.
    """
    if not cases:
        raise AnalysisError("no bundles to draw a timeline of")
    with matplotlib.rc_context(style.RC_PARAMS):
        layouts = []
        for bundle, ledger in cases:
            it = typical_iteration(ledger, repetition) if iteration is None else iteration
            win = ledger.windows[(ledger.windows["repetition"] == repetition) & (ledger.windows["iteration"] == it)]
            if win.empty:
                raise AnalysisError(f"{ledger.label}: no iteration {it} in repetition {repetition}; "
                                    f"choose one of {sorted(ledger.windows['iteration'].unique().tolist())}")
            w0, w1 = int(win["start_ns"].iloc[0]), int(win["end_ns"].iloc[0])
            ev = compare.aligned_events(bundle.events[bundle.events["kind"].isin(GPU_KINDS)], ledger)
            ev = ev[(ev["end_ns"] > w0) & (ev["start_ns"] < w1)]
            iv = ledger.intervals
            iv = iv[(iv["repetition"] == repetition) & (iv["iteration"] == it)]
            ranks = sorted(set(int(r) for r in ledger.parts["rank"].unique()) | set(int(r) for r in ev["rank"].unique()))
            lanes = []  # (rank, kind, stream or None)
            for r in ranks:
                for s in sorted(ev.loc[ev["rank"] == r, "stream"].unique()):
                    lanes.append((r, "stream", int(s)))
                lanes.append((r, "ledger", None))
            layouts.append((bundle, ledger, it, w0, w1, ev, iv, lanes))
        heights = [max(1.2, 0.32 * len(lay[7]) + 0.5) for lay in layouts]
        fig = _new_figure(11.0, sum(heights) + 0.9)
        axes = fig.subplots(len(layouts), 1, sharex=True, squeeze=False, height_ratios=heights)[:, 0]
        parts_seen: set[str] = set()
        roles_seen: set[str] = set()
        for ax, (bundle, ledger, it, w0, w1, ev, iv, lanes) in zip(axes, layouts):
            ypos = {lane: len(lanes) - 1 - i for i, lane in enumerate(lanes)}
            for r in sorted({lane[0] for lane in lanes}):
                rank_rows = [ypos[lane] for lane in lanes if lane[0] == r]
                if r % 2 == 1:
                    ax.axhspan(min(rank_rows) - 0.5, max(rank_rows) + 0.5, color="#F4F4F4", zorder=0, linewidth=0)
            for role, g in ev.groupby("role", sort=True):
                st = style.ROLE_STYLES.get(str(role), style.ROLE_STYLES["other"])
                roles_seen.add(str(role))
                for (r, s), gg in g.groupby(["rank", "stream"]):
                    y = ypos[(int(r), "stream", int(s))]
                    spans = list(zip((gg["start_ns"].to_numpy() - w0) / NS_PER_US,
                                     (gg["end_ns"] - gg["start_ns"]).to_numpy() / NS_PER_US))
                    ax.broken_barh(spans, (y - 0.38, 0.76), facecolors=st["color"], hatch=st["hatch"],
                                   edgecolor=style.EDGE_COLOR, linewidth=0.5, zorder=3)
                    _label_wide_kernels(ax, gg, y, w0, w1)
            # Useful/inefficiency first, taxes on top: when intervals overlap, the taxes stay visible.
            for sub in _STACK_ORDER:
                g = iv[iv["subcategory"] == sub]
                if g.empty:
                    continue
                parts_seen.add(sub)
                st = style.part_style(sub)
                for r, gg in g.groupby("rank"):
                    y = ypos.get((int(r), "ledger", None))
                    if y is None:
                        continue
                    spans = list(zip((gg["start_ns"].to_numpy() - w0) / NS_PER_US,
                                     (gg["end_ns"] - gg["start_ns"]).to_numpy() / NS_PER_US))
                    ax.broken_barh(spans, (y - 0.42, 0.84), facecolors=st.color, hatch=st.hatch,
                                   edgecolor="none", linewidth=0, zorder=2)
            ax.axvline((w1 - w0) / NS_PER_US, color="black", linestyle=":", linewidth=1.0, zorder=4)
            ax.set_yticks([ypos[lane] for lane in lanes],
                          [f"rank {lane[0]} · stream {lane[2]}" if lane[1] == "stream" else f"rank {lane[0]} · ledger"
                           for lane in lanes])
            ax.set_ylim(-0.6, len(lanes) - 0.4)
            ax.grid(axis="y", visible=False)
            ident = compare.identity(ledger)
            ax.set_title(f"{ident.variant}: iteration {it} ({_fmt_us((w1 - w0) / NS_PER_US)})", loc="left")
        axes[-1].set_xlabel("time since the iteration's first GPU activity (us, aligned clock)")
        longest = max((lay[4] - lay[3]) for lay in layouts) / NS_PER_US
        axes[-1].set_xlim(0, longest * 1.01)  # work of the neighbouring iterations is cut off at the window
        handles = [Patch(facecolor=style.ROLE_STYLES[r]["color"], hatch=style.ROLE_STYLES[r]["hatch"],
                         edgecolor=style.EDGE_COLOR, linewidth=0.5, label=f"{r} kernel")
                   for r in style.ROLE_STYLES if r in roles_seen]
        handles += _legend_handles([p for p in _STACK_ORDER if p in parts_seen])
        handles.append(matplotlib.lines.Line2D([], [], color="black", linestyle=":", label="window end"))
        fig.legend(handles=handles, loc="outside right upper")
        return fig


def _label_wide_kernels(ax, kernels: pd.DataFrame, y: float, w0: int, w1: int) -> None:
    """Name the kernels whose visible part (inside the window) is wide enough to hold a label,
    so a reader does not need the trace to know them; longer names are cut with an ellipsis."""
    s = np.maximum(kernels["start_ns"].to_numpy(), w0)
    e = np.minimum(kernels["end_ns"].to_numpy(), w1)
    wide = (e - s) >= 0.12 * (w1 - w0)
    for name, a, b in zip(kernels["name"].to_numpy()[wide], s[wide], e[wide]):
        fits = int(0.85 * (b - a) / (w1 - w0) * 110)  # ~110 characters of 7 pt text across the axis
        text = str(name) if len(str(name)) <= fits else str(name)[: max(fits - 1, 3)] + "…"
        ax.text((a + b) / 2 / NS_PER_US - w0 / NS_PER_US, y, text, ha="center", va="center", fontsize=7, zorder=6,
                clip_on=True, bbox={"facecolor": "white", "alpha": 0.85, "edgecolor": "none", "pad": 1.0})


# --- 3. sweeps across problem sizes -------------------------------------------------------------

_SWEEP_PANELS: tuple[str, ...] = ("latency", "speedup") + TAXES + ("compute_inefficiency",)


def sweep(ledgers: Sequence[LedgerLike], *, workload: str | None = None) -> Figure:
    """Latency, speedup over ``bsp`` and each tax against problem size, one line per variant."""
    if workload is None:
        workloads = sorted({compare.identity(led).workload for led in ledgers})
        if len(workloads) != 1:
            raise AnalysisError(f"sweep: ledgers of several workloads ({', '.join(workloads)}); pass workload=")
        workload = workloads[0]
    ledgers = [led for led in ledgers if compare.identity(led).workload == workload]
    if not ledgers:
        raise AnalysisError(f"sweep: no ledgers of workload {workload!r}")
    with matplotlib.rc_context(style.RC_PARAMS):
        shapes: list[tuple] = []
        for led in sorted(ledgers, key=lambda led: compare._size_key(compare.identity(led).shape)):
            sh = compare.identity(led).shape
            if sh not in shapes:
                shapes.append(sh)
        axis = compare.size_axis([dict(s) for s in shapes])
        xpos = dict(zip(shapes, axis.values))
        by_variant = compare.group_by_variant(ledgers)
        variants = sorted({v for (_, v) in by_variant}, key=lambda v: (v != compare.REFERENCE_VARIANT, v))
        ref_latency = {compare.identity(led).shape: compare.mean_window_ns(led)
                       for led in ledgers if compare.identity(led).variant == compare.REFERENCE_VARIANT}
        fig = _new_figure(11.0, 6.4)
        axes = fig.subplots(2, 3, sharex=True).ravel()
        for ax, panel in zip(axes, _SWEEP_PANELS):
            for variant in variants:
                group = by_variant[(workload, variant)]
                xs, ys = [], []
                for led in group:
                    sh = compare.identity(led).shape
                    if panel == "latency":
                        y = compare.mean_window_ns(led) / NS_PER_US
                    elif panel == "speedup":
                        if sh not in ref_latency or variant == compare.REFERENCE_VARIANT:
                            continue
                        y = ref_latency[sh] / compare.mean_window_ns(led)
                    else:
                        y = compare.category_means_ns(led)[panel] / NS_PER_US
                    xs.append(xpos[sh])
                    ys.append(y)
                if xs:
                    ax.plot(xs, ys, label=variant, markersize=5, linewidth=1.6, **style.variant_style(variant, variants))
            if panel == "latency":
                ax.set_title("Latency per iteration")
                ax.set_ylabel("us")
            elif panel == "speedup":
                ax.set_title(f"Speedup over {compare.REFERENCE_VARIANT}")
                ax.axhline(1.0, color="black", linewidth=1.2)
                ax.text(0.01, 1.0, f" {compare.REFERENCE_VARIANT} = 1", transform=ax.get_yaxis_transform(),
                        va="bottom", ha="left", fontsize=8)
                ax.set_ylabel("x (higher is better)")
            else:
                ax.set_title(LABELS[panel])
                ax.set_ylabel("us per iteration (mean per rank)")
                ax.add_patch(Rectangle((0.0, 1.02), 0.035, 0.06, transform=ax.transAxes, clip_on=False,
                                       facecolor=style.part_style(panel).color, edgecolor=style.EDGE_COLOR, linewidth=0.5))
            if axis.log:
                ax.set_xscale("log", base=2)
            ax.set_xticks(axis.values, axis.ticklabels, rotation=30 if max(len(t) for t in axis.ticklabels) > 6 else 0)
            ax.minorticks_off()
            if panel != "speedup":
                ax.set_ylim(bottom=0)
                if not any(line.get_ydata().any() for line in ax.get_lines()):
                    ax.set_ylim(0, 1)
                    ax.text(0.5, 0.5, "zero for every variant", transform=ax.transAxes, ha="center", va="center",
                            color="#666666")
        for ax in axes[3:]:
            ax.set_xlabel(axis.label)
        handles, labels = axes[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside right upper", title="variant")
        fig.suptitle(f"{workload}: sweep over problem size")
        return fig


# --- 4. per-CTA view of a fused kernel -----------------------------------------------------------

def has_cta_records(bundle: Bundle) -> bool:
    ev = bundle.events
    return bool(((ev["kind"] == "record") & (ev["cta"] >= 0)).any())


_WORK_GREYS = ("#4D4D4D", "#9A9A9A", "#D0D0D0", "#6E6E6E", "#B5B5B5")
_WORK_HATCHES = ("", "//", "..", "xx", "\\\\")


def records_with_iteration(events: pd.DataFrame) -> pd.DataFrame:
    """In-kernel records (kind 'record' with a CTA); those without an iteration take the one of the
    kernel they ran inside (same rank, latest kernel starting at or before the record)."""
    rec = events[(events["kind"] == "record") & (events["cta"] >= 0)]
    missing = rec["iteration"].to_numpy() < 0
    if not missing.any():
        return rec
    kernels = events[events["kind"] == "kernel"][["rank", "start_ns", "end_ns", "iteration", "repetition"]]
    kernels = kernels.rename(columns={"start_ns": "k_start", "end_ns": "k_end", "iteration": "k_iteration",
                                      "repetition": "k_repetition"}).sort_values("k_start")
    lost = rec[missing][["rank", "start_ns"]].assign(row=np.flatnonzero(missing)).sort_values("start_ns")
    found = pd.merge_asof(lost, kernels, left_on="start_ns", right_on="k_start", by="rank", direction="backward")
    inside = (found["start_ns"] < found["k_end"]).to_numpy()
    iteration = rec["iteration"].to_numpy().copy()
    repetition = rec["repetition"].to_numpy().copy()
    rows = found["row"].to_numpy()
    iteration[rows[inside]] = found["k_iteration"].to_numpy()[inside]
    repetition[rows[inside]] = found["k_repetition"].to_numpy()[inside]
    return rec.assign(iteration=iteration, repetition=repetition)


def _is_wait(phase: pd.Series) -> np.ndarray:
    return phase.astype(str).str.contains("wait", case=False).to_numpy()


def cta_timeline(bundle: Bundle, *, rank: int | None = None, iteration: int | None = None, repetition: int = 0) -> Figure:
    """In-kernel records of one rank and iteration: per CTA, when it waited on flags and when it worked.

    Left: each CTA's phases over time (wait phases in the flag-wait colour, work in greys).
    Right: total wait vs work per CTA, so stragglers and starved CTAs stand out.
    """
    rec = records_with_iteration(bundle.events)
    if rec.empty:
        raise AnalysisError(f"{bundle.label}: no in-kernel records (kind 'record' with cta); "
                            "profile a fused variant with in-kernel instrumentation to get them")
    if rank is None:
        rank = int(rec["rank"].min())
    rec = rec[(rec["rank"] == rank) & (rec["repetition"] == repetition)]
    if iteration is None:
        its = sorted(int(i) for i in rec["iteration"].unique())
        iteration = its[(len(its) - 1) // 2] if its else -1
    rec = rec[rec["iteration"] == iteration]
    if rec.empty:
        raise AnalysisError(f"{bundle.label}: no in-kernel records on rank {rank}, repetition {repetition}, iteration {iteration}")
    with matplotlib.rc_context(style.RC_PARAMS):
        t0 = int(rec["start_ns"].min())
        wait = _is_wait(rec["phase"])
        wait_phases = sorted(set(rec.loc[wait, "phase"].astype(str)))
        work_phases = sorted(set(rec.loc[~wait, "phase"].astype(str)))
        fw = style.part_style("flag_wait")
        phase_style = {p: (fw.color, fw.hatch) for p in wait_phases}
        for i, p in enumerate(work_phases):
            phase_style[p] = (_WORK_GREYS[i % len(_WORK_GREYS)], _WORK_HATCHES[i % len(_WORK_HATCHES)])
        ctas = sorted(int(c) for c in rec["cta"].unique())
        row = pd.Series(np.arange(len(ctas)), index=ctas)
        fig = _new_figure(11.0, min(9.0, 1.8 + 0.16 * len(ctas)))
        ax, ax_tot = fig.subplots(1, 2, sharey=True, width_ratios=[4, 1])
        bar_h, edge = (0.8, 0.3) if len(ctas) <= 48 else (1.0, 0.0)  # many CTAs: no gaps, or the rows shimmer
        for p, g in rec.groupby("phase"):
            color, hatch = phase_style[str(p)]
            ax.barh(row.loc[g["cta"].astype(int)].to_numpy(), (g["end_ns"] - g["start_ns"]).to_numpy() / NS_PER_US,
                    left=(g["start_ns"].to_numpy() - t0) / NS_PER_US, height=bar_h, color=color, hatch=hatch,
                    edgecolor="none", linewidth=0)
        dur = (rec["end_ns"] - rec["start_ns"]).to_numpy() / NS_PER_US
        totals = pd.DataFrame({"cta": rec["cta"].to_numpy(), "wait": np.where(wait, dur, 0.0), "work": np.where(wait, 0.0, dur)})
        totals = totals.groupby("cta")[["wait", "work"]].sum().reindex(ctas, fill_value=0.0)
        y = np.arange(len(ctas))
        ax_tot.barh(y, totals["work"], color="#7F7F7F", edgecolor=style.EDGE_COLOR, linewidth=edge, height=bar_h,
                    label="work")
        ax_tot.barh(y, totals["wait"], left=totals["work"], color=fw.color, hatch=fw.hatch, edgecolor=style.EDGE_COLOR,
                    linewidth=edge, height=bar_h, label="wait")
        step = max(1, len(ctas) // 24)
        ax.set_yticks(y[::step], [str(c) for c in ctas[::step]])
        ax.set_ylim(-0.6, len(ctas) - 0.4)
        ax.invert_yaxis()
        ax.set_ylabel("CTA (program id)")
        ax.set_xlabel("time since the first record (us)")
        ax.set_xlim(left=0)
        ax.grid(axis="y", visible=False)
        ax_tot.set_xlabel("total per CTA (us)")
        ax_tot.set_title("work (grey) + wait", loc="left")
        ax_tot.grid(axis="y", visible=False)
        share = totals["wait"].sum() / max(totals.to_numpy().sum(), 1e-12)
        ax.set_title(f"{bundle.label}: rank {rank}, iteration {iteration}: {share:.0%} of CTA time waiting on flags", loc="left")
        handles = [Patch(facecolor=phase_style[p][0], hatch=phase_style[p][1], edgecolor=style.EDGE_COLOR,
                         linewidth=0.5, label=p)
                   for p in wait_phases + work_phases]
        fig.legend(handles=handles, loc="outside right upper", title="phase")
        return fig
