"""Terminal tables fit 120 characters; what does not fit is named under the table and shown by
--wide (and is in --json): the side-by-side of four variants, the per-rank ledger of 8 ranks, the
advisor's table."""
from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from taxmodel.cli import cli
from taxmodel.ledger.categories import SUBCATEGORY_ORDER
from taxmodel.report.terminal import TERMINAL_WIDTH

PROFILES = Path(__file__).resolve().parents[2] / "profiles"
FOUR_VARIANTS = sorted((PROFILES / "h200x4" / "ag_gemm").glob("*-M8192xN8192xK8192xtp0"))  # bsp, pull, push, torch_fused
EIGHT_RANKS = PROFILES / "h200x8-graph-gate" / "gemm_rs" / "bsp-M8192xN8192xK8192"
ADVISED = PROFILES / "h200x4-graph-gate" / "gemm_rs" / "bsp-M8192xN8192xK8192"


def _tables(text: str) -> list[list[str]]:
    """The tables of a command's output: a header, its dashes, its rows (up to a blank line)."""
    lines, out = text.splitlines(), []
    for i in range(1, len(lines)):
        if lines[i].startswith("----") and lines[i - 1].strip():
            end = next((j for j in range(i + 1, len(lines)) if not lines[j].strip()), len(lines))
            out.append(lines[i - 1:end])
    return out


def _run(*args: str) -> str:
    r = CliRunner().invoke(cli, list(args))
    assert r.exit_code == 0, r.output
    return r.output


def test_four_variants_side_by_side_fit_and_wide_shows_every_column():
    assert len(FOUR_VARIANTS) == 4
    narrow = _run("analyze", *map(str, FOUR_VARIANTS))
    tables = _tables(narrow)
    assert len(tables) == 5  # one ledger each, then the side-by-side
    assert all(len(line) <= TERMINAL_WIDTH for t in tables for line in t), max(len(x) for t in tables for x in t)
    side = tables[-1]
    assert side[0].split("  ")[0:1] == ["category"] and "torch_fused − bsp (us)" in side[0]
    assert side[-1].startswith("(left out to fit 120 characters: pull (us), push (us), torch_fused (us)")
    wide = _tables(_run("analyze", "--wide", *map(str, FOUR_VARIANTS)))[-1]
    assert "torch_fused (us)" in wide[0] and max(len(line) for line in wide) > TERMINAL_WIDTH
    assert not wide[-1].startswith("(left out")


def test_the_per_rank_ledger_has_a_column_per_rank():
    out = _run("analyze", "--per-rank", str(EIGHT_RANKS))
    per_rank = _tables(out)[1]
    assert per_rank[0].split() == ["part", *[w for r in range(8) for w in ("rank", str(r))]]
    assert per_rank[2].startswith("Useful work (roofline floor)") and len(per_rank) == 2 + len(SUBCATEGORY_ORDER)
    assert all(len(line) <= TERMINAL_WIDTH for line in per_rank)


def test_the_advisors_table_fits_and_wide_adds_the_rest():
    narrow = _run("advise", str(ADVISED))
    assert all(len(line) <= TERMINAL_WIDTH for line in narrow.splitlines()), narrow
    (table,) = _tables(narrow)
    assert table[0].split() == ["kind", "kernels", "bound_us", "bound_pct", "predicted_saving_us", "saving_range_us",
                                "confidence"]
    assert table[2].startswith("GEMM+RS")
    (wide,) = _tables(_run("advise", "--wide", str(ADVISED)))
    assert {"action", "ops", "bsp_tax_us", "missing"} <= set(wide[0].split())
