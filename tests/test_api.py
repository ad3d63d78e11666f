"""The notebook-facing API (taxmodel.api): loading, tables, comparisons, figures, display.

Numbers are checked against the ledger computed directly (compute_ledger) and against the
synthetic bundles' known taxes; the figures only for being figures (their drawing is
tested in tests/report)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from matplotlib.figure import Figure

import taxmodel
from taxmodel.api import Profile, ProfileSet, load, open_profiles, sum_check
from taxmodel.errors import InputError
from taxmodel.ledger.categories import CATEGORY_ORDER
from taxmodel.ledger.compute import compute_ledger
from taxmodel.trace.bundle import load_bundle, write_bundle
from taxmodel.testing.synthetic import synthetic_bundle

ROOT = Path(__file__).resolve().parents[1]
KINETO = sorted((ROOT / "tests" / "data" / "kineto").glob("h200x4_ag_gemm_bsp_clean_rank*.json.gz"))
CPU = ROOT / "notebooks" / "data" / "cpu"


def _write(tmp: Path, name: str, **kw) -> Path:
    case = synthetic_bundle(**kw)
    return write_bundle(tmp / name, case.bundle.events, case.bundle.meta)


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory) -> Path:
    """bsp and pull at two sizes of a synthetic ag_gemm, plus one injected bsp."""
    tmp = tmp_path_factory.mktemp("sweep")
    for m, scale in ((64, 1.0), (128, 2.0)):
        _write(tmp, f"bsp-{m}", variant="bsp", workload="ag_gemm", shape={"M": m, "N": 32}, scale=scale, skew_ns=4000)
        _write(tmp, f"pull-{m}", variant="pull", workload="ag_gemm", shape={"M": m, "N": 32}, scale=scale,
               flag_wait_ns=2000)
    case = synthetic_bundle(variant="bsp", workload="ag_gemm", shape={"M": 64, "N": 32}, extra_launches=3)
    meta = {**case.bundle.meta, "capture": {**case.bundle.meta.get("capture", {}), "inject": {"extra_launches": 3}}}
    write_bundle(tmp / "nested" / "bsp-64-injected", case.bundle.events, meta)
    return tmp


def test_load_dispatches_on_what_it_is_given(sweep_dir):
    one = taxmodel.load(sweep_dir / "bsp-64")
    assert isinstance(one, Profile) and one.label == "ag_gemm/bsp/M64xN32"
    many = taxmodel.load(sweep_dir)
    assert isinstance(many, ProfileSet) and len(many) == 5
    assert many.root == sweep_dir
    listed = load([sweep_dir / "bsp-64", sweep_dir / "nested"])
    assert isinstance(listed, ProfileSet) and len(listed) == 2
    traces = taxmodel.load(KINETO)
    assert isinstance(traces, Profile) and traces.world_size == 4
    with pytest.raises(InputError, match="no such file"):
        taxmodel.load(sweep_dir / "missing")
    (sweep_dir / "empty").mkdir(exist_ok=True)
    with pytest.raises(InputError, match="no profile bundles"):
        taxmodel.load(sweep_dir / "empty")


def test_tables_are_the_ledger_s_and_cached(sweep_dir):
    p = taxmodel.load(sweep_dir / "bsp-128")
    direct = compute_ledger(load_bundle(sweep_dir / "bsp-128"))
    assert p.analysis is p.analysis  # computed once
    assert p.ledger.equals(direct.parts)
    assert p.windows.equals(direct.windows)
    assert np.allclose(p.summary["mean_ns"], direct.summary()["mean_ns"])
    assert np.allclose(p.summary["mean_us"] * 1000.0, p.summary["mean_ns"])
    assert p.window_ns == pytest.approx(direct.windows["window_ns"].mean())
    assert p.iterations.equals(direct.per_iteration())
    assert sum_check(p)
    k = p.kernels
    assert (k["duration_ns"] == k["end_ns"] - k["start_ns"]).all() and (k["duration_ns"] > 0).all()
    assert len(k) == int(p.events["kind"].isin(["kernel", "memcpy", "memset"]).sum())
    assert list(p.table()["category"])[-1] == "Total"


@settings(max_examples=6, deadline=None)
@given(skew=st.integers(min_value=500, max_value=15_000), world=st.integers(min_value=2, max_value=4))
def test_collectives_give_each_rank_s_wait_for_the_last(skew, world):
    case = synthetic_bundle(world_size=world, variant="bsp", skew_ns=skew, iterations=2)
    c = Profile(case.bundle).collectives
    assert len(c) == world * 2 and set(c["op"]) == {"allgather"}
    for row in c.itertuples():
        assert row.wait_ns == case.expected_ns("skew_wait", rank=row.rank, iteration=row.iteration)
    assert (c["skew_ns"] == skew).all()
    assert (c.groupby("collective_id")["rank"].nunique() == world).all()


def test_where_families_and_summary(sweep_dir):
    ps = taxmodel.load(sweep_dir)
    assert len(ps.where(injected=False)) == 4
    assert ps.where(variant="bsp", M=64).labels == ["ag_gemm/bsp/M64xN32"] * 2
    assert len(ps.where(variant=["bsp", "pull"], M=lambda m: m > 64)) == 2
    fams = ps.where(injected=False).families("M")
    assert len(fams) == 1 and sorted({p.shape["M"] for p in fams[0]}) == [64, 128]
    s = ps.summary
    assert list(s["label"]) == ps.labels
    cats = s[[f"{c}_us" for c in CATEGORY_ORDER]].sum(axis=1)
    assert np.allclose(cats, s["window_us"])  # the parts sum to the window
    assert set(ps.ledger["label"]) == set(ps.labels)
    assert ps["pull-64"].variant == "pull"


def test_compare_is_the_difference_of_ledgers(sweep_dir):
    ps = taxmodel.load(sweep_dir).where(injected=False)
    df = ps.compare(reference="bsp")
    assert sorted(df["M"]) == [64, 128] and set(df["candidate"]) == {"pull"}
    for row in df.itertuples():
        ref = compute_ledger(load_bundle(sweep_dir / f"bsp-{row.M}"))
        cand = compute_ledger(load_bundle(sweep_dir / f"pull-{row.M}"))
        want = (ref.windows["window_ns"].mean() - cand.windows["window_ns"].mean()) / 1000.0
        assert row.saved_us == pytest.approx(want, abs=1e-9)
        parts = sum(getattr(row, f"{c}_saved_us") for c in CATEGORY_ORDER)
        assert parts == pytest.approx(want, abs=1e-6)
        assert row.reference_label == "ag_gemm/bsp/" + f"M{row.M}xN32"
    assert ps.compare(reference="no-such-variant").empty
    table = ps.where(M=64).comparison_table()
    assert "pull − bsp (us)" in table.columns
    with pytest.raises(InputError, match="one workload and shape"):
        ps.comparison_table()


def test_figures_come_back_as_figures(sweep_dir):
    ps = taxmodel.load(sweep_dir).where(injected=False)
    p = ps["pull-64"]
    for fig in (p.plot_ledger(), p.plot_timeline(), ps.plot_ledger(), ps.plot_sweep(), ps.where(M=64).plot_timeline()):
        assert isinstance(fig, Figure)


def test_display(sweep_dir):
    p = taxmodel.load(sweep_dir / "bsp-64")
    assert repr(p).startswith("<Profile ag_gemm/bsp/M64xN32: 2 rank(s)")
    html = p._repr_html_()
    assert "<table" in html and "ag_gemm/bsp/M64xN32" in html and "iteration window" in html
    ps = taxmodel.load(sweep_dir)
    assert repr(ps).startswith("<ProfileSet of 5 profile(s)")
    assert ps._repr_html_().count("<tr") == 1 + len(ps)
    broken = p.with_meta()
    broken.bundle.events = broken.bundle.events[broken.bundle.events["kind"] == "marker"]
    assert "ledger not available" in broken._repr_html_()


def test_open_profiles_falls_back_and_says_so(sweep_dir, tmp_path, capsys):
    ps = open_profiles(tmp_path / "not-yet", workload="ag_gemm", fallback=sweep_dir)
    assert len(ps) == 5 and "no ag_gemm bundles under" in capsys.readouterr().out
    assert "NOTE" in ps.note
    direct = open_profiles(sweep_dir, workload="ag_gemm", fallback=tmp_path)
    assert direct.note is None and len(direct) == 5
    with pytest.raises(InputError, match="nor under the fallback"):
        open_profiles(tmp_path / "a", workload="flash_decode", fallback=sweep_dir)


def test_cpu_stand_ins_are_marked_emulated():
    ps = open_profiles(CPU / "missing", fallback=CPU, quiet=True)
    assert len(ps) >= 2 and all(p.emulated for p in ps)
    assert "say nothing about GPUs" in ps.note


def test_traces_with_declared_meta_and_prediction():
    p = taxmodel.load(KINETO)
    # no declared cost yet, and the traces have no shapes: only the collectives' link floors and the
    # memsets' bytes are costed (docs/ledger.md 5a)
    base = p.categories_ns()["useful"]
    k = p.analysis.kernels
    assert not k.loc[k["role"] == "compute", "costed"].any() and k.loc[k["role"] == "comm", "costed"].all()
    from taxmodel.workload import get_workload, load_builtin_workloads

    load_builtin_workloads()
    shape = {"M": 4096, "N": 8192, "K": 8192, "tp": 0}
    d = p.with_meta(workload="ag_gemm", variant="bsp", shape=shape, cost=get_workload("ag_gemm").cost(shape, 4, "bsp").to_dict())
    assert d.window_ns == p.window_ns and d.categories_ns()["useful"] > base
    pred = d.predict()
    from taxmodel.model import analytic

    hw, _ = analytic.resolve_model_hardware(None, d.meta)
    direct = analytic.predict("ag_gemm", "bsp", shape, 4, hw, analytic.ModelParams.from_hardware(hw), cost=d.meta["cost"])
    assert pred.window_ns == pytest.approx(direct.window_ns)
    assert isinstance(d.plot_vs_prediction(pred), Figure)
    assert taxmodel.predict("ag_gemm", "bsp", shape, 4, "h200-calibrated", fitted={}, align="host").window_ns == \
        pytest.approx(analytic.predict("ag_gemm", "bsp", shape, 4, "h200-calibrated").window_ns)
    with pytest.raises(InputError, match="needs workload, variant and shape"):
        p.predict()
