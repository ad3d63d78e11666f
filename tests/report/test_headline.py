"""The headline and comparison tables, on ledgers with hand-picked numbers (exact) and on
random ones (the parts of a saving always add up to the saving)."""
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fake_ledger import ledger_from_parts
from taxmodel.ledger.categories import SUBCATEGORY_ORDER
from taxmodel.report import headline

BSP = {"useful": 50_000, "compute_inefficiency": 10_000, "locality_tax": 4_000, "skew_wait": 6_000,
       "exposed_comm": 20_000, "barrier_idle": 1_000, "launch_latency": 3_000, "kernel_gap": 2_000, "unattributed": 0}
FG = {"useful": 50_000, "compute_inefficiency": 16_000, "locality_tax": 0, "flag_wait": 5_000,
      "barrier_idle": 1_000, "launch_latency": 2_000, "unattributed": 0}
# bsp window 96 us, fg window 74 us: saves 22 us (22.9%); bsp tax 27 - 6 = 21, launch 5 - 2 = 3,
# locality 4 - 0 = 4, efficiency lost 6: 21 + 3 + 4 - 6 = 22.


def test_sentence_exact_numbers():
    ref, fg = ledger_from_parts("bsp", BSP), ledger_from_parts("fg_pull", FG)
    (sentence,) = headline.headlines([fg, ref])
    assert sentence == ("ag_gemm at M=1024: fg_pull saves 22.0 us (22.9%) per iteration over bsp, of which "
                        "BSP tax 21.0 us, launch tax 3.0 us, locality tax 4.0 us; it loses 6.0 us to compute efficiency.")


def test_slower_candidate_and_negative_parts():
    slow = dict(FG, flag_wait=40_000)  # fg pays 35 us more flag wait: window 109 us
    ref, fg = ledger_from_parts("bsp", BSP), ledger_from_parts("fg_push", slow)
    c = headline.compare_ledgers(ref, fg)
    assert c.saved_ns == -13_000
    assert c.category_saved_ns["bsp_tax"] == 27_000 - 41_000
    s = headline.comparison_sentence(c)
    assert "fg_push is 13.0 us (13.5%) slower per iteration than bsp" in s
    assert "BSP tax −14.0 us" in s


def test_other_parts_are_named_not_hidden():
    odd = dict(FG, unattributed=3_000)
    s = headline.comparison_sentence(headline.compare_ledgers(ledger_from_parts("bsp", BSP), ledger_from_parts("fg", odd)))
    assert s.endswith("(other parts: −3.0 us).")


def test_groups_without_reference_describe_each_ledger():
    a = ledger_from_parts("fg_pull", FG)
    b = ledger_from_parts("fg_push", FG)
    lines = headline.headlines([a, b])
    assert lines[0].startswith("ag_gemm/fg_pull at M=1024: 74.0 us per iteration; BSP tax 6.0 us (8.1%)")
    assert "no bsp bundle" in lines[-1]
    # different shapes are never compared
    other = ledger_from_parts("bsp", BSP, shape={"M": 2048})
    assert headline.comparisons([a, other]) == []


def test_comparison_table_totals_and_differences():
    ref, fg = ledger_from_parts("bsp", BSP), ledger_from_parts("fg_pull", FG)
    t = headline.comparison_table([ref, fg]).set_index(["category", "part"])
    assert t.loc[("Bulk-synchronous tax", "total"), "bsp (us)"] == pytest.approx(27.0)
    assert t.loc[("", "Flag wait"), "fg_pull (us)"] == pytest.approx(5.0)
    assert t.loc[("Total", "iteration window"), "fg_pull − bsp (us)"] == pytest.approx(-22.0)
    # parts (not totals) add up to the window in every numeric column
    parts = t.reset_index()
    is_part = (parts["part"] != "total") & (parts["category"] != "Total")
    for col in ("bsp (us)", "fg_pull (us)", "fg_pull − bsp (us)"):
        assert parts.loc[is_part, col].sum() == pytest.approx(parts.loc[~is_part & (parts["category"] == "Total"), col].iloc[0])


def test_ledger_table_percentages():
    t = headline.ledger_table(ledger_from_parts("bsp", BSP))
    parts = t[(t["part"] != "total") & (t["category"] != "Total")]
    assert parts["% of window"].sum() == pytest.approx(100.0)
    assert t.iloc[-1]["mean (us)"] == pytest.approx(96.0)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, 200_000), min_size=2 * len(SUBCATEGORY_ORDER), max_size=2 * len(SUBCATEGORY_ORDER)))
def test_saving_is_the_sum_of_its_parts(values):
    n = len(SUBCATEGORY_ORDER)
    a = dict(zip(SUBCATEGORY_ORDER, values[:n]))
    b = dict(zip(SUBCATEGORY_ORDER, values[n:]))
    if sum(a.values()) == 0 or sum(b.values()) == 0:
        return
    c = headline.compare_ledgers(ledger_from_parts("bsp", a), ledger_from_parts("x", b))
    assert c.saved_ns == sum(a.values()) - sum(b.values())
    total = sum(c.category_saved_ns[t] for t in ("bsp_tax", "launch_tax", "locality_tax")) - c.efficiency_lost_ns + c.other_saved_ns
    assert math.isclose(total, c.saved_ns, abs_tol=1e-6)


def test_a_shape_reads_in_its_bundles_order_and_is_one_shape_whatever_the_order():
    """Headings name a shape in the order its bundle lists it (the workload's, as in the bundle's
    folder name bsp-M96xN40xK40), and bundles that list one shape in two orders (written before
    meta.json kept the order: sorted) are still compared."""
    new = ledger_from_parts("bsp", BSP, shape={"M": 96, "N": 40, "K": 40})
    old = ledger_from_parts("fg_pull", FG, shape={"K": 40, "M": 96, "N": 40})
    (sentence,) = headline.headlines([new, old])
    assert sentence.startswith("ag_gemm at M=96 N=40 K=40: fg_pull saves 22.0 us")


def test_a_locality_tax_that_was_not_measured_says_so_in_the_headline():
    """The headline named an estimated locality tax (declared intermediates x 2 / HBM bandwidth: a
    formula) like a measured one; it now says 'estimated', and 'n/m' where neither exists."""
    ref, fg = ledger_from_parts("bsp", BSP), ledger_from_parts("fg_pull", FG)
    ref.locality, fg.locality = "measured", "estimated"
    (sentence,) = headline.headlines([fg, ref])
    assert "locality tax 4.0 us (estimated, not measured); it loses" in sentence
    fg.locality = "not measured"
    (sentence,) = headline.headlines([fg, ref])
    assert "launch tax 3.0 us, locality tax n/m; it loses" in sentence
    alone = ledger_from_parts("fg_pull", FG)
    alone.locality = "estimated"
    assert "locality tax 0.0 us (0.0%, estimated, not measured)" in headline.ledger_sentence(alone)
    ref.locality = fg.locality = "measured"
    (sentence,) = headline.headlines([fg, ref])
    assert "locality tax 4.0 us; it loses" in sentence
