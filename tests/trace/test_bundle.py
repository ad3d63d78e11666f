"""The bundle store: round trip, atomic writes, archives, and errors that name what is wrong."""
from __future__ import annotations

import json
import tarfile

import pandas as pd
import pytest

from taxmodel.errors import BundleError, InputError
from taxmodel.trace import bundle, schema
from taxmodel.trace.bundle import (Bundle, archive_bundle, bundle_rank_ids, find_bundles, load_bundle, load_rank_events,
                                   make_meta, write_bundle)


def _events(n_ranks: int = 2) -> pd.DataFrame:
    rows = []
    for r in range(n_ranks):
        rows += [
            {"rank": r, "device": r, "stream": 7, "kind": "kernel", "role": "compute", "name": "gemm",
             "start_ns": 1_000 + r, "end_ns": 2_000 + r, "correlation": 5, "iteration": 0},
            {"rank": r, "device": r, "stream": 9, "kind": "kernel", "role": "comm", "name": "nccl_ag",
             "start_ns": 2_100, "end_ns": 3_000, "correlation": 6, "iteration": 0, "collective_id": "0:0",
             "collective_op": "allgather", "bytes": 4096},
            {"rank": r, "stream": 1, "kind": "launch", "name": "cudaLaunchKernel", "start_ns": 500, "end_ns": 600,
             "correlation": 5, "iteration": 0},
            {"rank": r, "stream": 1, "kind": "marker", "name": "ProfilerStep#0", "start_ns": 400, "end_ns": 400,
             "iteration": 0},
        ]
    return pd.DataFrame(rows)


def test_round_trip(tmp_path):
    raw = tmp_path / "trace.json"
    raw.write_text("{}")
    path = write_bundle(tmp_path / "b", _events(), {"workload": "ag_gemm", "variant": "bsp", "shape": {"M": 64},
                                                    "world_size": 2, "my_key": [1, 2]}, raw_files=[raw])
    b = load_bundle(path)
    want = schema.normalize_events(_events())
    pd.testing.assert_frame_equal(b.events, want)
    assert b.meta["workload"] == "ag_gemm" and b.meta["my_key"] == [1, 2]
    assert b.meta["ranks"] == [0, 1] and b.meta["schema_version"] == schema.SCHEMA_VERSION
    assert b.meta["repetitions"] == 1 and b.meta["notes"] == []  # defaults filled in
    assert (path / "raw" / "trace.json").read_text() == "{}"
    assert b.ranks == [0, 1] and b.world_size == 2 and b.label == "ag_gemm/bsp/M64"
    assert len(b.gpu_events()) == 4


