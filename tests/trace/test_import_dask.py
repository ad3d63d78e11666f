"""`taxmodel import --scheduler` (trace/import_dask.py) writes the one-process import's bundle:
on the committed 4-rank Kineto traces and two ranks of an HTA NCCL job, through the CLI on
worker processes; per-file tasks (an importer with parse/combine) run on a worker that sees
their file; a trace that no worker sees is a missing rank (refused, or left out with
--allow-missing-ranks)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from click.testing import CliRunner

from taxmodel.cli import cli
from taxmodel.errors import InputError
from taxmodel.trace import importers
from taxmodel.trace.bundle import EVENTS_FILE, META_FILE, load_bundle

DATA = Path(__file__).resolve().parents[1] / "data"
KINETO = sorted((DATA / "kineto").glob("h200x4_ag_gemm_bsp_clean_rank*.json.gz"))
HTA = [DATA / "thirdparty/hta/sampled_rank0_of_128.json.gz", DATA / "thirdparty/hta/sampled_rank1_of_128.json.gz"]

distributed = pytest.importorskip("dask.distributed", reason="dask[distributed] is not installed (the 'distributed' extra)")


def assert_same_bundle(a: Path, b: Path, extra_notes: int = 0) -> None:
    """The same events.parquet, byte for byte, and the same meta.json but for its creation time
    (and ``extra_notes`` notes that only ``b`` has)."""
    assert (a / EVENTS_FILE).read_bytes() == (b / EVENTS_FILE).read_bytes()
    ma, mb = (json.loads((p / META_FILE).read_text()) for p in (a, b))
    ma.pop("created"), mb.pop("created")
    if extra_notes:
        mb["notes"] = mb["notes"][:-extra_notes]
    assert ma == mb
    assert sorted(p.name for p in (a / "raw").glob("*")) == sorted(p.name for p in (b / "raw").glob("*"))


@pytest.mark.parametrize("traces, options", [(KINETO, []), (HTA, ["--allow-missing-ranks"])], ids=["kineto4", "hta2of128"])
def test_import_on_dask_writes_the_one_process_bundle(tmp_path, traces, options):
    files = [str(p) for p in traces]
    one = CliRunner().invoke(cli, ["import", *files, "-o", str(tmp_path / "one"), *options])
    many = CliRunner().invoke(cli, ["import", *files, "-o", str(tmp_path / "many"), "--scheduler", "local:2", *options])
    assert one.exit_code == many.exit_code == 0, many.output
    assert "format: kineto (detected on the Dask workers)" in many.output
    assert_same_bundle(tmp_path / "one", tmp_path / "many")
    assert load_bundle(tmp_path / "many").ranks == load_bundle(tmp_path / "one").ranks


@pytest.fixture(scope="module")
def client():
    """Two worker processes; the first in address order is ``client.workers[0]``."""
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  silence_logs=50) as cluster, distributed.Client(cluster) as c:
        c.workers = sorted(c.scheduler_info()["workers"])
        yield c


def _hide(pattern: str) -> None:
    """On a worker: the files whose path matches ``pattern`` are not on this node."""
    from taxmodel.trace import import_dask

    real = getattr(import_dask._readable, "real", import_dask._readable)

    def readable(paths):
        return [ok and not re.search(pattern, p) for p, ok in zip(paths, real(paths))]

    readable.real = real
    import_dask._readable = readable


def _unhide() -> None:
    from taxmodel.trace import import_dask

    import_dask._readable = getattr(import_dask._readable, "real", import_dask._readable)


@pytest.fixture
def hide(client):
    """``hide(pattern, workers)``: those workers do not see the matching files, until the test ends."""
    def on(pattern: str, workers: list[str]) -> None:
        client.run(_hide, pattern, workers=workers)

    yield on
    client.run(_unhide)


def test_per_file_tasks_run_where_their_file_is(client, hide, tmp_path, monkeypatch):
    import per_file_importer

    from taxmodel.trace.import_dask import import_bundle_dask

    monkeypatch.setattr(importers, "IMPORTER_MODULES", importers.IMPORTER_MODULES + [per_file_importer.MODULE])
    fmt = per_file_importer.FORMAT
    importers.import_bundle(KINETO, tmp_path / "one", fmt)
    hide("rank3", [client.workers[1]])  # rank 3's trace is on the first worker's node only
    with distributed.get_task_stream(client) as tasks:
        bundle, got = import_bundle_dask(KINETO, tmp_path / "many", client, fmt)
    assert got == fmt and bundle.ranks == [0, 1, 2, 3]
    assert_same_bundle(tmp_path / "one", tmp_path / "many")
    parsed = {t["key"].split("-")[2]: t["worker"] for t in tasks.data if t["key"].startswith("taxmodel-parse-")}
    assert sorted(parsed) == ["0", "1", "2", "3"] and parsed["3"] == client.workers[0]


def test_a_trace_on_no_worker_is_a_missing_rank(client, hide, tmp_path):
    from taxmodel.trace.import_dask import import_bundle_dask

    hide("rank3", client.workers)
    with pytest.raises(InputError) as err:
        import_bundle_dask(KINETO, tmp_path / "refused", client)
    assert str(err.value) == (f"{KINETO[3]}: no such file on any of the 2 Dask workers (each looked at that path on its "
                              "node); put each trace at that path on a node whose worker reads it, or pass "
                              "--allow-missing-ranks to import the ranks that can be read")
    assert not (tmp_path / "refused").exists()
    bundle, _ = import_bundle_dask(KINETO, tmp_path / "subset", client, allow_missing_ranks=True)
    assert bundle.ranks == [0, 1, 2]
    assert bundle.meta["notes"][-1] == f"import: on no Dask worker's node, so left out (--allow-missing-ranks): {KINETO[3]}"
    importers.import_bundle(KINETO[:3], tmp_path / "one", allow_missing_ranks=True)
    assert_same_bundle(tmp_path / "one", tmp_path / "subset", extra_notes=1)


def test_keep_raw_needs_the_traces_here(tmp_path):
    from taxmodel.trace.import_dask import import_bundle_dask

    elsewhere = tmp_path / "on-a-node" / "rank0.json.gz"
    with pytest.raises(InputError, match=r"rank0.json.gz: not on this machine, so --keep-raw cannot copy it .*"
                                         r"pass --no-keep-raw"):
        import_bundle_dask([elsewhere], tmp_path / "b", client=None)
