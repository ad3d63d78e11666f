"""Bundles never cost the user data and never end in a traceback: what may stand at -o, damaged
meta.json types, unsafe or truncated archives, times beyond the ledger's exact range (issue 28)."""
from __future__ import annotations

import io
import json
import os
import shutil
import stat
import tarfile

import pytest

from kineto_fixtures import write_ranks
from taxmodel import fsutil
from taxmodel.cli import cli
from taxmodel.errors import BundleError, InputError
from taxmodel.testing.synthetic import synthetic_bundle
from taxmodel.trace import bundle as bundle_module
from taxmodel.trace.bundle import load_bundle, prepare_output, write_bundle
from cli_runner import stderr_runner


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    case = synthetic_bundle(variant="bsp", workload="ag_gemm", shape={"M": 1024, "N": 256, "K": 512})
    return write_bundle(tmp_path_factory.mktemp("good") / "b", case.bundle.events, case.bundle.meta)


def _traces(directory):
    directory.mkdir(parents=True, exist_ok=True)
    return write_ranks(directory)


def _one_line_exit_2(res) -> str:
    assert res.exit_code == 2, (res.exit_code, res.output, res.stderr, res.exception)
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    return res.stderr.strip()


# --- -o never deletes what the tool did not write ----------------------------------------------


def test_import_refuses_a_directory_holding_other_things(tmp_path):
    paths, _ = _traces(tmp_path / "traces")
    project = tmp_path / "myproject"
    (project / "src").mkdir(parents=True)
    (project / "src" / "code.py").write_text("print('mine')\n")
    res = stderr_runner().invoke(cli, ["import", *map(str, paths), "-o", str(project)])
    assert "is a directory holding other things (src), not a bundle" in _one_line_exit_2(res)
    assert (project / "src" / "code.py").read_text() == "print('mine')\n"
    # --force does not change that: it only ever replaces a bundle
    res = stderr_runner().invoke(cli, ["import", *map(str, paths), "-o", str(project), "--force"])
    _one_line_exit_2(res)
    assert (project / "src" / "code.py").exists()


def test_a_directory_of_bundles_is_not_replaced(tmp_path, good):
    runs = tmp_path / "runs"
    for name in ("a", "b"):
        shutil.copytree(good, runs / "ag_gemm" / name)
    paths, _ = _traces(tmp_path / "traces")
    res = stderr_runner().invoke(cli, ["import", *map(str, paths), "-o", str(runs), "--force"])
    assert "holding other things (ag_gemm)" in _one_line_exit_2(res)
    assert sorted(p.name for p in (runs / "ag_gemm").iterdir()) == ["a", "b"]


def test_replacing_a_bundle_needs_force_and_says_so(tmp_path):
    paths, _ = _traces(tmp_path / "traces")
    out = tmp_path / "b"
    assert stderr_runner().invoke(cli, ["import", *map(str, paths), "-o", str(out)]).exit_code == 0
    before = (out / "meta.json").read_text()
    res = stderr_runner().invoke(cli, ["import", *map(str, paths), "-o", str(out)])
    assert "a bundle already exists there; pass --force" in _one_line_exit_2(res)
    assert (out / "meta.json").read_text() == before
    res = stderr_runner().invoke(cli, ["import", *map(str, paths), "-o", str(out), "--force"])
    assert res.exit_code == 0 and f"wrote {out} (replaced the bundle that was there: --force)" in res.output
    assert "--force" in stderr_runner().invoke(cli, ["import", "--help"]).output


def test_a_bundle_with_the_users_files_beside_it_is_not_replaced(tmp_path, good):
    b = tmp_path / "b"
    shutil.copytree(good, b)
    (b / "notes.txt").write_text("my notes")
    with pytest.raises(InputError, match="also notes.txt, which taxmodel did not write"):
        prepare_output(b, force=True)
    bundle = load_bundle(good)
    with pytest.raises(InputError):
        write_bundle(b, bundle.events, bundle.meta)  # the library refuses too (profile writes through it)
    assert (b / "notes.txt").read_text() == "my notes"



def _bundle_with_raw(tmp_path, good):
    """A copy of ``good`` with a raw/ file that its meta does not list (so no file of raw/ is ours)."""
    b = tmp_path / "b"
    shutil.copytree(good, b)
    (b / "raw").mkdir()
    (b / "raw" / "rank0.json").write_text("{}")
    return b


def test_the_meta_json_read_for_raw_is_held_to_its_size_cap(tmp_path, good, monkeypatch):
    """It was read whole, whatever its size (a sparse file of gigabytes)."""
    b = _bundle_with_raw(tmp_path, good)
    monkeypatch.setattr(bundle_module, "META_MAX_BYTES", 100)
    with pytest.raises(InputError, match=r"meta.json: meta.json amounts to more than 100 bytes"):
        prepare_output(b, force=True)


