"""The ledger on Dask (ledger/on_dask.py) is the single-process ledger to the nanosecond:
committed multi-rank H200 bundles and synthetic jobs with many ranks, on an in-process
2-worker cluster, and a committed bundle on worker processes (everything crosses pickling);
without Dask, --scheduler says how to install it; a worker that dies (in either per-rank phase,
with Dask's default retries) or a node without the bundle ends in one line naming the rank and
the worker."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from taxmodel.cli import cli
from taxmodel.errors import AnalysisError, InputError
from taxmodel.ledger.compute import compute_ledger
from taxmodel.testing.synthetic import large_synthetic_bundle, synthetic_bundle
from taxmodel.trace import schema
from taxmodel.trace.bundle import EVENTS_FILE, bundle_rank_ids, load_bundle, load_rank_events, write_bundle

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = [  # 4 and 8 ranks, collectives, in-kernel records, graphs
    "profiles/h200x4/flash_decode/bsp-batch16xkv_len65536xq_heads32xkv_heads4xhead_dim128",
    "profiles/h200x4/flash_decode/fused-batch16xkv_len65536xq_heads32xkv_heads4xhead_dim128",
]


def _committed() -> list[Path]:
    paths = [ROOT / p for p in COMMITTED]
    gate = sorted((ROOT / "profiles/h200x8-graph-gate").glob("**/meta.json"))
    return paths + [gate[0].parent] if gate else paths


def assert_same_ledger(a, b) -> None:
    """Every part of two ledgers equal, exactly (integers to the ns, floats bit for bit)."""
    for f in ("parts", "windows", "intervals", "kernels"):
        pd.testing.assert_frame_equal(getattr(a, f), getattr(b, f), check_exact=True, obj=f)
    if a.kernel_locality_ns is None:
        assert b.kernel_locality_ns is None
    else:
        pd.testing.assert_series_equal(a.kernel_locality_ns, b.kernel_locality_ns, check_exact=True)
    assert (a.caveats, a.skipped, a.label, a.ranks, a.locality, a.meta) == (b.caveats, b.skipped, b.label, b.ranks,
                                                                             b.locality, b.meta)
    assert a.clock.to_dict() == b.clock.to_dict()


@pytest.fixture(scope="module")
def client():
    distributed = pytest.importorskip("dask.distributed", reason="dask[distributed] is not installed (the 'distributed' extra)")
    c = distributed.Client(processes=False, n_workers=2, threads_per_worker=1, dashboard_address=None)
    yield c
    c.close()


@pytest.mark.parametrize("path", _committed(), ids=lambda p: "/".join(p.parts[-3:-1]))
def test_committed_bundles_same_ledger_on_dask(client, path):
    from taxmodel.ledger.on_dask import compute_ledger_dask

    bundle, led = compute_ledger_dask(path, client, lenient=True)
    assert_same_ledger(compute_ledger(load_bundle(path), lenient=True), led)
    assert len(led.ranks) >= 4 and bundle.meta == led.meta


def test_many_ranks_same_ledger_on_dask(client, tmp_path):
    from taxmodel.ledger.on_dask import compute_ledger_dask

    case = synthetic_bundle(world_size=24, iterations=2, skew_ns=list(range(0, 24_000, 1000)), kernel_gap_ns=700,
                            host_starved_ns=900, intermediate_bytes=1 << 20, seed=3)
    path = write_bundle(tmp_path / "syn24", case.bundle.events, case.bundle.meta)
    _, led = compute_ledger_dask(path, client)
    assert_same_ledger(compute_ledger(load_bundle(path)), led)
    fused = synthetic_bundle(world_size=16, iterations=2, variant="fused", flag_wait_ns=1500, seed=4)
    path = write_bundle(tmp_path / "fused16", fused.bundle.events, fused.bundle.meta)
    _, led = compute_ledger_dask(path, client)
    assert_same_ledger(compute_ledger(load_bundle(path)), led)
    big = large_synthetic_bundle(world_size=64, kernels=64 * 200)
    path = write_bundle(tmp_path / "big64", big.events, big.meta)
    _, led = compute_ledger_dask(path, client)
    assert_same_ledger(compute_ledger(load_bundle(path)), led)
    assert len(led.ranks) == 64 and len(led.parts) > 0


def test_task_errors_reach_the_user_as_in_one_process(client, tmp_path):
    from taxmodel.ledger.on_dask import compute_ledger_dask

    case = synthetic_bundle(world_size=4, iterations=2)
    ev = case.bundle.events
    drop = (ev["rank"] == 2) & (ev["collective_id"].astype(str) != "") & (ev["iteration"] == 1)
    path = write_bundle(tmp_path / "cut", ev[~drop], case.bundle.meta)
    with pytest.raises(AnalysisError) as one:
        compute_ledger(load_bundle(path))
    with pytest.raises(AnalysisError) as many:
        compute_ledger_dask(path, client)
    assert str(one.value) == str(many.value)


def test_rank_row_groups_and_older_bundles(tmp_path):
    case = synthetic_bundle(world_size=3, iterations=2)
    path = write_bundle(tmp_path / "b", case.bundle.events, case.bundle.meta)
    whole = load_bundle(path).events
    import pyarrow.parquet as pq

    assert pq.ParquetFile(path / EVENTS_FILE).metadata.num_row_groups == 3  # one per rank
    for layout in ("per rank", "one row group (older bundles)"):
        assert bundle_rank_ids(path) == [0, 1, 2]
        for r in (0, 1, 2):
            ev, pos = load_rank_events(path, r)
            assert (ev["rank"] == r).all() and len(ev) == int((whole["rank"] == r).sum())
            pd.testing.assert_frame_equal(ev, whole.iloc[pos], check_exact=True)
        schema.normalize_events(whole).to_parquet(path / EVENTS_FILE, index=False)
    assert pq.ParquetFile(path / EVENTS_FILE).metadata.num_row_groups == 1
    assert np.array_equal(load_rank_events(path, 7)[1], np.zeros(0, np.int64))  # a rank with no events


def test_scheduler_without_dask_says_how_to_install(tmp_path, monkeypatch):
    case = synthetic_bundle(world_size=2, iterations=2)
    path = write_bundle(tmp_path / "b", case.bundle.events, case.bundle.meta)
    monkeypatch.setitem(sys.modules, "dask.distributed", None)  # import fails as if not installed
    from taxmodel.ledger.on_dask import connect

    with pytest.raises(InputError, match=r"pip install 'taxmodel\[distributed\]'"):
        connect("local:2")
    res = CliRunner().invoke(cli, ["analyze", str(path), "--scheduler", "local:2"])
    assert res.exit_code == 2
    assert "pip install 'taxmodel[distributed]'" in res.output and "Traceback" not in res.output


try:
    from distributed import WorkerPlugin
except ImportError:  # the tests that need it skip
    WorkerPlugin = object


class _DieOnRank(WorkerPlugin):
    """On every worker, also those started to replace a dead one: the task of ``rank`` in phase
    ``phase`` ("a" or "c") kills its worker process; with ``once`` (a file path) only the first
    time."""

    name = "taxmodel-test-die-on-rank"

    def __init__(self, rank: int, phase: str, once: str | None = None):
        self.rank, self.phase, self.once = rank, phase, once

    def setup(self, worker) -> None:
        import os

        from taxmodel.ledger import rank_summary, sweep

        module, attr = {"a": (rank_summary, "summarize_rank"), "c": (sweep, "rank_ledger")}[self.phase]
        real, rank, once = getattr(module, attr), self.rank, self.once

        def die_on_rank(rank_events, *args):
            if rank_events.rank == rank and not (once and os.path.exists(once)):
                if once:
                    open(once, "w").close()
                os._exit(1)
            return real(rank_events, *args)

        setattr(module, attr, die_on_rank)


def _dying_run(tmp_path, phase: str, workers: int, once: bool = False, **config) -> AnalysisError | None:
    """The error of a 3-rank ledger on a LocalCluster of worker processes where rank 1's task of
    ``phase`` kills its worker (``once``: the first time only; then the ledger must be right)."""
    dask = pytest.importorskip("dask", reason="dask[distributed] is not installed (the 'distributed' extra)")
    from dask.distributed import Client, LocalCluster

    from taxmodel.ledger.on_dask import compute_ledger_dask

    case = synthetic_bundle(world_size=3, iterations=2)
    path = write_bundle(tmp_path / "b", case.bundle.events, case.bundle.meta)
    with dask.config.set(config):
        with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None,
                          silence_logs=50) as cluster, Client(cluster) as c:
            c.register_plugin(_DieOnRank(1, phase, str(tmp_path / "died") if once else None))
            if once:
                assert_same_ledger(compute_ledger(load_bundle(path)), compute_ledger_dask(path, c)[1])
                assert (tmp_path / "died").exists()
                return None
            with pytest.raises(AnalysisError) as err:
                compute_ledger_dask(path, c)
    assert err.value.exit_code == 2 and "\n" not in str(err.value)
    return err.value


def test_a_worker_dying_fails_with_one_line_naming_rank_and_worker(tmp_path):
    # one worker, no retry: rank 2's task is queued on the worker that rank 1's kills, and both
    # fail in Dask's eyes; the message names the one that ran (submitted first), not the queued one
    err = _dying_run(tmp_path, "a", 1, **{"distributed.scheduler.allowed-failures": 0})
    assert re.match(r"rank 1: the Dask worker tcp://\S+ died while running this task.*during the ledger's first phase",
                    str(err)), err


def test_a_worker_dying_in_the_second_phase_with_default_retries(tmp_path):
    """Phase (c) after the plan: with Dask's default retries (allowed-failures 3) rank 1's task
    kills 4 workers (each replaced by its nanny); the plan, sent inside each task, survives, and the
    error names rank 1 and its last worker, never a cancelled future."""
    import dask

    assert dask.config.get("distributed.scheduler.allowed-failures") == 3  # the CLI's default
    err = _dying_run(tmp_path, "c", 2)
    assert re.match(r"rank 1: the Dask worker tcp://[\d.]+:\d+ died while running this task \(4 workers died "
                    r"running it.*during the ledger's second phase \(per-rank ledger\); nothing was written", str(err)), err


def test_a_worker_dying_once_in_the_second_phase_loses_nothing(tmp_path):
    """The only worker dies running rank 1's phase-(c) task; its replacement computes every rank
    again, with the plan each task carries: the ledger is the one-process ledger."""
    assert _dying_run(tmp_path, "c", 1, once=True) is None


@pytest.fixture(scope="module")
def process_client():
    """Two worker processes: tasks, their inputs (the plan) and results are pickled."""
    distributed = pytest.importorskip("dask.distributed", reason="dask[distributed] is not installed (the 'distributed' extra)")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  silence_logs=50) as cluster, distributed.Client(cluster) as c:
        yield c


def test_committed_bundle_same_ledger_on_worker_processes(process_client):
    from taxmodel.ledger.on_dask import compute_ledger_dask

    path = ROOT / COMMITTED[0]
    _, led = compute_ledger_dask(path, process_client)
    assert_same_ledger(compute_ledger(load_bundle(path)), led)
    one = CliRunner().invoke(cli, ["analyze", str(path), "--json"])
    many = CliRunner().invoke(cli, ["analyze", str(path), "--json", "--scheduler", "local:2"])
    assert one.exit_code == many.exit_code == 0, many.output
    assert json.loads(one.output) == json.loads(many.output)


def _no_bundle_here(missing: str) -> None:
    """On one worker: every rank's read looks for the bundle where this node has none."""
    from taxmodel.ledger import on_dask as ledger_dask
    from taxmodel.trace import bundle

    ledger_dask.load_rank_events = lambda path, rank: bundle.load_rank_events(missing, rank)


