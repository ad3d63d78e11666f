"""Vectorized interval helpers against brute-force references on random inputs."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from taxmodel.ledger import intervals as iv


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(0, 40), w=st.integers(1, 8))
def test_expand_to_windows_matches_brute_force(seed, n, w):
    rng = np.random.default_rng(seed)
    s = rng.integers(0, 1000, n)
    e = s + rng.integers(1, 200, n)
    ws = np.sort(rng.integers(0, 1000, w))
    we = ws + rng.integers(1, 400, w)
    a, b = iv.expand_to_windows(s, e, ws, we)
    got = set(zip(a.tolist(), b.tolist()))
    want = {(i, j) for i in range(n) for j in range(w) if s[i] < we[j] and ws[j] < e[i]}
    assert got == want


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 10**6), rows=st.integers(1, 20), k=st.integers(1, 5))
def test_largest_remainder_exact_total(seed, rows, k):
    rng = np.random.default_rng(seed)
    totals = rng.integers(0, 10**6, rows)
    w = rng.random((rows, k))
    vals = w / w.sum(axis=1, keepdims=True) * totals[:, None]
    out = iv.largest_remainder(vals, totals)
    assert (out.sum(axis=1) == totals).all()
    assert (np.abs(out - vals) < 1.0 + 1e-9).all()


def test_apportion_lays_out_in_order():
    group = np.array([0, 0, 1])
    start = np.array([0, 10, 100])
    end = np.array([5, 20, 104])
    out = iv.apportion(group, start, end, np.array([[3, 9, 3], [0, 4, 0]]), np.array([0, 1]))
    pieces = sorted(zip(out["group"].tolist(), out["start"].tolist(), out["end"].tolist(), out["label"].tolist()))
    assert pieces == [(0, 0, 3, 0), (0, 3, 5, 1), (0, 10, 17, 1), (0, 17, 20, 2), (1, 100, 104, 1)]


def test_sweep_counts_and_next_key():
    seg = iv.sweep(np.array([0, 0]), np.array([10, 30]), np.array([20, 40]), np.array([0, 1]), 2, np.array([5, 25]),
                   np.array([0]), np.array([0]), np.array([50]))
    assert seg["start"].tolist() == [0, 10, 20, 30, 40]
    assert seg["counts"].tolist() == [[0, 0], [1, 0], [0, 0], [0, 1], [0, 0]]
    assert seg["next_key"][2] == 25 and seg["next_key"][0] == 5


def test_covered_against_brute_force():
    from taxmodel.ledger.intervals import covered

    rng = np.random.default_rng(7)
    for _ in range(300):
        n = int(rng.integers(0, 8))
        pts = np.sort(rng.choice(300, size=2 * n, replace=False))
        perm = rng.permutation(n)
        s, e = pts[0::2][perm], pts[1::2][perm]
        q0 = rng.integers(0, 300, size=25)
        q1 = q0 + rng.integers(0, 100, size=25)
        want = [sum(max(0, min(b, qb) - max(a, qa)) for a, b in zip(s, e)) for qa, qb in zip(q0, q1)]
        assert covered(s, e, q0, q1).tolist() == want
