"""Which calibrated collective curve the analytic model uses, and that it counts the ranks' skew and
the host's launch cost once: the curve is the collective's own time (graph-timed by `taxmodel
calibrate`), the timeline adds launch costs and the start skew itself, for graph and eager launches."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from taxmodel.model.analytic import flash_decode, predict
from taxmodel.model.analytic.collective_model import CollectiveModel
from taxmodel.model.analytic.params import ModelParams
from taxmodel.model.analytic.topology import topology
from taxmodel.hardware.specs import HardwareSpec

SHIPPED = Path(__file__).resolve().parents[2] / "taxmodel" / "data" / "hardware" / "h200-calibrated.json"
FD = {"batch": 1, "q_heads": 32, "kv_heads": 4, "head_dim": 128, "kv_len": 1024}
PACKED = 1 * 32 * (128 + 1) * 4  # the all-gathered partial of flash decode bsp, bytes per rank

OPS = ("allgather", "allreduce", "reduce_scatter")
SIZES = (8192, 65536, 524288, 1 << 27)
GRAPH_S = (8e-6, 9e-6, 14e-6, 1.3e-3)  # test numbers, not measurements
EAGER_S = (79e-6, 65e-6, 61e-6, 1.31e-3)


def _curve(times, timing) -> dict:
    return {"world_size": 4, **({"timing": timing} if timing is not None else {}),
            **{op: [[b, s] for b, s in zip(SIZES, times)] for op in OPS}}


def _spec(collectives: dict | None, eager: dict | None = None) -> HardwareSpec:
    d = json.loads(SHIPPED.read_text())
    d.pop("measured", None)
    d.pop("collectives", None)
    d.pop("collectives_by_world", None)  # only the curves a test gives
    if collectives is not None:
        d["collectives"] = collectives
    if eager is not None:
        d["collectives_eager"] = eager
    return HardwareSpec.from_dict(d)


def _coll(spec: HardwareSpec, world: int = 4) -> CollectiveModel:
    params = ModelParams.from_hardware(spec)
    return CollectiveModel.from_hardware(spec, topology(spec, world, params), params)


def _loglog(b: float, times) -> float:
    return float(np.exp(np.interp(math.log(b), np.log(SIZES), np.log(times))))


def test_the_timing_is_read_per_op_and_missing_means_eager():
    assert _coll(_spec(_curve(GRAPH_S, {op: "graph" for op in OPS}))).timing == {op: "graph" for op in OPS}
    assert _coll(_spec(_curve(GRAPH_S, "graph"))).timing == {op: "graph" for op in OPS}
    mixed = _coll(_spec(_curve(GRAPH_S, {"allgather": "graph", "allreduce": "eager"})))
    assert mixed.timing == {"allgather": "graph", "allreduce": "eager", "reduce_scatter": "eager"}
    assert _coll(_spec(_curve(EAGER_S, None))).timing == {op: "eager" for op in OPS}  # files from before the graph timing
    assert _coll(_spec(_curve(EAGER_S, "bogus"))).timing["allgather"] == "eager"


def test_the_eager_reference_curve_is_never_used():
    coll = _coll(_spec(_curve(GRAPH_S, "graph"), eager=_curve(EAGER_S, "eager")))
    assert coll.time("allgather", 65536, 4) == pytest.approx(9e-6)
    only_eager_ref = _coll(_spec(None, eager=_curve(EAGER_S, "eager")))
    assert only_eager_ref.curves == {}  # no `collectives`: the alpha-beta formula, not the eager curve


@pytest.mark.parametrize("graph_launch", [True, False])
def test_flash_decode_bsp_all_gather_takes_the_curve_time_for_both_launch_modes(graph_launch):
    spec = _spec(_curve(GRAPH_S, "graph"))
    params = ModelParams.from_hardware(spec, graph_launch=graph_launch)
    p = predict("flash_decode", "bsp", FD, 4, spec, params)
    assert p.details["all_gather"] == pytest.approx(_loglog(PACKED, GRAPH_S), rel=1e-12)
    assert any("graph-timed" in a for a in p.assumptions)
    # the host's launch cost of the NCCL call is the plan's host_s, once, not inside the duration
    plans, _, _ = flash_decode.plans("bsp", FD, 4, spec, params, _coll(spec))
    ag = [k for k in plans[0] if k.collective]
    assert len(ag) == 1 and ag[0].duration_s == p.details["all_gather"]
    assert ag[0].host_s == params.host_launch_torch_s


@pytest.mark.parametrize("graph_launch", [True, False])
def test_the_ranks_skew_comes_from_the_timeline_not_from_the_curve(graph_launch):
    """Same skew_wait whatever the curve; without start skew none at all; a slower curve moves the
    window by exactly its extra time under a graph launch (the all-gather is on the critical path),
    by at most that much with eager launches (the host's launch of the next kernel hides part of it)."""
    fast, slow = _spec(_curve(GRAPH_S, "graph")), _spec(_curve(EAGER_S, None))
    taxes = {}
    for name, spec in (("fast", fast), ("slow", slow)):
        for skew in (0.0, 11.5e-6):
            params = ModelParams.from_hardware(spec, graph_launch=graph_launch, barrier_skew_s=skew)
            p = predict("flash_decode", "bsp", FD, 4, spec, params)
            taxes[name, skew] = (p.taxes_ns(), p.details["all_gather"])
    for skew in (0.0, 11.5e-6):
        (tf, agf), (ts, ags) = taxes["fast", skew], taxes["slow", skew]
        assert tf.get("skew_wait", 0.0) == pytest.approx(ts.get("skew_wait", 0.0), abs=2.0)
        if graph_launch:
            assert ts["window"] - tf["window"] == pytest.approx((ags - agf) * 1e9, abs=3.0)
        else:
            assert 0 < ts["window"] - tf["window"] <= (ags - agf) * 1e9 + 3.0
    assert taxes["fast", 0.0][0].get("skew_wait", 0.0) == pytest.approx(0.0, abs=2.0)
    assert taxes["fast", 11.5e-6][0]["skew_wait"] > 5e3


def test_an_eager_timed_curve_says_it_over_predicts():
    p = predict("flash_decode", "bsp", FD, 4, _spec(_curve(EAGER_S, None)))
    line = next(a for a in p.assumptions if a.startswith("collectives:"))
    assert "eager-timed" in line and "--only collectives --update" in line
    p8 = predict("flash_decode", "bsp", FD, 8, _spec(_curve(GRAPH_S, "graph")))
    line = next(a for a in p8.assumptions if a.startswith("collectives:"))
    assert "at 4 ranks, alpha-beta fitted" in line and "graph-timed" in line


# --- curves measured on other numbers of ranks (collectives_by_world) ---------------------------------

TWO_S = (6e-6, 7.5e-6, 12e-6, 1.9e-3)  # test numbers for a 2-rank curve, not measurements


def _curve_at(world: int, times, timing) -> dict:
    return {**_curve(times, timing), "world_size": world}


def _spec_by_world(by_world: dict) -> HardwareSpec:
    d = json.loads(SHIPPED.read_text())
    d.pop("measured", None)
    d["collectives"] = _curve(GRAPH_S, "graph")
    d["collectives_by_world"] = by_world
    return HardwareSpec.from_dict(d)


def test_the_curve_of_the_asked_world_size_is_used_at_that_world_size():
    spec = _spec_by_world({"2": _curve_at(2, TWO_S, "graph")})
    only_primary = _coll(_spec(_curve(GRAPH_S, "graph")))
    for world in (2, 4, 8):
        coll = _coll(spec, world)
        for op in OPS:
            for b, two, four in zip(SIZES, TWO_S, GRAPH_S):
                if world == 2:
                    assert coll.time(op, b, 2) == pytest.approx(two, rel=1e-12)  # the 2-rank point, exactly
                if world == 4:
                    assert coll.time(op, b, 4) == pytest.approx(four, rel=1e-12)
        assert coll.time("reduce_scatter", 300_000, 2) == pytest.approx(_loglog(300_000, TWO_S), rel=1e-12)
        # 8 and 3 ranks: alpha-beta fitted to the nearest curve (4; a tie at 3 goes to the file's own), as before
        for w in (3, 8):
            assert coll.time("reduce_scatter", 1 << 22, w) == only_primary.time("reduce_scatter", 1 << 22, w)
            assert coll.time("allreduce", 1 << 20, w) == only_primary.time("allreduce", 1 << 20, w)
        assert coll.alpha_beta("allgather") == only_primary.alpha_beta("allgather")  # no world: the file's own
    # outside the 2-rank curve's sizes: alpha-beta fitted to the 2-rank curve (one ring step), not to the 4-rank one
    coll = _coll(spec, 2)
    # s = alpha + b / beta at W = 2, through the curve's smallest and largest message
    slope = (TWO_S[-1] - TWO_S[0]) / (SIZES[-1] - SIZES[0])
    intercept = TWO_S[0] - slope * SIZES[0]
    big = 1 << 28
    assert coll.time("reduce_scatter", big, 2) == pytest.approx(intercept + slope * big, rel=1e-9)
    assert coll.time("reduce_scatter", big, 2) != pytest.approx(only_primary.time("reduce_scatter", big, 2), rel=1e-3)


def test_the_note_says_which_curve_each_world_size_uses():
    spec = _spec_by_world({"2": _curve_at(2, TWO_S, {"allgather": "graph", "allreduce": "graph"})})
    coll = _coll(spec, 2)
    assert coll.by_world[2][1] == {"allgather": "graph", "allreduce": "graph", "reduce_scatter": "eager"}
    note2 = coll.curve_note(2)
    assert note2.startswith("collectives: calibrated curve at 2 ranks (collectives_by_world);")
    assert "reduce_scatter eager-timed" in note2 and "--update FILE -n 2`" in note2 and "alpha-beta" not in note2
    primary_note = _coll(_spec(_curve(GRAPH_S, "graph"))).curve_note(4)
    assert coll.curve_note(4) == primary_note  # the file's own world size: the note as before
    assert "graph-timed" in primary_note and "at 4 ranks," in primary_note
    note8 = coll.curve_note(8)
    assert "at 4 ranks, alpha-beta fitted to it for this world size (the nearest of the curves at 2, 4 ranks)" in note8
    p = predict("flash_decode", "bsp", FD, 2, spec)
    assert p.details["all_gather"] == pytest.approx(_loglog(PACKED, TWO_S), rel=1e-12)
    assert any(a.startswith("collectives: calibrated curve at 2 ranks (collectives_by_world)") for a in p.assumptions)


def test_curves_of_other_world_sizes_are_dropped_beyond_one_domain_and_when_bad():
    spec = _spec_by_world({"2": _curve_at(2, TWO_S, "graph"), "8": {"world_size": 8, "allgather": [[8192, 1e-5]]},
                           "4": _curve_at(4, EAGER_S, "eager")})
    coll = _coll(spec, 2)
    assert set(coll.by_world) == {2}  # one point is no curve; the file's own 4-rank curve wins over a duplicate
    assert coll.timing == {op: "graph" for op in OPS} and coll.time("allgather", 65536, 4) == pytest.approx(9e-6)
    params = ModelParams.from_hardware(spec, domain_size=1)
    split = CollectiveModel.from_hardware(spec, topology(spec, 2, params), params)
    assert split.curves == {} and split.by_world == {}
    assert "no calibrated curve" in split.curve_note(2)
