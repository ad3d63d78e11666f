"""Input holes a red team found (issue 38): each case used to crash (exit 70), hang, take memory or
disk without bound, lose a user's file, or accept nonsense; each is now one line or works."""
from __future__ import annotations

import gzip
import io
import json
import os
import tarfile
import tempfile
from pathlib import Path

import pytest

from kineto_fixtures import build_trace, write_ranks, write_trace
from cli_runner import stderr_runner
from taxmodel import fsutil, limits
from taxmodel.cli import cli
from taxmodel.errors import InputError
from taxmodel.hardware.specs import load_hardware
from taxmodel.regress.config import load_config
from taxmodel.testing.synthetic import synthetic_bundle
from taxmodel.trace import importers
from taxmodel.trace.bundle import archive_bundle, load_bundle, write_bundle
from taxmodel.trace.ncu import read_counters

DAY_US = 86400 * 10**6
DEAD_PID = 2 ** 22 + 4321  # above pid_max's default: never a live process


def cli_run(*args):
    res = stderr_runner().invoke(cli, [str(a) for a in args])
    return res.exit_code, res.output, res.stderr


def test_a_kernel_103_days_after_its_launch_is_refused(tmp_path):
    doc, _ = build_trace(0, 1)
    launches = {e["args"]["correlation"] for e in doc["traceEvents"]
                if e.get("cat") == "cuda_runtime" and isinstance(e.get("args"), dict) and "correlation" in e["args"]}
    kernels = [e for e in doc["traceEvents"] if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and e["args"].get("correlation") in launches]
    last = max(kernels, key=lambda e: e["args"]["correlation"])  # last enqueued on its stream
    last["ts"] = float(last["ts"]) + 103 * DAY_US  # still within 2**53 ns of the rest: the old range check passed
    path = write_trace(tmp_path / "rank0.json", doc)
    with pytest.raises(InputError, match=r"starts 8,899,200 s \(103.0 days\) after its launch call ended"):
        importers.import_traces([path])


def test_import_force_never_deletes_a_users_file_inside_raw(tmp_path):
    (tmp_path / "t").mkdir()
    paths, _ = write_ranks(tmp_path / "t", 2)
    out = tmp_path / "b"
    assert cli_run("import", *paths, "-o", out)[0] == 0
    notes = out / "raw" / "my-notes.txt"
    notes.write_text("keep me")
    code, _, err = cli_run("import", *paths, "-o", out, "--force")
    assert code == 2 and "raw: holds my-notes.txt, which taxmodel did not write" in err
    assert notes.read_text() == "keep me"
    notes.unlink()
    assert cli_run("import", *paths, "-o", out, "--force")[0] == 0  # its own raw files it replaces


def _bundle(path: Path, **kw) -> Path:
    case = synthetic_bundle(**kw)
    return write_bundle(path, case.bundle.events, case.bundle.meta)


def test_show_a_directory_with_one_bundle_below(tmp_path):
    _bundle(tmp_path / "runs" / "ag" / "bsp")
    code, out, err = cli_run("show", tmp_path / "runs")
    assert code == 0, err
    assert "synthetic/bsp" in out


@pytest.mark.parametrize("command", [["show"], ["analyze"], ["compare", "SELF"], ["export-trace", "-o", "OUT"]])
def test_a_bundle_left_aside_by_a_killed_swap_is_found_before_the_path_check(tmp_path, command):
    """Killed between a bundle's two renames: show/analyze/compare used to say 'Path does not exist'."""
    target = _bundle(tmp_path / "b")
    os.rename(target, tmp_path / f".b.{DEAD_PID}-{fsutil.OLD_TAG}00c0ffee{fsutil.TMP_SUFFIX}")
    args = [a if a not in ("SELF", "OUT") else (target if a == "SELF" else tmp_path / "t.json") for a in command[1:]]
    code, out, err = cli_run(command[0], target, *args)
    assert "does not exist" not in err
    assert code == 0, err
    assert (target / "meta.json").is_file()


