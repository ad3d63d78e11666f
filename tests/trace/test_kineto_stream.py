"""The streaming Kineto reader (issue 38: a 533 MB job took 148 s and 4.1 GB, a sparse 3 GiB file
6.4 GB): the same events whatever the chunk and window sizes, the slow path where a cut would fall
inside a string, and huge or hollow files refused from their first bytes."""
from __future__ import annotations

import json
import os
import resource
import time

import pandas as pd
import pytest

from kineto_fixtures import REAL_RANKS, build_trace, write_trace
from taxmodel import limits
from taxmodel.errors import InputError
from taxmodel.trace import importers, json_stream, kineto


def _import(paths):
    events, meta, _ = importers.import_traces(paths)
    return events, meta


@pytest.mark.parametrize("chunk,window", [(1009, 613), (64, 37), (7, 3)])
def test_any_chunk_and_window_size_gives_the_same_bundle(tmp_path, monkeypatch, chunk, window):
    doc, _ = build_trace(0, 1)
    # names that look like event boundaries to the fast path: a "}," inside a string
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel":
            e["name"] = e["name"] + '}, {"ph": "X"},'
    path = write_trace(tmp_path / "r.json", doc)
    want_events, want_meta = _import([path])
    monkeypatch.setattr(json_stream, "CHUNK_BYTES", chunk)
    monkeypatch.setattr(json_stream, "WINDOW_CHARS", window)
    events, meta = _import([path])
    pd.testing.assert_frame_equal(events, want_events)
    assert {k: v for k, v in meta.items() if k != "created"} == {k: v for k, v in want_meta.items() if k != "created"}
    assert any("}, {" in n for n in events["name"])


def test_real_gzipped_traces_read_as_one_document(monkeypatch):
    """The stream and a whole-document parse of the same real trace agree event for event."""
    monkeypatch.setattr(json_stream, "WINDOW_CHARS", 4096)
    stream = json_stream.TraceStream(REAL_RANKS[0])
    events = [e for batch in stream.batches() for e in batch]
    doc = {**stream.top, "traceEvents": events}
    with open(REAL_RANKS[0], "rb") as f:
        import gzip

        whole = json.loads(gzip.decompress(f.read()), parse_float=str, parse_constant=lambda _: None)
    assert doc == whole


def test_a_hollow_sparse_file_is_refused_from_its_first_bytes(tmp_path):
    path = tmp_path / "rank0.json"
    with open(path, "wb") as f:
        f.write(b'{"traceEvents": [')
        f.truncate(3 * 2 ** 30)  # 3 GiB that occupy no disk: NUL bytes after the header
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.monotonic()
    with pytest.raises(InputError, match="not valid JSON"):
        kineto.read([path])
    assert time.monotonic() - t0 < 10
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200 * 1024  # KiB: far below the file
    os.environ[limits.BUDGET_ENV] = str(2 ** 30)
    try:
        with pytest.raises(InputError, match=r"the trace amounts to more than 1,073,741,824 bytes"):
            kineto.read([path])
    finally:
        del os.environ[limits.BUDGET_ENV]


def test_damage_is_named_as_before(tmp_path):
    doc, _ = build_trace(0, 1)
    text = json.dumps(doc)
    path = tmp_path / "r.json"
    path.write_text(text[: len(text) // 2])
    with pytest.raises(InputError, match="the file looks truncated"):
        kineto.read([path])
    path.write_text(text.replace("}, {", "} oops {", 1))
    with pytest.raises(InputError, match=r"the file is not valid JSON \(Expecting ',' delimiter at line 1 column"):
        kineto.read([path])
