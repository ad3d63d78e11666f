"""`taxmodel calibrate`'s collective curve without a GPU: the graph timing's arithmetic with a fake
graph backend and a fake stopwatch, the curve on real gloo ranks (eager only: CPU has no graphs;
with a stand-in backend: both, and every rank stopping the graph curve together when a capture
fails on one), the fitted hardware file (graph curve for the model, eager curve kept beside it),
partial runs (``--only collectives --update FILE``) and the CLI's arguments."""
from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from shipped_calibration import shipped_four_ranks

from taxmodel.errors import InputError
from taxmodel.model import calibration as calfit
from taxmodel.runtime import calibrate as cal

# --- graph_per_call_ms: what cancels, what is kept ------------------------------------------------


class CountingBackend:
    """A graph backend whose "graph" replays the captured step (as tests/runtime/fake_graphs.py does)
    and that logs the calls capture needs, in order."""

    def __init__(self, fail_capture: bool = False, fail_replay: bool = False) -> None:
        self.log: list[str] = []
        self.fail_capture, self.fail_replay = fail_capture, fail_replay

    def unavailable_reason(self):
        return None

    @contextlib.contextmanager
    def side_stream(self):
        self.log.append("side+")
        yield
        self.log.append("side-")

    def synchronize(self):
        self.log.append("sync")

    def capture(self, step):
        self.log.append("capture")
        if self.fail_capture:
            raise RuntimeError("operation not permitted when stream is capturing (fake)")
        backend = self

        class Graph:
            def replay(self):
                if backend.fail_replay:
                    raise RuntimeError("replay failed (fake)")
                step()

            def reset(self):
                backend.log.append("reset")

        return Graph()


