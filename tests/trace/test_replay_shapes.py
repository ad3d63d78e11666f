"""CUDA-graph replays costed from the eager step of the same program (trace/replay_shapes.py), on
hand-made events with known shapes: what matches, what is refused and why."""
from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from taxmodel.hardware.specs import find_preset
from taxmodel.ledger.kernel_costs import BASIS_EAGER_STEP, BASIS_LAUNCH_GRID, kernel_floors
from taxmodel.trace import replay_shapes as rs
from taxmodel.trace.schema import normalize_events

H200 = find_preset("h200")
GEMM = "nvjet_sm90_tst_128x256_64x4_2x1_v_bz_NTN"
ADD = "void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<c10::BFloat16>>"
GELU = "void at::native::vectorized_elementwise_kernel<8, at::native::GeluCUDAKernelImpl>"
NORM = "void at::native::vectorized_layer_norm_kernel<c10::BFloat16, float, false>"
ADAM = ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
        "TensorListMetadata<2>, at::native::(anonymous namespace)::BinaryOpListAlphaFunctor<c10::BFloat16, 2, 2, 0>, "
        "std::plus<float>, float>(T1, T2, T3, T4)")


class Trace:
    """Events of one rank built step by step: eager kernels carry their op's work, replayed ones
    only name, launch dims and time (what a trace of a replay shows)."""

    def __init__(self) -> None:
        self.rows: list[dict] = []
        self.t = 1_000_000
        self.corr = 0
        self.op_id = 0

    def eager(self, it: int, kernels: list[tuple]) -> "Trace":
        """kernels: (name, grid, dur_ns, op, flops, bytes)."""
        for name, grid, dur, op, flops, nbytes in kernels:
            self.corr += 1
            self.op_id += 1
            self._row(name, grid, dur, it, graph=-1, corr=self.corr, op=op, flops=flops, floor_bytes=nbytes,
                      dtype="bf16" if flops >= 0 else "", op_id=self.op_id)
        self.t += 50_000
        return self

    def replay(self, it: int, graph: int, kernels: list[tuple]) -> "Trace":
        """kernels: (name, grid, dur_ns). One graph launch: every kernel carries its correlation."""
        self.corr += 1
        self.rows.append({"rank": 0, "kind": "launch", "name": "cudaGraphLaunch", "start_ns": self.t - 10_000,
                          "end_ns": self.t - 5_000, "correlation": self.corr, "iteration": it, "stream": 1})
        for name, grid, dur in kernels:
            self._row(name, grid, dur, it, graph=graph, corr=self.corr, uncosted="CUDA graph replay")
        self.t += 50_000
        return self

    def _row(self, name, grid, dur, it, **kw) -> None:
        self.rows.append({"rank": 0, "device": 0, "stream": 7, "kind": "kernel", "role": "compute", "name": name,
                          "start_ns": self.t, "end_ns": self.t + dur, "iteration": it, "grid": grid, "block": "128,1,1",
                          "graph_id": kw.pop("graph"), "correlation": kw.pop("corr"), **kw})
        self.t += dur + 2_000

    def events(self) -> pd.DataFrame:
        return normalize_events(pd.DataFrame(self.rows))


def _layer(batch: int, scale: float = 1.0) -> list[tuple]:
    """An eager decoder layer at ``batch``: the weight-gradient GEMM's grid does not depend on the
    batch (its output is d x d), its work does."""
    m = 1024 * batch
    return [(NORM, f"{m},1,1", int(4_000 * batch * scale), "aten::native_layer_norm", 8 * m * 1024, 6 * m * 1024),
            (GEMM, f"{8 * batch},32,1", int(30_000 * batch * scale), "aten::addmm", 2 * m * 1024 * 4096, 2 * (m + 4096) * 1024),
            (GELU, f"{4 * m},1,1", int(9_000 * batch * scale), "aten::gelu", m * 4096, 4 * m * 4096),
            (GEMM, "8,32,1", int(30_000 * batch * scale), "aten::mm", 2 * 1024 * 4096 * m, 2 * (m + 1024) * 4096),
            (ADD, f"{m},1,1", int(3_000 * batch * scale), "aten::add", m * 1024, 6 * m * 1024)]


def _as_replay(kernels: list[tuple], scale: float = 1.0) -> list[tuple]:
    return [(k[0], k[1], int(k[2] * scale)) for k in kernels]


