"""Work for the kernels of a CUDA-graph replay, from the eager step of the same program.

Why: a trace of a replay shows each kernel's name and launch dims but no op and no shapes (the
one ``cudaGraphLaunch`` launched them all), so no floor can be computed from the replay alone.
The kernels a replay runs are the kernels that were captured, and a graph captures what one
eager step of the program launches: same kernels, same launch dims, same order. An eager step
of the same program, in the same trace (warm-up steps before the capture) or in a second trace
(``taxmodel import GRAPH_TRACE --shapes-from EAGER_TRACE``), has the shapes.

The match, per rank (docs/ledger.md 5a, "CUDA-graph replays"):

* An *eager step* is the eager kernels (no graph id) of one (repetition, iteration) in time
  order; a *replay* is the kernels of one graph launch (graph id and the launch's correlation)
  in time order. A kernel's key is (name, grid, block). Steps and replays with the same key
  sequence are taken together (durations: their median per position).
* Each replay is aligned with each eager step, keys paired in order ("position in the step"),
  by the best window: ``w`` per pair (half the replay's length) less one per eager kernel left
  unpaired between the window's first and last pair. A graph replays one contiguous stretch of
  the program, and a profiler step may hold that stretch more than once (the three warm-up runs
  of ``make_graphed_callables``) or next to the same kernels with other work (two batches'
  warm-ups): a plain longest common subsequence could pair a kernel with one of its key a
  stretch away. The steps with the best score are the replay's eager step (several when they
  tie, e.g. a graph of one layer against identical layers).
* A replayed kernel gets the work (``op``, ``dtype``, ``flops``, ``floor_bytes``) of its eager
  counterpart when every best alignment pairs it with an eager kernel (it is never skipped),
  and all the eager kernels it can be paired with had the same work. Otherwise it stays
  uncosted with the reason: no kernel of that name in the eager step; launched with other
  launch dims; no counterpart at its place (the replay runs it more often or in another
  order); ambiguous (eager kernels of different shapes fit its place).
* Shapes that differ are refused, never guessed: where a best alignment leaves kernels of
  the replay and of the eager step of the same name but other launch dims between the same
  aligned neighbours, for ``OTHER_SHAPES_SHARE`` of the replay's kernels or more, the graph was
  captured with other shapes than the eager step (a different batch), and none of that
  replay's kernels is costed from it (kernels whose launch dims do not depend on the batch
  would take the wrong work); fewer are refused alone (other launch dims); and a matched kernel
  whose replayed time differs from its counterpart's by more than ``MAX_TIME_RATIO`` (and more
  than a microsecond, the resolution of older traces) is refused (same launch dims, other work:
  a weight gradient's GEMM has the same grid at any batch).

Collectives (their bus bytes come from their own metadata) and copies (their own size) keep
their costs; tensor-list kernels matched to an eager kernel whose op recorded no shapes keep
the model's launch-grid floor. Matched rows carry ``shapes_from = "eager step"``; the ledger
calls their floors' basis ``shapes from eager step``. ``meta["graph_shapes"]`` has the match
rate and the unmatched kernels per reason.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

#: every replayed kernel's reason starts with this (what the ledger and tests look for)
REPLAY = "CUDA graph replay"
#: ``shapes_from`` of a replayed kernel costed from its eager counterpart
SHAPES_FROM_EAGER = "eager step"
#: a matched kernel whose replayed time is off its eager counterpart's by more than this factor
#: (either way) did other work; same-shape pairs of the committed H200 training step stay within
#: 0.67-1.73 (benchmarks/results/per_kernel_floors.md), a batch-8 replay against a batch-1 step
#: shows 4.2-7.8x on the kernels whose launch dims do not depend on the batch
MAX_TIME_RATIO = 2.0
#: a replay is taken as captured with other shapes than the eager step when at least this share of
#: its kernels run with other launch dims than the eager kernel of the same name at their place:
#: another batch changes every activation-sized kernel's grid (203 of the 793 kernels of the
#: committed batch-8 training step against batch 1, 26%; 180 of 774, 23%, the other way);
#: same-shape pairs have none, and a few (the attention kernel alone at another sequence length,
#: one other kernel choice) leave the others' shapes as they are
OTHER_SHAPES_SHARE = 0.05
#: differences below this are within the whole-microsecond resolution of older traces
TIME_SLACK_NS = 1000
#: the largest alignment (replay kernels x eager-step kernels that share a key) computed: its time
#: (a few seconds); larger pairs are refused
MAX_CELLS = 50_000_000

COST_COLUMNS = ("op", "dtype", "flops", "floor_bytes", "uncosted", "shapes_from")

#: why a replayed kernel has no work from an eager step (key: what ``meta["graph_shapes"]`` counts)
REASONS = {
    "no_eager_step": f"{REPLAY}: no eager step of the program in the trace to take shapes from (trace eager steps "
                     "before the capture, or import with --shapes-from EAGER_TRACE)",
    "no_name": f"{REPLAY}: no kernel of this name in the eager step",
    "other_dims": f"{REPLAY}: launched with other grid/block than this kernel in the eager step",
    "no_place": f"{REPLAY}: no counterpart at this place in the eager step (the replay runs it more often or in "
                "another order)",
    "ambiguous": f"{REPLAY}: ambiguous, eager kernels of different shapes fit this place",
    "other_shapes": f"{REPLAY}: the graph was captured with other shapes than the eager step",
    "time": f"{REPLAY}: its time differs from its eager counterpart's beyond x{MAX_TIME_RATIO:g} (other shapes)",
    "too_long": f"{REPLAY}: replay and eager step too long to align",
}


@dataclass
class _Seq:
    """Identical key sequences of one rank taken together: the rows of each occurrence and, per
    position, the median duration; for eager steps also the work's identity (-1 where the
    occurrences disagree), the median flops and bytes, and one row to read op and dtype from."""

    keys: np.ndarray
    rows: list[np.ndarray] = field(default_factory=list)
    dur: np.ndarray | None = None
    work: np.ndarray | None = None
    flops: np.ndarray | None = None
    nbytes: np.ndarray | None = None


def attach_replay_shapes(events: pd.DataFrame, meta: dict, reference: pd.DataFrame | None = None,
                         reference_name: str | None = None) -> tuple[pd.DataFrame, dict]:
    """``events`` with the work of their replayed kernels taken from eager steps (module
    docstring): the trace's own, and ``reference``'s (another import's events, same ranks; a
    one-rank reference serves a one-rank trace whatever the rank numbers) when given
    (``reference_name`` names it in meta). A trace without replays is returned as it is."""
    kind = events["kind"].to_numpy(object)
    replay = (kind == "kernel") & (events["graph_id"].to_numpy(np.int64) >= 0)
    if not replay.any():
        return events, meta
    events = events.copy(deep=False)  # only whole columns are set below: the others are shared, not copied
    for c, v in (("op_id", -1), ("shapes_from", "")):
        if c not in events.columns:
            events[c] = v
    target = replay & (events["role"].to_numpy(object) != "comm")
    cols = {c: events[c].to_numpy(copy=True) for c in COST_COLUMNS}
    for c, v in (("op", ""), ("dtype", ""), ("flops", -1), ("floor_bytes", -1), ("shapes_from", "")):
        cols[c][target] = v
    cols["uncosted"][target] = REASONS["no_eager_step"]
    outcome = np.full(len(events), "", dtype=object)
    outcome[target] = "no_eager_step"
    eager = _eager_table([events] + ([reference] if reference is not None else []))
    if reference is not None and events["rank"].nunique() == 1 and reference["rank"].nunique() == 1:
        eager["rank"] = events["rank"].iloc[0]
    rank = events["rank"].to_numpy()
    for r in np.unique(rank[target]):
        _match_rank(events, np.flatnonzero(replay & (rank == r)), eager[eager["rank"].to_numpy() == r], cols, outcome)
    for c in COST_COLUMNS:
        events[c] = cols[c]
    meta = dict(meta)
    meta["graph_shapes"] = _summary(events, target, outcome, cols, reference_name)
    return events, meta


def _eager_table(sources: list[pd.DataFrame]) -> pd.DataFrame:
    """The eager kernels (no graph id) of every source, one table: what a step is made of, and
    each kernel's work with its identity (``work``): op, dtype and reason, and for a kernel of
    an op call with several kernels the call's whole flops and bytes, the number of its kernels
    and the kernel's place among them (its own share follows its duration, which varies from
    step to step; the call's work does not)."""
    parts = []
    for k, src in enumerate(sources):
        sel = (src["kind"].to_numpy(object) == "kernel") & (src["graph_id"].to_numpy(np.int64) < 0)
        cols = ["rank", "iteration", "name", "grid", "block", "start_ns", "end_ns", "op", "dtype", "uncosted", "flops",
                "floor_bytes"]
        part = src.loc[sel, cols].copy()
        part["repetition"] = src["repetition"].to_numpy()[sel] if "repetition" in src.columns else 0
        part["op_id"] = src["op_id"].to_numpy()[sel] if "op_id" in src.columns else -1
        part["source"] = k
        parts.append(part)
    e = pd.concat(parts, ignore_index=True)
    call = e["op_id"].to_numpy() >= 0
    g = e[call].groupby(["source", "rank", "op_id"], sort=False)
    whole = e[["flops", "floor_bytes"]].copy()
    n = pd.Series(1, index=e.index)
    place = pd.Series(0, index=e.index)
    whole.loc[call, "flops"] = g["flops"].transform("sum")
    whole.loc[call, "floor_bytes"] = g["floor_bytes"].transform("sum")
    n[call] = g["flops"].transform("size")
    place[call] = g["start_ns"].rank(method="first")
    ident = pd.DataFrame({"op": e["op"].astype(str), "dtype": e["dtype"].astype(str), "why": e["uncosted"].astype(str),
                          "f": whole["flops"], "b": whole["floor_bytes"], "n": n, "place": place})
    e["work"] = _codes(ident)
    return e.reset_index(drop=True)