class FakeWatch:
    """Elapsed time of one timed call = ``entries[k]`` (what the k-th timed round pays once: graph
    launch, waiting for the last rank) + ``per_call`` * the calls of ``fn`` made inside it."""

    def __init__(self, counter: list[int], per_call: float, entries: list[float]) -> None:
        self.counter, self.per_call, self.entries = counter, per_call, entries
        self.timed = 0

    def synchronize(self):
        pass

    def elapsed_ms(self, fn) -> float:
        before = self.counter[0]
        fn()
        entry = self.entries[(self.timed // 2) % len(self.entries)]  # both replays of one round pay the same
        self.timed += 1
        return entry + self.per_call * (self.counter[0] - before)


@settings(max_examples=25, deadline=None)
@given(per_call=st.floats(1e-3, 5.0), entries=st.lists(st.floats(0.0, 0.5), min_size=6, max_size=6))
def test_graph_per_call_cancels_what_every_replay_pays(per_call, entries):
    counter = [0]

    def fn():
        counter[0] += 1

    backend, barriers = CountingBackend(), []
    watch = FakeWatch(counter, per_call, entries)
    res = cal.graph_per_call_ms(fn, backend=backend, watch=watch, barrier=lambda: barriers.append(1), calls=(2, 34), reps=5)
    assert res["method"] == "difference" and res["calls"] == [2, 34]
    assert res["ms"] == pytest.approx(per_call, rel=1e-9, abs=1e-12)
    med_entry = sorted(entries[1:])[2]  # the first round is dropped
    assert res["replay_ms"] == {"2": pytest.approx(med_entry + 2 * per_call), "34": pytest.approx(med_entry + 34 * per_call)}
    # warm-up on a side stream before any capture; two captures; both graphs released at the end
    assert backend.log[:4] == ["side+", "side-", "sync", "capture"] and backend.log.count("capture") == 2
    assert backend.log[-2:] == ["reset", "reset"]
    assert counter[0] == 2 + 6 * (2 + 34)  # warm-up + (reps + 1) rounds of both replays
    assert len(barriers) == 12  # a barrier before every timed replay


def test_graph_per_call_adds_the_traced_kernel_time_of_one_more_long_replay():
    """``kernel_time`` gets the long graph's replay once, after the timed rounds and a barrier: the
    median of its kernels' durations x kernels per call is ``kernel_ms`` (the first call's wait for
    the last rank is left out; the per-call ``ms`` keeps the gap to the next call)."""
    counter, seen, barriers = [0], [], []

    def kernel_time(replay):
        before = counter[0]
        replay()
        seen.append(counter[0] - before)
        return [2.0] + [0.0056] * 33  # the first call waited 2 ms for the other rank

    res = cal.graph_per_call_ms(lambda: counter.__setitem__(0, counter[0] + 1), backend=CountingBackend(),
                                watch=FakeWatch(counter, 0.0092, [0.0]), barrier=lambda: barriers.append(1),
                                calls=(2, 34), reps=5, kernel_time=kernel_time)
    assert seen == [34] and len(barriers) == 13
    assert res["ms"] == pytest.approx(0.0092) and res["kernel_ms"] == pytest.approx(0.0056)
    two = cal.graph_per_call_ms(lambda: None, backend=CountingBackend(), watch=FakeWatch([0], 1.0, [0.0]),
                                barrier=lambda: None, calls=(2, 4), kernel_time=lambda replay: [0.5, 0.01, 0.02] * 4)
    assert two["kernel_ms"] == pytest.approx(0.02 * 3)  # three kernels per call: their median x 3
    none = cal.graph_per_call_ms(lambda: None, backend=CountingBackend(), watch=FakeWatch([0], 1.0, [0.0]),
                                 barrier=lambda: None, kernel_time=lambda replay: [])
    assert "kernel_ms" not in none  # no trace (no GPU profiler): the per-call time only


def test_the_printed_table_shows_the_kernel_time_the_model_uses():
    meas = {"collectives": [{"op": "allgather", "bytes_per_rank": 8192, "ms": 0.044}],
            "collectives_graph": [{"op": "allgather", "bytes_per_rank": 8192, "ms": 0.0104, "kernel_ms": 0.0051,
                                   "method": "difference"}]}
    row = calfit.curve_table(meas).splitlines()[1].split()
    assert row == ["allgather", "8192", "44.0", "10.4", "5.1", "(difference)"]
    meas["collectives_graph"][0].pop("kernel_ms")
    assert calfit.curve_table(meas).splitlines()[1].split()[4] == "-"


def test_curves_prefer_the_traced_kernel_time_and_say_which_they_hold():
    meas = _meas()
    for r in meas["collectives_graph"]:
        if r["op"] == "allgather":
            r["kernel_ms"] = r["ms"] - 0.0025
    curve, _ = calfit.collective_curves(meas, 4)
    assert curve["allgather"][0] == [8192, pytest.approx((0.008 + 3 * 8192 / 320e9 * 1e3 - 0.0025) * 1e-3)]
    assert curve["reduce_scatter"][0] == [8192, pytest.approx((0.008 + 3 * 8192 / 320e9 * 1e3) * 1e-3)]
    assert curve["graph_points"] == {"allgather": "kernel"}  # the others are per-call times (no label)
    assert "graph_points" not in calfit.collective_curves(_meas(), 4)[0]  # files without traced times stay as they were
    from taxmodel.model.analytic.collective_model import CollectiveModel
    from taxmodel.model.analytic.params import ModelParams
    from taxmodel.model.analytic.topology import topology
    from taxmodel.hardware.specs import HardwareSpec, find_preset

    hw = find_preset("H200 SXM")
    spec = HardwareSpec.from_dict({**hw.to_dict(), "collectives": curve})  # the model reads the points, skips the label
    params = ModelParams.from_hardware(spec)
    coll = CollectiveModel.from_hardware(spec, topology(spec, 4, params), params)
    assert coll.time("allgather", 8192, 4) == pytest.approx(curve["allgather"][0][1])
    assert set(coll.curves) == {"allgather", "allreduce", "reduce_scatter"}
    assert "traced time" not in calfit._curve_note(curve)
    every = {**curve, "graph_points": {op: "kernel" for op in curve["timing"]}}
    assert "traced time per call" in calfit._curve_note(every)


def test_graph_per_call_falls_back_to_the_mean_when_the_difference_is_not_positive():
    counter = [0]

    class Backwards(FakeWatch):
        def elapsed_ms(self, fn):
            before = self.counter[0]
            fn()
            return 10.0 if self.counter[0] - before == 2 else 6.8  # the long replay "faster": noise

    res = cal.graph_per_call_ms(lambda: counter.__setitem__(0, counter[0] + 1), backend=CountingBackend(),
                                watch=Backwards(counter, 0.0, [0.0]), barrier=lambda: None)
    assert res["method"] == "mean" and res["ms"] == pytest.approx(6.8 / 34)


def test_graph_per_call_releases_its_graphs_when_a_replay_fails():
    backend = CountingBackend(fail_replay=True)
    with pytest.raises(RuntimeError, match="replay failed"):
        cal.graph_per_call_ms(lambda: None, backend=backend, watch=FakeWatch([0], 1.0, [0.0]), barrier=lambda: None)
    assert backend.log.count("reset") == 2
    with pytest.raises(ValueError, match="short < long"):
        cal.graph_per_call_ms(lambda: None, backend=backend, watch=FakeWatch([0], 1.0, [0.0]), barrier=lambda: None,
                              calls=(4, 4))


def test_graph_per_call_agrees_on_capture_errors_before_any_replay():
    from taxmodel.runtime.graph import GraphCaptureError

    seen, barriers = [], []
    agree = lambda e: seen.append(e) or e  # noqa: E731
    with pytest.raises(GraphCaptureError, match="RuntimeError: operation not permitted"):
        cal.graph_per_call_ms(lambda: None, backend=CountingBackend(fail_capture=True), watch=FakeWatch([0], 1.0, [0.0]),
                              barrier=lambda: barriers.append(1), agree=agree)
    assert len(seen) == 1 and seen[0].startswith("RuntimeError") and barriers == []
    # captured here, failed on another rank: this rank stops too, releasing what it captured
    backend = CountingBackend()
    with pytest.raises(GraphCaptureError, match="rank 1: boom"):
        cal.graph_per_call_ms(lambda: None, backend=backend, watch=FakeWatch([0], 1.0, [0.0]),
                              barrier=lambda: barriers.append(1), agree=lambda e: "rank 1: boom")
    assert barriers == [] and backend.log.count("reset") == 2


# --- collective_curve on gloo ranks ---------------------------------------------------------------


@pytest.fixture
def gloo_rank(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


SIZES = (1 << 13, 1 << 16)


def test_curve_on_cpu_is_eager_only(gloo_rank):
    res = cal.collective_curve("cpu", 1, SIZES)
    assert "no CUDA graphs" in res["graph_note"] and res["graph"] == []
    assert [(r["op"], r["bytes_per_rank"]) for r in res["eager"]] == [
        (op, b) for b in SIZES for op in ("allgather", "allreduce", "reduce_scatter")]
    assert all(r["ms"] > 0 for r in res["eager"])


def test_curve_with_graphs_has_both_timings(gloo_rank):
    res = cal.collective_curve("cpu", 1, SIZES, backend=CountingBackend())
    assert res["graph_note"] is None
    assert [(r["op"], r["bytes_per_rank"]) for r in res["graph"]] == [(r["op"], r["bytes_per_rank"]) for r in res["eager"]]
    assert all(r["ms"] > 0 and r["method"] in ("difference", "mean") and r["calls"] == list(cal.GRAPH_CALLS)
               for r in res["graph"])


def test_a_failed_capture_ends_the_graph_curve_and_keeps_the_eager_one(gloo_rank):
    res = cal.collective_curve("cpu", 1, SIZES, backend=CountingBackend(fail_capture=True))
    assert res["graph"] == [] and "allgather at 8192 B" in res["graph_note"] and "RuntimeError" in res["graph_note"]
    assert len(res["eager"]) == 6


class FailOnRankBackend(CountingBackend):
    """Captures fail on one rank at one message size (the element count of the captured tensors
    is not visible here, so: from the n-th capture on)."""

    def __init__(self, rank: int, fail_rank: int, from_capture: int) -> None:
        super().__init__()
        self.rank, self.fail_rank, self.from_capture, self.captures = rank, fail_rank, from_capture, 0

    def capture(self, step):
        self.captures += 1
        self.fail_capture = self.rank == self.fail_rank and self.captures > self.from_capture
        return super().capture(step)


def _two_rank_curve(rank: int, store: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        # two captures per (op, size): rank 1 fails from the allreduce at the first size on
        res = cal.collective_curve("cpu", 2, SIZES, backend=FailOnRankBackend(rank, fail_rank=1, from_capture=2))
        Path(f"{out}.{rank}").write_text(json.dumps({"graph": [[r["op"], r["bytes_per_rank"]] for r in res["graph"]],
                                                     "note": res["graph_note"], "eager": len(res["eager"])}))
    finally:
        dist.destroy_process_group()


def test_ranks_agree_when_a_capture_fails_on_one_of_them(tmp_path):
    torch.multiprocessing.spawn(_two_rank_curve, args=(str(tmp_path / "store"), str(tmp_path / "out")), nprocs=2)
    r0, r1 = (json.loads((tmp_path / f"out.{r}").read_text()) for r in (0, 1))
    assert r0 == r1  # same path on both ranks (else the next collective would hang)
    assert r0["graph"] == [["allgather", 8192]] and r0["note"].startswith("rank 1: allreduce at 8192 B")
    assert r0["eager"] == 6


# --- fit: which curve the hardware file gives the model ----------------------------------------------


def _meas(graph_ops=("allgather", "allreduce", "reduce_scatter")) -> dict:
    sizes = (1 << 13, 1 << 16, 1 << 27)
    eager = [{"op": op, "bytes_per_rank": b, "ms": 0.060 + 3 * b / 300e9 * 1e3}
             for op in ("allgather", "allreduce", "reduce_scatter") for b in sizes]
    graph = [{"op": op, "bytes_per_rank": b, "ms": 0.008 + 3 * b / 320e9 * 1e3, "method": "difference"}
             for op in graph_ops for b in sizes]
    return {"hbm": {"bytes_per_s": 4.2e12}, "gemm": {"bf16": {"flops_per_s": 790e12}},
            "collectives": eager, "collectives_graph": graph}


def test_fit_gives_the_model_the_graph_curve_and_keeps_the_eager_one():
    spec = calfit.fit(_meas(), "NVIDIA H200", 132, 4)
    coll, eager = spec["collectives"], spec["collectives_eager"]
    assert coll["timing"] == {"allgather": "graph", "allreduce": "graph", "reduce_scatter": "graph"}
    assert coll["allgather"][0] == [8192, pytest.approx(0.008e-3 + 3 * 8192 / 320e9)]
    assert eager["timing"] == "eager" and eager["allgather"][0] == [8192, pytest.approx(0.060e-3 + 3 * 8192 / 300e9)]
    # link numbers from the curve the model uses: latency per ring step from the smallest graph time
    assert spec["link_latency_s"] == pytest.approx((0.008e-3 + 3 * 8192 / 320e9) / 3)
    big = 1 << 27
    assert spec["link_bytes_per_s"] == pytest.approx(3 * big / (0.008e-3 + 3 * big / 320e9))
    assert "own device time" in spec["notes"]


def test_fit_names_the_calibration_after_the_datasheet_without_taking_its_name(tmp_path, monkeypatch):
    """A calibrated file must not carry an alias that spells the datasheet's own name ('h200-sxm'
    for 'H200 SXM'): `--hardware "H200 SXM"` keeps selecting the datasheet, 'NVIDIA H200' the file."""
    from taxmodel.hardware import specs as hardware

    spec = calfit.fit(_meas(), "NVIDIA H200", 132, 4)
    assert spec["name"] == "H200 SXM (calibrated)" and "NVIDIA H200" in spec["aliases"]
    assert all(hardware.normalized_name(a) != hardware.normalized_name("H200 SXM") for a in spec["aliases"])
    shipped = json.loads((Path(cal.__file__).parents[1] / "data" / "hardware" / "h200-calibrated.json").read_text())
    assert all(hardware.normalized_name(a) != hardware.normalized_name("H200 SXM") for a in shipped["aliases"])
    assert hardware.find_preset("H200 SXM").source == "datasheet"


def test_fit_falls_back_to_eager_per_op():
    spec = calfit.fit(_meas(graph_ops=("allgather",)), "NVIDIA H200", 132, 4)
    assert spec["collectives"]["timing"] == {"allgather": "graph", "allreduce": "eager", "reduce_scatter": "eager"}
    assert spec["collectives"]["allreduce"][0][1] == pytest.approx(0.060e-3 + 3 * 8192 / 300e9)
    only_eager = calfit.fit(_meas(graph_ops=()), "NVIDIA H200", 132, 4)
    assert set(only_eager["collectives"]["timing"].values()) == {"eager"} and "collectives_eager" not in only_eager
    assert "eager-timed op includes host launch cost" in only_eager["notes"]
    none = calfit.fit({**_meas(graph_ops=()), "collectives": [], "peer_copy": [{"bytes_per_s": 3e11}]}, "NVIDIA H200", 132, 4)
    assert "collectives" not in none and "collectives_eager" not in none


# --- partial runs: --only collectives --update FILE ------------------------------------------------


def test_refitting_the_shipped_file_from_its_own_raw_numbers_changes_nothing():
    shipped = shipped_four_ranks()
    raw = shipped["measured"]["raw"]
    step_raw = {k: raw[k] for k in calfit.STEP_KEYS["collectives"] if k in raw}
    assert "collectives_graph" in step_raw  # the shipped curve is graph-timed (measured on the H200s)
    new = calfit.update_spec(shipped, step_raw, ("collectives",), device_name="NVIDIA H200",
                          num_sms=132, world=4, info={"date": "d"})
    assert set(shipped["collectives"]["timing"].values()) == {"graph"}
    for key, value in shipped.items():
        if key in ("measured", "notes", "aliases"):
            continue
        assert new[key] == value, key
    assert set(shipped["aliases"]) <= set(new["aliases"])
    assert new["measured"]["updates"][-1] == {"date": "d", "steps": ["collectives"]}


def test_update_replaces_only_what_its_steps_feed():
    shipped = shipped_four_ranks()
    m = _meas()
    new = calfit.update_spec(shipped, {"collectives": m["collectives"], "collectives_graph": m["collectives_graph"],
                                    "hbm": {"bytes_per_s": 1.0}}, ("collectives",), device_name="NVIDIA H200", num_sms=132,
                          world=4)
    assert new["collectives"]["timing"]["allgather"] == "graph" and "collectives_eager" in new
    assert new["measured"]["raw"]["collectives_graph"] == m["collectives_graph"]
    assert new["hbm_bytes_per_s"] == shipped["hbm_bytes_per_s"]  # hbm was not a step of this run
    for key in ("peak_flops", "barrier_skew_s", "peer_load_bytes_per_s", "host_launch_s", "flag_roundtrip_s"):
        assert new[key] == shipped[key], key
    # a failed step keeps the earlier numbers and says so
    kept = calfit.update_spec(shipped, {"collectives": [], "errors": {"collectives": "boom"}}, ("collectives",),
                           device_name="NVIDIA H200", num_sms=132, world=4)
    assert kept["collectives"]["allgather"] == shipped["collectives"]["allgather"]
    assert kept["measured"]["updates"][-1]["failed"] == {"collectives": "boom"}


def test_update_refuses_files_it_cannot_update():
    shipped = shipped_four_ranks()
    assert calfit.check_update(shipped, ("collectives",), 2) == 2  # adds a curve for 2 ranks
    for steps in (("collectives", "barrier"), ("peer",), ("flag",), ("barrier",)):
        with pytest.raises(InputError, match="measured on 4 ranks.*only the collectives step.*--world-size 4"):
            calfit.check_update(shipped, steps, 2)
    with pytest.raises(InputError, match="needs 2 or more ranks"):
        calfit.check_update(shipped, ("collectives",), 1)
    assert calfit.check_update(shipped, ("hbm",), 1) == 1  # single-GPU steps may run on fewer ranks
    with pytest.raises(InputError, match="no raw measurements"):
        calfit.check_update({k: v for k, v in shipped.items() if k != "measured"}, ("collectives",), 4)


def _meas_at(lat_ms: float, bw: float, world: int, sizes=(1 << 13, 1 << 16, 1 << 27)) -> dict:
    """A collectives step's raw rows as a run on ``world`` ranks writes them (test numbers)."""
    graph = [{"op": op, "bytes_per_rank": b, "ms": lat_ms + (world - 1) * b / bw * 1e3, "method": "difference"}
             for op in ("allgather", "allreduce", "reduce_scatter") for b in sizes]
    eager = [{**r, "ms": r["ms"] + 0.05} for r in graph]
    return {"collectives": eager, "collectives_graph": graph}


def _unchanged_but(new: dict, old: dict, *added: str) -> None:
    for key, value in old.items():
        if key in ("measured", "notes", "aliases"):
            continue
        assert new[key] == value, key
    assert set(new) - set(old) - {"measured", "notes", "aliases"} == set(added)


def test_an_update_on_another_world_size_adds_a_curve_and_changes_nothing_else():
    shipped = shipped_four_ranks()
    two = _meas_at(0.020, 150e9, 2)
    new = calfit.update_spec(shipped, two, ("collectives",), device_name="NVIDIA H200", num_sms=132, world=2,
                          info={"date": "d", "world_size": 2})
    _unchanged_but(new, shipped, "collectives_by_world")  # primary curve, link fits, every other number
    curve = new["collectives_by_world"]["2"]
    assert list(new["collectives_by_world"]) == ["2"] and curve["world_size"] == 2
    assert curve["timing"] == {"allgather": "graph", "allreduce": "graph", "reduce_scatter": "graph"}
    assert curve["reduce_scatter"] == [[8192, pytest.approx((0.020 + 8192 / 150e9 * 1e3) * 1e-3)],
                                       [65536, pytest.approx((0.020 + 65536 / 150e9 * 1e3) * 1e-3)],
                                       [1 << 27, pytest.approx((0.020 + (1 << 27) / 150e9 * 1e3) * 1e-3)]]
    raw, old_raw = new["measured"]["raw"], shipped["measured"]["raw"]
    assert {k: v for k, v in raw.items() if k != "collectives_at"} == old_raw  # the 4-rank rows stay
    assert raw["collectives_at"] == {"2": two}
    assert new["measured"]["world_size"] == 4
    assert new["measured"]["updates"][-1] == {"date": "d", "world_size": 2, "steps": ["collectives"]}
    assert "collectives_by_world" in new["notes"] and "2 ranks" in new["notes"]
    from taxmodel.hardware.specs import HardwareSpec

    assert HardwareSpec.from_dict(new).extra["collectives_by_world"]["2"] == curve  # loads as a HardwareSpec

    # a second update at 2 replaces that curve; one at 3 adds another; neither touches the rest
    again = _meas_at(0.030, 120e9, 2)
    newer = calfit.update_spec(new, again, ("collectives",), device_name="NVIDIA H200", num_sms=132, world=2)
    _unchanged_but(newer, shipped, "collectives_by_world")
    assert newer["measured"]["raw"]["collectives_at"] == {"2": again}
    assert newer["collectives_by_world"] == {"2": calfit.collective_curves(again, 2)[0]}
    assert newer["collectives_by_world"]["2"]["allgather"][0][1] == pytest.approx((0.030 + 8192 / 120e9 * 1e3) * 1e-3)
    assert len(newer["measured"]["updates"]) == len(shipped["measured"]["updates"]) + 2
    three = calfit.update_spec(newer, _meas_at(0.025, 140e9, 3), ("collectives",), device_name="NVIDIA H200", num_sms=132,
                            world=3)
    assert list(three["collectives_by_world"]) == ["2", "3"] and three["collectives_by_world"]["3"]["world_size"] == 3
    assert three["collectives_by_world"]["2"] == newer["collectives_by_world"]["2"]

    # an update at the file's own world size behaves as before and keeps the other curves
    own = {k: shipped["measured"]["raw"][k] for k in calfit.STEP_KEYS["collectives"] if k in shipped["measured"]["raw"]}
    back = calfit.update_spec(three, own, ("collectives",), device_name="NVIDIA H200", num_sms=132, world=4,
                           info={"date": "e"})
    _unchanged_but(back, shipped, "collectives_by_world")
    assert back["collectives_by_world"] == three["collectives_by_world"]
    assert back["measured"]["updates"][-1] == {"date": "e", "steps": ["collectives"]}


def test_a_failed_update_on_another_world_size_keeps_the_earlier_curve():
    shipped = shipped_four_ranks()
    two = _meas_at(0.020, 150e9, 2)
    new = calfit.update_spec(shipped, two, ("collectives",), device_name="NVIDIA H200", num_sms=132, world=2)
    kept = calfit.update_spec(new, {"collectives": [], "errors": {"collectives": "boom"}}, ("collectives",),
                           device_name="NVIDIA H200", num_sms=132, world=2)
    assert kept["collectives_by_world"] == new["collectives_by_world"]
    assert kept["measured"]["raw"] == new["measured"]["raw"]  # no error recorded against the 4-rank curve
    assert kept["measured"]["updates"][-1]["failed"] == {"collectives": "boom"}
    with pytest.raises(InputError, match="only the collectives step"):
        calfit.update_spec(shipped, {**two, "barrier": {"barrier_skew_s": 1e-6}}, ("collectives", "barrier"), world=2)


def test_a_single_gpu_update_on_fewer_ranks_refits_at_the_files_world_size():
    shipped = shipped_four_ranks()
    new = calfit.update_spec(shipped, {"hbm": {"bytes_per_s": 4.0e12}}, ("hbm",), device_name="NVIDIA H200", num_sms=132,
                          world=1)
    assert new["hbm_bytes_per_s"] == 4.0e12
    assert new["collectives"] == shipped["collectives"]  # still the 4-rank curve, labelled 4
    assert new["link_bytes_per_s"] == shipped["link_bytes_per_s"]
    assert new["link_latency_s"] == shipped["link_latency_s"]


def test_parse_steps_and_command():
    assert calfit.parse_steps(None) == tuple(calfit.STEP_KEYS) and calfit.parse_steps("all") == tuple(calfit.STEP_KEYS)
    assert calfit.parse_steps("barrier, collectives") == ("collectives", "barrier")
    with pytest.raises(InputError, match="unknown step.*nccl"):
        calfit.parse_steps("collectives,nccl")
    cmd = cal.calibration_command("hw.json", only="collectives", update="old.json", sizes="8192")
    # one rank's command (the launcher starts them), never importing the working directory's modules
    module = cmd.index("-m")
    assert cmd[module + 1] == "taxmodel.runtime.calibrate" and cmd[1:module] in ([], ["-P"])
    assert cmd[-6:-2] == ["--only", "collectives", "--update", str(Path("old.json").resolve())]
    assert cmd[-2:] == ["--sizes", "8192"] and "--device" not in cmd


def test_cli_arguments(tmp_path):
    from taxmodel.cli import cli

    res = CliRunner().invoke(cli, ["calibrate", "--help"])
    assert res.exit_code == 0 and "--only" in res.output and "--update" in res.output and "collectives" in res.output
    # checked before any GPU is looked for
    res = CliRunner().invoke(cli, ["calibrate", "-o", str(tmp_path / "x.json"), "--only", "collectives"])
    assert res.exit_code != 0 and "needs --update" in str(res.output) + str(res.exception)


def test_main_updates_a_file_on_cpu_ranks(tmp_path, capfd):
    """The whole partial run on two gloo ranks started by the launcher: --only collectives --update."""
    old = shipped_four_ranks()
    old["measured"]["world_size"] = 2  # a file measured on as many ranks as this test has
    (tmp_path / "old.json").write_text(json.dumps(old))
    out = tmp_path / "sub" / "new.json"
    out.parent.mkdir()
    spec = cal.run_calibration(out, world_size=2, only="collectives", update=tmp_path / "old.json", sizes="8192,65536",
                               device="cpu", timeout_s=120)
    assert spec.source == "calibrated"
    assert "graph us" in capfd.readouterr().out  # the compact eager/graph table, printed by rank 0
    new = json.loads(out.read_text())
    assert new["collectives"]["world_size"] == 2 and set(new["collectives"]["timing"].values()) == {"eager"}
    assert [p[0] for p in new["collectives"]["allgather"]] == [8192, 65536]
    assert new["hbm_bytes_per_s"] == old["hbm_bytes_per_s"] and new["peak_flops"] == old["peak_flops"]
    update = new["measured"]["updates"][-1]
    assert update["steps"] == ["collectives"] and update["device"] == "cpu (gloo)" and update["world_size"] == 2
    assert "no CUDA graphs" in new["measured"]["raw"]["collectives_graph_note"]


def test_main_adds_a_curve_for_another_world_size_on_cpu_ranks(tmp_path, capfd):
    """A 4-rank file updated by a 2-rank collectives run: the curve lands in collectives_by_world["2"]."""
    old = shipped_four_ranks()
    (tmp_path / "old.json").write_text(json.dumps(old))
    out = tmp_path / "new.json"
    cal.run_calibration(out, world_size=2, only="collectives", update=tmp_path / "old.json", sizes="8192,65536",
                        device="cpu", timeout_s=120)
    assert 'collectives_by_world["2"]' in capfd.readouterr().out
    new = json.loads(out.read_text())
    assert new["collectives"] == old["collectives"] and new["link_bytes_per_s"] == old["link_bytes_per_s"]
    curve = new["collectives_by_world"]["2"]
    assert curve["world_size"] == 2 and set(curve["timing"].values()) == {"eager"}
    assert [p[0] for p in curve["allgather"]] == [8192, 65536]
    at = new["measured"]["raw"]["collectives_at"]["2"]
    assert "no CUDA graphs" in at["collectives_graph_note"] and at["collectives_graph"] == []
    assert new["measured"]["raw"]["collectives"] == old["measured"]["raw"]["collectives"]
    assert new["measured"]["updates"][-1]["world_size"] == 2 and new["measured"]["world_size"] == 4



def test_an_update_never_writes_over_the_file_it_updates(tmp_path):
    """-o FILE --update FILE was accepted and replaced the earlier calibration, the command's input:
    refused before any rank starts, by the command and by a rank started by hand; the file stays."""
    from taxmodel.cli import cli

    old = tmp_path / "old.json"
    old.write_text(json.dumps(shipped_four_ranks()))
    before = old.read_bytes()
    r = CliRunner().invoke(cli, ["calibrate", "--device", "cpu", "--only", "collectives", "-n", "2", "-o", str(old),
                                 "--update", str(old)])
    assert r.exit_code == 2 and "is the input" in r.output and "write the hardware file outside" in r.output, r.output
    with pytest.raises(SystemExit) as exc:
        cal._calibrate(["-o", str(old), "--update", str(old), "--only", "collectives", "--device", "cpu"])
    assert exc.value.code == 2
    assert old.read_bytes() == before