def _replayed(events: pd.DataFrame) -> pd.DataFrame:
    return events[(events["kind"] == "kernel") & (events["graph_id"] >= 0)]


def _eager(events: pd.DataFrame, it: int) -> pd.DataFrame:
    return events[(events["kind"] == "kernel") & (events["graph_id"] < 0) & (events["iteration"] == it)]


def test_replayed_kernels_take_the_work_of_the_eager_step_in_the_same_trace():
    layer = _layer(1)
    tr = Trace().eager(1, layer).eager(2, layer)
    for it in (3, 4):
        tr.replay(it, graph=7, kernels=_as_replay(layer, 0.95))
    ev, meta = rs.attach_replay_shapes(tr.events(), {})
    rep = _replayed(ev)
    assert len(rep) == 10 and (rep["shapes_from"] == rs.SHAPES_FROM_EAGER).all() and (rep["uncosted"] == "").all()
    for it in (3, 4):
        got = rep[rep["iteration"] == it][["op", "flops", "floor_bytes", "dtype"]].to_numpy().tolist()
        assert got == _eager(ev, 1)[["op", "flops", "floor_bytes", "dtype"]].to_numpy().tolist()
    g = meta["graph_shapes"]
    assert (g["replayed_kernels"], g["matched"], g["match_rate"], g["matched_time_share"]) == (10, 10, 1.0, 1.0)
    assert g["unmatched"] == {} and g["eager_steps"] == "this trace"
    floors = kernel_floors(rep, H200)
    assert floors["costed"].all() and (floors["basis"] == BASIS_EAGER_STEP).all()
    # eager kernels keep their own basis
    assert (kernel_floors(_eager(ev, 1), H200)["basis"] == "shapes").all()


def test_a_kernel_twice_per_step_with_different_shapes_is_matched_by_its_place():
    """One GEMM kernel with the same launch dims twice per step, over K = 1024 and K = 4096 (a
    tile grid covers the output, not K): each replayed launch gets its own place's work."""
    k1024 = (GEMM, "8,32,1", 30_000, "aten::mm", 2 * 1024 * 4096 * 1024, 16_777_216)
    k4096 = (GEMM, "8,32,1", 110_000, "aten::mm", 2 * 1024 * 4096 * 4096, 50_331_648)
    add = (ADD, "1024,1,1", 3_000, "aten::add", 1024 * 1024, 6 * 1024 * 1024)
    step = [k1024, add, k4096, add, k1024]
    ev, meta = rs.attach_replay_shapes(Trace().eager(1, step).replay(2, graph=3, kernels=_as_replay(step)).events(), {})
    rep = _replayed(ev)
    assert rep["flops"].tolist() == [k[4] for k in step] and rep["floor_bytes"].tolist() == [k[5] for k in step]
    assert meta["graph_shapes"]["match_rate"] == 1.0


def test_a_place_that_eager_kernels_of_different_shapes_fit_is_ambiguous():
    """Replay [GEMM] against eager [GEMM(K=1024), ADD, GEMM(K=4096)] with the same launch dims:
    either fits; with different work it is refused, with the same work it is costed (a graph of
    one layer against a step of identical layers)."""
    a1 = (GEMM, "8,32,1", 30_000, "aten::mm", 1_000, 10)
    a2 = (GEMM, "8,32,1", 30_000, "aten::mm", 4_000, 40)
    add = (ADD, "1024,1,1", 3_000, "aten::add", 5, 6)
    ev, meta = rs.attach_replay_shapes(Trace().eager(1, [a1, add, a2]).replay(2, 1, [(GEMM, "8,32,1", 30_000)]).events(), {})
    rep = _replayed(ev)
    assert rep["uncosted"].tolist() == [rs.REASONS["ambiguous"]] and rep["flops"].tolist() == [-1]
    assert meta["graph_shapes"]["unmatched"]["ambiguous"]["kernels"] == 1
    ev, _ = rs.attach_replay_shapes(Trace().eager(1, [a1, add, a1]).replay(2, 1, [(GEMM, "8,32,1", 30_000)]).events(), {})
    assert _replayed(ev)["flops"].tolist() == [1_000]


