"""A Kineto file that holds several ranks (TraceFusion, a renaming merger, a plain concatenation)
is split into its ranks, each the same as its own trace imported alone; one whose GPU activity
cannot be told apart is refused in one line, never read as one rank (issue 36 item 4)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

import kineto_merge_fixtures as merge
from taxmodel.errors import InputError
from taxmodel.ledger.compute import compute_ledger
from taxmodel.trace import importers, json_stream
from taxmodel.trace.bundle import Bundle, make_meta

THIRD = Path(__file__).resolve().parents[1] / "data" / "thirdparty" / "hta"
RANKS = [THIRD / "sampled_rank0_of_128.json.gz", THIRD / "sampled_rank1_of_128.json.gz"]
GPU = ["kernel", "memcpy", "memset"]


def _gpu_rows(events: pd.DataFrame) -> pd.DataFrame:
    g = events[events["kind"].isin(GPU)]
    return g[["rank", "device", "stream", "kind", "name", "start_ns", "end_ns", "iteration", "collective_op"]] \
        .sort_values(["rank", "start_ns", "end_ns", "name"]).reset_index(drop=True)


@pytest.fixture(scope="module")
def separate():
    events, meta, _ = importers.import_traces(RANKS, allow_missing_ranks=True)
    return events, meta


@pytest.mark.parametrize("build", [merge.trace_fusion, merge.renamed_processes, merge.concatenated],
                         ids=["tracefusion", "renamed", "concatenated"])
@pytest.mark.parametrize("window", [None, 64 << 10], ids=["one-batch", "many-batches"])
def test_a_merged_file_is_split_into_its_ranks(tmp_path, monkeypatch, separate, build, window):
    """Split from the columns the streaming reader keeps (never the whole document), the same
    whether the file streams by in one batch of events or in many."""
    if window:
        monkeypatch.setattr(json_stream, "WINDOW_CHARS", window)
    path = build(RANKS, tmp_path / "merged.json.gz")
    events, meta, fmt = importers.import_traces([path], allow_missing_ranks=True)
    assert fmt == "kineto" and meta["ranks"] == [0, 1]
    ref, _ = separate
    pd.testing.assert_frame_equal(_gpu_rows(events), _gpu_rows(ref))
    launches = events[events["kind"] == "launch"].groupby("rank").size()
    assert launches.tolist() == ref[ref["kind"] == "launch"].groupby("rank").size().tolist()
    assert any("holds 2 ranks merged into one file" in n for n in meta["notes"])
    assert [i["rank_source"] for i in meta["inputs"]] == ["merged file", "merged file"]
    assert meta["clock_domain"]["shared"] is not True  # the merge says nothing of hosts: offsets are estimated
    led = compute_ledger(Bundle(events, make_meta(**meta)))
    sums = led.parts.groupby(["repetition", "iteration", "rank"])["ns"].sum()
    windows = led.windows.set_index(["repetition", "iteration"])["window_ns"]
    assert (sums.to_numpy() == windows.reindex(sums.index.droplevel("rank")).to_numpy()).all()
    assert sorted(led.parts["rank"].unique()) == [0, 1]


def test_tracefusion_ranks_keep_their_own_collectives(tmp_path, separate):
    """Each rank's collectives are its own (84 collectives counted once per rank on one timeline
    was the bug): the merged file has as many per rank as its own trace."""
    path = merge.trace_fusion(RANKS, tmp_path / "merged.json.gz")
    events, _, _ = importers.import_traces([path], allow_missing_ranks=True)
    ref, _ = separate
    ids = events[events["collective_id"] != ""].groupby("rank")["collective_id"].nunique()
    assert ids.tolist() == ref[ref["collective_id"] != ""].groupby("rank")["collective_id"].nunique().tolist()


def test_a_merge_whose_gpu_work_cannot_be_told_apart_is_refused(tmp_path):
    path = merge.concatenated(RANKS, tmp_path / "merged.json.gz", drop_correlation=True)
    with pytest.raises(InputError) as err:
        importers.import_traces([path], allow_missing_ranks=True)
    msg = str(err.value)
    assert "\n" not in msg and "merged.json.gz" in msg and "processes launched GPU work" in msg
    assert "import each rank's own trace" in msg


def test_one_processs_trace_is_not_split():
    events, meta, _ = importers.import_traces(RANKS[:1], allow_missing_ranks=True)
    assert meta["ranks"] == [0] and not any("merged" in n for n in meta["notes"])


def test_an_op_that_records_a_rank_does_not_make_a_trace_a_merge(tmp_path):
    """Only a file whose every GPU activity carries args.rank is a TraceFusion merge."""
    import gzip
    import json

    doc = json.load(gzip.open(RANKS[1]))
    ops = [e for e in doc["traceEvents"] if isinstance(e, dict) and e.get("cat") == "cpu_op"]
    for e in ops[:50]:
        e.setdefault("args", {})["rank"] = 5
    path = tmp_path / "rank1.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(doc, f)
    _, meta, _ = importers.import_traces([path], allow_missing_ranks=True)
    assert meta["ranks"] == [1] and not any("merged" in n for n in meta["notes"])