def test_a_meta_json_that_is_a_fifo_does_not_block_the_raw_check(tmp_path, good):
    b = _bundle_with_raw(tmp_path, good)
    (b / "meta.json").unlink()
    os.mkfifo(b / "meta.json")
    assert prepare_output(b, force=True)  # no meta to list raw/: its regular files count as ours


def test_writing_a_bundle_checks_its_output_once(tmp_path, good, monkeypatch):
    """Right before the swap (it checked at the start too, reading meta.json twice)."""
    b = _bundle_with_raw(tmp_path, good)
    calls = []
    real = bundle_module._check_raw_is_ours
    monkeypatch.setattr(bundle_module, "_check_raw_is_ours", lambda path: calls.append(path) or real(path))
    bundle = load_bundle(good)
    write_bundle(b, bundle.events, bundle.meta)
    assert calls == [b] and not (b / "raw").exists()

@pytest.mark.parametrize("where", ["same", "parent"])
def test_output_holding_the_inputs_is_refused(tmp_path, where):
    traces = tmp_path / "traces"
    paths, _ = _traces(traces)
    out = traces if where == "same" else tmp_path
    res = stderr_runner().invoke(cli, ["import", *map(str, paths), "-o", str(out), "--no-keep-raw", "--force"])
    assert "holds the input" in _one_line_exit_2(res)
    assert all(p.exists() for p in paths)


def test_output_under_a_regular_file_and_special_files(tmp_path, good):
    f = tmp_path / "file"
    f.write_text("x")
    bundle = load_bundle(good)
    with pytest.raises(InputError, match="is a regular file, not a directory"):
        write_bundle(f / "b", bundle.events, bundle.meta)
    with pytest.raises(InputError, match="is a regular file, not a bundle directory"):
        write_bundle(f, bundle.events, bundle.meta)
    link = tmp_path / "link"
    link.symlink_to(good)
    with pytest.raises(InputError, match="is a symbolic link"):
        prepare_output(link, force=True)
    assert f.read_text() == "x" and (good / "meta.json").exists()


def test_bundle_directories_get_the_umask_permissions(tmp_path, good):
    bundle = load_bundle(good)
    old = os.umask(0o022)
    try:
        out = write_bundle(tmp_path / "b", bundle.events, bundle.meta)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o755  # mkdtemp alone gives 0700
    assert stat.S_IMODE(os.stat(out / "meta.json").st_mode) == 0o644


def test_a_killed_writers_temporary_is_cleaned_by_the_next_write(tmp_path, good):
    bundle = load_bundle(good)
    dead = 2 ** 22 + 12345  # above the default pid_max: no such process
    stale = tmp_path / f".b.{dead}-abc123{fsutil.TMP_SUFFIX}"
    stale.mkdir()
    (stale / "events.parquet").write_bytes(b"half")
    alive = tmp_path / f".b.{os.getpid()}-zzz{fsutil.TMP_SUFFIX}"
    alive.mkdir()
    other = tmp_path / ".b.notes.tmp"  # not our pattern: never touched
    other.write_text("keep")
    write_bundle(tmp_path / "b", bundle.events, bundle.meta)
    assert not stale.exists() and alive.exists() and other.exists()


# --- damaged meta.json: one line naming file and field, exit 2, in every command ---------------

COMMANDS = {
    "show": lambda b, o: ["show", b],
    "show --json": lambda b, o: ["show", "--json", b],
    "analyze": lambda b, o: ["analyze", b],
    "report": lambda b, o: ["report", b, "-o", str(o / "r.html")],
    "export-trace": lambda b, o: ["export-trace", b, "-o", str(o / "t.json")],
    "advise": lambda b, o: ["advise", b],
}

BAD_FIELDS = [("capture", [1]), ("cost", "x"), ("clock_offsets_ns", {"0": "x"}), ("shape", {"M": [1]}),
              ("cost", {"flops": 1, "hbm_bytes": 1, "link_bytes": 1, "dtype": None}), ("world_size", 2 ** 62), ("ranks", [2 ** 40]), ("clock_offsets_ns", {"0": 2 ** 70}), ("shape", {"M": 2 ** 64}),
              ("cost", {"flops": 1, "hbm_bytes": 1, "link_bytes": 1,
                        "intermediates": [{"name": "x", "bytes": 5, "producer": "(", "consumer": "gemm"}]}),
              ("shape", True), ("world_size", "x"), ("ranks", 3.5), ("hardware", "x"), ("software", [1]),
              ("notes", -1), ("repetitions", 0), ("cost", {"flops": "many", "hbm_bytes": 0, "link_bytes": 0}),
              ("capture", {"gate_hold_us": "x"}), ("workload", {"a": 1})]


