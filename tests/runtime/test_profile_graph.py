"""`taxmodel profile --graph`: the capture/replay unit with fakes, in-kernel records under a graph,
graph-launched kernels through the Kineto importer and the ledger, the CLI's refusals, and (slow)
end to end on CPU ranks with a stand-in graph backend (tests/runtime/fake_graphs.py)."""
from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from hypothesis import example, given, settings
from hypothesis import strategies as st

import taxmodel
from taxmodel.trace import capture_meta
from taxmodel.errors import InputError
from taxmodel.kernels.device import sync, trace
from taxmodel.runtime import graph as g
from taxmodel.runtime import records
from taxmodel.workload import Variant

HERE = Path(__file__).resolve().parent
TOY = str(HERE / "toy_workload.py")
FAKE = str(HERE / "fake_graphs.py")
sys.path.insert(0, str(HERE.parent / "trace"))

from kineto_fixtures import us, write_trace  # noqa: E402  (tests/trace's trace builders)
from record_writer import write_records  # noqa: E402  (host-side record writes, as the kernels do)


# --- the capture/replay unit, with a fake backend ------------------------------------------------


class LoggingBackend(g.GraphBackend):
    """Records the order of the CUDA calls capture_iteration makes; ``fail`` breaks the capture."""

    name = "logging"

    def __init__(self, log: list[str], fail: Exception | None = None, why: str | None = None) -> None:
        super().__init__("cpu")
        self.log, self.fail, self.why = log, fail, why

    def unavailable_reason(self):
        return self.why

    @contextlib.contextmanager
    def side_stream(self):
        self.log.append("side+")
        yield
        self.log.append("side-")

    def capture(self, step):
        self.log.append("capture")
        if self.fail is not None:
            raise self.fail
        log = self.log

        class Graph:
            def replay(self):
                log.append("replay")

            def reset(self):
                log.append("reset")

        return Graph()

    def synchronize(self):
        self.log.append("sync")


def test_capture_orders_warmup_barriers_capture_and_never_runs_the_step_while_capturing():
    log: list[str] = []
    backend = LoggingBackend(log)
    runner = g.capture_iteration(lambda: log.append("step"), backend=backend, between=lambda: log.append("barrier"),
                                 warmup=2, before_capture=lambda: log.append("install"))
    assert log == ["side+", "step", "side-", "barrier"] * 2 + ["install", "capture"]
    assert runner.graph is True
    log.clear()
    runner()
    runner()
    assert log == ["replay", "sync", "replay", "sync"]
    log.clear()
    runner.close()
    runner.close()  # idempotent
    assert log == ["reset"]


def test_capture_failure_is_one_line_and_chained():
    cause = RuntimeError("operation not permitted when stream is capturing\nCUDA kernel errors might be ...")
    with pytest.raises(g.GraphCaptureError) as info:
        g.capture_iteration(lambda: None, backend=LoggingBackend([], fail=cause), between=lambda: None)
    assert str(info.value) == "RuntimeError: operation not permitted when stream is capturing"
    assert info.value.__cause__ is cause


def test_warmup_errors_are_not_capture_errors():
    def boom():
        raise ValueError("kernel bug")

    with pytest.raises(ValueError, match="kernel bug"):
        g.capture_iteration(boom, backend=LoggingBackend([]), between=lambda: None)


def test_eager_iteration_runs_then_waits():
    log: list[str] = []
    it = g.EagerIteration(lambda: log.append("step"), lambda: log.append("wait"))
    it()
    it.close()
    assert (it.graph, log) == (False, ["step", "wait"])


