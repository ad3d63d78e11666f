"""Bad input: a clear AnalysisError naming the problem, or with lenient=True a ledger of what can
be analyzed plus the list of what was skipped."""
from __future__ import annotations

import pandas as pd
import pytest

from taxmodel.errors import AnalysisError, InputError
from taxmodel.ledger.compute import compute_ledger
from taxmodel.trace.schema import normalize_events
from taxmodel.testing.synthetic import synthetic_bundle


def drop(case, mask):
    ev = case.bundle.events
    case.bundle.events = ev[~mask(ev)].reset_index(drop=True)
    return case


def test_iteration_missing_on_a_rank():
    case = drop(synthetic_bundle(world_size=3, iterations=3), lambda ev: (ev["rank"] == 2) & (ev["iteration"] == 1))
    with pytest.raises(AnalysisError, match=r"iteration 1 .*not on rank\(s\) 2.*--lenient"):
        compute_ledger(case.bundle, case.hardware)
    led = compute_ledger(case.bundle, case.hardware, lenient=True)
    assert sorted(led.windows["iteration"]) == [0, 2]
    assert any("iteration 1" in s for s in led.skipped)
    # the remaining iterations are still exact
    exp = case.expected[case.expected["iteration"] != 1]
    m = led.parts.merge(exp, on=["repetition", "iteration", "rank", "subcategory"], suffixes=("", "_exp"))
    assert len(m) == len(exp) and (m["ns"] == m["ns_exp"]).all()


def test_collective_missing_on_a_rank():
    case = synthetic_bundle(world_size=3, iterations=3)
    ev = case.bundle.events
    victim = ev[(ev["rank"] == 1) & (ev["collective_id"] != "") & (ev["iteration"] == 2)].index
    case.bundle.events = ev.drop(index=victim).reset_index(drop=True)
    with pytest.raises(AnalysisError, match=r"collective 0:2 .*iteration 2.*rank\(s\) 1"):
        compute_ledger(case.bundle, case.hardware)
    led = compute_ledger(case.bundle, case.hardware, lenient=True)
    assert sorted(led.windows["iteration"]) == [0, 1]
    assert any("0:2" in s for s in led.skipped)


def barrier_markers(shifts_rank1):
    rows = []
    for i, sh in enumerate(shifts_rank1):
        for r in (0, 1):
            t = 900_000_000 + i * 10_000_000 + (sh if r == 1 else 0)
            rows.append({"rank": r, "kind": "marker", "role": "other", "name": "taxmodel::clock_barrier",
                         "start_ns": t - 100, "end_ns": t})
    return pd.DataFrame(rows)


def test_barrier_markers_align_clocks():
    case = synthetic_bundle(world_size=2, clock_offsets_ns={1: 777_000}, clock_measured=False, skew_ns=4000)
    ev = case.bundle.events
    case.bundle.events = normalize_events(pd.concat([ev, barrier_markers([-777_000 + d for d in (-10, 0, 10)])]))
    led = compute_ledger(case.bundle, case.hardware)
    assert led.clock.method.startswith("barrier")
    assert led.clock.offsets_ns[1] == 777_000 and led.clock.uncertainty_ns == 10


def test_untrustworthy_clock():
    case = synthetic_bundle(world_size=2, clock_measured=False)
    ev = case.bundle.events
    # barrier exits that disagree by +-5 ms: far more than the ~120 us iteration window
    case.bundle.events = normalize_events(pd.concat([ev, barrier_markers([-5_000_000, 5_000_000] * 3)]))
    with pytest.raises(AnalysisError, match="clock alignment .* uncertain"):
        compute_ledger(case.bundle, case.hardware)
    led = compute_ledger(case.bundle, case.hardware, lenient=True)
    assert any("clock alignment" in s for s in led.skipped)


def test_no_iterations_gives_one_window_over_all_gpu_activity():
    """A trace without iteration markers is not a dead end (ledger/windows.py): each repetition
    gets one window from the first GPU activity on any rank to the last, and says so."""
    case = synthetic_bundle()
    ev = case.bundle.events
    ev["iteration"] = -1
    led = compute_ledger(case.bundle, case.hardware)
    assert any("no iteration markers" in c for c in led.caveats)
    gpu = ev[ev["kind"].isin(["kernel", "memcpy", "memset"])]
    off = gpu["rank"].map(led.clock.offsets_ns).fillna(0)
    spans = pd.DataFrame({"rep": gpu["repetition"], "s": gpu["start_ns"] + off, "e": gpu["end_ns"] + off}).groupby("rep")
    expected = (spans["e"].max() - spans["s"].min()).sort_index().to_numpy()
    assert led.windows.sort_values("repetition")["window_ns"].to_numpy().tolist() == expected.tolist()
    per_rank = led.parts.groupby(["repetition", "iteration", "rank"])["ns"].sum()
    assert (per_rank.groupby(level=0).transform("max") == per_rank).all()


def test_unknown_hardware_with_cost():
    case = synthetic_bundle()
    case.bundle.meta["hardware"] = {"name": "Mystery GPU 9000"}
    with pytest.raises(InputError, match="--hardware"):
        compute_ledger(case.bundle)


def test_unknown_launch_is_unattributed_not_hidden():
    case = drop(synthetic_bundle(host_starved_ns=5000), lambda ev: ev["kind"] == "launch")
    led = compute_ledger(case.bundle, case.hardware)
    assert led.parts.loc[led.parts["subcategory"] == "unattributed", "ns"].sum() > 0
    assert any("no recorded launch call" in c for c in led.caveats)