def test_a_graph_captured_with_another_batch_is_refused_and_said():
    """Eager step at batch 1, graph at batch 8: the layer norm, GELU and add run with other grids
    at the same places, so none of the replay takes eager shapes, not even the weight-gradient
    GEMM whose launch dims are the same at both batches."""
    tr = Trace().eager(1, _layer(1)).replay(2, graph=5, kernels=_as_replay(_layer(8)))
    ev, meta = rs.attach_replay_shapes(tr.events(), {})
    rep = _replayed(ev)
    assert (rep["uncosted"] == rs.REASONS["other_shapes"]).all() and (rep["flops"] == -1).all()
    assert (rep["shapes_from"] == "").all()
    g = meta["graph_shapes"]
    assert g["matched"] == 0 and g["unmatched"]["other_shapes"]["kernels"] == 5
    assert "other shapes" in rs.describe(meta)


def test_the_same_launch_dims_in_another_time_are_refused():
    """No kernel shows other launch dims, but the replay's weight-gradient GEMM ran 8x as long as
    its eager counterpart: same grid, other work."""
    layer = _layer(1)
    replay = _as_replay(layer)
    replay[3] = (replay[3][0], replay[3][1], replay[3][2] * 8)
    ev, meta = rs.attach_replay_shapes(Trace().eager(1, layer).replay(2, 5, replay).events(), {})
    rep = _replayed(ev)
    assert rep["uncosted"].tolist()[3] == rs.REASONS["time"]
    assert (rep["shapes_from"] == rs.SHAPES_FROM_EAGER).sum() == 4 and meta["graph_shapes"]["unmatched"]["time"]["kernels"] == 1


def test_kernels_the_eager_step_does_not_run_are_unmatched_with_their_reason():
    """A graph whose optimizer differs from the eager step's (capturable AdamW adds kernels):
    other names and a surplus launch of a known kernel stay uncosted; the rest match."""
    layer = _layer(1)
    replay = _as_replay(layer) + [("void capturable_adam_kernel", "64,1,1", 5_000), _as_replay(layer)[2]]
    ev, meta = rs.attach_replay_shapes(Trace().eager(1, layer).replay(2, 5, replay).events(), {})
    rep = _replayed(ev)
    assert rep["uncosted"].tolist()[5:] == [rs.REASONS["no_name"], rs.REASONS["no_place"]]
    assert (rep["shapes_from"].iloc[:5] == rs.SHAPES_FROM_EAGER).all()
    assert meta["graph_shapes"]["match_rate"] == pytest.approx(5 / 7, abs=1e-4)
    # a second launch of the step's last kernel after the extra one: either launch could be the
    # eager one's counterpart, so neither is costed
    replay[-1] = _as_replay(layer)[-1]
    ev, _ = rs.attach_replay_shapes(Trace().eager(1, layer).replay(2, 5, replay).events(), {})
    assert _replayed(ev)["uncosted"].tolist()[4:] == [rs.REASONS["no_place"], rs.REASONS["no_name"], rs.REASONS["no_place"]]
    replay[1] = (GEMM, "16,32,1", replay[1][2])  # a GEMM launched with a grid the eager step never used
    ev, _ = rs.attach_replay_shapes(Trace().eager(1, layer[1:]).replay(2, 5, replay[1:2]).events(), {})
    assert _replayed(ev)["uncosted"].tolist() == [rs.REASONS["other_dims"]]


def test_several_graphs_per_step_and_graphs_of_different_batches():
    """Per step a forward graph, an eager optimizer and a backward graph, after eager warm-up
    steps at batch 1 and 2; then replays of the batch-2 graphs: each replay takes the work of the
    warm-up step it aligns with best (its own batch), whatever the order."""
    fwd1, bwd1 = _layer(1)[:3], _layer(1)[3:]
    fwd2, bwd2 = _layer(2)[:3], _layer(2)[3:]
    opt = [(ADAM, "64,1,1", 8_000, "aten::_foreach_add_", -1, -1)]
    tr = Trace().eager(1, fwd1 + opt + bwd1).eager(2, fwd2 + opt + bwd2)
    for it in (3, 4):
        tr.replay(it, graph=21, kernels=_as_replay(fwd2)).eager(it, opt).replay(it, graph=22, kernels=_as_replay(bwd2))
    tr.replay(5, graph=11, kernels=_as_replay(fwd1))
    ev, meta = rs.attach_replay_shapes(tr.events(), {})
    rep = _replayed(ev)
    assert (rep["shapes_from"] == rs.SHAPES_FROM_EAGER).all()
    want2 = [k[4] for k in fwd2], [k[4] for k in bwd2]
    for it in (3, 4):
        one = rep[rep["iteration"] == it]
        assert one.loc[one["graph_id"] == 21, "flops"].tolist() == want2[0]
        assert one.loc[one["graph_id"] == 22, "flops"].tolist() == want2[1]
    assert rep.loc[rep["graph_id"] == 11, "flops"].tolist() == [k[4] for k in fwd1]
    assert meta["graph_shapes"]["match_rate"] == 1.0


