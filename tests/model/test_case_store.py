"""validate's cases and predictions, kept on disk and computed on worker processes: a second run
computes nothing and gives the same table; a changed bundle, a changed taxmodel or a damaged entry
is computed anew; worker processes give what one process gives."""
from __future__ import annotations

import io
import json
import sys

import pandas as pd
import pytest

from taxmodel.model import case_store, cases as cases_mod
from taxmodel.model import validate as val

from model_bundles import AG, model_bundle


@pytest.fixture
def bundles(tmp_path):
    root = tmp_path / "profiles"
    model_bundle(root / "bsp", "bsp", AG, 4)
    model_bundle(root / "pull", "pull", AG, 2)
    return root


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(case_store.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def counted(monkeypatch):
    """How many bundles' ledgers and how many predictions' ledgers are computed."""
    calls = {"cases": 0, "predictions": 0}
    load, taxes = cases_mod.load_case, case_store._predicted_taxes

    def counting_load(*a, **k):
        calls["cases"] += 1
        return load(*a, **k)

    def counting_taxes(*a, **k):
        calls["predictions"] += 1
        return taxes(*a, **k)

    monkeypatch.setattr(case_store, "load_case", counting_load)
    monkeypatch.setattr(case_store, "_predicted_taxes", counting_taxes)
    return calls


def test_a_second_run_computes_nothing_and_gives_the_same_validation(bundles, cache, counted):
    first = val.validate(bundles)
    assert counted == {"cases": 2, "predictions": 2}
    second = val.validate(bundles)
    assert counted == {"cases": 2, "predictions": 2}, "the second run computed again"
    pd.testing.assert_frame_equal(first.table, second.table)
    assert first.fitted == second.fitted and first.skipped == second.skipped
    assert [c.hardware for c in first.cases] == [c.hardware for c in second.cases]
    assert len(list((cache / case_store.code_fingerprint() / "cases").glob("*.json"))) == 2
    # without the cache everything is computed
    val.validate(bundles, cache=False)
    assert counted == {"cases": 4, "predictions": 4}


def test_a_changed_bundle_taxmodel_or_entry_is_computed_anew(bundles, cache, counted, monkeypatch):
    val.validate(bundles)
    model_bundle(bundles / "pull", "pull", {**AG, "M": 8192}, 2)  # the same path, other contents
    v = val.validate(bundles)
    assert counted == {"cases": 3, "predictions": 3}
    assert set(v.table.loc[v.table["variant"] == "pull", "shape"]) == {"K=8192,M=8192,N=8192,tp=0"}
    # a damaged entry is computed again, not an error
    for entry in (cache / case_store.code_fingerprint() / "cases").glob("*.json"):
        entry.write_text("{not json")
    val.validate(bundles)
    assert counted == {"cases": 5, "predictions": 3}
    # another taxmodel (any change to its code) starts a cache of its own
    monkeypatch.setattr(case_store, "code_fingerprint", lambda: "other-version")
    val.validate(bundles)
    assert counted == {"cases": 7, "predictions": 5}


def test_the_code_fingerprint_covers_taxmodel_and_its_kernels(tmp_path):
    import shutil

    import taxmodel

    roots = case_store.code_roots()
    assert case_store.Path(taxmodel.__file__).parent.resolve() in roots
    kernels = case_store.Path(case_store.importlib.util.find_spec("taxmodel.kernels").origin).parent.resolve()
    assert any(kernels == r or r in kernels.parents for r in roots)
    copy = tmp_path / "code"
    shutil.copytree(kernels, copy, ignore=shutil.ignore_patterns("__pycache__"))
    before = case_store.tree_digest([copy])
    (copy / "device" / "__init__.py").write_text((copy / "device" / "__init__.py").read_text() + "# changed\n")
    assert case_store.tree_digest([copy]) != before


def test_an_unwritable_cache_costs_time_not_the_run(bundles, tmp_path, monkeypatch, counted):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(case_store.CACHE_ENV, str(blocker / "cache"))  # below a file: cannot be created
    v = val.validate(bundles)
    assert len(v.cases) == 2 and counted == {"cases": 2, "predictions": 2}


def test_old_versions_caches_are_pruned(bundles, cache):
    for i in range(case_store.CaseStore.KEEP_VERSIONS + 2):
        (cache / f"{i:016x}").mkdir(parents=True)
    val.validate(bundles)
    left = sorted(d.name for d in cache.iterdir())
    assert case_store.code_fingerprint() in left and len(left) == case_store.CaseStore.KEEP_VERSIONS + 1


def test_pruning_leaves_what_is_not_a_versions_cache(bundles, cache):
    """$TAXMODEL_CACHE_DIR may name a folder that holds the user's own directories: only the
    caches of other taxmodel versions (named by their code fingerprint) are ever removed."""
    mine = [cache / "results", cache / "old0", cache / "0123456789abcdeF"]
    for d in mine:
        d.mkdir(parents=True)
        (d / "keep.txt").write_text("mine")
    for i in range(case_store.CaseStore.KEEP_VERSIONS + 2):
        (cache / f"{i:016x}").mkdir()
    val.validate(bundles)
    assert all((d / "keep.txt").read_text() == "mine" for d in mine)
    versions = [d for d in cache.iterdir() if case_store.FINGERPRINT_NAME.match(d.name)]
    assert case_store.code_fingerprint() in {d.name for d in versions}
    assert len(versions) == case_store.CaseStore.KEEP_VERSIONS + 1


def test_worker_processes_give_what_one_process_gives(bundles, monkeypatch):
    model_bundle(bundles / "push", "push", AG, 4)
    monkeypatch.setattr(case_store, "MIN_PARALLEL", 1)
    one = val.validate(bundles, jobs=1, cache=False)
    two = val.validate(bundles, jobs=2, cache=False)
    pd.testing.assert_frame_equal(one.table, two.table)
    assert len(two.cases) == 3 and one.fitted == two.fitted


def test_a_progress_bar_only_on_a_terminal(bundles, monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    for stream, shown in ((Terminal(), True), (io.StringIO(), False)):
        monkeypatch.setattr(sys, "stderr", stream)
        val.validate(bundles, cache=False, progress=True)
        assert ("validate: measured ledgers" in stream.getvalue()) is shown, stream.getvalue()
        assert ("validate: predictions" in stream.getvalue()) is shown


def test_case_json_round_trip(bundles):
    cases, _ = case_store.find_cases(bundles, cache=False)
    for c in cases:
        back = case_store.case_from_json(json.loads(json.dumps(case_store.case_to_json(c))))
        assert back == c


def test_the_same_bundles_by_another_path_are_the_same_cases(bundles, cache, counted, tmp_path, monkeypatch):
    """A run from another directory (`validate profiles/` from the repository, the test suite's
    absolute path) reuses the cases and names the bundles where they are now."""
    import shutil

    from taxmodel.testing.synthetic import synthetic_bundle
    from taxmodel.trace.bundle import write_bundle

    other = synthetic_bundle()  # workload "synthetic": no analytic model, skipped with its reason
    write_bundle(bundles / "other", other.bundle.events, other.bundle.meta)
    first = val.validate(bundles)
    assert first.skipped == [f"{bundles / 'other'}: workload 'synthetic' has no analytic model"]
    moved = tmp_path / "elsewhere" / "profiles"
    shutil.copytree(bundles, moved)
    monkeypatch.chdir(moved.parent)
    v = val.validate("profiles")
    assert counted == {"cases": 3, "predictions": 2}
    assert sorted(str(c.path) for c in v.cases) == ["profiles/bsp", "profiles/pull"]
    assert v.skipped == ["profiles/other: workload 'synthetic' has no analytic model"]