def test_eager_reason():
    safe = Variant("a", run=lambda s: None, graph_safe=True)
    unsafe = Variant("b", run=lambda s: None)
    ok = LoggingBackend([])
    assert g.eager_reason("auto", safe, ok) is None
    assert g.eager_reason("require", safe, ok) is None
    assert g.eager_reason("off", safe, ok) == "graph capture not requested"
    assert "'b' is not graph-safe" in g.eager_reason("auto", unsafe, ok)
    assert g.eager_reason("auto", safe, LoggingBackend([], why="no graphs here")) == "no graphs here"
    assert "CPU run" in g.GraphBackend("cpu").unavailable_reason()
    with pytest.raises(InputError, match="choose one of off, auto, require"):
        g.check_mode("sometimes")
    with pytest.raises(InputError, match="graph backend 'nope' unknown"):
        g.get_backend("nope", "cpu")


def test_prime_tracer_runs_one_ordinary_session_per_tracer_and_device(monkeypatch):
    sessions: list[str] = []

    class Tracer:
        name = "fake-tracer"

        def __init__(self, device):
            self.device = device

        def __enter__(self):
            sessions.append(f"start {self.device}")

        def __exit__(self, *exc):
            sessions.append(f"stop {self.device}")

    monkeypatch.setattr(g, "_PRIMED", set())
    for _ in range(2):
        g.prime_tracer(Tracer, "cpu")
    assert sessions == ["start cpu", "stop cpu"]


def test_graph_meta():
    assert capture_meta.graph_meta(True, "auto", None, "cuda") == {"graph": True, "graph_mode": "auto", "graph_backend": "cuda",
                                                        "graph_note": None}
    assert capture_meta.graph_meta(False, "auto", "why", "cuda") == {"graph": False, "graph_mode": "auto", "graph_backend": None,
                                                          "graph_note": "why"}
    assert capture_meta.graph_meta(False, "off", "graph capture not requested", "cuda")["graph_note"] is None


# --- in-kernel records under a graph ---------------------------------------------------------------


def test_graph_slots_keep_one_address_for_every_repetition():
    book = records.RecordBook()
    buf = book.buffer("k", trace.RecordLayout(2, 2), "cpu", sync.SYNC_POLL)
    slots = g.GraphRecordSlots(book, iterations=3)
    slots.install()
    frozen = buf.tensor()  # what a capture would bake into the graph
    assert frozen is not buf.scratch
    # append mode (every replay's records follow the previous ones), room for 3 launches of 2 x 2
    assert int(frozen[trace.APPEND_WORD]) == 1
    assert int(frozen[trace.CTAS_WORD]) * int(frozen[trace.PER_CTA_WORD]) == 12
    for rep in range(2):
        slots.rearm()
        assert buf.tensor() is frozen and int(frozen[0]) == 0 and int(frozen[trace.APPEND_WORD]) == 1
        assert not frozen[trace.HEADER:].any()
        for it in range(3):  # three replays write through the frozen address
            write_records(frozen, [(0, "compute", 1000 * it + rep, 1000 * it + 10)])
        out = slots.drain(rank=1, repetition=rep)
        assert len(out) == 3 and (out["iteration"] == -1).all() and (out["repetition"] == rep).all()
        assert sorted(out["start_ns"]) == [rep, 1000 + rep, 2000 + rep]
    slots.uninstall()
    assert buf.tensor() is buf.scratch


def _kernel_rows(rank, rep, name, spans):
    return [dict(rank=rank, repetition=rep, kind="kernel", name=name, iteration=it, start_ns=s, end_ns=e)
            for it, s, e in spans]


def _record_rows(rank, rep, name, spans):
    return [dict(rank=rank, repetition=rep, iteration=-1, name=name, cta=c, phase="compute", start_ns=s, end_ns=e)
            for c, s, e in spans]