def test_a_long_legal_output_name_is_written(tmp_path):
    """A 240-character name is legal; its temporary sibling used to exceed NAME_MAX."""
    name = "b" * 240
    (tmp_path / "t").mkdir()
    paths, _ = write_ranks(tmp_path / "t", 2)
    code, _, err = cli_run("import", *paths, "-o", tmp_path / name)
    assert code == 0, err
    assert load_bundle(tmp_path / name).world_size == 2
    long_file = tmp_path / ("r" * 250 + ".md")
    fsutil.atomic_write(long_file, "x")
    assert long_file.read_text() == "x"
    assert fsutil.temp_stem("a" * 200) != fsutil.temp_stem("a" * 199 + "b")


def _tar_gz(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_a_small_archive_cannot_unpack_gigabytes(tmp_path, monkeypatch):
    monkeypatch.setattr(limits, "MIN_CAP_BYTES", 2 ** 20)
    bomb = _tar_gz(tmp_path / "b.tar.gz", {"b/meta.json": b"{}", "b/events.parquet": bytes(16 * 2 ** 20)})
    assert bomb.stat().st_size < 100_000
    (tmp_path / "tmp").mkdir()
    # tempfile caches its directory on first use (TMPDIR set now would be ignored): point the cache here
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    code, _, err = cli_run("show", bomb)
    assert code == 2 and "the bundle inside the archive amounts to more than 8," not in err
    assert "the bundle inside the archive amounts to more than" in err
    assert not any((tmp_path / "tmp").rglob("events.parquet"))


def test_errors_inside_an_archive_name_the_archive_not_a_temporary_directory(tmp_path):
    b = _bundle(tmp_path / "b")
    archive = archive_bundle(b, tmp_path / "b.tar.gz")
    with tarfile.open(archive) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}
    members["b/meta.json"] = b"{not json"
    damaged = _tar_gz(tmp_path / "d.tar.gz", members)
    code, _, err = cli_run("show", damaged)
    assert code == 2 and f"{damaged}:b/meta.json: not valid JSON" in err
    assert "taxmodel-bundle-" not in err and str(Path(os.environ.get("TMPDIR", "/tmp"))) + "/taxmodel" not in err


NCU_HEAD = '"ID","Process ID","Kernel Name","Metric Name","Metric Unit","Metric Value"\n'


@pytest.mark.parametrize("value", ["inf", "1e19", "-5", "nan(0)"])
def test_absurd_counter_values_are_refused_not_wrapped(tmp_path, value):
    f = tmp_path / "c.csv"
    f.write_text(NCU_HEAD + f'"0","1","gemm","dram__bytes_read.sum","byte","{value}"\n'
                 '"0","1","gemm","dram__bytes_write.sum","byte","100"\n')
    with pytest.raises(InputError) as err:
        read_counters(f)
    assert "not a count a kernel can have" in str(err.value) or "is not a number" in str(err.value)


def test_a_small_counters_gzip_cannot_inflate_without_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(limits, "MIN_CAP_BYTES", 2 ** 20)
    f = tmp_path / "c.csv.gz"
    f.write_bytes(gzip.compress(NCU_HEAD.encode() + b" " * (32 * 2 ** 20), 9))
    with pytest.raises(InputError, match="gzip content amounts to more than"):
        read_counters(f)


@pytest.mark.parametrize("content", [b"\x00\x01\x02binary\xff\xfe", "[" * 200_000, b"\xff\xfe\xfd not utf-8"])
def test_binary_or_deeply_nested_settings_files_are_one_line(tmp_path, content):
    for name, load in (("regress.json", load_config), ("regress.toml", load_config), ("hw.json", load_hardware)):
        f = tmp_path / name
        f.write_bytes(content if isinstance(content, bytes) else content.encode())
        with pytest.raises(InputError):
            load(f)
    code, _, err = cli_run("compare", _bundle(tmp_path / "b"), tmp_path / "b", "--config", tmp_path / "regress.json")
    assert code == 2 and len(err.strip().splitlines()) == 1


def test_a_mathtext_kernel_name_does_not_stop_the_report(tmp_path):
    case = synthetic_bundle()
    events = case.bundle.events.copy()
    events.loc[events["kind"] == "kernel", "name"] = "gemm_$\\foo{$"
    b = write_bundle(tmp_path / "b", events, case.bundle.meta)
    code, _, err = cli_run("report", b, "-o", tmp_path / "r.html")
    assert code == 0, err
