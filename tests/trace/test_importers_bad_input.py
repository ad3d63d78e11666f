"""Bad input gets one clear InputError naming the file and the problem -- never a traceback,
never a partial bundle. The property tests feed mangled traces to the whole import."""
from __future__ import annotations

import copy
import gzip
import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kineto_fixtures import build_trace, write_ranks, write_trace
from taxmodel.errors import BundleError, InputError
from taxmodel.trace import importers, schema
from taxmodel.trace.bundle import load_bundle


def _import_error(paths, **kwargs) -> str:
    with pytest.raises(InputError) as err:
        importers.import_traces(paths, **kwargs)
    msg = str(err.value)
    assert "\n" not in msg
    return msg


def test_missing_file_and_directory(tmp_path):
    assert _import_error([tmp_path / "nope.json"]) == f"{tmp_path / 'nope.json'}: no such file"
    assert "not a file" in _import_error([tmp_path])


def test_empty_and_non_json_files(tmp_path):
    empty = tmp_path / "empty.json"
    empty.write_text("")
    assert _import_error([empty]).startswith(f"{empty}: the file is empty")
    junk = tmp_path / "junk.json"
    junk.write_text("hello, I am not a trace")
    assert _import_error([junk]).startswith(f"{junk}: format not recognized")
    assert "not valid JSON" in _import_error([junk], fmt="kineto")
    binary = tmp_path / "bin.json"
    binary.write_bytes(b'{"traceEvents": [\xff\xfe]}')
    assert "not a text JSON file" in _import_error([binary], fmt="kineto")


def test_unknown_format_name_lists_the_known_ones(tmp_path):
    paths, _ = write_ranks(tmp_path)
    msg = _import_error(paths, fmt="nonsense")
    assert "unknown trace format 'nonsense'" in msg and "kineto" in msg


@pytest.mark.parametrize("gz", [False, True])
def test_truncated_file(tmp_path, gz):
    paths, _ = write_ranks(tmp_path, gz=gz)
    data = paths[1].read_bytes()
    paths[1].write_bytes(data[: len(data) * 2 // 3])
    msg = _import_error(paths)
    assert msg.startswith(f"{paths[1]}: ")
    assert ("truncated" in msg) or ("damaged" in msg)


def test_no_trace_events_list(tmp_path):
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"schemaVersion": 1, "traceEvents": {"not": "a list"}}))
    assert "no 'traceEvents' list" in _import_error([p])


def test_no_gpu_events_names_the_file(tmp_path):
    paths, _ = write_ranks(tmp_path)
    doc = json.loads(paths[1].read_text())
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset")]
    paths[1].write_text(json.dumps(doc))
    assert _import_error(paths).startswith(f"{paths[1]}: no GPU events")


def test_ranks_missing(tmp_path):
    docs = [build_trace(r, 4)[0] for r in (0, 1, 3)]
    paths = [write_trace(tmp_path / f"r{r}.json", d) for r, d in zip((0, 1, 3), docs)]
    msg = _import_error(paths)
    assert "ranks {2} of world size 4 are missing (got {0, 1, 3})" in msg and "--allow-missing-ranks" in msg
    events, meta, _ = importers.import_traces(paths, allow_missing_ranks=True)
    assert meta["ranks"] == [0, 1, 3] and meta["world_size"] == 4


def test_ranks_duplicated(tmp_path):
    a = write_trace(tmp_path / "a.json", build_trace(0, 2)[0])
    b = write_trace(tmp_path / "b.json", build_trace(0, 2)[0])
    assert _import_error([a, b]) == (f"{b}: rank 0 is duplicated (also in {a}); give each rank's trace once")


def test_mixed_world_sizes(tmp_path):
    a = write_trace(tmp_path / "a.json", build_trace(0, 2)[0])
    b = write_trace(tmp_path / "b.json", build_trace(1, 4)[0])
    msg = _import_error([a, b])
    assert "different world sizes" in msg and f"{a} says 2" in msg and f"{b} says 4" in msg


def test_rank_outside_world(tmp_path):
    a = write_trace(tmp_path / "a.json", build_trace(0, 2)[0])
    b = write_trace(tmp_path / "b.json", build_trace(5, 2)[0])
    assert _import_error([a, b]) == f"{b}: rank 5 is outside world size 2"


