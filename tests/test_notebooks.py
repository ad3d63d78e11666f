"""The notebooks run top to bottom on CPU against the committed bundles, and the numbers they
print (``RESULT key=value ...`` lines) equal the ledger computed here directly.

Committed notebooks carry no outputs or execution counts, so that diffs stay reviewable.
The kernel is this interpreter (a kernelspec written to a temporary JUPYTER_PATH), with the Agg
backend; each notebook reads bundles only, never runs a workload.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
PROFILES = ROOT / "profiles" / "h200x4"  # what every notebook's first code cell names
FALLBACK = NOTEBOOKS / "data" / "cpu"
KINETO = ROOT / "tests" / "data" / "kineto"
GRAPH_PROFILES = ROOT / "profiles" / "h200x4-graph"  # notebook 06: CUDA-graph captures
TRAIN = ROOT / "profiles" / "h200x1-train"  # notebook 07: a real training step on one H200
EXPECTED = ["01_bsp_ag_gemm", "02_fine_grained_ag_gemm", "03_flash_decode", "04_model_accuracy",
            "05_bring_your_own_trace", "06_graph_captures_and_records", "07_what_fusing_would_buy"]
KERNEL = "taxmodel-nbtest"


def test_the_notebooks_exist():
    assert sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb")) == EXPECTED


@pytest.mark.parametrize("name", EXPECTED)
def test_committed_without_outputs(name):
    book = json.loads((NOTEBOOKS / f"{name}.ipynb").read_text())
    code = [c for c in book["cells"] if c["cell_type"] == "code"]
    assert code
    for cell in code:
        assert cell["outputs"] == [], f"{name}: a code cell has outputs; clear them before committing"
        assert cell["execution_count"] is None, f"{name}: a code cell has an execution count; clear outputs"
    first = "".join(code[0]["source"])
    if name == "06_graph_captures_and_records":
        assert 'PROFILES = "../profiles/h200x4-graph"' in first
    elif name == "07_what_fusing_would_buy":
        assert 'PROFILES = "../profiles/h200x1-train"' in first
    elif name != "05_bring_your_own_trace":  # the input directory is one variable in the first code cell
        assert 'PROFILES = "../profiles/h200x4"' in first


@pytest.fixture(scope="module")
def kernel_env(tmp_path_factory):
    """A kernelspec for this very interpreter, so the notebooks see the installed taxmodel."""
    root = tmp_path_factory.mktemp("jupyter")
    spec = root / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "taxmodel tests", "language": "python"}))
    return root


def _run(name: str, kernel_env: Path, monkeypatch) -> tuple[list[str], int]:
    """Execute a notebook; return its printed lines and the number of images it displayed."""
    monkeypatch.setenv("JUPYTER_PATH", str(kernel_env))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    book = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    client = nbclient.NotebookClient(book, kernel_name=KERNEL, timeout=300,
                                     resources={"metadata": {"path": str(NOTEBOOKS)}})
    client.execute()  # raises CellExecutionError naming the failing cell
    lines, images = [], 0
    for cell in book.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream" and out.get("name") == "stdout":
                lines.extend(out["text"].splitlines())
            images += "image/png" in out.get("data", {})
    return lines, images


def _results(lines: list[str]) -> list[dict[str, str]]:
    return [dict(kv.split("=", 1) for kv in line.split()[1:]) for line in lines if line.startswith("RESULT ")]


def _input_dir(workload: str) -> Path:
    from taxmodel.trace.bundle import find_bundles, load_bundle

    for d in (PROFILES, FALLBACK):
        if d.is_dir() and any(load_bundle(p).meta.get("workload") == workload for p in find_bundles(d)):
            return d
    raise AssertionError(f"no {workload} bundles under {PROFILES} or {FALLBACK}")


def _direct(workload: str) -> dict[str, object]:
    """label -> the ledger of that bundle, computed here without taxmodel.api."""
    from taxmodel.ledger.compute import compute_ledger
    from taxmodel.trace.bundle import find_bundles, load_bundle

    out = {}
    for path in find_bundles(_input_dir(workload)):
        b = load_bundle(path)
        if b.meta.get("workload") == workload:
            out[b.label] = compute_ledger(b, lenient=True)
    return out


def _mean(ledger, category: str) -> float:
    """Mean ns per iteration and rank of a category (or sub-category)."""
    parts = ledger.parts
    sel = parts[(parts["category"] == category) | (parts["subcategory"] == category)]
    return float(sel["ns"].sum()) / (len(ledger.windows) * len(ledger.ranks))


def _window_us(ledger) -> float:
    return float(ledger.windows["window_ns"].mean()) / 1e3


def test_01_bsp_ag_gemm(kernel_env, monkeypatch):
    lines, images = _run("01_bsp_ag_gemm", kernel_env, monkeypatch)
    assert images >= 2
    direct = _direct("ag_gemm")
    results = _results(lines)
    assert results
    for r in results:
        led = direct[r["label"]]
        assert led.meta["variant"] == "bsp"
        assert float(r["window_us"]) == pytest.approx(_window_us(led), abs=2e-3)
        assert float(r["bsp_tax_us"]) == pytest.approx(_mean(led, "bsp_tax") / 1e3, abs=2e-3)
        assert float(r["launch_tax_us"]) == pytest.approx(_mean(led, "launch_tax") / 1e3, abs=2e-3)


def test_02_fine_grained(kernel_env, monkeypatch):
    lines, images = _run("02_fine_grained_ag_gemm", kernel_env, monkeypatch)
    assert images >= 3
    direct = _direct("ag_gemm")
    results = _results(lines)
    assert results
    for r in results:
        ref, cand = direct[r["reference"]], direct[r["candidate"]]
        assert ref.meta["variant"] == "bsp" and cand.meta["variant"] != "bsp"
        assert ref.meta["shape"] == cand.meta["shape"]
        assert float(r["saved_us"]) == pytest.approx(_window_us(ref) - _window_us(cand), abs=2e-3)
        assert float(r["bsp_tax_saved_us"]) == pytest.approx((_mean(ref, "bsp_tax") - _mean(cand, "bsp_tax")) / 1e3, abs=2e-3)


def test_03_flash_decode(kernel_env, monkeypatch):
    lines, images = _run("03_flash_decode", kernel_env, monkeypatch)
    assert images >= 3
    direct = _direct("flash_decode")
    results = _results(lines)
    assert len({direct[r["label"]].meta["shape"]["kv_len"] for r in results}) >= 2
    for r in results:
        led = direct[r["label"]]
        window = _window_us(led)
        assert float(r["window_us"]) == pytest.approx(window, abs=2e-3)
        sync_launch = (_mean(led, "bsp_tax") + _mean(led, "launch_tax")) / 1e3
        assert float(r["sync_launch_pct"]) == pytest.approx(100 * sync_launch / window, abs=2e-3)


def _kineto_ledger(**meta):
    from taxmodel.ledger.compute import compute_ledger
    from taxmodel.trace.bundle import Bundle, make_meta
    from taxmodel.trace.importers import import_traces

    events, found, _ = import_traces(sorted(KINETO.glob("h200x4_ag_gemm_bsp_clean_rank*.json.gz")))
    bundle = Bundle(events=events, meta=make_meta(**{**found, **meta}))
    return bundle, compute_ledger(bundle)


def test_04_model_accuracy(kernel_env, monkeypatch):
    from taxmodel.model import analytic
    from taxmodel.workload import get_workload, load_builtin_workloads

    lines, images = _run("04_model_accuracy", kernel_env, monkeypatch)
    assert images >= 1
    (r,) = [r for r in _results(lines) if r.get("case") == "h200_bsp_m4096"]
    load_builtin_workloads()
    shape = {"M": 4096, "N": 8192, "K": 8192, "tp": 0}
    cost = get_workload("ag_gemm").cost(shape, 4, "bsp").to_dict()
    bundle, led = _kineto_ledger(workload="ag_gemm", variant="bsp", shape=shape, cost=cost)
    assert float(r["measured_us"]) == pytest.approx(_window_us(led), abs=2e-3)
    hw, _ = analytic.resolve_model_hardware(None, bundle.meta)
    pred = analytic.predict("ag_gemm", "bsp", shape, 4, hw, analytic.ModelParams.from_hardware(hw), cost=cost)
    assert float(r["predicted_us"]) == pytest.approx(pred.window_ns / 1e3, abs=2e-3)


def test_05_bring_your_own_trace(kernel_env, monkeypatch):
    lines, images = _run("05_bring_your_own_trace", kernel_env, monkeypatch)
    assert images >= 2
    (r,) = _results(lines)
    bundle, led = _kineto_ledger()
    assert float(r["window_us"]) == pytest.approx(_window_us(led), abs=2e-3)
    assert float(r["skew_wait_us"]) == pytest.approx(_mean(led, "skew_wait") / 1e3, abs=2e-3)
    # the largest spread of arrivals at one collective inside the profiled iterations, on the aligned clock
    ev = bundle.events
    coll = ev[(ev["collective_id"] != "") & (ev["iteration"] >= 0) & ev["kind"].isin(["kernel", "memcpy", "memset"])]
    start = coll["start_ns"].to_numpy(np.int64) + coll["rank"].map(led.clock.offsets_ns).to_numpy(np.int64)
    arrivals = coll.assign(aligned=start).groupby(["repetition", "collective_id", "rank"])["aligned"].min()
    spread = arrivals.groupby(level=[0, 1]).agg(lambda s: s.max() - s.min())
    assert float(r["max_skew_us"]) == pytest.approx(float(spread.max()) / 1e3, abs=2e-3)
    assert re.search(r"ag_gemm/bsp at M=4096 N=8192 K=8192 tp=0: [\d.]+ us per iteration", "\n".join(lines))


def test_06_graph_captures_and_records(kernel_env, monkeypatch):
    from taxmodel.ledger.compute import compute_ledger
    from taxmodel.trace.bundle import find_bundles, load_bundle

    lines, images = _run("06_graph_captures_and_records", kernel_env, monkeypatch)
    assert images >= 2
    bundles = {b.label: b for b in (load_bundle(p) for p in find_bundles(GRAPH_PROFILES))}
    assert all(b.meta["capture"]["graph"] for b in bundles.values())
    results = _results(lines)
    ag = [r for r in results if r["kind"] == "ag"]
    assert len(ag) == 8  # pull and push against bsp at four sizes
    for r in ag:
        ref, cand = (compute_ledger(bundles[r[k]], lenient=True) for k in ("reference", "candidate"))
        assert float(r["saved_us"]) == pytest.approx(_window_us(ref) - _window_us(cand), abs=2e-3)
        assert float(r["bsp_tax_saved_us"]) == pytest.approx((_mean(ref, "bsp_tax") - _mean(cand, "bsp_tax")) / 1e3,
                                                             abs=2e-3)
    (fd,) = [r for r in results if r["kind"] == "fd"]
    ev = bundles[fd["label"]].events
    kern = ev[(ev["kind"] == "kernel") & (ev["iteration"] >= 0)].set_index(["rank", "repetition", "iteration"])["start_ns"]
    rec = ev[ev["kind"] == "record"]
    key = list(zip(rec["rank"], rec["repetition"], rec["iteration"]))
    end_us = (rec["end_ns"].to_numpy() - kern.reindex(key).to_numpy()) / 1e3
    last = rec.assign(end_us=end_us).groupby(["rank", "repetition", "iteration", "phase"])["end_us"].max()
    for phase, field in (("compute", "compute_end_us"), ("store_push", "push_end_us"), ("flag_wait", "wait_end_us")):
        assert float(fd[field]) == pytest.approx(float(last.xs(phase, level="phase").median()), abs=2e-3)
    # the workers finish long before the pushes, which finish before the waits end
    assert float(fd["compute_end_us"]) < float(fd["push_end_us"]) < float(fd["wait_end_us"])


def test_07_what_fusing_would_buy(kernel_env, monkeypatch, tmp_path):
    from taxmodel.model.advise import Inputs, advise, kernel_table, with_trace_floors
    from taxmodel.ledger.compute import compute_ledger
    from taxmodel.trace.bundle import Bundle, make_meta
    from taxmodel.trace.importers import import_bundle, import_traces

    lines, images = _run("07_what_fusing_would_buy", kernel_env, monkeypatch)
    assert images >= 1
    results = _results(lines)

    def direct(name: str, counters: bool = False):
        if counters:
            bundle, _ = import_bundle([TRAIN / f"{name}.json.gz"], tmp_path / name, counters=TRAIN / "ncu_eager_b1.csv.gz")
        else:
            events, found, _ = import_traces([TRAIN / f"{name}.json.gz"])
            bundle = Bundle(events=events, meta=make_meta(**found))
        return bundle, compute_ledger(bundle)

    def memory_family(bundle, led) -> tuple[float, float]:
        k = kernel_table(with_trace_floors(Inputs(bundle, led)))
        mem = k[k["cls"] == "memory"]
        n = len(led.windows)
        return len(mem) / n, float((mem["end"] - mem["start"]).sum()) / 1e3 / n

    sanity = {int(r["batch"]): r for r in results if r["kind"] == "sanity"}
    ledger_lines = {int(r["batch"]): r for r in results if r["kind"] == "ledger"}
    assert set(sanity) == set(ledger_lines) == {1, 8}
    for b in (1, 8):
        timing = json.loads((TRAIN / f"timing_eager_compile_b{b}.json").read_text())["unprofiled"]
        saving = (timing["eager"]["median_ms"] - timing["compile"]["median_ms"]) * 1e3
        r = sanity[b]
        assert float(r["saving_us"]) == pytest.approx(saving, abs=2e-3)
        eb, el = direct(f"trace_eager_b{b}", counters=b == 1)
        assert float(ledger_lines[b]["window_us"]) == pytest.approx(_window_us(el), abs=2e-3)
        assert float(ledger_lines[b]["launch_tax_us"]) == pytest.approx(_mean(el, "launch_tax") / 1e3, abs=2e-3)
        chains = advise(Inputs(eb, el), top=None)
        chains = chains[chains["kind"] == "chain"]
        assert float(r["chain_bound_us"]) == pytest.approx(float(chains["bound_us"].sum()), abs=2e-3)
        assert r["covered"] == str(float(r["chain_bound_us"]) >= saving)
        n_e, us_e = memory_family(eb, el)
        n_c, us_c = memory_family(*direct(f"trace_compile_b{b}"))
        assert float(r["memory_kernels_eager"]) == pytest.approx(n_e, abs=0.5)
        assert float(r["memory_kernels_compile"]) == pytest.approx(n_c, abs=0.5)
        assert float(r["memory_us_eager"]) == pytest.approx(us_e, abs=2e-3)
        assert float(r["memory_us_compile"]) == pytest.approx(us_c, abs=2e-3)
