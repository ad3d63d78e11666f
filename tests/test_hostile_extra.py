"""Twenty more hostile or careless inputs (issue 38, the review's own round): each is refused in one
line, shown harmlessly, or simply works; none hangs, crashes or takes memory without bound."""
from __future__ import annotations

import json
import os
import sys
import tarfile
import threading
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "trace"))
from kineto_fixtures import build_trace, write_trace  # noqa: E402

from cli_runner import stderr_runner  # noqa: E402
from taxmodel import limits  # noqa: E402
from taxmodel.cli import cli  # noqa: E402
from taxmodel.errors import InputError  # noqa: E402
from taxmodel.testing.synthetic import synthetic_bundle  # noqa: E402
from taxmodel.trace import importers  # noqa: E402
from taxmodel.trace.bundle import archive_bundle, load_bundle, write_bundle  # noqa: E402
from test_regress_compare import write_side  # noqa: E402

DAY_US = 86400 * 10**6


def cli_run(*args, env=None):
    res = stderr_runner().invoke(cli, [str(a) for a in args], env=env)
    return res.exit_code, res.output, res.stderr


def _bundle(path: Path, **kw) -> Path:
    case = synthetic_bundle(**kw)
    return write_bundle(path, case.bundle.events, case.bundle.meta)


def _trace(tmp_path: Path, edit=None, name="rank0.json") -> Path:
    doc, _ = build_trace(0, 1)
    if edit:
        edit(doc)
    return write_trace(tmp_path / name, doc)


def test_01_a_fifo_as_a_settings_file_never_blocks(tmp_path):
    fifo = tmp_path / "regress.toml"
    os.mkfifo(fifo)
    done = []
    t = threading.Thread(target=lambda: done.append(pytest.raises(InputError, limits.read_small_text, fifo)))
    t.start()
    t.join(10)
    assert done, "reading a FIFO blocked"


