"""Vectorized interval arithmetic for the ledger: no Python loop over events.

Three tools:
- ``expand_to_windows``: pair every activity with every (possibly overlapping) window it
  intersects, by two binary searches instead of a join;
- ``sweep``: cut each group's timeline (one group = one rank in one window) into elementary
  segments at every boundary and count, per segment, how many activities of each class run;
- ``apportion``: lay out integer amounts (useful, locality, ...) one after another along a
  group's segments, for sub-parts that are shares of busy time rather than instants;
plus ``largest_remainder`` to round float shares to integers that keep an exact total.
"""
from __future__ import annotations

import numpy as np

INT64_MAX = np.iinfo(np.int64).max


def order_by_group_then_time(group: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Stable order by (group, t): one argsort of a combined int64 key when it fits (the
    common case), else a two-key lexsort."""
    if len(t) == 0:
        return np.zeros(0, np.int64)
    t0 = int(t.min())
    span = int(t.max()) - t0 + 1
    if int(group.max()) < (2**62) // span and int(group.min()) >= 0:
        return np.argsort(group.astype(np.int64) * span + (t - t0), kind="stable")
    return np.lexsort((t, group))


def expand_to_windows(start: np.ndarray, end: np.ndarray, wstart: np.ndarray, wend: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Indices (activity, window) of every pair whose half-open ranges overlap.

    ``wstart`` must be sorted ascending; window ends need not be (windows may overlap).
    """
    start = np.asarray(start, dtype=np.int64)
    end = np.asarray(end, dtype=np.int64)
    if len(start) == 0 or len(wstart) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    reach = np.maximum.accumulate(wend)  # the furthest any window up to i reaches
    lo = np.searchsorted(reach, start, side="right")  # first window that reaches past the start
    hi = np.searchsorted(wstart, end, side="left")  # windows starting before the end
    count = np.maximum(hi - lo, 0)
    act = np.repeat(np.arange(len(start), dtype=np.int64), count)
    offsets = np.arange(count.sum(), dtype=np.int64) - np.repeat(np.cumsum(count) - count, count)
    win = np.repeat(lo, count) + offsets
    keep = (wend[win] > start[act]) & (wstart[win] < end[act])
    return act[keep], win[keep]


def sweep(group: np.ndarray, start: np.ndarray, end: np.ndarray, cls: np.ndarray, n_classes: int,
          start_key: np.ndarray, bound_group: np.ndarray, bound_start: np.ndarray, bound_end: np.ndarray) -> dict[str, np.ndarray]:
    """Elementary segments of every group's timeline.

    Intervals ``[start, end)`` of class ``cls`` belong to ``group``; every group also has a
    bounding range (``bound_*``, indexed by group id) so that segments cover it completely even
    where nothing runs. ``start_key`` is carried with each interval start; for each segment the
    smallest key among the intervals starting exactly where the segment ends is returned as
    ``next_key`` (INT64_MAX when none starts there): the ledger passes launch-call ends, so an
    idle segment learns the launch of the kernel that ended it.

    Returns arrays over segments: group, start, end, counts (n_seg x n_classes), next_key.
    """
    n = len(start)
    nb = len(bound_group)
    g = np.concatenate([group, group, bound_group, bound_group]).astype(np.int64)
    t = np.concatenate([start, end, bound_start, bound_end]).astype(np.int64)
    key = np.concatenate([np.asarray(start_key, np.int64), np.full(n + 2 * nb, INT64_MAX, np.int64)])
    delta = np.zeros((2 * n + 2 * nb, n_classes), dtype=np.int32)
    idx = np.arange(n)
    delta[idx, cls] = 1
    delta[n + idx, cls] = -1
    order = order_by_group_then_time(g, t)
    g, t, key, delta = g[order], t[order], key[order], delta[order]
    counts = np.cumsum(delta, axis=0)
    same = g[:-1] == g[1:]
    # the smallest key among the points that share (group, t): every point of a run gets it
    run_start = np.flatnonzero(np.r_[True, (g[1:] != g[:-1]) | (t[1:] != t[:-1])])
    run_min = np.minimum.reduceat(key, run_start)
    key = np.repeat(run_min, np.diff(np.r_[run_start, len(t)]))
    seg = np.flatnonzero(same & (t[1:] > t[:-1]))
    return {"group": g[seg], "start": t[seg], "end": t[seg + 1], "counts": counts[seg], "next_key": key[seg + 1]}


def largest_remainder(values: np.ndarray, totals: np.ndarray) -> np.ndarray:
    """Round each row of non-negative ``values`` to integers summing exactly to ``totals``.

    Floors first, then hands the missing units to the largest fractional parts (ties to the
    leftmost column). Values are first rounded to 1e-6 so that float noise in a value that is
    an integer up to rounding never moves a unit.
    """
    values = np.round(np.clip(np.asarray(values, dtype=np.float64), 0.0, None), 6)
    totals = np.asarray(totals, dtype=np.int64)
    if values.size == 0:
        return values.astype(np.int64)
    floors = np.floor(values).astype(np.int64)
    rest = totals - floors.sum(axis=1)
    frac = values - floors
    order = np.argsort(-frac, axis=1, kind="stable")
    pos = np.empty_like(order)
    np.put_along_axis(pos, order, np.broadcast_to(np.arange(values.shape[1]), values.shape).copy(), axis=1)
    floors += (pos < rest[:, None]).astype(np.int64)
    # rest < 0 can only come from values summing above the total: take units back from the largest
    over = rest < 0
    if over.any():
        for i in np.flatnonzero(over):  # pragma: no cover - guarded by the callers' clipping
            while floors[i].sum() > totals[i]:
                floors[i, int(np.argmax(floors[i]))] -= 1
    return floors


def apportion(group: np.ndarray, start: np.ndarray, end: np.ndarray, amounts: np.ndarray,
              amount_group: np.ndarray) -> dict[str, np.ndarray]:
    """Lay out ``amounts[i, j]`` (ns of label j for group ``amount_group[i]``) one label after
    another along the group's segments in time order; return the resulting pieces.

    Segments must be sorted by (group, start) and each group's amounts must sum to the total
    length of its segments. Returns arrays over pieces: group, start, end, label.
    """
    if len(group) == 0:
        z = np.zeros(0, np.int64)
        return {"group": z, "start": z, "end": z, "label": z}
    length = (end - start).astype(np.int64)
    axis_end = np.cumsum(length)
    axis_start = axis_end - length
    # where each group begins on the concatenated busy axis
    first = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
    gids = group[first]
    gpos = axis_start[first]
    row = np.searchsorted(gids, amount_group)
    have = (row < len(gids)) & (gids[np.minimum(row, len(gids) - 1)] == amount_group)
    amounts, row = amounts[have], row[have]
    k = amounts.shape[1]
    cuts_local = np.cumsum(amounts, axis=1)[:, :-1]  # k-1 cut positions inside each group
    cuts = (cuts_local + gpos[row][:, None]).ravel()
    bounds = np.sort(np.concatenate([axis_start, axis_end, cuts]), kind="stable")
    bounds = bounds[np.r_[True, bounds[1:] != bounds[:-1]]]
    p0, p1 = bounds[:-1], bounds[1:]
    seg = np.searchsorted(axis_start, p0, side="right") - 1
    inside = p1 <= axis_end[seg]
    p0, p1, seg = p0[inside], p1[inside], seg[inside]
    # label = number of this group's cuts at or before p0
    grp_row = np.searchsorted(gids, group[seg])
    grp_cut_base = gpos[grp_row]
    # cuts of group row r occupy cuts_local[r]; count those <= p0 - group start
    rel = p0 - grp_cut_base
    rowpos = np.full(len(gids), -1, np.int64)
    rowpos[row] = np.arange(len(row))
    rr = rowpos[grp_row]
    if (rr < 0).any():
        raise ValueError("apportion: a group has segments but no amounts")
    label = np.zeros(len(p0), np.int64)
    for j in range(k - 1):  # k is the handful of labels, not events
        label += (cuts_local[rr, j] <= rel).astype(np.int64)
    t0 = start[seg] + (p0 - axis_start[seg])
    return {"group": group[seg], "start": t0, "end": t0 + (p1 - p0), "label": label}


def merge_adjacent(order_key: np.ndarray, label: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, ...]:
    """Sort pieces by (order_key, start) and join those of the same (order_key, label) that touch
    end to start. Pieces of one key must not overlap (they partition a rank's window)."""
    if len(start) == 0:
        return order_key, label, start, end
    order = order_by_group_then_time(order_key, start)
    key, label, start, end = order_key[order], label[order], start[order], end[order]
    new = np.r_[True, (key[1:] != key[:-1]) | (label[1:] != label[:-1]) | (start[1:] != end[:-1])]
    idx = np.flatnonzero(new)
    last = np.r_[idx[1:], len(start)] - 1
    return key[idx], label[idx], start[idx], end[last]


def covered(start: np.ndarray, end: np.ndarray, q0: np.ndarray, q1: np.ndarray) -> np.ndarray:
    """For each query ``[q0[i], q1[i])``, how much of it the intervals ``[start, end)`` cover;
    the intervals must not overlap one another (a ledger's intervals on one rank do not). From
    the cumulative covered length at each query end (searchsorted): no loop over events."""
    out = np.zeros(len(q0), np.float64)
    if not len(start) or not len(q0):
        return out
    order = np.argsort(start, kind="stable")
    s, e = np.asarray(start, np.int64)[order], np.asarray(end, np.int64)[order]
    cum = np.concatenate([[0], np.cumsum(e - s)])

    def upto(t: np.ndarray) -> np.ndarray:  # covered length in (-inf, t)
        k = np.searchsorted(s, t, side="right")  # intervals starting before t
        last = np.maximum(k - 1, 0)
        partial = np.where(k > 0, np.clip(t - s[last], 0, e[last] - s[last]) - (e[last] - s[last]), 0)
        return cum[k] + partial

    q0, q1 = np.asarray(q0, np.int64), np.asarray(q1, np.int64)
    return (upto(q1) - upto(q0)).astype(np.float64)