def test_records_go_to_the_iterations_of_their_launches_in_time_order():
    # Iterations traced out of numeric order in time (2, 0, 1) must still map by time.
    ev = pd.DataFrame(_kernel_rows(0, 0, "k", [(2, 100, 200), (0, 1_000, 1_100), (1, 2_000, 2_100)])
                      + _kernel_rows(0, 0, "other", [(0, 1_000, 1_050)]))
    # Device clock offset 5_000_000 from the trace; within a launch CTAs overlap or touch, with a
    # small pause (3 ns) inside the second launch.
    base = 5_000_000
    rec = pd.DataFrame(_record_rows(0, 0, "k", [(0, base + 110, base + 150), (1, base + 120, base + 180),
                                                (0, base + 1_010, base + 1_040), (1, base + 1_043, base + 1_090),
                                                (0, base + 2_005, base + 2_095)]))
    out, unplaced = g.assign_graph_record_iterations(ev, rec.sample(frac=1.0, random_state=3))
    assert unplaced == 0
    got = out.sort_values("start_ns")["iteration"].tolist()
    assert got == [2, 2, 0, 0, 1]


def test_records_that_cannot_be_split_are_left_unplaced():
    ev = pd.DataFrame(_kernel_rows(0, 0, "k", [(0, 0, 10), (1, 100, 110), (2, 200, 210)]))
    rec = pd.DataFrame(_record_rows(0, 0, "k", [(0, 1, 9), (0, 101, 109)])  # iteration 2 wrote nothing
                       + _record_rows(0, 0, "missing", [(0, 1, 2)]))  # no such kernel in the trace
    out, unplaced = g.assign_graph_record_iterations(ev, rec)
    assert unplaced == 3 and (out["iteration"] == -1).all()
    merged, info = records.merge_records(ev.assign(device=0, stream=7, role="fused"), out)
    assert info["records"] == 0 and info["unmatched"] == 3


@settings(max_examples=60, deadline=None)
@given(n_iter=st.integers(1, 6), ctas=st.integers(1, 5), seed=st.integers(0, 2**31 - 1),
       offset=st.integers(-10**12, 10**12))
@example(n_iter=2, ctas=2, seed=2661255, offset=0)  # ambiguous: a 1.5 us shift fits every record as well
def test_random_launches_place_exactly(n_iter, ctas, seed, offset):
    """Launch gaps (barriers) may be shorter than pauses inside a launch (CTAs one after another,
    as in Triton's interpreter); a launch's records start and end within 2 us of it (CTAs begin
    at its start, the last ends near its end), on a shifted clock."""
    rng = np.random.default_rng(seed)
    durs = rng.integers(20_000, 60_000, size=n_iter)
    gaps = rng.integers(1_000, 5_000, size=n_iter)
    starts = np.cumsum(np.r_[0, durs[:-1] + gaps[:-1]])
    order = rng.permutation(n_iter)  # iteration numbers in time order
    ev = pd.DataFrame(_kernel_rows(2, 1, "k", [(int(order[i]), int(s), int(s + d))
                                                for i, (s, d) in enumerate(zip(starts, durs))]))
    rows, want = [], []
    for i, (s, d) in enumerate(zip(starts, durs)):
        pre, post = (int(x) for x in rng.integers(0, 2_000, size=2))
        cuts = np.sort(rng.integers(int(s) + pre, int(s + d) - post, size=2 * ctas))
        cuts[0], cuts[-1] = int(s) + pre, int(s + d) - post
        for c in range(ctas):  # CTA c runs [cuts[2c], cuts[2c+1]]: sequential, with pauses between
            a, b = int(cuts[2 * c]), int(cuts[2 * c + 1])
            if b > a:
                rows.append((c, a + offset, b + offset))
                want.append(int(order[i]))
    if not rows:
        return
    rec = pd.DataFrame(_record_rows(2, 1, "k", rows))
    out, unplaced = g.assign_graph_record_iterations(ev, rec)
    if unplaced:  # allowed only when another clock offset fits every record as well: then nothing is guessed
        assert unplaced == len(rows)
        spans = sorted((int(s), int(s + d)) for s, d in zip(starts, durs))
        assert len(_assignments_fitting_all(rows, spans, offset)) > 1
        return
    assert out["iteration"].tolist() == want