def test_02_a_symlinked_baseline_dir_is_refused_not_replaced_by_a_directory(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "h200"
    link.symlink_to(real)
    cand = write_side(tmp_path / "c", seed=1, variants=("bsp",))
    code, _, err = cli_run("baseline", "update", cand, "--baseline", link, "--yes")
    assert code == 2 and "is a symbolic link" in err and link.is_symlink()


def test_03_a_parquet_that_claims_more_than_the_budget_is_refused(tmp_path, monkeypatch):
    b = _bundle(tmp_path / "b")
    monkeypatch.setenv(limits.BUDGET_ENV, "1000")
    code, _, err = cli_run("show", b)
    assert code == 2 and "the events (unpacked) amounts to more than 1,000 bytes" in err


def test_04_a_kernel_without_a_launch_two_days_later_is_caveated(tmp_path):
    def late(doc):
        k = next(e for e in reversed(doc["traceEvents"]) if e.get("cat") == "kernel")
        k["args"].pop("correlation", None)
        k["ts"] = float(k["ts"]) + 2 * DAY_US
    events, meta, _ = importers.import_traces([_trace(tmp_path, late)])
    assert any("GPU activity spans 2.0 days" in n for n in meta["notes"])


def test_05_a_deeply_nested_event_is_one_line(tmp_path):
    path = _trace(tmp_path)
    text = path.read_text().replace('"traceEvents": [', '"traceEvents": [' + "[" * 50_000 + "]" * 50_000 + ",", 1)
    path.write_text(text)
    with pytest.raises(InputError, match="nested too deeply"):
        importers.import_traces([path])


@pytest.mark.parametrize("value", [10 ** 30, True, "zero", [0]])
def test_06_an_unreadable_rank_is_refused_not_guessed_from_file_order(tmp_path, value):
    path = _trace(tmp_path, lambda d: d["distributedInfo"].update(rank=value))
    with pytest.raises(InputError, match="distributedInfo.rank is .* not a whole number|not a valid rank"):
        importers.import_traces([path])


def test_07_a_negative_top_is_a_usage_error(tmp_path):
    code, _, err = cli_run("show", _bundle(tmp_path / "b"), "--top", "-5")
    assert code == 2 and "--top" in err


def test_08_a_markdown_report_with_a_long_name_writes_its_figures(tmp_path):
    out = tmp_path / ("r" * 250 + ".md")
    code, _, err = cli_run("report", _bundle(tmp_path / "b"), "-o", out)
    assert code == 0, err
    written = list(tmp_path.rglob("*"))  # the report, and its figures in a folder beside it
    assert all(len(p.name) <= 255 for p in written) and any(p.suffix == ".png" for p in written)


def test_09_a_huge_meta_json_is_refused_without_reading_it(tmp_path):
    b = _bundle(tmp_path / "b")
    with open(b / "meta.json", "r+b") as f:
        f.truncate(3 * 2 ** 30)
    code, _, err = cli_run("show", b)
    assert code == 2 and "meta.json amounts to more than" in err


def test_10_html_report_escapes_names(tmp_path):
    case = synthetic_bundle()
    ev = case.bundle.events.copy()
    ev.loc[ev["kind"] == "kernel", "name"] = "<script>alert(1)</script>\u202e"
    b = write_bundle(tmp_path / "b", ev, case.bundle.meta)
    assert cli_run("report", b, "-o", tmp_path / "r.html")[0] == 0
    html = (tmp_path / "r.html").read_text()
    assert "<script>alert" not in html


def test_11_junit_holds_any_name(tmp_path):
    base = tmp_path / "b"
    _bundle(base / "x", variant='"]]><x a="\x0c', iterations=4)
    cli_run("compare", base, base, "--junit", tmp_path / "j.xml")
    ET.parse(tmp_path / "j.xml")


def test_12_a_garbage_budget_setting_is_one_line(tmp_path):
    code, _, err = cli_run("show", _bundle(tmp_path / "b"), env={limits.BUDGET_ENV: "lots"})
    assert code == 2 and "is not a number of bytes" in err


def test_13_an_output_over_the_config_file_is_refused(tmp_path):
    side = write_side(tmp_path / "s", seed=1, variants=("bsp",))
    cfg = tmp_path / "regress.toml"
    cfg.write_text("[statistics]\nseed = 1\n")
    code, _, err = cli_run("compare", side, side, "--config", cfg, "--markdown", cfg)
    assert code == 2 and "is the input" in err and cfg.read_text().startswith("[statistics]")


def test_14_a_counters_file_inside_the_output_is_refused_before_the_import(tmp_path):
    out = tmp_path / "b"
    out.mkdir()
    (out / "c.csv").write_text("x")
    code, _, err = cli_run("import", _trace(tmp_path), "-o", out, "--counters", out / "c.csv")
    assert code == 2 and "holds the input" in err and (out / "c.csv").exists()


def test_15_a_nan_timestamp_is_one_line(tmp_path):
    path = _trace(tmp_path)
    path.write_text(path.read_text().replace('"ts": ', '"ts": NaN, "x": ', 1))
    with pytest.raises(InputError, match="no usable 'ts'"):
        importers.import_traces([path])


def test_16_bidirectional_overrides_are_shown_not_obeyed(tmp_path):
    case = synthetic_bundle()
    ev = case.bundle.events.copy()
    ev.loc[ev["kind"] == "kernel", "name"] = "gemm\u202eevil\x1b[31m"
    b = write_bundle(tmp_path / "b", ev, case.bundle.meta)
    code, out, _ = cli_run("show", b)
    assert code == 0 and "\u202e" not in out and "\x1b" not in out and "\\u202e" in out


def test_17_an_archive_member_leaving_its_folder_is_refused(tmp_path, monkeypatch):
    import io
    import tempfile

    unpack = tmp_path / "unpack" / "here"  # where archives unpack; an escaping member would land beside it
    unpack.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(unpack))
    bad = tmp_path / "b.tar.gz"
    with tarfile.open(bad, "w:gz") as tar:
        for name in ("b/meta.json", "../escape/events.parquet"):
            info = tarfile.TarInfo(name)
            info.size = 2
            tar.addfile(info, io.BytesIO(b"{}"))
    code, _, err = cli_run("show", bad)
    assert code == 2 and "unsafe archive" in err, err
    assert not list(tmp_path.rglob("escape"))


def test_18_a_garbage_query_deadline_is_one_line(tmp_path):
    nsys = Path(__file__).resolve().parent / "data" / "nsys" / "rank0.sqlite"
    code, _, err = cli_run("import", nsys, "-o", tmp_path / "o", env={limits.QUERY_SECONDS_ENV: "-1"})
    assert code == 2 and "must be a positive number of seconds" in err


def test_19_a_fifo_given_as_a_trace_is_refused(tmp_path):
    fifo = tmp_path / "rank0.json"
    os.mkfifo(fifo)
    code, _, err = cli_run("import", fifo, "-o", tmp_path / "o")
    assert code == 2 and "not a file" in err


def test_20_export_trace_never_writes_over_its_archive(tmp_path):
    archive = archive_bundle(_bundle(tmp_path / "b"), tmp_path / "b.tar.gz")
    before = archive.read_bytes()
    code, _, err = cli_run("export-trace", archive, "-o", archive)
    assert code == 2 and "is the input" in err and archive.read_bytes() == before