def test_a_step_that_runs_the_graphed_part_several_times_pairs_each_kernel_at_its_place():
    """make_graphed_callables warms a module up three times (forward and backward) in one step
    of the profiler, then replays a forward and a backward graph per step. The forward's two
    GEMMs share kernel and launch dims but not work (K = 1024 and K = 4096): each replayed GEMM
    takes its own place's work in a repetition, never the other GEMM's one repetition on
    (which a longest common subsequence alone allows: it left them ambiguous)."""
    norm, up, gelu, down, add = _layer(1)
    down = (up[0], up[1], up[2] * 4, "aten::addmm", up[4] * 4, up[5] * 2)  # same kernel and grid as up, 4x the work
    fwd, bwd = [norm, up, gelu, down, add], _layer(1)[::-1]
    tr = Trace().eager(1, (fwd + bwd) * 3)
    for it in (2, 3):
        tr.replay(it, graph=10 * it, kernels=_as_replay(fwd)).replay(it, graph=10 * it + 1, kernels=_as_replay(bwd))
    ev, meta = rs.attach_replay_shapes(tr.events(), {})
    rep = _replayed(ev)
    assert meta["graph_shapes"]["match_rate"] == 1.0
    for it in (2, 3):
        assert rep.loc[rep["graph_id"] == 10 * it, "flops"].tolist() == [k[4] for k in fwd]
        assert rep.loc[rep["graph_id"] == 10 * it + 1, "flops"].tolist() == [k[4] for k in bwd]


def test_warm_ups_of_two_batches_in_one_step_give_each_graph_its_own_batch():
    """Two graphs of one forward at batch 1 and 2, both warmed up in the same step of the
    profiler: the forward's last GEMM has the same launch dims at both batches (its grid covers
    the weight), so the batch-1 replay could end on either warm-up's GEMM by order alone; it
    takes the batch-1 one, next to the rest of its replay."""
    f1, f2 = _layer(1)[:4], _layer(2)[:4]
    assert f1[-1][:2] == f2[-1][:2] and f1[-1][4] != f2[-1][4]
    tr = Trace().eager(1, f1 + f2)
    for it in (2, 3):
        tr.replay(it, graph=1, kernels=_as_replay(f1)).replay(it, graph=2, kernels=_as_replay(f2))
    ev, meta = rs.attach_replay_shapes(tr.events(), {})
    rep = _replayed(ev)
    assert rep.loc[rep["graph_id"] == 1, "flops"].tolist() == [k[4] for k in f1] * 2
    assert rep.loc[rep["graph_id"] == 2, "flops"].tolist() == [k[4] for k in f2] * 2
    assert meta["graph_shapes"]["match_rate"] == 1.0


def test_without_an_eager_step_only_the_launch_grid_floors_remain():
    tr = Trace().replay(1, 3, _as_replay(_layer(1)) + [(ADAM, "64,1,1", 8_000)])
    tr.rows[-1]["block"] = "512,1,1"
    ev, meta = rs.attach_replay_shapes(tr.events(), {})
    rep = _replayed(ev)
    assert (rep["uncosted"] == rs.REASONS["no_eager_step"]).all()
    floors = kernel_floors(rep, H200)
    assert floors["basis"].tolist() == [""] * 5 + [BASIS_LAUNCH_GRID]
    assert meta["graph_shapes"]["matched"] == 0 and meta["graph_shapes"]["unmatched"]["no_eager_step"]["kernels"] == 6