def _assignments_fitting_all(rows, spans, offset) -> set[tuple[int, ...]]:
    """Brute force: every launch assignment under which some single clock offset puts every record
    inside a launch (with the placement's tolerance of a quarter of the smallest gap)."""
    gaps = [b[0] - a[1] for a, b in zip(spans, spans[1:])]
    tol = max(min(gaps), 0) // 4 if gaps else 0
    found = set()
    candidates = {lo - (a - offset) for _, a, _b in rows for lo, _hi in spans} | \
                 {hi - (b - offset) for _, _a, b in rows for _lo, hi in spans}
    for x in candidates:
        for shift in (x - tol, x + tol, x):
            where = []
            for _, a, b in rows:
                a2, b2 = a - offset + shift, b - offset + shift
                j = [k for k, (lo, hi) in enumerate(spans) if lo - tol <= a2 and b2 <= hi + tol]
                if not j:
                    break
                where.append(j[0])
            else:
                found.add(tuple(where))
    return found


# --- graph-launched kernels: Kineto importer and ledger -----------------------------------------------


def _graph_trace(rank: int, steps: int = 3) -> dict:
    """One rank of a graph-replay loop: per ProfilerStep one cudaGraphLaunch whose replay runs
    gemm, combine, an NCCL all-gather and a global combine (all with the launch's correlation),
    then a cudaStreamSynchronize after the step range. Rank 1's replays start 4 us later. The host
    step ranges end before the GPU runs, and the next step's host range overlaps this step's
    kernels, so only the correlation can place them."""
    ev: list[dict] = []
    pid = tid = 100 + rank

    def x(cat, name, start, dur, p, t, args=None):
        e = {"ph": "X", "cat": cat, "name": name, "pid": p, "tid": t, "ts": us(start), "dur": us(dur)}
        if args is not None:
            e["args"] = args
        ev.append(e)

    late = 4_000 * rank
    # (name, stream, start, end) relative to the replay's start on rank 0
    nodes = [("gemm_a", 7, 0 + late, 10_000 + late), ("combine", 7, 11_500 + late, 14_500 + late),
             ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 9, 15_200 + late, 24_200),
             ("combine_global", 7, 24_500, 26_000)]
    for step in range(steps):
        host = 1_700_000_000_000_000 + step * 30_000
        gpu = host + 20_000
        corr = 500 + step
        x("user_annotation", f"ProfilerStep#{step}", host, 7_000, pid, tid)
        x("cuda_runtime", "cudaGraphLaunch", host + 1_000, 5_000, pid, tid, {"correlation": corr})
        # CUPTI replicates GPU-side step annotations onto every stream: a misleading one here.
        x("gpu_user_annotation", f"ProfilerStep#{step}", gpu + 12_000, 100, 0, 9)
        for node, (name, stream, s, e) in enumerate(nodes):
            args = {"device": rank, "stream": stream, "correlation": corr, "graph node id": 1_000 + node}
            if rank == 0:
                args["graph id"] = 5
            x("kernel", name, gpu + s, e - s, 0, stream, args)
        x("cuda_runtime", "cudaStreamSynchronize", host + 7_500, 20_000 + 26_100 - 7_500, pid, tid, {"correlation": 900 + step})
    return {"schemaVersion": 1, "traceEvents": ev,
            "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2},
            "deviceProperties": [{"id": rank, "name": "NVIDIA H200", "numSms": 132}]}


@pytest.fixture(scope="module")
def graph_bundle(tmp_path_factory):
    from taxmodel.trace.importers import import_bundle

    d = tmp_path_factory.mktemp("graph_trace")
    paths = [write_trace(d / f"rank{r}.json", _graph_trace(r)) for r in range(2)]
    bundle, fmt = import_bundle(paths, d / "bundle", "kineto", keep_raw=False)
    assert fmt == "kineto"
    return bundle