def test_negative_gpu_duration(tmp_path):
    doc, _ = build_trace(0, 1)
    kern = next(e for e in doc["traceEvents"] if e.get("name") == "gemm_kernel")
    kern["dur"] = -1.5
    p = write_trace(tmp_path / "t.json", doc)
    msg = _import_error([p])
    assert msg.startswith(f"{p}: kernel 'gemm_kernel'") and "negative duration (-1500 ns)" in msg


def test_zero_gpu_duration_is_kept_as_one_ns_with_a_note(tmp_path):
    """Integer-microsecond Kineto writes sub-microsecond kernels as lasting 0: they ran."""
    doc, _ = build_trace(0, 1)
    kerns = [e for e in doc["traceEvents"] if e.get("name") == "gemm_kernel"]
    for k in kerns:
        k["dur"] = 0
    events, meta, _ = importers.import_traces([write_trace(tmp_path / "t.json", doc)])
    gemm = events[events["name"] == "gemm_kernel"]
    assert len(gemm) == len(kerns) and ((gemm["end_ns"] - gemm["start_ns"]) == 1).all()
    assert any(f"{len(kerns)} of " in n and "zero duration" in n for n in meta["notes"])


def test_negative_host_duration(tmp_path):
    doc, _ = build_trace(0, 1)
    next(e for e in doc["traceEvents"] if e.get("name") == "cudaLaunchKernel")["dur"] = -2
    p = write_trace(tmp_path / "t.json", doc)
    assert "launch 'cudaLaunchKernel'" in _import_error([p]) and "negative duration (-2000 ns)" in _import_error([p])


def test_timestamps_going_backwards_on_a_stream(tmp_path):
    doc, _ = build_trace(0, 1)
    gemms = [e for e in doc["traceEvents"] if e.get("name") == "gemm_kernel"]
    # the second step's GEMM (enqueued later) now starts before the first one started
    gemms[1]["ts"] = gemms[0]["ts"] - 1.0
    p = write_trace(tmp_path / "t.json", doc)
    msg = _import_error([p])
    assert msg.startswith(f"{p}: timestamps go backwards on device 0 stream 7")
    assert f"correlation {gemms[1]['args']['correlation']}" in msg


def test_overlap_on_a_stream_is_not_going_backwards(tmp_path):
    # programmatic dependent launch: a kernel may start before the previous one on its stream ended
    doc, _ = build_trace(0, 1)
    gemms = [e for e in doc["traceEvents"] if e.get("name") == "gemm_kernel"]
    copies = [e for e in doc["traceEvents"] if e.get("cat") == "gpu_memcpy"]
    gemms[1]["ts"] = copies[0]["ts"] + 1.0  # inside the 3 us memcpy enqueued just before it
    events, _, _ = importers.import_traces([write_trace(tmp_path / "t.json", doc)])
    assert len(events[events["name"] == "gemm_kernel"]) == 3  # one per step


def test_check_stream_order_other_streams_are_independent():
    import pandas as pd

    def frame(starts):
        return schema.normalize_events(pd.DataFrame({
            "rank": [0, 0, 0], "device": [0, 0, 0], "stream": [7, 9, 7], "kind": ["kernel"] * 3,
            "start_ns": starts, "end_ns": [s + 5 for s in starts], "correlation": [1, 2, 3]}))

    importers.check_stream_order(frame([100, 50, 200]))  # stream 9's row starts earlier: another stream
    with pytest.raises(InputError, match="rank 0: timestamps go backwards on device 0 stream 7.*correlation 3"):
        importers.check_stream_order(frame([100, 50, 90]))


def test_bad_iteration_pattern(tmp_path):
    paths, _ = write_ranks(tmp_path)
    assert "needs one group" in _import_error(paths, iteration_pattern=r"ProfilerStep#\d+")
    assert "not a valid regular expression" in _import_error(paths, iteration_pattern=r"(")


def test_damaged_rank_field(tmp_path):
    doc, _ = build_trace(0, 1)
    doc["distributedInfo"]["rank"] = -3
    assert "not a valid rank" in _import_error([write_trace(tmp_path / "t.json", doc)])
    doc["distributedInfo"]["rank"] = 0
    doc["distributedInfo"]["world_size"] = 10**12
    assert "not a valid world size" in _import_error([write_trace(tmp_path / "t.json", doc)])