def _codes(frame: pd.DataFrame) -> np.ndarray:
    """One integer per distinct row of ``frame``."""
    if not len(frame):
        return np.zeros(0, np.int64)
    codes, _ = pd.factorize(pd.MultiIndex.from_frame(frame))
    return codes.astype(np.int64)


def _sequences(frame: pd.DataFrame, keys: np.ndarray, by: list[str], eager: bool) -> list[_Seq]:
    """``frame``'s rows grouped by ``by`` into time-ordered sequences; identical key sequences
    taken together."""
    if not len(frame):
        return []
    sub = frame[by + ["start_ns"]].copy()
    sub["pos"] = np.arange(len(frame))
    sub = sub.sort_values(by + ["start_ns", "pos"], kind="stable")
    dur = (frame["end_ns"].to_numpy() - frame["start_ns"].to_numpy()).astype(np.float64)
    seqs: dict[bytes, _Seq] = {}
    for _, g in sub.groupby(by, sort=False):
        pos = g["pos"].to_numpy()
        seqs.setdefault(keys[pos].tobytes(), _Seq(keys=keys[pos])).rows.append(pos)
    for s in seqs.values():
        s.dur = np.median(np.vstack([dur[p] for p in s.rows]), axis=0)
        if eager:
            w = np.vstack([frame["work"].to_numpy()[p] for p in s.rows])
            s.work = np.where((w == w[0]).all(axis=0), w[0], -1)
            s.flops = np.median(np.vstack([frame["flops"].to_numpy(np.float64)[p] for p in s.rows]), axis=0)
            s.nbytes = np.median(np.vstack([frame["floor_bytes"].to_numpy(np.float64)[p] for p in s.rows]), axis=0)
    return list(seqs.values())


