"""Matching collectives across ranks: the same collective is the same ``collective_id``
(``'<process group>:<sequence>'``) within a repetition.

A collective's time on a rank is the wait until the last member arrived (skew_wait) plus the
transfer; both need every member's instance, so a collective missing on some member is an
error (or, leniently, a reason to skip its iteration). A process group's members are the ranks
that run any collective of that group; a rank that never takes part in a group is not expected
in it, which is how several process groups coexist.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd


@dataclass
class CollectiveMatch:
    """``instances``: one row per (repetition, collective_id, rank) with ``arrival_ns`` (first
    kernel start), ``done_ns`` (last kernel end), ``iteration``; rank-local clock.
    ``incomplete``: one row per collective missing on some member: repetition, collective_id,
    iteration, missing (comma-separated ranks)."""

    instances: pd.DataFrame
    incomplete: pd.DataFrame

    def complete(self) -> pd.DataFrame:
        if self.incomplete.empty:
            return self.instances
        bad = self.incomplete.set_index(["repetition", "collective_id"]).index
        idx = self.instances.set_index(["repetition", "collective_id"]).index
        return self.instances[~idx.isin(bad)]


def match_collectives(gpu: pd.DataFrame) -> CollectiveMatch:
    """Group the GPU rows that carry a collective_id into per-rank instances and find the
    collectives that some member of their process group never ran."""
    return match_instances(collective_instances(gpu))


def collective_instances(gpu: pd.DataFrame) -> pd.DataFrame:
    """One row per (repetition, collective_id, rank) of the GPU rows that carry a collective_id:
    ``arrival_ns`` (first kernel start), ``done_ns`` (last kernel end), ``iteration``; sorted by
    that key. Per rank this is the ledger's first phase: the instances of several ranks
    concatenated and sorted are those of all their rows together."""
    rows = gpu[gpu["collective_id"].astype(str) != ""]
    if rows.empty:
        return pd.DataFrame({"repetition": pd.Series([], dtype="int64"), "collective_id": pd.Series([], dtype=object),
                             "rank": pd.Series([], dtype="int64"), "arrival_ns": pd.Series([], dtype="int64"),
                             "done_ns": pd.Series([], dtype="int64"), "iteration": pd.Series([], dtype="int64")})
    # A groupby-aggregate in numpy (the ledger runs this per rank and bundle: pandas' own costs ms
    # per call): the rows sorted by the key, each group reduced where the key changes.
    cid, names = pd.factorize(rows["collective_id"], sort=True)  # a missing id (code -1) is in no group
    keep = cid >= 0
    rows, cid = rows[keep], cid[keep]
    rep, rank = rows["repetition"].to_numpy(), rows["rank"].to_numpy()
    order = np.lexsort((rank, cid, rep))
    rep, cid, rank = rep[order], cid[order], rank[order]
    first = np.flatnonzero(np.r_[True, (rep[1:] != rep[:-1]) | (cid[1:] != cid[:-1]) | (rank[1:] != rank[:-1])])
    return pd.DataFrame({"repetition": rep[first], "collective_id": np.asarray(names, dtype=object)[cid[first]],
                         "rank": rank[first],
                         "arrival_ns": np.minimum.reduceat(rows["start_ns"].to_numpy()[order], first),
                         "done_ns": np.maximum.reduceat(rows["end_ns"].to_numpy()[order], first),
                         "iteration": np.maximum.reduceat(rows["iteration"].to_numpy()[order], first)})


def match_instances(inst: pd.DataFrame) -> CollectiveMatch:
    """Find, among per-rank instances (``collective_instances``, sorted by repetition,
    collective_id, rank), the collectives that some member of their process group never ran."""
    if inst.empty:
        return CollectiveMatch(inst, pd.DataFrame(columns=["repetition", "collective_id", "iteration", "missing"]))
    inst = inst.copy()
    inst["group"] = inst["collective_id"].astype(str).str.rsplit(":", n=1).str[0]
    n_members = inst.groupby("group")["rank"].nunique()
    per = inst.groupby(["repetition", "collective_id"]).agg(n=("rank", "size"), group=("group", "first"),
                                                            iteration=("iteration", "max"))
    short = per[per["n"].to_numpy() < per["group"].map(n_members).to_numpy()]
    missing = []
    if len(short):  # only the incomplete collectives get their member sets compared
        members = inst.groupby("group")["rank"].agg(lambda s: frozenset(int(r) for r in s))
        have = inst.set_index(["repetition", "collective_id"]).loc[short.index].groupby(level=[0, 1])["rank"].agg(
            lambda s: frozenset(int(r) for r in s))
        missing = [",".join(str(r) for r in sorted(members[g] - have[k])) for k, g in zip(short.index, short["group"])]
    incomplete = pd.DataFrame({
        "repetition": short.index.get_level_values(0).astype("int64"),
        "collective_id": short.index.get_level_values(1),
        "iteration": short["iteration"].astype("int64").to_numpy(),
        "missing": missing,
    })
    return CollectiveMatch(inst.drop(columns="group"), incomplete)


def last_arrivals(instances: pd.DataFrame, offsets_ns: dict[int, int]) -> pd.DataFrame:
    """Per (repetition, collective_id): the aligned time at which the last member arrived."""
    off = instances["rank"].map(offsets_ns).fillna(0).astype("int64").to_numpy()
    aligned = instances.assign(arrival_aligned=instances["arrival_ns"].to_numpy(np.int64) + off)
    return aligned.groupby(["repetition", "collective_id"], as_index=False)["arrival_aligned"].max().rename(
        columns={"arrival_aligned": "last_arrival_ns"})