def test_failed_import_leaves_no_bundle_and_keeps_an_old_one(tmp_path):
    paths, _ = write_ranks(tmp_path)
    out = tmp_path / "bundle"
    importers.import_bundle(paths, out)
    before = (out / "events.parquet").read_bytes()
    paths[1].write_text(paths[1].read_text()[:100])
    with pytest.raises(InputError, match="truncated|not valid JSON|not recognized"):
        importers.import_bundle(paths, out, force=True)
    assert (out / "events.parquet").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    with pytest.raises(InputError):
        importers.import_bundle(paths, tmp_path / "new")
    assert not (tmp_path / "new").exists()


# --- property tests: mangled traces -----------------------------------------------------------------

_BASE = [build_trace(r, 2, steps=2)[0] for r in range(2)]
_JUNK = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                  st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8),
                  st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
_KEYS = ["ph", "cat", "name", "pid", "tid", "ts", "dur", "args"]
_ARG_KEYS = ["correlation", "device", "stream", "grid", "block", "bytes", "Collective name", "In msg nelems",
             "Out msg nelems", "dtype", "Process Group Name", "Seq", "graph id"]
_TOP_KEYS = ["distributedInfo", "deviceProperties", "cuda_runtime_version", "traceEvents"]


def _outcome_is_valid(paths: list[Path]) -> None:
    """The import either succeeds with a bundle that loads and validates, or raises one of ours."""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            bundle, _ = importers.import_bundle(paths, Path(tmp) / "b", keep_raw=False)
        except (InputError, BundleError) as exc:
            assert str(exc) and "\n" not in str(exc)
            assert not (Path(tmp) / "b").exists()
            return
        loaded = load_bundle(Path(tmp) / "b")
        schema.validate_events(loaded.events)
        assert len(loaded.events) == len(bundle.events)
        assert loaded.events["kind"].isin(schema.GPU_KINDS).any()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(which=st.integers(0, 1), fraction=st.floats(0.0, 1.0), gz=st.booleans())
def test_truncation_at_any_offset(which, fraction, gz):
    with tempfile.TemporaryDirectory() as tmp:
        paths = [write_trace(Path(tmp) / f"r{r}.json", d, gz=gz) for r, d in enumerate(_BASE)]
        data = paths[which].read_bytes()
        paths[which].write_bytes(data[: int(len(data) * fraction)])
        _outcome_is_valid(paths)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_field_deletions_and_type_changes(data):
    docs = copy.deepcopy(_BASE)
    for _ in range(data.draw(st.integers(1, 6), label="edits")):
        doc = docs[data.draw(st.integers(0, 1), label="rank")]
        where = data.draw(st.sampled_from(["event", "arg", "top", "dist"]), label="where")
        delete = data.draw(st.booleans(), label="delete")
        value = data.draw(_JUNK, label="value")
        if where == "top":
            target, key = doc, data.draw(st.sampled_from(_TOP_KEYS))
        elif where == "dist":
            target, key = doc.get("distributedInfo"), data.draw(st.sampled_from(["rank", "world_size"]))
        else:
            events = doc.get("traceEvents")
            if not isinstance(events, list) or not events:
                continue
            target = events[data.draw(st.integers(0, len(events) - 1), label="event")]
            if where == "arg":
                target = target.get("args") if isinstance(target, dict) else None
                key = data.draw(st.sampled_from(_ARG_KEYS))
            else:
                key = data.draw(st.sampled_from(_KEYS))
        if not isinstance(target, dict):
            continue
        if delete:
            target.pop(key, None)
        else:
            target[key] = value
    with tempfile.TemporaryDirectory() as tmp:
        paths = [write_trace(Path(tmp) / f"r{r}.json", d) for r, d in enumerate(docs)]
        _outcome_is_valid(paths)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pos=st.integers(0, 10**9), byte=st.integers(0, 255))
def test_random_byte_corruption(pos, byte):
    with tempfile.TemporaryDirectory() as tmp:
        paths = [write_trace(Path(tmp) / f"r{r}.json", d) for r, d in enumerate(_BASE)]
        raw = bytearray(paths[0].read_bytes())
        raw[pos % len(raw)] = byte
        paths[0].write_bytes(bytes(raw))
        _outcome_is_valid(paths)


def test_gzip_with_damaged_body(tmp_path):
    paths, _ = write_ranks(tmp_path, gz=True)
    raw = bytearray(paths[0].read_bytes())
    for i in range(40, 60):
        raw[i] ^= 0xFF
    paths[0].write_bytes(bytes(raw))
    msg = _import_error(paths)
    assert msg.startswith(f"{paths[0]}: ")
    with gzip.open(paths[1]) as f:  # the other file is intact
        json.load(f)