def _match_rank(events: pd.DataFrame, replay_rows: np.ndarray, eager: pd.DataFrame, cols: dict, outcome: np.ndarray) -> None:
    """Match one rank's replays (``replay_rows`` of ``events``) to its eager steps (``eager``)."""
    if not len(eager):
        return
    rep = events.iloc[replay_rows]
    both = pd.concat([rep[["name", "grid", "block"]], eager[["name", "grid", "block"]]], ignore_index=True)
    keys = _codes(both.astype(str))
    rkeys, ekeys = keys[:len(rep)], keys[len(rep):]
    key_name = dict(zip(keys.tolist(), both["name"].astype(str).tolist()))
    steps = _sequences(eager, ekeys, ["source", "repetition", "iteration"], eager=True)
    first_row = {}  # work identity -> an eager row to read op, dtype and reason from
    for w, i in zip(eager["work"].to_numpy().tolist(), range(len(eager))):
        first_row.setdefault(w, i)
    names = set(eager["name"].astype(str))
    role = rep["role"].to_numpy(object)
    for seq in _sequences(rep, rkeys, ["graph_id", "correlation"], eager=False):
        work, flops, nbytes, why = _match_replay(seq, steps, key_name, names)
        for pos in seq.rows:
            keep = role[pos] != "comm"
            rows, w, f, b, y = replay_rows[pos][keep], work[keep], flops[keep], nbytes[keep], why[keep]
            ok = w >= 0
            src = np.array([first_row[int(x)] for x in w[ok]], np.int64)
            for c in ("op", "dtype", "uncosted"):
                cols[c][rows[ok]] = eager[c].to_numpy(object)[src]
            cols["flops"][rows[ok]] = np.where(f[ok] >= 0, np.round(f[ok]), -1).astype(np.int64)
            cols["floor_bytes"][rows[ok]] = np.where(b[ok] >= 0, np.round(b[ok]), -1).astype(np.int64)
            cols["shapes_from"][rows[ok]] = SHAPES_FROM_EAGER
            cols["uncosted"][rows[~ok]] = [REASONS[k] for k in y[~ok]]
            outcome[rows] = np.where(ok, "matched", y)