@pytest.mark.parametrize("field,value", BAD_FIELDS, ids=[f"{f}={json.dumps(v)}" for f, v in BAD_FIELDS])
def test_wrong_meta_types_are_named_at_load(tmp_path, good, field, value):
    b = tmp_path / "bad"
    shutil.copytree(good, b)
    meta = json.loads((b / "meta.json").read_text())
    meta[field] = value
    (b / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(BundleError, match=rf"meta.json: field '{field}(\.\w+|\.intermediates\[0\]\.\w+)?' must be"):
        load_bundle(b)


@pytest.mark.parametrize("command", sorted(COMMANDS) + ["compare", "validate"])
def test_every_command_reports_a_damaged_meta_in_one_line(tmp_path, good, command):
    root = tmp_path / "profiles"
    b = root / "ag_gemm" / "bsp"
    shutil.copytree(good, b)
    meta = json.loads((b / "meta.json").read_text())
    meta["clock_offsets_ns"] = [0, 1]
    (b / "meta.json").write_text(json.dumps(meta))
    if command == "compare":
        args = ["compare", str(good), str(b)]
    elif command == "validate":  # validate skips what it cannot use, one line each, and goes on
        res = stderr_runner().invoke(cli, ["validate", str(root)])
        assert res.exception is None or isinstance(res.exception, SystemExit)
        assert "meta.json: field 'clock_offsets_ns' must be" in res.stderr and "Traceback" not in res.stderr
        return
    else:
        args = COMMANDS[command](str(b), tmp_path)
    line = _one_line_exit_2(stderr_runner().invoke(cli, args))
    assert "meta.json: field 'clock_offsets_ns' must be" in line


def test_times_beyond_the_ledgers_exact_range_are_refused(tmp_path, good):
    bundle = load_bundle(good)
    ev = bundle.events.copy()
    i = ev.index[ev["kind"] == "kernel"][0]
    ev.loc[i, "end_ns"] = ev.loc[i, "start_ns"] + 2 ** 60
    with pytest.raises(BundleError, match=r"more than 2\*\*53 ns"):
        write_bundle(tmp_path / "w", ev, bundle.meta)
    # a bundle written by something else: refused at load, before the ledger's AssertionError
    b = tmp_path / "b"
    shutil.copytree(good, b)
    ev.to_parquet(b / "events.parquet", index=False)
    line = _one_line_exit_2(stderr_runner().invoke(cli, ["analyze", str(b)]))
    assert "events.parquet: times span" in line and "a timestamp is damaged" in line


# --- archives --------------------------------------------------------------------------------------


def _tar(path, members):
    with tarfile.open(path, "w:gz") as t:
        for name, data, kind in members:
            ti = tarfile.TarInfo(name)
            if kind == "link":
                ti.type, ti.linkname = tarfile.SYMTYPE, data
                t.addfile(ti)
            else:
                ti.size = len(data)
                t.addfile(ti, io.BytesIO(data))
    return path


def test_unsafe_and_truncated_archives(tmp_path, good):
    meta, events = (good / "meta.json").read_bytes(), (good / "events.parquet").read_bytes()
    ok = _tar(tmp_path / "ok.tgz", [("b/meta.json", meta, "file"), ("b/events.parquet", events, "file"),
                                    ("b/raw/secret", "/etc/hostname", "link")])
    assert len(load_bundle(ok).events) == len(load_bundle(good).events)  # raw/ is not unpacked to load
    trunc = tmp_path / "trunc.tgz"
    trunc.write_bytes(ok.read_bytes()[:2000])
    link = _tar(tmp_path / "link.tgz", [("b/meta.json", "/etc/passwd", "link"), ("b/events.parquet", events, "file")])
    escape = _tar(tmp_path / "escape.tgz", [("../../meta.json", meta, "file"), ("../../events.parquet", events, "file")])
    for path, want in ((trunc, "the archive is damaged or truncated (EOFError"), (link, "is not a regular file"),
                       (escape, "unsafe archive")):
        line = _one_line_exit_2(stderr_runner().invoke(cli, ["show", str(path)]))
        assert want in line, line
        assert "Aborted!" not in line


def test_archive_bundle_writes_through_a_unique_temporary(tmp_path, good):
    from taxmodel.trace.bundle import archive_bundle

    victim = tmp_path / "victim"
    victim.write_text("do not touch")
    (tmp_path / ".b.tgz.tmp").symlink_to(victim)  # the old fixed temporary name
    archive_bundle(good, tmp_path / "b.tgz")
    assert victim.read_text() == "do not touch"
    assert len(load_bundle(tmp_path / "b.tgz").events) == len(load_bundle(good).events)
