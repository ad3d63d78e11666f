"""The figures draw the ledger's numbers (read back from the artists), in the palette's colours,
without overlapping labels."""
import io
from collections import defaultdict

import numpy as np
import pytest
from matplotlib import colors as mcolors
from PIL import Image

from taxmodel.errors import AnalysisError
from taxmodel.report import compare, figures, style


def _overlaps(boxes) -> list:
    boxes = sorted(boxes, key=lambda b: (b[0].x0, b[0].y0))
    bad = []
    for i, (a, ta) in enumerate(boxes):
        for b, tb in boxes[i + 1:]:
            if a.overlaps(b) and min(a.x1, b.x1) - max(a.x0, b.x0) > 1 and min(a.y1, b.y1) - max(a.y0, b.y0) > 1:
                bad.append((ta, tb))
    return bad


def assert_readable(fig):
    """No two tick labels of one axis overlap, and nothing is drawn outside the figure."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        for labels in (ax.get_xticklabels(), ax.get_yticklabels()):
            boxes = [(t.get_window_extent(renderer), t.get_text()) for t in labels if t.get_visible() and t.get_text()]
            assert not _overlaps(boxes), f"overlapping tick labels in {ax.get_title()!r}: {_overlaps(boxes)[:3]}"
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=60)
    img = np.asarray(Image.open(png).convert("L"), dtype=float)
    assert img.std() > 10, "figure looks blank"


def _hex(rgba) -> str:
    return mcolors.to_hex(rgba).lower()


def test_ledger_bars_heights_are_the_mean_ledger(real_cases):
    ledgers = [led for _, led in real_cases]
    fig = figures.ledger_bars(ledgers)
    assert_readable(fig)
    groups = list(compare.group_by_shape(ledgers).values())
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert len(panels) == len(groups) == 2
    palette = {s.color.lower() for s in style.PART_STYLES.values()}
    for ax, group in zip(panels, groups):
        heights = np.zeros(len(group))
        for container in ax.containers:
            heights += [p.get_height() for p in container.patches]
            assert {_hex(p.get_facecolor()) for p in container.patches} <= palette
        expected = [compare.mean_window_ns(led) / 1000 for led in group]
        np.testing.assert_allclose(heights, expected, rtol=1e-12)
        floors = ax.collections[-1].get_segments()  # the useful-floor marks
        np.testing.assert_allclose([seg[0][1] for seg in floors],
                                   [compare.part_means_ns(led)["useful"] / 1000 for led in group], rtol=1e-12)


def _bar_widths_by_row(ax, zorder):
    """Sum of rectangle widths per y row of the broken_barh collections drawn at ``zorder``."""
    out = defaultdict(float)
    for coll in ax.collections:
        if coll.get_zorder() != zorder:
            continue
        for path in coll.get_paths():
            v = path.vertices
            out[round(float((v[:, 1].min() + v[:, 1].max()) / 2), 3)] += float(v[:, 0].max() - v[:, 0].min())
    return out


def test_timeline_ledger_strip_covers_each_rank_window(real_cases):
    pair = [real_cases[0], real_cases[1]]  # bsp and fused at one size
    fig = figures.iteration_timeline(pair)
    assert_readable(fig)
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert len(axes) == 2
    for ax, (bundle, led) in zip(axes, pair):
        it = figures.typical_iteration(led)
        window_us = float(led.windows.set_index("iteration").loc[it, "window_ns"]) / 1000
        labels = {round(float(y), 3): t.get_text() for y, t in zip(ax.get_yticks(), ax.get_yticklabels())}
        strips = _bar_widths_by_row(ax, zorder=2)
        ledger_rows = {y: w for y, w in strips.items() if labels.get(y, "").endswith("ledger")}
        assert len(ledger_rows) == bundle.world_size
        # the real ledger partitions every rank's window, so the strip covers it exactly
        for width in ledger_rows.values():
            assert width == pytest.approx(window_us, rel=1e-9)
        assert f"iteration {it}" in ax.get_title(loc="left")


def test_timeline_clock_offsets_align_ranks(fake_cases):
    """Rank 1's events are recorded ~1 ms off; drawn on the aligned clock they sit inside the window."""
    bundle, led = fake_cases[0]
    fig = figures.iteration_timeline([(bundle, led)], iteration=1)
    ax = fig.axes[0]
    window_us = float(led.windows.set_index("iteration").loc[1, "window_ns"]) / 1000
    for coll in ax.collections:
        if coll.get_zorder() == 3:  # kernels
            for path in coll.get_paths():
                assert -1e-9 <= path.vertices[:, 0].min() and path.vertices[:, 0].max() <= window_us + 1e-9