def test_another_traces_steps_serve_with_their_own_ranks():
    """--shapes-from: a separate eager capture of the same program; the reference's rank 0 serves
    the graph trace's rank 0 only (a one-rank pair whatever the numbers)."""
    layer = _layer(1)
    graph = Trace().replay(1, 5, _as_replay(layer)).events()
    eager = Trace().eager(1, layer).events()
    ev, meta = rs.attach_replay_shapes(graph, {}, eager, "eager.json.gz")
    assert (_replayed(ev)["flops"].to_numpy() == [k[4] for k in layer]).all()
    assert meta["graph_shapes"]["eager_steps"] == "this trace and eager.json.gz"
    two = pd.concat([graph, graph.assign(rank=1)], ignore_index=True)
    ev, meta = rs.attach_replay_shapes(two, {}, eager, "eager.json.gz")
    r1 = _replayed(ev)
    assert (r1.loc[r1["rank"] == 0, "shapes_from"] == rs.SHAPES_FROM_EAGER).all()
    assert (r1.loc[r1["rank"] == 1, "uncosted"] == rs.REASONS["no_eager_step"]).all()


def test_collectives_and_copies_in_a_replay_keep_their_own_costs():
    tr = Trace().eager(1, _layer(1)).replay(2, 5, _as_replay(_layer(1)) + [("ncclDevKernel_AllGather_RING_LL", "4,1,1", 9_000)])
    tr.rows[-1].update(role="comm", floor_bytes=4096, uncosted="")
    ev, _ = rs.attach_replay_shapes(tr.events(), {})
    nccl = ev[ev["name"].str.startswith("nccl")]
    assert nccl["floor_bytes"].tolist() == [4096] and nccl["shapes_from"].tolist() == [""]


def test_a_trace_without_replays_is_left_as_it_is():
    ev = Trace().eager(1, _layer(1)).events()
    out, meta = rs.attach_replay_shapes(ev, {"x": 1})
    assert out is ev and meta == {"x": 1}


