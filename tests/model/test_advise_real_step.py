"""The fusion advisor on a real training step (profiles/h200x1-train: an 8-layer transformer,
eager, AdamW foreach, one H200, with Nsight Compute DRAM counters of one step): candidates end
where fusing is plausible, names are readable, the ledger's measured locality flows through,
the optimizer is a candidate of its own, and a bundle without floors or with one iteration
still gets candidates that say what is missing. Expected values come from the trace's own rows
(markers, launches, the ledger's parts), not from the advisor."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

import taxmodel
from taxmodel.cli import cli
from taxmodel.model import advise as adv
from taxmodel.model import advise_regions as regions
from taxmodel.ledger.compute import compute_ledger
from taxmodel.trace.bundle import Bundle

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "profiles" / "h200x1-train"


@pytest.fixture(scope="module")
def step(tmp_path_factory):
    """The eager batch-1 step imported once, with its counters."""
    out = tmp_path_factory.mktemp("advise_real") / "eager_b1"
    r = CliRunner().invoke(cli, ["import", str(TRAIN / "trace_eager_b1.json.gz"), "--counters",
                                 str(TRAIN / "ncu_eager_b1.csv.gz"), "-o", str(out)])
    assert r.exit_code == 0, r.output
    p = taxmodel.load(out)
    return p, p.advise(top=None)


def _step_kernels(p) -> pd.DataFrame:
    ev = p.events
    return ev[(ev["kind"] == "kernel") & (ev["iteration"] >= 0)]


def test_candidates_end_at_threads_annotations_and_the_chain_cap(step):
    p, t = step
    per_step = len(_step_kernels(p)) / len(p.analysis.windows)
    assert per_step == 570
    assert t["n_kernels"].max() < per_step / 1.5  # no candidate is the whole step any more
    chains = t[t["kind"] == "chain"]
    assert len(chains) and chains["n_kernels"].max() <= regions.MAX_CHAIN_KERNELS
    assert not chains["kernels"].str.contains("multi_tensor_apply").any()  # no chain runs into the optimizer
    cut = chains[chains["missing"].str.contains("cut at")]
    assert len(cut) and (cut["n_kernels"] == regions.MAX_CHAIN_KERNELS).all()
    # every chain starts at a GEMM or attention kernel, launched by a matmul or attention op
    k = _step_kernels(p)
    cls = pd.Series(adv._classes(k["name"].astype(str), k["role"].astype(str), k["collective_op"].astype(str), None,
                                 k.index), index=adv.short_names(k["name"].astype(str)))
    heads = chains["kernels"].str.split(" -> ").str[0]
    assert heads.map(lambda h: set(cls[[h]])).map(lambda c: c <= {"gemm", "attention"}).all()
    assert chains["ops"].str.split(" -> ").str[0].isin(["aten::addmm", "aten::mm", "aten::_cudnn_attention_forward",
                                                         "aten::_cudnn_attention_backward"]).all()


def test_names_are_readable_with_their_ops(step):
    _, t = step
    names = " -> ".join(t["kernels"]).split(" -> ")
    assert all(n and "void" not in n and "(" not in n and "::" not in n for n in names), \
        [n for n in names if "void" in n or "(" in n or "::" in n][:3]
    assert "vectorized_layer_norm_kernel" in names  # behind '(anonymous namespace)::' in the trace
    forward = t[(t["kind"] == "chain") & t["ops"].str.startswith("aten::addmm")]
    assert "aten::addmm -> aten::add -> aten::native_layer_norm" in set(forward["ops"])


def test_measured_locality_flows_from_the_ledger(step):
    p, t = step
    led = p.analysis
    assert led.locality == "measured" and led.kernel_locality_ns is not None
    assert t["locality_tax_us"].notna().all()
    assert not t["missing"].str.contains("locality \\(no counters").any()
    # runs and the optimizer carry the measured part only and together hold every kernel of the step
    # that has a neighbour in its region, so they add up to the ledger's locality tax
    parts = led.parts
    ledger_us = parts.loc[parts["subcategory"] == "locality_tax", "ns"].sum() / len(led.windows) / 1e3
    whole = t[t["kind"].isin(["run", "optimizer"])]
    assert ledger_us > 10
    # (the ledger's parts are whole ns per window, the candidates' sums are not: 1 ns per window apart at most)
    assert float((whole["locality_tax_us"] * whole["per_iteration"]).sum()) == pytest.approx(ledger_us, abs=1e-3 * len(led.windows))
    # chains add the intermediates between their kernels: estimated
    chains = t[t["kind"] == "chain"]
    assert (chains.loc[chains["locality_tax_us"] > 0, "confidence"] == "estimated").all()


def test_the_eager_adamw_step_is_an_optimizer_candidate(step):
    p, t = step
    (opt,) = t[t["kind"] == "optimizer"].itertuples(index=False)
    ev = p.events
    mark = ev[(ev["kind"] == "marker") & ev["name"].str.startswith("Optimizer.step#")]
    launches = ev[(ev["kind"] == "launch") & (ev["iteration"] == 1)]
    m = mark[mark["iteration"] == 1].iloc[0]
    inside = launches[(launches["start_ns"] >= m["start_ns"]) & (launches["start_ns"] <= m["end_ns"])]
    k = _step_kernels(p)
    n_inside = int(k[(k["iteration"] == 1) & k["correlation"].isin(inside["correlation"])].shape[0])
    assert opt.n_kernels == n_inside > 10
    assert "multi_tensor_apply_kernel" in opt.kernels
    assert opt.bound_us > 0


def test_the_profiler_caveat_reaches_the_table(step):
    _, t = step
    assert any("inflated by the profiler" in c for c in t.attrs["caveats"])
    assert t.loc[t["launch_tax_us"] > 0, "missing"].str.contains("profiler-inflated").all()


def test_without_floors_and_with_one_iteration_candidates_say_what_is_missing(step):
    p, _ = step
    ev = p.events.copy()
    for c in ("flops", "floor_bytes", "dram_read_bytes", "dram_write_bytes"):
        ev[c] = -1
    ev["op"] = ""
    ev = ev[(ev["iteration"] == 1) | (ev["iteration"] < 0)].reset_index(drop=True)
    bundle = Bundle(events=ev, meta=p.meta)
    led = compute_ledger(bundle)
    t = adv.advise(adv.Inputs(bundle, led), top=None)
    assert len(t) and {"run", "chain", "optimizer"} <= set(t["kind"])
    missing = " ".join(t["missing"])
    assert "per-kernel floors" in missing and "one iteration" in missing and "locality (no counters" in missing
    assert t["locality_tax_us"].isna().all()
    assert t["n_kernels"].max() < 570 / 1.5


def test_report_section_shows_the_new_kinds(step):
    from taxmodel.report import blocks as d
    from taxmodel.report.advice import KIND_ACTIONS, section

    p, _ = step
    blocks = section([(p.bundle, p.analysis)])
    tables = [b for b in blocks if isinstance(b, d.Table)]
    assert tables
    cells = {c for row in tables[0].rows for c in row}
    assert KIND_ACTIONS["optimizer"] in cells or KIND_ACTIONS["chain"] in cells
    assert any(isinstance(b, d.Paragraph) and "inflated by the profiler" in b.text for b in blocks)


def test_cap_chains_and_optimizer_groups_on_small_tables():
    chain = np.array([-1, 0, 0, 0, 0, -1, 1, 1])
    capped, lost = regions.cap_chains(chain, limit=3)
    assert list(capped) == [-1, 0, 0, 0, -1, -1, 1, 1]
    assert list(lost) == [0, 1, 1, 1, 0, 0, 0, 0]
    # no optimizer annotation: consecutive multi-tensor kernels of one run are the candidate
    k = pd.DataFrame({"name": ["gemm", "multi_tensor_apply_kernel", "multi_tensor_apply_kernel", "add", "foreach_x"],
                      "scope": [""] * 5})
    got = regions.optimizer_groups(k, np.zeros(5, np.int64))
    assert (got[1:3] >= 0).all() and got[1] == got[2] and got[0] == -1 and got[3] == -1 and got[4] == -1