def test_timeline_unknown_iteration_is_a_clear_error(real_cases):
    with pytest.raises(AnalysisError, match="choose one of"):
        figures.iteration_timeline([real_cases[0]], iteration=99)


def test_sweep_lines_are_latency_and_speedup(real_cases):
    ledgers = [led for _, led in real_cases]
    fig = figures.sweep(ledgers)
    assert_readable(fig)
    latency, speedup = fig.axes[0], fig.axes[1]
    lines = {ln.get_label(): ln for ln in latency.get_lines()}
    by_variant = compare.group_by_variant(ledgers)
    for (_, variant), group in by_variant.items():
        np.testing.assert_allclose(lines[variant].get_ydata(), [compare.mean_window_ns(g) / 1000 for g in group])
    sp = {ln.get_label(): ln for ln in speedup.get_lines() if not ln.get_label().startswith("_")}
    bsp, fused = by_variant[("ag_gemm", "bsp")], by_variant[("ag_gemm", "fused")]
    np.testing.assert_allclose(sp["fused"].get_ydata(),
                               [compare.mean_window_ns(b) / compare.mean_window_ns(f) for b, f in zip(bsp, fused)])
    assert "bsp" not in sp  # the reference is the horizontal line at 1
    tax_titles = [ax.get_title() for ax in fig.axes[2:]]
    assert tax_titles == ["Bulk-synchronous tax", "Data-locality tax", "Launch-overhead tax", "Compute inefficiency"]


def test_size_axis_numeric_for_one_varying_key_else_categorical():
    ax = compare.size_axis([{"M": 1024, "N": 8}, {"M": 16384, "N": 8}])
    assert ax.values == [1024.0, 16384.0] and ax.log and ax.label.startswith("M")
    ax = compare.size_axis([{"M": 1, "N": 2}, {"M": 2, "N": 4}])
    assert ax.values == [0.0, 1.0] and ax.ticklabels == ["M=1 N=2", "M=2 N=4"]


def test_cta_view_of_synthetic_fused_kernel(real_cases):
    bundle, _ = real_cases[1]
    rec = figures.records_with_iteration(bundle.events)
    assert (rec["iteration"] >= 0).all()
    fig = figures.cta_timeline(bundle, rank=0, iteration=1)
    assert_readable(fig)
    mine = rec[(rec["rank"] == 0) & (rec["iteration"] == 1)]
    ax = fig.axes[0]
    bars = [p for c in ax.containers for p in c.patches]
    assert len(bars) == len(mine)
    fw = style.part_style("flag_wait").color.lower()
    waits = [p for p in bars if _hex(p.get_facecolor()) == fw]
    assert len(waits) == int((mine["phase"] == "flag_wait").sum())
    dur = (mine["end_ns"] - mine["start_ns"]).astype(float)
    share = dur[mine["phase"] == "flag_wait"].sum() / dur.sum()
    assert f"{share:.0%} of CTA time waiting" in ax.get_title(loc="left")


def test_cta_view_without_records_says_what_to_do(real_cases):
    with pytest.raises(AnalysisError, match="in-kernel records"):
        figures.cta_timeline(real_cases[0][0])


def test_many_ctas_keep_ticks_readable(fake_cases):
    from fake_ledger import fake_case

    bundle, _ = fake_case("fg_pull", ctas=132)
    assert_readable(figures.cta_timeline(bundle))
