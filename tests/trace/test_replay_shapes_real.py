"""CUDA-graph replays costed from an eager capture of the same program, on the committed H200
training step (profiles/h200x1-train: the whole step captured in one graph, AdamW with
capturable=True there and foreach in the eager step, so the optimizers' kernels differ)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cli_runner import stderr_runner
from taxmodel.cli import cli
from taxmodel.ledger.compute import compute_ledger
from taxmodel.trace import importers, replay_shapes as rs
from taxmodel.trace.bundle import load_bundle

TRAIN = Path(__file__).resolve().parents[2] / "profiles" / "h200x1-train"


def _path(name: str) -> Path:
    f = TRAIN / name
    if not f.exists():
        pytest.skip(f"{f} not present")
    return f


@pytest.fixture(scope="module")
def imported():
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = importers.import_traces([_path(f"trace_{name}.json.gz")])[:2]
        return cache[name]
    return get


def _kernels(ev: pd.DataFrame, replayed: bool) -> pd.DataFrame:
    k = ev[ev["kind"] == "kernel"]
    return k[(k["graph_id"] >= 0) == replayed]


def test_a_trace_of_replays_alone_has_no_eager_step(imported):
    ev, meta = imported("graph_b1")
    g = meta["graph_shapes"]
    assert g["matched"] == 0 and set(g["unmatched"]) == {"no_eager_step"}
    assert (_kernels(ev, True)["uncosted"] == rs.REASONS["no_eager_step"]).all()


@pytest.mark.parametrize("batch", [1, 8])
def test_the_graph_step_takes_the_shapes_of_the_eager_step(imported, batch):
    graph, meta = imported(f"graph_b{batch}")
    eager, _ = imported(f"eager_b{batch}")
    ev, meta = rs.attach_replay_shapes(graph, meta, eager, "eager")
    rep, eag = _kernels(ev, True), _kernels(eager, False)
    matched = rep["shapes_from"] == rs.SHAPES_FROM_EAGER
    g = meta["graph_shapes"]
    assert g["matched"] == int(matched.sum()) and g["replayed_kernels"] == len(rep)
    # forward and backward match; what does not is the capturable optimizer, whose kernels the eager step never ran
    assert g["matched_time_share"] > 0.69 and set(g["unmatched"]) == {"no_name"}
    assert not set(rep.loc[~matched, "name"]) & set(eag["name"])
    # each matched kernel has the work of the eager kernel of the same name and launch dims at the
    # same occurrence among them (checked on one replay against one eager step)
    one = rep[rep["iteration"] == rep["iteration"].min()].sort_values("start_ns")
    step = eag[eag["iteration"] == eag["iteration"].min()].sort_values("start_ns")
    key = ["name", "grid", "block"]
    one = one[one["shapes_from"] == rs.SHAPES_FROM_EAGER].assign(n=lambda d: d.groupby(key).cumcount())
    step = step.assign(n=lambda d: d.groupby(key).cumcount())
    pair = one.merge(step, on=key + ["n"], suffixes=("", "_e"))
    assert len(pair) == len(one)
    assert (pair["op"] == pair["op_e"]).all() and (pair["dtype"] == pair["dtype_e"]).all()
    costed = pair["flops_e"] >= 0
    # the op calls split their work by duration, which varies per step: within 15% of this step's
    assert np.allclose(pair.loc[costed, "flops"], pair.loc[costed, "flops_e"], rtol=0.15)


def test_a_graph_of_another_batch_is_refused_and_said(imported):
    graph, meta = imported("graph_b8")
    eager, _ = imported("eager_b1")
    ev, meta = rs.attach_replay_shapes(graph, meta, eager, "eager_b1")
    rep = _kernels(ev, True)
    assert (rep["uncosted"] == rs.REASONS["other_shapes"]).all() and (rep["flops"] < 0).all()
    assert meta["graph_shapes"]["matched"] == 0


def test_import_shapes_from_then_analyze(tmp_path, imported):
    out = tmp_path / "b"
    res = stderr_runner().invoke(cli, ["import", str(_path("trace_graph_b1.json.gz")), "--shapes-from",
                                       str(_path("trace_eager_b1.json.gz")), "-o", str(out), "--no-keep-raw"])
    assert res.exit_code == 0, res.output + res.stderr
    # every replayed kernel whose name the eager step runs matches (the others are the capturable optimizer's)
    rep, eag = _kernels(imported("graph_b1")[0], True), _kernels(imported("eager_b1")[0], False)
    n = int(rep["name"].isin(set(eag["name"])).sum())
    line = res.output.splitlines()[-1]
    assert line.startswith(f"CUDA-graph replays: {n} of {len(rep)} replayed kernels") and "trace_eager_b1.json.gz" in line
    bundle = load_bundle(out)
    assert bundle.meta["graph_shapes"]["matched"] == n
    led = compute_ledger(bundle)
    k = led.kernels
    eager_basis = k["basis"] == "shapes from eager step"
    assert k.loc[eager_basis, "costed"].all() and k.loc[eager_basis, "time_ns"].sum() / k["time_ns"].sum() > 0.45
    cav = next(c for c in led.caveats if c.startswith("CUDA-graph replays:"))
    assert "floored from the shapes of the eager step" in cav and f"{n} of {len(rep)}" in cav
    # the bundle given as the eager capture works the same
    eager = tmp_path / "eager"
    importers.import_bundle([_path("trace_eager_b1.json.gz")], eager, keep_raw=False)
    again, _ = importers.import_bundle([_path("trace_graph_b1.json.gz")], tmp_path / "c", keep_raw=False,
                                       shapes_from=[eager])
    assert again.meta["graph_shapes"]["matched"] == n



def test_shapes_from_matches_the_replays_in_one_pass(monkeypatch):
    """With --shapes-from the graph trace's replays are matched once, with both captures' eager
    steps (the import matched them with the trace's own steps first, then all over again)."""
    real, calls = rs.attach_replay_shapes, []

    def spy(events, meta, reference=None, reference_name=None):
        calls.append(reference_name)
        return real(events, meta, reference, reference_name)

    monkeypatch.setattr(rs, "attach_replay_shapes", spy)
    _, meta, _ = importers.import_traces([_path("trace_graph_b1.json.gz")], shapes_from=[_path("trace_eager_b1.json.gz")])
    assert calls == [None, "trace_eager_b1.json.gz"]  # the eager capture's own import, then the graph trace's pass
    assert meta["graph_shapes"]["eager_steps"] == "this trace and trace_eager_b1.json.gz"

def test_shapes_from_a_trace_with_no_eager_kernels_is_refused(tmp_path):
    res = stderr_runner().invoke(cli, ["import", str(_path("trace_graph_b1.json.gz")), "--shapes-from",
                                       str(_path("trace_graph_b8.json.gz")), "-o", str(tmp_path / "b")])
    assert res.exit_code == 2 and "no eager kernels" in res.stderr and not (tmp_path / "b").exists()


# --- the captures of benchmarks/graph_replay_pairs.py (one GPU), once committed ------------------

PAIRS = sorted((Path(__file__).resolve().parents[2] / "profiles").glob("h*x1-graph-pairs"))


@pytest.fixture(params=PAIRS or [None], ids=lambda d: d.name if d else "none")
def pairs(request) -> Path | None:
    """Each committed capture of the script (one folder per GPU it ran on)."""
    return request.param


def _pair_trace(folder: Path | None, name: str) -> Path:
    f = folder / f"{name}.json.gz" if folder is not None else None
    if f is None or not f.exists():
        pytest.skip(f"no {name}.json.gz under profiles/h*x1-graph-pairs (benchmarks/graph_replay_pairs.py writes it)")
    return f


def _imported(folder: Path | None, graph: str, eager: str | None = None) -> tuple[pd.DataFrame, dict, list[pd.DataFrame]]:
    """The graph trace's events and meta, matched, and the eager steps they were matched with
    (the trace's own and ``eager``'s eager kernels, one frame per iteration, in time order)."""
    ev, meta = importers.import_traces([_pair_trace(folder, graph)])[:2]
    sources = [ev]
    if eager is not None:
        ev, meta = importers.attach_shapes_from(ev, meta, [_pair_trace(folder, eager)])
        sources.append(importers.import_traces([_pair_trace(folder, eager)])[0])
    assert "graph_shapes" in meta, f"{graph}: no CUDA-graph replays in the trace"
    steps = [step for src in sources for _, step in _kernels(src, False).sort_values("start_ns").groupby("iteration")]
    return ev, meta, steps


def _matched(folder: Path | None, graph: str, eager: str | None = None) -> tuple[pd.DataFrame, dict]:
    ev, meta, _ = _imported(folder, graph, eager)
    return _kernels(ev, True), meta["graph_shapes"]


SAME_PROGRAM = [("graph_b2", "eager_b2"), ("graph_warmup_b2", None), ("graphed_callables_b2", None),
                ("reduce_overhead_b2", None), ("serve_b2_b4", None)]


@pytest.mark.parametrize("graph, eager", SAME_PROGRAM)
def test_each_replayed_kernel_takes_the_work_at_its_place_where_the_eager_step_ran_the_replay(pairs, graph, eager):
    """Checked without the matcher: where a replay's (name, grid, block) sequence runs as one
    contiguous stretch of an eager step (the warm-up before a capture, each of
    make_graphed_callables' three warm-ups, one batch's warm-up next to another's), each
    replayed kernel carries the op and dtype of the kernel at its place in that stretch and its
    work (within 15%: an op call's kernels split its work by their durations, per step)."""
    ev, _, steps = _imported(pairs, graph, eager)
    key = ["name", "grid", "block"]
    stretches = [list(map(tuple, s[key].to_numpy().tolist())) for s in steps]
    for corr, rep in _kernels(ev, True).sort_values("start_ns").groupby("correlation"):
        want = list(map(tuple, rep[key].to_numpy().tolist()))
        found = [steps[k].iloc[at:at + len(want)] for k, keys in enumerate(stretches)
                 for at in range(len(keys) - len(want) + 1) if keys[at:at + len(want)] == want]
        assert found, f"{graph}: the replay of launch {corr} runs as no stretch of an eager step"
        for eag in found:
            assert rep["op"].tolist() == eag["op"].tolist() and rep["dtype"].tolist() == eag["dtype"].tolist()
            costed = eag["flops"].to_numpy() >= 0
            assert np.allclose(rep["flops"].to_numpy()[costed], eag["flops"].to_numpy()[costed], rtol=0.15)
            assert (rep["flops"].to_numpy()[~costed] < 0).all()


@pytest.mark.parametrize("graph, eager", SAME_PROGRAM)
def test_replays_of_the_same_program_take_the_eager_steps_shapes(pairs, graph, eager):
    """The same model and optimizer eagerly and in graphs (a whole step, a trace with its own
    warm-up, forward and backward graphs around an eager optimizer, Inductor's CUDA-graph trees,
    two graphs of different batches): the replays run the eager step's kernels."""
    rep, g = _matched(pairs, graph, eager)
    assert g["matched_time_share"] >= 0.9, g
    assert (rep.loc[rep["shapes_from"] == rs.SHAPES_FROM_EAGER, "uncosted"] == "").mean() >= 0.9


def test_the_graphs_of_two_batches_each_take_their_own_batchs_shapes(pairs):
    rep, _ = _matched(pairs, "serve_b2_b4")
    gemm = rep[(rep["op"].isin(["aten::addmm", "aten::mm", "aten::linear"])) & (rep["flops"] > 0)]
    per_graph = gemm.groupby("graph_id")["flops"].sum()
    assert len(per_graph) >= 2
    # every step replays the batch-2 graph, then the batch-4 one: the second does twice the GEMM work
    assert sorted(per_graph.unique() / per_graph.min()) == pytest.approx([1.0, 2.0], rel=1e-3)


def test_a_graph_captured_at_another_batch_than_the_eager_step_is_refused(pairs):
    rep, g = _matched(pairs, "graph_b4", "eager_b2")
    assert g["matched"] == 0 and set(g["unmatched"]) == {"other_shapes"}
    assert (rep["flops"] < 0).all()


def test_the_python_api_takes_shapes_from_too():
    from taxmodel.api import Profile

    prof = Profile.from_traces(_path("trace_graph_b8.json.gz"), shapes_from=_path("trace_eager_b8.json.gz"))
    assert prof.meta["graph_shapes"]["matched_time_share"] > 0.85
