"""Report and trace outputs never replace what is not a regular file, never follow a planted
temporary, and Markdown never lets a bundle-supplied name become Markdown (issue 28)."""
from __future__ import annotations

import json
import os
import re
import shutil
import stat

import pytest

from taxmodel.cli import cli
from taxmodel.testing.synthetic import synthetic_bundle
from taxmodel.trace.bundle import write_bundle
from cli_runner import stderr_runner


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory):
    case = synthetic_bundle(variant="bsp", workload="ag_gemm", shape={"M": 1024, "N": 256, "K": 512})
    return write_bundle(tmp_path_factory.mktemp("b") / "bsp", case.bundle.events, case.bundle.meta)


def _refused(res, want: str) -> None:
    assert res.exit_code == 2, (res.exit_code, res.output, res.stderr, res.exception)
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert want in res.stderr, res.stderr


@pytest.mark.parametrize("command", ["report", "export-trace"])
def test_a_device_fifo_link_or_directory_at_o_is_refused(tmp_path, bundle_dir, command):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    link = tmp_path / "link.html"
    link.symlink_to(victim)
    for target, want in (("/dev/full", "is a character device"), (fifo, "is a FIFO"),
                         (link, "is a symbolic link")):
        _refused(stderr_runner().invoke(cli, [command, str(bundle_dir), "-o", str(target)]), want)
    res = stderr_runner().invoke(cli, [command, str(bundle_dir), "-o", str(tmp_path)])
    if command == "report":  # click's own usage error
        assert res.exit_code == 2 and "is a directory" in res.stderr and "Traceback" not in res.stderr
    else:  # a directory gets one trace per bundle, named after its folder
        assert res.exit_code == 0 and res.output == f"wrote {tmp_path / 'bsp.json'}\n", res.stderr
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and link.is_symlink() and victim.read_text() == "mine"


@pytest.mark.parametrize("command,name", [("report", "r.html"), ("export-trace", "t.json")])
def test_a_planted_link_at_the_old_temporary_name_is_not_followed(tmp_path, bundle_dir, command, name):
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    (tmp_path / f".{name}.tmp").symlink_to(victim)
    res = stderr_runner().invoke(cli, [command, str(bundle_dir), "-o", str(tmp_path / name)])
    assert res.exit_code == 0, res.stderr
    assert victim.read_text() == "mine" and (tmp_path / name).stat().st_size > 0
    assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o666 & ~_umask()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp") and not p.is_symlink()]


def _umask() -> int:
    old = os.umask(0)
    os.umask(old)
    return old


def test_an_output_under_a_regular_file_is_one_line(tmp_path, bundle_dir):
    f = tmp_path / "file"
    f.write_text("x")
    _refused(stderr_runner().invoke(cli, ["report", str(bundle_dir), "-o", str(f / "r.html")]),
             "is a regular file, not a directory")
    _refused(stderr_runner().invoke(cli, ["compare", str(bundle_dir), str(bundle_dir), "--markdown", str(f / "s.md")]),
             "is a regular file, not a directory")


def test_markdown_escapes_bundle_supplied_names(tmp_path):
    evil = "fg\n# Owned\n![x](https://evil.example/p.png) <img src=x> [link](https://evil.example)"
    case = synthetic_bundle(variant="bsp", workload="ag_gemm", shape={"M": 1024, "N": 256, "K": 512})
    meta = {**case.bundle.meta, "variant": evil}
    b = write_bundle(tmp_path / "b", case.bundle.events, meta)
    res = stderr_runner().invoke(cli, ["report", str(b), "-o", str(tmp_path / "r.md")])
    assert res.exit_code == 0, res.stderr
    md = (tmp_path / "r.md").read_text()
    assert "Owned" in md  # the name is shown...
    assert not re.search(r"^#+ Owned", md, re.M)  # ...but adds no heading
    assert not re.search(r"(?<!\\)!\[x\]\(https", md)  # no remote image
    assert not re.search(r"(?<!\\)<img", md) and not re.search(r"(?<!\\)\[link\]", md)


def test_lenient_skips_a_damaged_bundle_among_good_ones(tmp_path, bundle_dir):
    runs = tmp_path / "runs"
    shutil.copytree(bundle_dir, runs / "good")
    shutil.copytree(bundle_dir, runs / "bad")
    meta = json.loads((runs / "bad" / "meta.json").read_text())
    meta["capture"] = "oops"
    (runs / "bad" / "meta.json").write_text(json.dumps(meta))
    _refused(stderr_runner().invoke(cli, ["analyze", str(runs)]), "field 'capture' must be a JSON object")
    res = stderr_runner().invoke(cli, ["analyze", str(runs), "--lenient"])
    assert res.exit_code == 0, res.stderr
    assert res.stderr.count("(--lenient: skipped)") == 1 and "bad/meta.json: field 'capture'" in res.stderr
    assert "ag_gemm/bsp" in res.output
    res = stderr_runner().invoke(cli, ["report", str(runs), "--lenient", "-o", str(tmp_path / "r.html")])
    assert res.exit_code == 0 and "(--lenient: skipped)" in res.stderr


def test_wrong_types_in_a_hardware_file_are_one_line(tmp_path, bundle_dir):
    from taxmodel.hardware.specs import presets

    spec = next(iter(presets().values())).to_dict()
    spec["link_latency_s"] = "fast"
    hw = tmp_path / "hw.json"
    hw.write_text(json.dumps(spec))
    _refused(stderr_runner().invoke(cli, ["analyze", str(bundle_dir), "--hardware", str(hw)]),
             "hw.json: field 'link_latency_s' must be a finite number >= 0, not \"fast\"")


@pytest.mark.parametrize("command,name", [("report", "meta.json"), ("export-trace", "events.parquet"),
                                          ("report", "raw/r.html")])
def test_an_output_inside_an_input_bundle_is_refused(tmp_path, bundle_dir, command, name):
    b = tmp_path / "b"
    shutil.copytree(bundle_dir, b)
    before = (b / "meta.json").read_bytes()
    _refused(stderr_runner().invoke(cli, [command, str(b), "-o", str(b / name)]), "is inside the input")
    assert (b / "meta.json").read_bytes() == before and not (b / "raw").exists()