def test_graph_kernels_land_in_the_iteration_of_their_graph_launch(graph_bundle):
    ev = graph_bundle.events
    k = ev[ev["kind"] == "kernel"]
    assert len(k) == 2 * 3 * 4
    launches = ev[(ev["kind"] == "launch")]
    assert launches["name"].unique().tolist() == ["cudaGraphLaunch"]
    by_corr = launches.set_index(["rank", "correlation"])["iteration"]
    assert (k["iteration"].to_numpy() == by_corr.loc[list(zip(k["rank"], k["correlation"]))].to_numpy()).all()
    assert sorted(k.groupby("iteration").size().to_dict().items()) == [(0, 8), (1, 8), (2, 8)]
    assert (k["iteration"] == k["correlation"] - 500).all()
    # graph ids: the trace's own on rank 0, the graph launch's correlation where only node ids exist
    assert set(k.loc[k["rank"] == 0, "graph_id"]) == {5}
    r1 = k[k["rank"] == 1]
    assert (r1["graph_id"] == r1["correlation"]).all()
    nccl = k[k["role"] == "comm"]
    assert len(nccl) == 6 and set(nccl["collective_op"]) == {"allgather"}
    assert (nccl.groupby("collective_id")["rank"].nunique() == 2).all()


def test_ledger_of_graph_replays_partitions_and_queues_later_kernels(graph_bundle):
    from taxmodel.ledger.compute import compute_ledger

    led = compute_ledger(graph_bundle)
    parts = led.parts
    per = parts.groupby(["repetition", "iteration", "rank"])["ns"].sum().reset_index()
    per = per.merge(led.windows, on=["repetition", "iteration"])
    assert (per["ns"] == per["window_ns"]).all() and (led.windows["window_ns"] == 26_000).all()
    assert (parts["ns"] >= 0).all()

    def total(sub, rank):
        p = parts[(parts["subcategory"] == sub) & (parts["rank"] == rank)]
        return int(p["ns"].sum())

    for rank in (0, 1):
        # the gaps between nodes of a replay are queued work: kernel_gap, not host-starved
        assert total("kernel_gap", rank) == 3 * (1_500 + 700 + 300)
        assert total("host_starved", rank) == 0 and total("launch_latency", rank) == 0
        assert total("exposed_comm", rank) == 3 * 5_000
        assert total("unattributed", rank) == 0
    assert total("skew_wait", 0) == 3 * 4_000 and total("skew_wait", 1) == 0
    assert total("barrier_idle", 1) == 3 * 4_000 and total("barrier_idle", 0) == 0


# --- display and CLI -------------------------------------------------------------------------------


def test_launch_mode_text():
    from taxmodel.trace.summary import launch_mode

    assert launch_mode({"source": "capture", "capture": {"graph": True}}) == "CUDA graph"
    assert launch_mode({"source": "capture", "capture": {"graph": False, "graph_note": "x"}}, detail=True) == \
        "eager (--graph fell back: x)"
    assert launch_mode({"source": "capture", "capture": {}}) == "eager"
    assert launch_mode({"source": "kineto", "capture": {}}) is None


def test_analyze_names_the_launch_mode_and_warns_when_compared_variants_differ(graph_bundle):
    import dataclasses

    from taxmodel.ledger.compute import compute_ledger
    from taxmodel.report.terminal import render_analysis

    def ledger(variant, graph):
        meta = {**graph_bundle.meta, "source": "capture", "workload": "toy", "variant": variant, "shape": {"N": 8},
                "capture": {**graph_bundle.meta.get("capture", {}), "graph": graph}}
        return compute_ledger(dataclasses.replace(graph_bundle, meta=meta))

    text = render_analysis([ledger("bsp", True), ledger("fused", False)])
    assert "toy/bsp/N8: 3 iteration window(s)" in text and "; launches: CUDA graph\n" in text
    assert "; launches: eager\n" in text
    assert "launch modes differ (bsp: CUDA graph, fused: eager): launch_tax is not comparable" in text
    same = render_analysis([ledger("bsp", True), ledger("fused", True)])
    assert "launch modes differ" not in same