def _bundle_back() -> None:
    from taxmodel.ledger import on_dask as ledger_dask
    from taxmodel.trace import bundle

    ledger_dask.load_rank_events = bundle.load_rank_events


def test_a_node_without_the_bundle_names_rank_worker_and_path(process_client, tmp_path):
    from taxmodel.ledger.on_dask import compute_ledger_dask

    case = synthetic_bundle(world_size=8, iterations=2)
    path = write_bundle(tmp_path / "b", case.bundle.events, case.bundle.meta)
    lacking = sorted(process_client.scheduler_info()["workers"])[0]
    process_client.run(_no_bundle_here, str(tmp_path / "elsewhere"), workers=[lacking])
    try:
        with pytest.raises(InputError) as err:
            compute_ledger_dask(path, process_client)
    finally:
        process_client.run(_bundle_back, workers=[lacking])
    msg = str(err.value)
    assert msg.startswith("rank ") and f"{path.resolve() / EVENTS_FILE} cannot be read on the Dask worker {lacking} " \
        "(No such file or directory); --scheduler reads the bundle at the same path on every worker" in msg, msg
    assert "\n" not in msg and err.value.exit_code == 2
    _, led = compute_ledger_dask(path, process_client)  # the same cluster, the bundle back: fine
    assert_same_ledger(compute_ledger(load_bundle(path)), led)