def _match_replay(rep: _Seq, steps: list[_Seq], key_name: dict, names: set):
    """Per position of the replay: the eager work identity (-1: none), its flops and bytes, and
    the reason's key where there is none."""
    m = len(rep.keys)
    work = np.full(m, -1, np.int64)
    flops = np.full(m, -1.0)
    nbytes = np.full(m, -1.0)
    why = np.full(m, "no_name", dtype=object)
    known = np.array([key_name[k] in names for k in rep.keys.tolist()], bool)
    results = [_align(s.keys, rep.keys) for s in steps]
    best_score = max((r[0] for r in results if r is not None), default=0)
    if best_score == 0:
        why[known] = "too_long" if any(r is None for r in results) else "other_dims"
        return work, flops, nbytes, why
    best = [(s, r) for s, r in zip(steps, results) if r is not None and r[0] == best_score]
    in_best = np.zeros(m, bool)
    for s, _ in best:
        in_best |= np.isin(rep.keys, s.keys)
    why[known & ~in_best] = "other_dims"
    if max(len(_substitutions(s.keys, rep.keys, r[4], key_name)) for s, r in best) >= OTHER_SHAPES_SHARE * m:
        why[:] = "other_shapes"
        return work, flops, nbytes, why
    # every pair on some best alignment with some best step: per replay position, its partners
    pj = np.concatenate([r[2] for _, r in best])
    pw = np.concatenate([s.work[r[1]] for s, r in best])
    pf = np.concatenate([s.flops[r[1]] for s, r in best])
    pb = np.concatenate([s.nbytes[r[1]] for s, r in best])
    pd_ = np.concatenate([s.dur[r[1]] for s, r in best])
    skipped = np.logical_or.reduce([r[3] for _, r in best])
    part = pd.DataFrame({"j": pj, "w": pw, "f": pf, "b": pb, "d": pd_}).groupby("j")
    agg = pd.DataFrame({"kinds": part["w"].nunique(), "w": part["w"].min(), "f": part["f"].median(),
                        "b": part["b"].median(), "d": part["d"].median()})
    why[in_best] = "no_place"
    j = agg.index.to_numpy()
    j_ok = j[in_best[j] & ~skipped[j]]
    a = agg.loc[j_ok]
    one = (a["kinds"].to_numpy() == 1) & (a["w"].to_numpy() >= 0)
    why[j_ok[~one]] = "ambiguous"
    d_e, d_r = a["d"].to_numpy(), rep.dur[j_ok]
    off = (np.abs(d_r - d_e) > TIME_SLACK_NS) & ((d_r > d_e * MAX_TIME_RATIO) | (d_r * MAX_TIME_RATIO < d_e))
    why[j_ok[one & off]] = "time"
    good = one & ~off
    jg = j_ok[good]
    work[jg] = a["w"].to_numpy()[good]
    flops[jg] = a["f"].to_numpy()[good]
    nbytes[jg] = a["b"].to_numpy()[good]
    why[jg] = ""
    return work, flops, nbytes, why