def test_graph_strict_on_cpu_stops_before_any_rank_starts():
    from taxmodel.cli import cli

    res = CliRunner().invoke(cli, ["profile", "toy", "--workload-module", TOY, "--device", "cpu", "--graph-strict"])
    assert res.exit_code == 2, res.output
    assert "--graph-strict: CPU run: there are no CUDA graphs" in res.output and "use --graph" in res.output


def test_graph_strict_refuses_variants_that_are_not_graph_safe():
    from taxmodel.runtime.profile import ProfileRequest, build_spec

    req = ProfileRequest(workload="toy", workload_modules=[TOY, FAKE], device="cpu", graph="require",
                         graph_backend="fake", variants=["bsp", "ring"])
    with pytest.raises(InputError, match=r"variant\(s\) ring are not graph-safe.*--variants \(bsp\)"):
        build_spec(req)
    spec, _, _ = build_spec(ProfileRequest(workload="toy", workload_modules=[TOY, FAKE], device="cpu",
                                           graph="require", graph_backend="fake", variants=["bsp"]))
    assert (spec["graph"], spec["graph_backend"]) == ("require", "fake")


def test_profile_help_documents_graph_options():
    from taxmodel.cli import cli

    out = CliRunner().invoke(cli, ["profile", "--help"]).output
    assert "--graph " in out and "--graph-strict" in out and "capture.graph" in out


# --- end to end on CPU ranks (slow) ---------------------------------------------------------------


def _request(tmp_path, **kw):
    from taxmodel.runtime.profile import ProfileRequest

    base = dict(workload="toy", workload_modules=[TOY, FAKE], device="cpu", iterations=3, warmup=1, out=str(tmp_path),
                timeout_s=240, progress=False, world_size=2)
    base.update(kw)
    return ProfileRequest(**base)


@pytest.mark.slow
def test_graph_auto_captures_safe_variants_and_profiles_the_others_eagerly(tmp_path):
    from taxmodel.ledger.compute import compute_ledger
    from taxmodel.runtime.profile import profile

    out = profile(_request(tmp_path, graph="auto", graph_backend="fake", repeat=2,
                           inject=["extra_launches=1"]), quiet=True)
    bundles = {p.name.split("-")[0]: taxmodel.load(p) for p in out.bundles}
    assert sorted(bundles) == ["bsp", "ring"]
    bsp, ring = bundles["bsp"].meta["capture"], bundles["ring"].meta["capture"]
    assert (bsp["graph"], bsp["graph_mode"], bsp["graph_backend"], bsp["graph_note"]) == (True, "auto", "fake", None)
    assert ring["graph"] is False and "'ring' is not graph-safe" in ring["graph_note"]
    assert out.graph_fallbacks == [f"toy/ring (tiny): eager launches: {ring['graph_note']}"]
    assert any(n.startswith("CUDA graph: every iteration") for n in bundles["bsp"].meta["notes"])
    assert any("although --graph was given" in n for n in bundles["ring"].meta["notes"])
    # Replays run the captured iteration, injected launches included, once per traced iteration.
    ev = bundles["bsp"].events
    k = ev[(ev["kind"] == "kernel") & (ev["iteration"] >= 0) & (ev["stream"] == 0)]
    per = k.groupby(["repetition", "iteration", "rank"])["name"].apply(list)
    assert len(per) == 2 * 3 * 2
    assert all(names == ["scale", "taxmodel_inject_empty", "sum"] for names in per)
    led = compute_ledger(bundles["bsp"])
    s = led.parts.groupby(["repetition", "iteration", "rank"])["ns"].sum().reset_index().merge(
        led.windows, on=["repetition", "iteration"])
    assert (s["ns"] == s["window_ns"]).all()


