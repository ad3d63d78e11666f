"""`taxmodel import` and `taxmodel show`: what they print, what they write, how they fail."""
from __future__ import annotations

import json

import pytest

from kineto_fixtures import REAL_RANKS, build_trace, write_ranks, write_trace
from taxmodel.cli import cli
from taxmodel.trace.bundle import load_bundle
from cli_runner import stderr_runner


def test_import_real_traces_then_show(tmp_path):
    out = tmp_path / "bundle"
    res = stderr_runner().invoke(cli, ["import", *map(str, REAL_RANKS), "-o", str(out)])
    assert res.exit_code == 0, res.output + res.stderr
    lines = res.output.splitlines()
    assert lines[0].startswith("format: kineto (detected from the content of")
    summary = lines[-1]
    assert summary.startswith("Imported 4 ranks from kineto traces: 43 kernels, 0 memcpy, 23 memset")
    assert "5 iterations (2..6)" in summary and "NVIDIA H200" in summary and "5 distinct collectives" in summary
    assert sorted(p.name for p in (out / "raw").iterdir()) == sorted(p.name for p in REAL_RANKS)
    assert load_bundle(out).ranks == [0, 1, 2, 3]

    res = stderr_runner().invoke(cli, ["show", str(out)])
    assert res.exit_code == 0, res.output + res.stderr
    text = res.output
    assert "4 of 4 ranks" in text and "5 iteration(s) (2..6)" in text
    assert "NVIDIA H200, 132 SMs" in text and "2.28.9" in text
    assert "GPU time by rank and role (us)" in text and "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT" in text
    # rank 0's 5 NCCL kernels: counts per role per rank are printed
    role_lines = [line.split() for line in text.splitlines() if line.split()[:2] == ["0", "comm"]]
    assert role_lines and role_lines[0][2] == "5"

    res = stderr_runner().invoke(cli, ["show", str(out), "--json"])
    assert res.exit_code == 0
    doc = json.loads(res.output)
    assert doc["overview"]["ranks"] == [0, 1, 2, 3] and doc["overview"]["iterations"] == [2, 3, 4, 5, 6]
    assert doc["overview"]["kernels"] == 43
    roles = {(r["rank"], r["role"]): r for r in doc["roles"]}
    assert roles[(0, "comm")]["count"] == 5 and roles[(1, "compute")]["count"] == 5
    top = doc["top_kernels"][0]
    assert top["name"].startswith("nvjet") and top["count"] == 23
    assert doc["meta"]["hardware"]["num_sms"] == 132


def test_import_options(tmp_path):
    doc, _ = build_trace(0, 1)
    for e in doc["traceEvents"]:
        if str(e.get("name", "")).startswith("ProfilerStep#"):
            e["name"] = "iter " + e["name"].split("#")[1]
    trace = write_trace(tmp_path / "t.json", doc)
    out = tmp_path / "b"
    res = stderr_runner().invoke(cli, ["import", str(trace), "-o", str(out), "--format", "kineto", "--no-keep-raw",
                                 "--iteration-pattern", r"iter (\d+)"])
    assert res.exit_code == 0, res.output + res.stderr
    assert "format: kineto (as given)" in res.output and "3 iterations (1..3)" in res.output
    assert not (out / "raw").exists()


def test_bad_input_is_one_line_and_exit_code_2(tmp_path):
    paths, _ = write_ranks(tmp_path)
    paths[1].write_text(paths[1].read_text()[:-200])
    out = tmp_path / "b"
    res = stderr_runner().invoke(cli, ["import", *map(str, paths), "-o", str(out)])
    assert res.exit_code == 2
    err = res.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"taxmodel: error: {paths[1]}: the file looks truncated")
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("args, message", [
    (["--format", "nope"], "unknown trace format 'nope'"),
    (["--iteration-pattern", "step"], "needs one group"),
])
def test_bad_options_exit_2(tmp_path, args, message):
    paths, _ = write_ranks(tmp_path)
    res = stderr_runner().invoke(cli, ["import", *map(str, paths), "-o", str(tmp_path / "b"), *args])
    assert res.exit_code == 2 and message in res.stderr


def test_missing_ranks_flag(tmp_path):
    trace = write_trace(tmp_path / "r0.json", build_trace(0, 2)[0])
    res = stderr_runner().invoke(cli, ["import", str(trace), "-o", str(tmp_path / "b")])
    assert res.exit_code == 2 and "ranks {1} of world size 2 are missing" in res.stderr
    res = stderr_runner().invoke(cli, ["import", str(trace), "-o", str(tmp_path / "b"), "--allow-missing-ranks"])
    assert res.exit_code == 0 and "1 rank of world size 2" in res.output
    res = stderr_runner().invoke(cli, ["show", str(tmp_path / "b")])
    assert "1 of 2 ranks" in res.output and "missing" in res.output  # the note is shown


def test_show_not_a_bundle(tmp_path):
    (tmp_path / "empty").mkdir()
    res = stderr_runner().invoke(cli, ["show", str(tmp_path / "empty")])
    # as analyze, report, advise and export-trace say it: show takes bundles and directories of them alike
    assert res.exit_code == 2 and "no bundles found below this directory (a bundle has meta.json" in res.stderr