@pytest.mark.parametrize("seed", range(60))
def test_the_alignment_against_every_alignment(seed):
    """``_align`` against brute force on short random sequences (keys 3 and 4 only one side
    has): every alignment pairs equal keys in order and scores w = ceil(len(b) / 2) per pair
    less one per eager position left unpaired between its first and last pair; the best score,
    the pairs on some best alignment, the replay positions some best one leaves unpaired, and
    one best alignment."""
    rng = np.random.default_rng(seed)
    a = rng.choice([0, 1, 2, 3], rng.integers(1, 8))
    b = rng.choice([0, 1, 2, 4], rng.integers(1, 7))
    w = max(1, (len(b) + 1) // 2)

    def score(ia, jb):
        return w * len(ia) - sum(y - x - 1 for x, y in zip(ia, ia[1:]))

    best, pairs, skippable = 0, set(), set(range(len(b)))
    for k in range(1, min(len(a), len(b)) + 1):
        for ia in itertools.combinations(range(len(a)), k):
            for jb in itertools.combinations(range(len(b)), k):
                if all(a[i] == b[j] for i, j in zip(ia, jb)):
                    s = score(ia, jb)
                    if s > best:
                        best, pairs, skippable = s, set(), set()
                    if s == best:
                        pairs |= set(zip(ia, jb))
                        skippable |= set(range(len(b))) - set(jb)
    S, pi, pj, skip, align = rs._align(a, b)
    assert S == best
    assert set(zip(pi.tolist(), pj.tolist())) == pairs
    assert set(np.flatnonzero(skip).tolist()) == skippable
    assert all(a[i] == b[j] for i, j in align) and (np.diff(align, axis=0) > 0).all()
    assert (score(tuple(align[:, 0]), tuple(align[:, 1])) if len(align) else 0) == best


def test_the_ledger_says_how_much_replayed_time_has_no_floor():
    """Without an eager step only the tensor-list kernel has a floor (its launch grid); with one,
    the rest is floored from the eager step's shapes. The caveat's shares are those of the
    replayed kernels' time, computed here from the events."""
    from taxmodel.ledger.compute import compute_ledger
    from taxmodel.trace.bundle import Bundle, make_meta

    layer = _layer(1)
    adam = (ADAM, "64,1,1", 8_000)

    def caveat(tr):
        tr.rows[-1]["block"] = "512,1,1"
        ev, meta = rs.attach_replay_shapes(tr.events(), {})
        led = compute_ledger(Bundle(ev, make_meta(**meta, hardware={"name": "NVIDIA H200"})))
        rep = _replayed(ev)
        share = (rep["end_ns"] - rep["start_ns"]).to_numpy()
        share = share / share.sum() * 100
        return next(c for c in led.caveats if c.startswith("CUDA-graph replays:")), share

    text, share = caveat(Trace().replay(1, 3, _as_replay(layer) + [adam]).replay(2, 3, _as_replay(layer) + [adam]))
    assert f"0.0% is floored from the shapes of the eager step, {share[-1]:.1f}% from launch grids, " \
           f"{share[:-1].sum():.1f}% has no floor" in text
    assert rs.REASONS["no_eager_step"] in text and "0 of 12 replayed kernels" in text
    text, share = caveat(Trace().eager(1, layer).replay(2, 3, _as_replay(layer) + [adam]))
    assert f"{share[:-1].sum():.1f}% is floored from the shapes of the eager step, {share[-1]:.1f}% from launch grids, " \
           "0.0% has no floor" in text


def test_a_kineto_trace_with_its_own_eager_step_end_to_end(tmp_path):
    """torch.profiler trace: step 1 eager (aten::mm launching a split-K GEMM and its reduce,
    aten::add), step 2 one cudaGraphLaunch replaying the same three kernels: the import gives the
    replay the eager kernels' work, the mm's split by the replay's own eager counterparts."""
    import json

    from taxmodel.trace import importers

    bf = "c10::BFloat16"

    def op(name, ts, dur, dims=None):
        args = {} if dims is None else {"Input Dims": dims, "Input type": [bf] * len(dims), "Concrete Inputs": [""] * len(dims)}
        return {"ph": "X", "cat": "cpu_op" if dims is not None else "user_annotation", "name": name, "pid": 1, "tid": 1,
                "ts": ts, "dur": dur, "args": args}

    def launch(ts, corr, name="cudaLaunchKernel"):
        return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": 2,
                "args": {"correlation": corr}}

    def kernel(name, ts, dur, corr, grid):
        return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
                "args": {"device": 0, "stream": 7, "correlation": corr, "grid": grid, "block": [128, 1, 1]}}

    gemm, red, add = "nvjet_splitK_gemm", "cublasLt::splitKreduce_kernel", "vectorized_elementwise_kernel<add>"
    events = [op("ProfilerStep#1", 0, 1000), op("aten::mm", 10, 100, [[256, 512], [512, 256]]),
              launch(20, 1), launch(30, 2), op("aten::add", 150, 50, [[256, 256], [256, 256]]), launch(160, 3),
              kernel(gemm, 300, 30, 1, [2, 2, 4]), kernel(red, 340, 10, 2, [64, 1, 1]), kernel(add, 360, 5, 3, [64, 1, 1]),
              op("ProfilerStep#2", 1000, 1000), launch(1010, 9, "cudaGraphLaunch"),
              kernel(gemm, 1300, 31, 9, [2, 2, 4]), kernel(red, 1335, 9, 9, [64, 1, 1]), kernel(add, 1350, 5, 9, [64, 1, 1])]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events, "deviceProperties": [{"id": 0, "name": "NVIDIA H200"}]}))
    ev, meta, _ = importers.import_traces([path])
    k = ev[ev["kind"] == "kernel"]
    eager, rep = k[k["graph_id"] < 0], k[k["graph_id"] >= 0]
    assert len(rep) == 3 and (rep["shapes_from"] == rs.SHAPES_FROM_EAGER).all()
    assert rep[["op", "flops", "floor_bytes"]].to_numpy().tolist() == eager[["op", "flops", "floor_bytes"]].to_numpy().tolist()
    mm = eager[eager["op"] == "aten::mm"]
    assert mm["flops"].sum() == 2 * 256 * 512 * 256 and mm["op_id"].nunique() == 1
    assert meta["graph_shapes"]["match_rate"] == 1.0 and meta["graph_shapes"]["eager_steps"] == "this trace"


def test_a_few_kernels_with_other_launch_dims_are_refused_alone():
    """Eight layers, one kernel launched with another grid at its place in the replay (1 of 40
    kernels, below the share that says "another batch"): that kernel alone is refused, the
    others take their work."""
    step = _layer(1) * 8
    replay = _as_replay(step)
    replay[7] = (replay[7][0], "2048,1,1", replay[7][2])  # the second layer's GELU
    ev, meta = rs.attach_replay_shapes(Trace().eager(1, step).replay(2, 5, replay).events(), {})
    rep = _replayed(ev)
    assert rep["uncosted"].tolist()[7] == rs.REASONS["other_dims"]
    assert (rep["shapes_from"] == rs.SHAPES_FROM_EAGER).sum() == 39 and meta["graph_shapes"]["matched"] == 39
