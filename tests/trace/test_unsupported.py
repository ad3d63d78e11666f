"""Profiler outputs taxmodel does not read are refused in one line that says what the file is and
how to get a supported one (issue 36 item 5); the real ones (an nvprof database, an RPD database, a
CPU-only Nsight Systems export) are in the third-party corpus, these are the cases built here."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from taxmodel.cli import cli
from taxmodel.errors import InputError
from taxmodel.trace import importers
from taxmodel.trace.unsupported import NSYS_REPORT_MAGIC

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data" / "nsys"))
import build_fixtures as nb  # noqa: E402


@pytest.mark.parametrize("name", ["run.nsys-rep", "run.qdrep", "renamed.json"])
def test_an_nsys_report_is_refused_with_the_export_command(tmp_path, name):
    """By its content (Nsight Systems' report header), whatever the file is called."""
    path = tmp_path / name
    path.write_bytes(NSYS_REPORT_MAGIC + b" 1.\n\x0bLocal (CLI)\x12\n" + bytes(range(256)) * 8)
    with pytest.raises(InputError) as err:
        importers.detect_format(path)
    msg = str(err.value)
    assert "\n" not in msg and "Nsight Systems report" in msg and f"nsys export --type sqlite -o {path.stem}.sqlite" in msg
    res = CliRunner().invoke(cli, ["import", str(path), "-o", str(tmp_path / "b")])
    assert res.exit_code == 2 and "nsys export --type sqlite" in res.output and "Traceback" not in res.output


def test_an_nsys_export_without_cuda_tables_is_refused_as_such(tmp_path):
    gpu_tables = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
                  "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_DRIVER")
    path = nb.write_nsys(tmp_path / "nvtx_only.sqlite", (0,), omit_tables=gpu_tables)
    with pytest.raises(InputError, match=r"an Nsight Systems export with no CUDA activity .*--trace=cuda"):
        importers.import_traces([path])


def test_a_named_format_does_not_read_an_unsupported_file_as_that_format(tmp_path):
    path = tmp_path / "report.nsys-rep"
    path.write_bytes(NSYS_REPORT_MAGIC + b" 1.\n")
    with pytest.raises(InputError, match="Nsight Systems report"):
        importers.import_traces([path], fmt="nsys")


def test_a_supported_export_is_not_refused(tmp_path):
    path = nb.write_nsys(tmp_path / "ok.sqlite", (0,))
    assert importers.detect_format(path) == "nsys"
