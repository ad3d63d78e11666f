"""rocprofv3 JSON / CSV / rocpd import, sniffing, rocprofiler capture availability, and the
equivalence of one trace imported from every format (Kineto, nsys, rocprofv3)."""
from __future__ import annotations

import gzip
import importlib.util
import json
import shutil
import sqlite3
import sys
from pathlib import Path

import pandas as pd
import pytest

from taxmodel.errors import InputError, UnavailableError
from taxmodel.trace import importers, rocpd, rocprof, rocprof_csv, rocprofiler_capture
from taxmodel.trace import sqlite_input as sq
from taxmodel.trace import vendor_common as vc

HERE = Path(__file__).resolve().parent
DATA = HERE.parent / "data" / "rocprof"
NSYS = HERE.parent / "data" / "nsys"
sys.path.insert(0, str(HERE))
import vendor_scenario as sc  # noqa: E402


def _load_builder(path: Path, name: str):
    """The fixture builder module of a data folder (both folders name theirs build_fixtures.py)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


rb = _load_builder(DATA / "build_fixtures.py", "rocprof_build_fixtures")

JSON = DATA / "two_ranks_results.json"
DBS = [DATA / "rank0_results.db", DATA / "rank1_results.db"]
CSVS = sorted((DATA / "csv").glob("*.csv"))


def _expected(bytes_known: bool = True) -> pd.DataFrame:
    e = sc.expected_events()
    if not bytes_known:
        e.loc[e["kind"] == "memcpy", "bytes"] = -1
    return sc.comparable(e)


def _names(events: pd.DataFrame) -> dict[str, list[str]]:
    return events.groupby("kind")["name"].agg(lambda s: sorted(set(s))).to_dict()


def test_json_gives_the_scenario_exactly():
    events, meta = rocprof.read([JSON])
    pd.testing.assert_frame_equal(sc.comparable(events), _expected())
    assert meta["source"] == "rocprof" and meta["ranks"] == [0, 1] and meta["hardware"]["vendor"] == "amd"
    assert meta["hardware"]["name"] == "AMD Instinct MI300X"
    names = _names(events)
    assert names["kernel"] == sorted({sc.GEMM, sc.NCCL_AMD})
    assert names["launch"] == ["hipLaunchKernel", "hipMemcpyAsync"] and names["sync"] == ["hipDeviceSynchronize"]
    assert names["memcpy"] == ["Memcpy HtoD"] and names["marker"] == ["ProfilerStep#1", "ProfilerStep#2"]


def test_grid_in_work_items_becomes_blocks():
    events, _ = rocprof.read([JSON])
    gemm = events[(events["kind"] == "kernel") & (events["name"] == sc.GEMM)]
    assert set(gemm["grid"]) == {"16,8,1"} and set(gemm["block"]) == {"256,1,1"}  # stored as 4096,8,1 work-items
    assert vc.blocks_from_work_items(pd.Series([4097, 256, 1]), pd.Series([256, 256, 0])).tolist() == [17, 1, 1]


def test_csv_of_two_rocprofv3_layouts_gives_the_scenario():
    events, meta = rocprof_csv.read(CSVS)
    pd.testing.assert_frame_equal(sc.comparable(events), _expected(bytes_known=False))  # CSV copies carry no bytes
    assert [i["ranks"] for i in meta["inputs"]] == [[0], [1]]
    assert set(events.loc[events["kind"] == "kernel", "device"]) == {0, 1}  # agent_info.csv and 'GPU n' both map
    assert _names(events)["marker"] == ["ProfilerStep#1", "ProfilerStep#2"]


def test_csv_group_without_kernels_is_an_error(tmp_path):
    only_api = [p for p in CSVS if "hip_api" in p.name]
    with pytest.raises(InputError, match="kernel_trace"):
        rocprof_csv.read(only_api)


def test_rocpd_gives_the_scenario_and_reads_ranks_from_the_environment(tmp_path):
    events, meta = rocpd.read(DBS)
    pd.testing.assert_frame_equal(sc.comparable(events), _expected())
    assert meta["capture"]["rank_assignment"].startswith("ranks read from the trace")
    assert meta["software"]["rocpd_schema_version"] == "3.0.3"
    swapped = [rb.write_rocpd(tmp_path / f"r{r}.db", r, env_rank=1 - r) for r in sc.RANKS]
    ev2, _ = rocpd.read(swapped)
    k = ev2[ev2["kind"] == "kernel"]
    assert set(k.loc[k["rank"] == 0, "device"]) == {1} and set(k.loc[k["rank"] == 1, "device"]) == {0}


def test_rocpd_without_views_reads_the_uuid_tables(tmp_path):
    dbs = [rb.write_rocpd(tmp_path / f"r{r}.db", r, views=False) for r in sc.RANKS]
    assert not any(n == "rocpd_kernel_dispatch" for n in sq.sqlite_object_names(dbs[0], importers.read_head(dbs[0])))
    events, meta = rocpd.read(dbs)
    pd.testing.assert_frame_equal(sc.comparable(events), _expected())
    assert meta["capture"]["rank_assignment"].startswith("ranks numbered by order")  # no RANK in the environment


def test_rocpd_missing_table_or_column_is_named(tmp_path):
    db = rb.write_rocpd(tmp_path / "a.db", 0, views=False)
    with sqlite3.connect(db) as conn:
        table = next(n for (n,) in conn.execute("SELECT name FROM sqlite_master") if n.startswith("rocpd_kernel_dispatch"))
        conn.execute(f'DROP TABLE "{table}"')
    with pytest.raises(InputError, match="rocpd table 'rocpd_kernel_dispatch' is missing"):
        rocpd.read([db])
    db = rb.write_rocpd(tmp_path / "b.db", 0, views=False)
    with sqlite3.connect(db) as conn:
        table = next(n for (n,) in conn.execute("SELECT name FROM sqlite_master") if n.startswith("rocpd_event"))
        conn.execute(f'ALTER TABLE "{table}" DROP COLUMN stack_id')
    with pytest.raises(InputError, match="'rocpd_event' lacks column.*'stack_id'"):
        rocpd.read([db])


def test_json_without_records_is_named(tmp_path):
    bad = tmp_path / "x_results.json"
    bad.write_text(json.dumps({"rocprofiler-sdk-tool": [{"metadata": {"pid": 1}}]}))
    with pytest.raises(InputError, match="lacks 'buffer_records'"):
        rocprof.read([bad])


def test_formats_are_detected_by_content(tmp_path):
    disguised = tmp_path / "rank0.sqlite"
    shutil.copy(JSON, disguised)
    assert importers.detect_format(disguised) == "rocprof-json"
    packed = tmp_path / "results.json.gz"
    packed.write_bytes(gzip.compress(JSON.read_bytes()))
    assert importers.detect_format(packed) == "rocprof-json"
    pd.testing.assert_frame_equal(sc.comparable(rocprof.read([packed])[0]), _expected())
    txt = tmp_path / "kernels.txt"
    shutil.copy(DATA / "csv" / "4001_kernel_trace.csv", txt)
    assert importers.detect_format(txt) == "rocprof-csv"
    db = tmp_path / "trace.json"
    shutil.copy(DBS[0], db)
    assert importers.detect_format(db) == "rocpd"
    assert importers.detect_format(NSYS / "rank0.sqlite") == "nsys"
    head = importers.read_head(NSYS / "rank0.sqlite")
    assert not rocpd.sniff(NSYS / "rank0.sqlite", head, sq.sqlite_object_names(NSYS / "rank0.sqlite", head))



@pytest.mark.parametrize("db", [DBS[0], NSYS / "rank0.sqlite"], ids=["rocpd", "nsys"])
def test_detecting_a_database_opens_it_once(db, monkeypatch):
    """Its tables are listed once, for the refusals and every sniffer (each listed them anew)."""
    opened = []
    real = sq.sqlite_connection
    monkeypatch.setattr(sq, "sqlite_connection", lambda path: opened.append(path) or real(path))
    assert importers.detect_format(db) in ("rocpd", "nsys")
    assert opened == [db]

# --- the same trace from every tool --------------------------------------------------------

def _kineto_trace(rank: int) -> dict:
    """The scenario as torch.profiler would write it (ts/dur in us with ns decimals)."""
    rec = sc.records(rank)
    us = lambda ns: ns / 1000  # noqa: E731
    ev = []
    for m in rec["markers"]:
        ev.append({"ph": "X", "cat": "user_annotation", "name": m["name"], "pid": sc.pid(rank), "tid": sc.pid(rank),
                   "ts": us(m["start"]), "dur": us(m["end"] - m["start"]), "args": {}})
    for c in rec["calls"]:
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": sc.API["cuda"][c["api"]], "pid": sc.pid(rank),
                   "tid": sc.pid(rank), "ts": us(c["start"]), "dur": us(c["end"] - c["start"]),
                   "args": {"correlation": c["corr"]}})
    for k in rec["kernels"]:
        args = {"correlation": k["corr"], "device": rank, "stream": k["stream"], "grid": list(k["grid"]),
                "block": list(k["block"])}
        if k["stream"] == sc.NCCL_STREAM:
            args.update({"Collective name": "_allgather_base", "Process Group Name": "0", "Group size": 2,
                         "dtype": "BFloat16", "In msg nelems": 1024, "Out msg nelems": 2048})
        ev.append({"ph": "X", "cat": "kernel", "name": k["name"], "pid": rank, "tid": k["stream"], "ts": us(k["start"]),
                   "dur": us(k["end"] - k["start"]), "args": args})
    for c in rec["copies"]:
        ev.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "pid": rank,
                   "tid": c["stream"], "ts": us(c["start"]), "dur": us(c["end"] - c["start"]),
                   "args": {"correlation": c["corr"], "device": rank, "stream": c["stream"], "bytes": c["bytes"]}})
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": len(sc.RANKS)},
            "traceEvents": ev}


@pytest.fixture
def kineto_files(tmp_path):
    paths = []
    for r in sc.RANKS:
        p = tmp_path / f"rank{r}.json"
        p.write_text(json.dumps(_kineto_trace(r)))
        paths.append(p)
    return paths


def _all_formats(kineto_files) -> dict[str, list[Path]]:
    return {"kineto": kineto_files, "nsys": [NSYS / "rank0.sqlite", NSYS / "rank1.sqlite"], "rocpd": DBS,
            "rocprof-json": [JSON], "rocprof-csv": CSVS}


def test_every_format_yields_the_same_events(kineto_files):
    ref = None
    for fmt, paths in _all_formats(kineto_files).items():
        events, _, got = importers.import_traces(paths)
        assert got == fmt
        cols = [c for c in sc.COMPARED if c not in ("collective_id", "bytes")]  # Kineto names groups; CSV has no bytes
        table = sc.comparable(events)[cols].sort_values(cols).reset_index(drop=True)
        if ref is None:
            ref = table
        pd.testing.assert_frame_equal(table, ref, obj=fmt)


def test_every_format_yields_the_same_ledger(kineto_files):
    ledger_mod = pytest.importorskip("taxmodel.ledger.compute")
    from taxmodel.hardware.specs import find_preset
    from taxmodel.trace.bundle import Bundle, make_meta

    spec = find_preset("h200-calibrated")
    parts = {}
    for fmt, paths in _all_formats(kineto_files).items():
        events, meta, _ = importers.import_traces(paths)
        ledger = ledger_mod.compute_ledger(Bundle(events, make_meta(**meta)), hardware=spec)
        p = ledger.parts.copy()
        # a copy's floor comes from its recorded size, which the CSV lacks: useful and compute_inefficiency
        # may trade a few ns between formats; their sum (the local busy time) may not
        p.loc[p["subcategory"] == "useful", "subcategory"] = "compute_inefficiency"
        p = p.groupby(["repetition", "iteration", "rank", "category", "subcategory"], as_index=False)["ns"].sum()
        p["category"] = p["category"].where(p["subcategory"] != "compute_inefficiency", "compute_inefficiency")
        p = p.groupby(["repetition", "iteration", "rank", "category", "subcategory"], as_index=False)["ns"].sum()
        parts[fmt] = p.sort_values(["repetition", "iteration", "rank", "subcategory"]).reset_index(drop=True)
    ref = parts["kineto"]
    assert ref["iteration"].unique().tolist() == [1, 2] and ref["ns"].sum() > 0
    for fmt, p in parts.items():
        pd.testing.assert_frame_equal(p, ref, obj=fmt)


# --- capture through rocprofiler-sdk -------------------------------------------------------

def test_rocprofiler_tracer_says_why_it_is_unavailable_and_what_to_use():
    from taxmodel.trace import capture

    reason = rocprofiler_capture.available()
    assert isinstance(reason, str) and "rocprofiler" in reason
    with pytest.raises(UnavailableError) as info:
        capture.get_tracer("rocprofiler")
    assert "--tracer torch" in str(info.value) and "rocprofv3" in str(info.value)
    assert capture.get_tracer("torch").name == "torch"


def test_rocprofiler_availability_follows_the_sdk(monkeypatch):
    monkeypatch.setattr(rocprofiler_capture, "_importable", lambda m: True)
    assert "cannot record a kernel timeline" in rocprofiler_capture.available()
    monkeypatch.setattr(rocprofiler_capture, "_trace_api", lambda: object())
    assert rocprofiler_capture.available() is None
    assert rocprofiler_capture.RocprofilerTracer.unavailable_reason() is None
    events, meta = rocprofiler_capture.RocprofilerTracer.read(DBS)
    pd.testing.assert_frame_equal(sc.comparable(events), _expected())


def test_csv_copies_only_are_local_copies_on_the_gpu_end(tmp_path):
    """A copies-only rocprofv3 CSV (``--memory-copy-trace``, no agent_info.csv) imports: host
    agents are not GPUs, so HtoD/DtoH copies are local ``copy`` work on the GPU end and only a
    copy between two different GPUs is communication."""
    p = tmp_path / "1234_memory_copy_trace.csv"
    p.write_text(
        '"Kind","Direction","Stream_Id","Source_Agent_Id","Destination_Agent_Id","Correlation_Id",'
        '"Start_Timestamp","End_Timestamp"\n'
        '"MEMORY_COPY","MEMORY_COPY_HOST_TO_DEVICE",0,"Agent 0","Agent 1",1,1000,2000\n'
        '"MEMORY_COPY","MEMORY_COPY_DEVICE_TO_HOST",0,"Agent 1","Agent 0",2,3000,3500\n'
        '"MEMORY_COPY","MEMORY_COPY_DEVICE_TO_DEVICE",0,"Agent 1","Agent 2",3,4000,4200\n')
    events, _, fmt = importers.import_traces([p])
    copies = events[events["kind"] == "memcpy"].sort_values("start_ns")
    assert fmt == "rocprof-csv"
    assert copies["name"].tolist() == ["Memcpy HtoD", "Memcpy DtoH", "Memcpy PtoP"]
    assert copies["role"].tolist() == ["copy", "copy", "comm"]
    assert copies["device"].tolist() == [1, 1, 2]  # the GPU end; a peer copy is booked on its destination


def test_rccl_call_arguments_in_rocpd_give_collectives_their_size(tmp_path):
    """rocprofv3's callback tracing keeps API arguments in ``rocpd_arg``: an ``ncclAllGather`` whose
    time range holds the RCCL kernel's launch gives its size (sendcount x datatype); the group is not
    recorded, so the link floor is the fewest bytes any group carries (2 ranks: one payload)."""
    path = rb.write_rocpd(tmp_path / "r0.db", 0, env_rank=0)
    uuid = "_0199c0de_7a3b_7000_8000_000000000000"
    guid = "0199c0de-7a3b-7000-8000-000000000000"
    conn = sqlite3.connect(path)
    conn.execute(f'CREATE TABLE "rocpd_arg{uuid}" (id INTEGER PRIMARY KEY, guid TEXT NOT NULL, event_id INTEGER, '
                 'position INTEGER, type TEXT, name TEXT, value TEXT, extdata JSONB)')
    conn.execute(f'CREATE VIEW "rocpd_arg" AS SELECT * FROM "rocpd_arg{uuid}"')
    name_id = conn.execute(f'INSERT INTO "rocpd_string{uuid}" (guid, string) VALUES (?, ?)', (guid, "ncclAllGather")).lastrowid
    cat = conn.execute(f'INSERT INTO "rocpd_string{uuid}" (guid, string) VALUES (?, ?)', (guid, "RCCL_API")).lastrowid
    nccl = [k for k in sc.records(0, vendor="amd")["kernels"] if "ccl" in k["name"].lower()]
    calls = {c["corr"]: c for c in sc.records(0, vendor="amd")["calls"]}
    p = sc.pid(0)
    for k in nccl:
        c = calls[k["corr"]]
        ev = conn.execute(f'INSERT INTO "rocpd_event{uuid}" (guid, category_id, stack_id, parent_stack_id, correlation_id, '
                          'extdata) VALUES (?, ?, 0, 0, 0, \'{}\')', (guid, cat)).lastrowid
        conn.execute(f'INSERT INTO "rocpd_region{uuid}" (guid, nid, pid, tid, start, "end", name_id, event_id, extdata) '
                     "VALUES (?, 1, ?, ?, ?, ?, ?, ?, '{}')", (guid, p, p, c["start"] - 100, c["end"] + 100, name_id, ev))
        for pos, (n, v) in enumerate((("sendbuff", "0x7f00"), ("sendcount", "262144"), ("datatype", "ncclBfloat16"))):
            conn.execute(f'INSERT INTO "rocpd_arg{uuid}" (guid, event_id, position, type, name, value) VALUES (?, ?, ?, ?, ?, ?)',
                         (guid, ev, pos, "", n, v))
    conn.commit()
    conn.close()
    events, _, _ = importers.import_traces([path], allow_missing_ranks=True)
    comm = events[(events["kind"] == "kernel") & (events["role"] == "comm")]
    assert len(comm) == len(nccl) > 0
    assert (comm["floor_bytes"] == 262144 * 2).all() and (comm["bytes"] == 2 * 262144 * 2).all()
    assert (comm["uncosted"] == "").all()


def test_rccl_call_arguments_name_their_collective_and_size():
    assert vc.call_from_args("ncclAllReduce", {"count": "1024", "datatype": "ncclFloat32"}) == ("allreduce", 4096)
    assert vc.call_from_args("ncclReduceScatter", {"recvcount": "16", "datatype": "9"}) == ("reduce_scatter", 32)  # bf16 by value
    assert vc.call_from_args("ncclGroupStart", {}) == ("", -1)
    assert vc.call_from_args("ncclAllGather", {"sendcount": "16"}) == ("allgather", -1)  # no datatype: size unknown