def test_row_groups_hold_one_rank_and_at_most_the_row_group_size(tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    monkeypatch.setattr(bundle, "ROW_GROUP_ROWS", 3)
    events = schema.normalize_events(_events(3))  # 4 rows a rank
    path = write_bundle(tmp_path / "b", events, {"world_size": 3})
    md = pq.ParquetFile(path / "events.parquet").metadata
    assert [md.row_group(i).num_rows for i in range(md.num_row_groups)] == [3, 1, 3, 1, 3, 1]
    pd.testing.assert_frame_equal(load_bundle(path).events, events)
    assert bundle_rank_ids(path) == [0, 1, 2]
    rank1, pos = load_rank_events(path, 1)
    assert list(pos) == [4, 5, 6, 7] and (rank1["rank"] == 1).all()


def test_gpu_events_of_some_columns():
    b = Bundle(events=schema.normalize_events(_events()))
    assert list(b.gpu_events(["rank", "name"]).columns) == ["rank", "name"]
    pd.testing.assert_frame_equal(b.gpu_events(["rank", "name"]), b.gpu_events()[["rank", "name"]])


def test_validation_failure_writes_nothing(tmp_path):
    bad = _events().assign(kind="bogus")
    with pytest.raises(BundleError, match="column 'kind' has unknown value 'bogus'"):
        write_bundle(tmp_path / "b", bad, {})
    assert list(tmp_path.iterdir()) == []


def test_failed_write_keeps_the_old_bundle(tmp_path):
    path = write_bundle(tmp_path / "b", _events(), {"workload": "old"})
    bad = _events()
    bad.loc[0, "end_ns"] = bad.loc[0, "start_ns"]
    with pytest.raises(BundleError, match="'end_ns' is not after 'start_ns'"):
        write_bundle(path, bad, {"workload": "new"})
    assert load_bundle(path).meta["workload"] == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["b"]
    write_bundle(path, _events(1), {"workload": "new"})  # a good write replaces it whole
    assert load_bundle(path).meta["workload"] == "new" and load_bundle(path).ranks == [0]
    assert [p.name for p in tmp_path.iterdir()] == ["b"]


def test_overwrite_false(tmp_path):
    write_bundle(tmp_path / "b", _events(), {})
    with pytest.raises(InputError, match="a bundle already exists there"):
        write_bundle(tmp_path / "b", _events(), {}, overwrite=False)


def test_wrong_schema_version_in_meta_is_refused(tmp_path):
    with pytest.raises(BundleError, match="field 'schema_version' is 99"):
        write_bundle(tmp_path / "b", _events(), {"schema_version": 99})
    path = write_bundle(tmp_path / "b", _events(), {})
    meta = json.loads((path / "meta.json").read_text())
    meta["schema_version"] = 2
    (path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(BundleError, match=r"field 'schema_version' is 2; this taxmodel reads version 1"):
        load_bundle(path)
    del meta["schema_version"]
    (path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(BundleError, match="field 'schema_version' is None"):
        load_bundle(path)


def test_loader_errors_name_the_problem(tmp_path):
    with pytest.raises(InputError, match="no such bundle"):
        load_bundle(tmp_path / "nothing")
    path = write_bundle(tmp_path / "b", _events(), {})
    (path / "meta.json").write_text("{not json")
    with pytest.raises(BundleError, match="meta.json: not valid JSON"):
        load_bundle(path)
    (path / "meta.json").write_text("[1, 2]")
    with pytest.raises(BundleError, match="expected a JSON object"):
        load_bundle(path)
    path = write_bundle(tmp_path / "c", _events(), {})
    (path / "events.parquet").write_bytes(b"garbage")
    with pytest.raises(BundleError, match="events.parquet: cannot be read as parquet"):
        load_bundle(path)
    (path / "events.parquet").unlink()
    with pytest.raises(BundleError, match="events.parquet is missing"):
        load_bundle(path)


def test_loader_validates_events(tmp_path):
    path = write_bundle(tmp_path / "b", _events(), {})
    ev = pd.read_parquet(path / "events.parquet")
    ev["role"] = "wizard"
    ev.to_parquet(path / "events.parquet", index=False)
    with pytest.raises(BundleError, match=r"column 'role' has unknown value 'wizard'"):
        load_bundle(path)


def test_archive_loads_like_the_directory(tmp_path):
    path = write_bundle(tmp_path / "b", _events(), {"workload": "w"})
    archive = archive_bundle(path, tmp_path / "b.tar.gz")
    a = load_bundle(archive)
    pd.testing.assert_frame_equal(a.events, load_bundle(path).events)
    assert a.meta["workload"] == "w" and a.path == archive
    assert not (tmp_path / ".b.tar.gz.tmp").exists()


def test_bad_archives(tmp_path):
    junk = tmp_path / "junk.tgz"
    junk.write_bytes(b"not a tar")
    with pytest.raises(BundleError, match="not a bundle directory and not a tar archive"):
        load_bundle(junk)
    a = write_bundle(tmp_path / "d" / "a", _events(), {})
    write_bundle(tmp_path / "d" / "b", _events(), {})
    two = tmp_path / "two.tar"
    with tarfile.open(two, "w") as tar:
        tar.add(tmp_path / "d", arcname="d")
    with pytest.raises(BundleError, match="archive holds 2 bundles; expected exactly one"):
        load_bundle(two)
    (a / "meta.json").unlink()
    with pytest.raises(BundleError, match="meta.json is missing"):
        archive_bundle(a, tmp_path / "a.tgz")


def test_find_bundles(tmp_path):
    a = write_bundle(tmp_path / "runs" / "x" / "a", _events(), {})
    b = write_bundle(tmp_path / "runs" / "b", _events(), {})
    assert find_bundles(tmp_path / "runs") == sorted([a, b])
    assert find_bundles(a) == [a]


def test_make_meta_and_label():
    meta = make_meta(variant="push")
    assert meta["variant"] == "push" and meta["source"] == "unknown" and meta["shape"] == {}
    meta["notes"].append("x")
    assert make_meta()["notes"] == []  # defaults are copied, never shared
    assert Bundle(events=schema.empty_events(), meta={}).label == "bundle"


def test_the_shape_keeps_the_workloads_order_every_other_key_sorted(tmp_path):
    """The shape reads in one order everywhere: the folder name `profile` gives a bundle
    (``bsp-M96xN40xK40xtp0``), its label and every heading; meta.json stays sorted otherwise."""
    from taxmodel.runtime.spec import bundle_path

    shape = {"M": 96, "N": 40, "K": 40, "tp": 0}
    path = bundle_path(tmp_path, "ag_gemm", "bsp", shape)
    write_bundle(path, _events(), {"workload": "ag_gemm", "variant": "bsp", "shape": shape, "world_size": 2,
                                   "capture": {"z": 1, "a": 2}})
    b = load_bundle(path)
    assert list(b.meta["shape"]) == ["M", "N", "K", "tp"]
    assert b.label == f"ag_gemm/{path.name.replace('-', '/', 1)}" == "ag_gemm/bsp/M96xN40xK40xtp0"
    text = (path / "meta.json").read_text()
    top = list(json.loads(text))
    assert top == sorted(top) and list(json.loads(text)["capture"]) == ["a", "z"]


def test_a_bundle_written_with_its_shape_sorted_reads_in_its_folders_order(tmp_path):
    """Bundles from before meta.json kept the shape's order (profiles/ holds many) list it sorted;
    loaded, they read in the order of their folder name, as new ones do."""
    shape = {"M": 8192, "N": 8192, "K": 8192}
    for folder, want in (("bsp-M8192xN8192xK8192", ["M", "N", "K"]), ("my_copy", ["K", "M", "N"]),
                         ("bsp-M8192xN8192", ["K", "M", "N"])):  # a name that lists other keys: as stored
        path = write_bundle(tmp_path / folder, _events(), {"workload": "gemm_rs", "variant": "bsp", "shape": shape,
                                                          "world_size": 2})
        meta = json.loads((path / "meta.json").read_text())
        meta["shape"] = dict(sorted(meta["shape"].items()))
        (path / "meta.json").write_text(json.dumps(meta, sort_keys=True))
        assert list(load_bundle(path).meta["shape"]) == want, folder
    assert load_bundle(tmp_path / "bsp-M8192xN8192xK8192").label == "gemm_rs/bsp/M8192xN8192xK8192"
