"""nsys SQLite import: exact events from the fixtures, schema variants, clear errors, sniffing."""
from __future__ import annotations

import gzip
import importlib.util
import shutil
import sqlite3
import sys
from pathlib import Path

import pandas as pd
import pytest

from taxmodel.errors import InputError
from taxmodel.trace import importers, nsys
from taxmodel.trace import sqlite_input as sq
from taxmodel.trace import vendor_common as vc
from taxmodel import vocabulary

HERE = Path(__file__).resolve().parent
DATA = HERE.parent / "data" / "nsys"
sys.path.insert(0, str(HERE))
import vendor_scenario as sc  # noqa: E402


def _load_builder(path: Path, name: str):
    """The fixture builder module of a data folder (both folders name theirs build_fixtures.py)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


nb = _load_builder(DATA / "build_fixtures.py", "nsys_build_fixtures")

PER_RANK = [DATA / "rank0.sqlite", DATA / "rank1.sqlite"]


def _read(paths, **kw):
    events, meta = nsys.read([Path(p) for p in paths], **kw)
    return events, meta


def test_per_rank_files_give_the_scenario_exactly():
    events, meta = _read(PER_RANK)
    pd.testing.assert_frame_equal(sc.comparable(events), sc.comparable(sc.expected_events()))
    assert meta["ranks"] == [0, 1] and meta["world_size"] == 2 and meta["source"] == "nsys"
    assert meta["hardware"]["name"] == "NVIDIA H200" and meta["hardware"]["num_sms"] == 132
    assert meta["inputs"] == [{"file": str(PER_RANK[0]), "ranks": [0]}, {"file": str(PER_RANK[1]), "ranks": [1]}]
    # names: demangled kernel names, API version suffix stripped, CUPTI-style copy names
    names = events.groupby("kind")["name"].agg(lambda s: sorted(set(s)))
    assert names["kernel"] == sorted({sc.GEMM, sc.NCCL_NVIDIA})
    assert names["launch"] == ["cudaLaunchKernel", "cudaMemcpyAsync"]
    assert names["sync"] == ["cudaDeviceSynchronize"]
    assert names["memcpy"] == ["Memcpy HtoD (Pinned -> Device)"]
    assert names["marker"] == ["ProfilerStep#1", "ProfilerStep#2"]
    # times: session-relative ns + utcEpochNs gives back the scenario's absolute ns
    k = events[(events["kind"] == "kernel") & (events["rank"] == 1) & (events["correlation"] == 22)].iloc[0]
    assert (int(k["start_ns"]), int(k["end_ns"])) == (sc.base(1) + sc.ITERATION_NS + 12_000, sc.base(1) + sc.ITERATION_NS + 31_000)
    assert set(events.loc[events["kind"] == "kernel", "stream"]) == {sc.GEMM_STREAM, sc.NCCL_STREAM}
    assert set(events.loc[events["kind"] == "launch", "stream"]) == {sc.pid(0), sc.pid(1)}  # host rows: thread id


def test_one_file_with_several_processes_ranks_by_gpu_and_keeps_extras():
    events, meta = _read([DATA / "two_process.sqlite"])
    assert meta["ranks"] == [0, 1]
    assert "rank 0 = pid 4000 on GPU 0" in meta["capture"]["rank_assignment"]
    extra = (events["correlation"] % 10 >= 5) & (events["correlation"] >= 10)
    pd.testing.assert_frame_equal(sc.comparable(events[~extra]), sc.comparable(sc.expected_events()))
    ex = events[extra]
    assert len(ex) == 2 * (2 + 2 + 3)  # per iteration: memset+call, driver launch+kernel, graph launch+2 kernels
    assert (ex["rank"] == 0).all()
    memset = ex[ex["kind"] == "memset"]
    assert memset["name"].tolist() == ["Memset (Device)"] * 2 and memset["bytes"].tolist() == [1024, 1024]
    assert memset["iteration"].tolist() == [1, 2] and (memset["role"] == "copy").all()
    driver = ex[(ex["kind"] == "launch") & (ex["correlation"] % 10 == 6)]
    assert driver["name"].tolist() == ["cuLaunchKernel"] * 2
    graph = ex[ex["correlation"] % 10 == 7]
    assert graph.groupby("kind").size().to_dict() == {"kernel": 4, "launch": 2}  # one launch per graph
    assert set(graph.loc[graph["kind"] == "kernel", "graph_id"]) == {3}
    assert set(ex.loc[ex["name"] == "_triton_fused_kernel", "graph_id"]) == {-1}
    # the launcher (no GPU work), the 'forward' range and the instantaneous NVTX mark are not rows
    assert not (events["name"] == "cudaMalloc").any()
    assert set(events.loc[events["kind"] == "marker", "name"]) == {"ProfilerStep#1", "ProfilerStep#2"}
    assert len(events) == 36 + 14


def test_mpi_ranks_table_decides_ranks(tmp_path):
    path = nb.write_nsys(tmp_path / "mpi.sqlite", sc.RANKS, mpi_ranks={0: 1, 1: 0})
    events, meta = _read([path])
    assert meta["capture"]["rank_assignment"].startswith("ranks read from the trace")
    gpu = events[events["kind"] == "kernel"]
    assert set(gpu.loc[gpu["rank"] == 1, "device"]) == {0} and set(gpu.loc[gpu["rank"] == 0, "device"]) == {1}


def test_older_schema_without_optional_columns_and_tables(tmp_path):
    drop = {"CUPTI_ACTIVITY_KIND_KERNEL": ("globalPid", "demangledName", "graphId", "greenContextId"),
            "CUPTI_ACTIVITY_KIND_MEMCPY": ("globalPid", "srcKind", "dstKind", "srcDeviceId", "dstDeviceId")}
    path = nb.write_nsys(tmp_path / "old.sqlite", (0,), drop_columns=drop, session_start=False,
                         omit_tables=("CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_DRIVER"))
    events, meta = _read([path])
    expected = sc.expected_events()
    pd.testing.assert_frame_equal(sc.comparable(events), sc.comparable(expected[expected["rank"] == 0]))
    assert set(events.loc[events["kind"] == "kernel", "name"]) == {sc.GEMM, sc.NCCL_NVIDIA.split("(")[0]}  # shortName
    assert set(events.loc[events["kind"] == "memcpy", "name"]) == {"Memcpy HtoD (Unknown -> Unknown)"}
    assert any("no globalPid" in n for n in meta["notes"])
    assert meta["capture"]["time_base"] == "session start"


def test_missing_runtime_table_gives_no_launch_rows_and_a_note(tmp_path):
    path = nb.write_nsys(tmp_path / "noapi.sqlite", (0,), omit_tables=("CUPTI_ACTIVITY_KIND_RUNTIME",))
    events, meta = _read([path])
    assert not events["kind"].isin(["launch", "sync"]).any()
    assert any("CUPTI_ACTIVITY_KIND_RUNTIME" in n for n in meta["notes"])
    # without launches, GPU rows fall back to the marker range holding their start
    gemm = events[(events["kind"] == "kernel") & (events["correlation"] == 11)]
    assert gemm["iteration"].tolist() == [1]
    late_copy = events[(events["kind"] == "memcpy") & (events["correlation"] == 13)]
    assert late_copy["iteration"].tolist() == [-1]  # starts after its host range ended


@pytest.mark.parametrize("omit,drop,needle", [
    (("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"), None,
     "none of the GPU activity tables CUPTI_ACTIVITY_KIND_KERNEL"),
    ((), {"CUPTI_ACTIVITY_KIND_KERNEL": ("correlationId",)}, "'CUPTI_ACTIVITY_KIND_KERNEL' lacks column(s) 'correlationId'"),
    ((), {"CUPTI_ACTIVITY_KIND_KERNEL": ("demangledName", "shortName", "mangledName")}, "no kernel-name column"),
    ((), {"CUPTI_ACTIVITY_KIND_RUNTIME": ("nameId", "globalTid")}, "lacks column(s) 'globalTid', 'nameId'"),
])
def test_missing_tables_and_columns_are_named(tmp_path, omit, drop, needle):
    path = nb.write_nsys(tmp_path / "bad.sqlite", (0,), omit_tables=omit, drop_columns=drop)
    with pytest.raises(InputError) as info:
        _read([path])
    assert needle in str(info.value) and "bad.sqlite" in str(info.value)


def test_format_is_detected_by_content_not_name(tmp_path):
    disguised = tmp_path / "trace.json"
    shutil.copy(DATA / "rank0.sqlite", disguised)
    assert importers.detect_format(disguised) == "nsys"
    packed = tmp_path / "rank0.sqlite.gz"
    packed.write_bytes(gzip.compress((DATA / "rank0.sqlite").read_bytes()))
    assert importers.detect_format(packed) == "nsys"
    events, _ = _read([packed, DATA / "rank1.sqlite"])
    pd.testing.assert_frame_equal(sc.comparable(events), sc.comparable(sc.expected_events()))
    plain = tmp_path / "other.sqlite"
    with sqlite3.connect(plain) as conn:
        conn.execute("CREATE TABLE t (x INTEGER)")
    head = importers.read_head(plain)
    assert not nsys.sniff(plain, head, sq.sqlite_object_names(plain, head))
    with pytest.raises(InputError, match="format not recognized"):
        importers.detect_format(plain)


def test_dispatcher_imports_and_checks(tmp_path):
    events, meta, fmt = importers.import_traces([str(p) for p in PER_RANK])
    assert fmt == "nsys" and meta["world_size"] == 2 and len(events) == 36


def test_iteration_pattern_option():
    events, _ = _read(PER_RANK, iteration_pattern=r"Step#(\d+)")
    assert sorted(events.loc[events["kind"] == "marker", "iteration"].unique()) == [1, 2]
    with pytest.raises(InputError, match="iteration"):
        _read(PER_RANK, iteration_pattern=r"ProfilerStep#\d+")


@pytest.mark.parametrize("name,role,op", [
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "comm", "allgather"),
    ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "comm", "reduce_scatter"),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "comm", "allreduce"),
    ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", "comm", "sendrecv"),
    ("ncclDevKernel_Broadcast_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "comm", "broadcast"),
    ("ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)", "comm", vocabulary.UNKNOWN_COLLECTIVE),
    ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm>(Params)", "compute", ""),
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", "compute", ""),
])
def test_collective_kernels_are_classified_from_their_names(name, role, op):
    r, o = vc.classify_kernels(pd.Series([name]))
    assert (r.iloc[0], o.iloc[0]) == (role, op)


def _nccl_ranges(path: Path, payload: str | None, init: str | None) -> None:
    """NCCL's NVTX ranges around each NCCL kernel's launch call, as NCCL 2.19+ records them
    ("ncclAllGather" with a JSON payload in the export's ``jsonText``), and a communicator
    init range before them."""
    conn = sqlite3.connect(path)
    rows = conn.execute(
        'SELECT r."start", r."end", r."globalTid" FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN CUPTI_ACTIVITY_KIND_KERNEL k '
        'ON k."correlationId" = r."correlationId" JOIN StringIds s ON s."id" = k."demangledName" WHERE s."value" LIKE \'nccl%\'').fetchall()
    for start, end, gtid in rows:
        conn.execute('INSERT INTO NVTX_EVENTS ("start", "end", "eventType", "text", "globalTid", "jsonText") VALUES (?, ?, ?, ?, ?, ?)',
                     (start - 200, end + 200, nb.PUSH_POP, "ncclAllGather", gtid, payload))
    if init is not None:
        first = min(r[0] for r in rows)
        for gtid in {r[2] for r in rows}:
            conn.execute('INSERT INTO NVTX_EVENTS ("start", "end", "eventType", "text", "globalTid", "jsonText") '
                         'VALUES (?, ?, ?, ?, ?, ?)', (first - 10_000, first - 5_000, nb.PUSH_POP, "ncclCommInitRank", gtid, init))
    conn.commit()
    conn.close()


@pytest.mark.parametrize("init, group", [('{"NCCL communicator ID": 7, "No. of ranks": 4, "Rank": 0}', 4), (None, 2)])
def test_nccl_nvtx_payloads_give_collectives_their_size(tmp_path, init, group):
    """An all-gather's payload is one rank's send buffer: the link carries (n-1) x payload, n from
    the communicator's init range, else 2 (the fewest any group carries: a lower bound)."""
    path = nb.write_nsys(tmp_path / "nccl.sqlite", sc.RANKS)
    _nccl_ranges(path, '{"NCCL communicator ID": 7, "Message size [bytes]": 1048576}', init)
    events, _ = _read([path])
    comm = events[(events["kind"] == "kernel") & (events["role"] == "comm")]
    assert len(comm) and (comm["floor_bytes"] == (group - 1) * 1048576).all()
    assert (comm["bytes"] == group * 1048576).all() and (comm["uncosted"] == "").all()


def test_collectives_without_a_sized_nccl_range_say_so(tmp_path):
    path = nb.write_nsys(tmp_path / "old_nccl.sqlite", sc.RANKS)
    _nccl_ranges(path, None, None)  # NCCL before 2.19: ranges without payloads
    events, _ = _read([path])
    comm = events[(events["kind"] == "kernel") & (events["role"] == "comm")]
    assert len(comm) and (comm["floor_bytes"] == -1).all() and (comm["uncosted"] == vc.NO_COLLECTIVE_SIZE).all()


def test_the_exports_gpu_table_describes_the_device_the_estimate_needs():
    """TARGET_INFO_GPU of a real export (Perlmutter, Nsight Systems 2022.2): the device the
    kernels ran on, with its memory bandwidth, clock, L2 and compute capability."""
    path = HERE.parent / "data" / "thirdparty" / "pipit" / "perlmutter_saxpy_mpi_cuda_rank0.sqlite"
    _, meta = _read([path])
    hw = meta["hardware"]
    assert hw["name"] == "NVIDIA A100-SXM4-40GB" and hw["num_sms"] == 108 and hw["compute_capability"] == "8.0"
    assert hw["memory_bandwidth_bytes_per_s"] == 1555200000000 and hw["clock_hz"] == 1410000000
    assert hw["l2_bytes"] == 41943040 and "integrated" not in hw


def test_kernel_names_say_the_architecture_when_no_device_is_recorded():
    names = pd.Series(["void at::native::vectorized_elementwise_kernel<4>", "sm80_xmma_gemm_f16f16_f16f32_f32_nn_n",
                       "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "ampere_sgemm_128x64_nn"])
    hint = vc.arch_from_kernel_names(names)
    assert hint["arch"] == "9.0" and "sm90_xmma" in hint["basis"]
    assert vc.arch_from_kernel_names(pd.Series(["void cutlass::device_kernel<cutlass::arch::Sm100>"]))["arch"] == "10.0"
    assert vc.arch_from_kernel_names(pd.Series(["ncclDevKernel_AllReduce_Sum_f32_RING_LL", "gemm_kernel"])) is None