@pytest.mark.slow
def test_capture_failure_on_one_rank_falls_back_everywhere_or_stops(tmp_path, monkeypatch):
    from taxmodel.errors import RunError
    from taxmodel.runtime.profile import profile

    monkeypatch.setenv("TAXMODEL_FAKE_GRAPH_FAIL_RANK", "1")
    out = profile(_request(tmp_path / "auto", graph="auto", graph_backend="fake", variants=["bsp"], iterations=1),
                  quiet=True)
    meta = taxmodel.load(out.bundles[0]).meta["capture"]
    assert meta["graph"] is False
    assert meta["graph_note"] == ("graph capture failed (rank 1: RuntimeError: operation not permitted when stream "
                                  "is capturing (fake))")
    with pytest.raises(RunError, match="CUDA graph capture failed .*rank 1.*use --graph instead of --graph-strict"):
        profile(_request(tmp_path / "strict", graph="require", graph_backend="fake", variants=["bsp"]), quiet=True)


@pytest.mark.slow
def test_instrumented_graph_replays_place_records_in_their_iterations(tmp_path):
    from taxmodel.runtime.profile import ProfileRequest, profile

    req = ProfileRequest(workload="flash_decode", workload_modules=[FAKE], device="cpu", variants=["fused"],
                         iterations=2, warmup=1, repeat=2, instrument=True, graph="require", graph_backend="fake",
                         out=str(tmp_path), timeout_s=240, progress=False, world_size=2)
    out = profile(req, quiet=True)
    b = taxmodel.load(out.bundles[0])
    assert b.meta["capture"]["graph"] is True and b.meta["capture"]["instrument"] is True
    info = b.meta["records"]
    assert info["unplaced"] == 0 and info["unmatched"] == 0 and info["records"] > 0
    ev = b.events
    rec = ev[ev["kind"] == "record"]
    kern = ev[(ev["kind"] == "kernel") & (ev["name"] == "flash_decode_fused") & (ev["iteration"] >= 0)]
    # every (rank, repetition, iteration) has its records, each inside its own launch
    assert set(map(tuple, rec[["rank", "repetition", "iteration"]].drop_duplicates().to_numpy())) == \
        set(map(tuple, kern[["rank", "repetition", "iteration"]].drop_duplicates().to_numpy()))
    assert len(kern) == 2 * 2 * 2
    spans = kern.set_index(["rank", "repetition", "iteration"])[["start_ns", "end_ns"]]
    j = rec.join(spans, on=["rank", "repetition", "iteration"], rsuffix="_k")
    assert ((j["start_ns"] >= j["start_ns_k"]) & (j["end_ns"] <= j["end_ns_k"])).all()
    per_launch = rec.groupby(["rank", "repetition", "iteration"]).size()
    assert per_launch.nunique() == 1  # every replay wrote the same records


@pytest.mark.slow
def test_graph_on_cpu_profiles_eagerly_with_a_warning(tmp_path):
    from taxmodel.cli import cli

    res = CliRunner().invoke(cli, ["profile", "toy", "--workload-module", TOY, "--device", "cpu", "-n", "1",
                                   "--variants", "bsp", "--graph", "--iterations", "1", "--warmup", "1",
                                   "-o", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "--graph: toy/bsp (tiny): eager launches: CPU run: there are no CUDA graphs" in res.output
    (path,) = (tmp_path / "toy").iterdir()
    meta = taxmodel.load(path).meta["capture"]
    assert (meta["graph"], meta["graph_mode"], meta["graph_backend"]) == (False, "auto", None)
    assert meta["graph_note"].startswith("CPU run: there are no CUDA graphs")
    show = CliRunner().invoke(cli, ["show", str(path)])
    assert "launches" in show.output and "eager (--graph fell back: CPU run" in show.output