def _substitutions(a: np.ndarray, b: np.ndarray, align: np.ndarray, key_name: dict) -> list[int]:
    """Positions in ``b`` (the replay) where, between the same aligned neighbours, ``a`` (the
    eager step) has a kernel of the same name with other launch dims."""
    out = []
    prev_i, prev_j = -1, -1
    for i, j in list(map(tuple, align)) + [(len(a), len(b))]:
        if j - prev_j > 1 and i - prev_i > 1:
            gap_a = {key_name[k] for k in a[prev_i + 1:i].tolist()}
            out += [prev_j + 1 + t for t, k in enumerate(b[prev_j + 1:j].tolist()) if key_name[k] in gap_a]
        prev_i, prev_j = i, j
    return out


def _align(a: np.ndarray, b: np.ndarray):
    """The best windows of ``a`` (eager step) for ``b`` (replay) by ``_windows``' score:
    (score, the pairs (i, j) that lie on some best alignment, the positions of ``b`` some best
    one leaves unpaired, one best alignment as an (L, 2) array); None when it would take more
    than ``MAX_CELLS`` cells. Keys only one side has never pair, so the alignment is computed
    without them (an eager kernel left out still counts where it lies inside a window)."""
    ka, kb = np.flatnonzero(np.isin(a, b)), np.flatnonzero(np.isin(b, a))
    if len(ka) * len(kb) > MAX_CELLS:
        return None
    skip = np.ones(len(b), bool)
    if not len(ka):
        return 0, ka, kb, skip, np.zeros((0, 2), np.int64)
    score, pi, pj, skip_k, align = _windows(a[ka], b[kb], ka, max(1, (len(b) + 1) // 2))
    skip[kb] = skip_k
    return score, ka[pi], kb[pj], skip, np.stack([ka[align[:, 0]], kb[align[:, 1]]], axis=1)


def _windows(a: np.ndarray, b: np.ndarray, pos: np.ndarray, w: int):
    """``_align`` on sequences that share every key; ``pos``: each eager kernel's place in the
    whole step (the kernels left out lie between them).

    An alignment pairs equal keys in order. Its score is ``w`` per pair minus one per eager
    kernel between its first and last pair that it leaves unpaired (the gaps of its window;
    what lies outside the window is free, so is any replay kernel left unpaired). A graph
    replays one contiguous stretch of the program, and an eager step may hold that stretch more
    than once (warm-up repetitions) or next to a stretch of the same kernels with other work
    (another batch's warm-up): a kernel pairs inside its own stretch. With ``w`` half the
    replay's length, reaching into another repetition of a stretch that holds the replay costs
    more than the pair gains, while a stretch of eager-only kernels inside the window (an
    optimizer's first-step state) is bridged whenever a few pairs follow it.

    ``M[i][j]`` (best score of an alignment whose last pair is (i, j)) =
    ``w + max(0, G[i-1][j-1] - pos[i] + 1)``, where ``G[i][j]`` = max over pairs (i1 <= i,
    j1 <= j) of ``M[i1][j1] + pos[i1]`` (row by row: a running maximum); ``Mb`` the same from the
    ends. (i, j) lies on a best alignment iff ``M + Mb - w`` is the best score; j can be left
    unpaired iff a best alignment pairs only before j, only after j, or around it:
    ``G[i-1][j-1] + max(Mb[i][j2 > j]) - pos[i] + 1`` is the best score for some i. The backward
    pass needs ``G`` row by row from the end: the forward pass keeps every k-th row (k ~ sqrt(n))
    and each block of rows is computed again from its first, so memory stays ~2 sqrt(n) rows."""
    n, m = len(a), len(b)
    at = pd.Series(np.arange(m)).groupby(b).apply(lambda s: s.to_numpy()).to_dict()
    none = np.full(m, -1, np.int64)  # no pair yet (every score is positive)
    neg = np.iinfo(np.int64).min // 4

    def row_step(i: int, prev: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Row i's pair columns, their ``M`` and ``G[i]``, from ``prev`` = ``G[i-1]``."""
        idx = at[int(a[i])]
        before = np.where(idx > 0, prev[np.maximum(idx - 1, 0)], -1)
        mi = w + np.maximum(0, np.where(before >= 0, before - pos[i] + 1, 0))
        g = none.copy()
        g[idx] = mi + pos[i]
        return idx, mi, np.maximum(np.maximum.accumulate(g), prev)

    k = max(1, math.isqrt(n))
    first_of_block = {}  # block start -> G[start - 1]
    best_col = np.full(m, -1, np.int64)  # max M per column
    prev = none
    for i in range(n):
        if i % k == 0:
            first_of_block[i] = prev
        idx, mi, prev = row_step(i, prev)
        best_col[idx] = np.maximum(best_col[idx], mi)
    score = int(best_col.max())
    skip = np.zeros(m, bool)
    skip[1:] = np.maximum.accumulate(best_col)[:-1] == score  # a best alignment pairs only before j
    on_i, on_j, on_m = [], [], []
    gb = np.full(m + 1, neg, np.int64)  # max over pairs (i2 > i, j2 >= j) of Mb[i2][j2] - pos[i2]
    best_col_b = np.full(m, neg, np.int64)
    for start in range(k * ((n - 1) // k), -1, -k):
        block, prev = [], first_of_block[start]
        for i in range(start, min(start + k, n)):
            idx, mi, g = row_step(i, prev)
            block.append((i, idx, mi, prev))
            prev = g
        for i, idx, mi, prev in reversed(block):
            mb = w + np.maximum(0, gb[idx + 1] + pos[i] + 1)
            on = mi + mb - w == score
            on_i.append(np.full(int(on.sum()), i))
            on_j.append(idx[on])
            on_m.append(mi[on])
            row = np.full(m, neg, np.int64)
            row[idx] = mb
            best_col_b = np.maximum(best_col_b, row)
            after = np.full(m, neg, np.int64)  # max Mb[i][j2 > j]
            after[:-1] = np.maximum.accumulate(row[::-1])[::-1][1:]
            left = np.full(m, -1, np.int64)  # G[i-1][j-1]
            left[1:] = prev[:-1]
            skip |= (left >= 0) & (after > neg) & (left + after - pos[i] + 1 == score)
            gb[:m] = np.maximum(np.maximum.accumulate((row - pos[i])[::-1])[::-1], gb[:m])
    skip[:-1] |= np.maximum.accumulate(best_col_b[::-1])[::-1][1:] == score  # ... only after j
    pi, pj, pm = np.concatenate(on_i), np.concatenate(on_j), np.concatenate(on_m)
    return score, pi, pj, skip, _one_best(pi, pj, pm, pos, w, score)


def _one_best(pi: np.ndarray, pj: np.ndarray, pm: np.ndarray, pos: np.ndarray, w: int, score: int) -> np.ndarray:
    """One best alignment of ``_windows`` from the pairs on best alignments (``pm``: each one's
    ``M``). A best alignment's first pair has ``M = w``, its last ``M = score``, and between
    consecutive pairs ``M2 + pos[i2] = M1 + pos[i1] + w + 1`` (a prefix of a best alignment is a
    best one ending there); any such pair after the current one continues a best alignment."""
    v = pm + pos[pi]
    order = np.lexsort((pj, pi, v))
    v, pi, pj, pm = v[order], pi[order], pj[order], pm[order]
    t = int(np.flatnonzero(pm == w)[0])
    out = [(int(pi[t]), int(pj[t]))]
    while pm[t] < score:
        lo, hi = np.searchsorted(v, v[t] + w + 1, "left"), np.searchsorted(v, v[t] + w + 1, "right")
        t = lo + int(np.flatnonzero((pi[lo:hi] > pi[t]) & (pj[lo:hi] > pj[t]))[0])
        out.append((int(pi[t]), int(pj[t])))
    return np.array(out, np.int64).reshape(-1, 2)


def _summary(events: pd.DataFrame, target: np.ndarray, outcome: np.ndarray, cols: dict, reference_name: str | None) -> dict:
    """What ``meta["graph_shapes"]`` says: the replayed kernels, how many (and how much of
    their time) took work from an eager step, and the others per reason."""
    d = (events["end_ns"].to_numpy() - events["start_ns"].to_numpy()).astype(np.int64)
    rows = np.flatnonzero(target)
    total_ns = int(d[rows].sum())
    matched = rows[outcome[rows] == "matched"]
    with_work = matched[(cols["flops"][matched] >= 0) | (cols["floor_bytes"][matched] >= 0)]
    unmatched = {}
    for key in REASONS:
        sel = rows[outcome[rows] == key]
        if len(sel):
            unmatched[key] = {"kernels": int(len(sel)), "ns": int(d[sel].sum()), "reason": REASONS[key]}
    return {
        "eager_steps": "this trace" + (f" and {reference_name}" if reference_name else ""),
        "replayed_kernels": int(len(rows)), "replayed_ns": total_ns,
        "matched": int(len(matched)), "matched_ns": int(d[matched].sum()),
        "matched_with_work": int(len(with_work)), "matched_with_work_ns": int(d[with_work].sum()),
        "match_rate": round(len(matched) / len(rows), 4) if len(rows) else 0.0,
        "matched_time_share": round(float(d[matched].sum()) / total_ns, 4) if total_ns else 0.0,
        "unmatched": unmatched,
    }


def describe(meta: dict) -> str | None:
    """One line for ``taxmodel import``: the match rate of the replayed kernels."""
    g = meta.get("graph_shapes")
    if not isinstance(g, dict) or not g.get("replayed_kernels"):
        return None
    worst = sorted(g.get("unmatched", {}).items(), key=lambda kv: -kv[1].get("ns", 0))[:2]
    rest = "; ".join(f"{v['kernels']} {v['reason'][len(REPLAY) + 2:]}" for _, v in worst)
    return (f"CUDA-graph replays: {g['matched']} of {g['replayed_kernels']} replayed kernels "
            f"({g['matched_time_share'] * 100:.1f}% of their time) matched to the eager step ({g['eager_steps']})"
            + (f"; unmatched: {rest}" if rest else ""))
