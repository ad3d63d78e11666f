"""Gzip input is inflated with a cap and named precisely when damaged (issue 28: a 1 MB gzip that
inflates to 1 GiB cost 2.2 GB before the error; a corrupt gzip was reported as "the file is empty")."""
from __future__ import annotations

import gzip
import os

import pytest

from taxmodel.errors import InputError
from taxmodel import limits
from taxmodel.trace import importers, inflate


def _read(path, data: bytes) -> bytes:
    path.write_bytes(data)
    return b"".join(inflate.input_chunks(path, "the test file"))


def test_round_trips_members_and_padding(tmp_path):
    payload = os.urandom(300_000) + b"x" * 2_000_000
    g = gzip.compress(payload)
    p = tmp_path / "t.gz"
    assert _read(p, g) == payload
    assert _read(p, g + gzip.compress(b"tail")) == payload + b"tail"
    assert _read(p, g + b"\0" * 8) == payload
    assert _read(p, payload) == payload  # a plain file as it is


@pytest.mark.parametrize("cut,want", [(0.5, "truncated gzip file"), (None, "damaged gzip file")])
def test_damage_is_named(cut, want, tmp_path):
    g = gzip.compress(os.urandom(100_000))
    bad = g[:int(len(g) * cut)] if cut else g[:10] + b"garbage" * 50
    with pytest.raises(InputError, match=want):
        _read(tmp_path / "t.gz", bad)


def test_a_plain_file_beyond_the_budget_is_refused_by_its_size(monkeypatch, tmp_path):
    monkeypatch.setenv(limits.BUDGET_ENV, "1000")
    with pytest.raises(InputError, match=r"the test file amounts to more than 1,000 bytes"):
        _read(tmp_path / "t.json", b" " * 1001)


def test_a_gzip_bomb_stops_at_the_cap(monkeypatch, tmp_path):
    monkeypatch.setattr(limits, "MIN_CAP_BYTES", 4 * 2 ** 20)
    bomb = gzip.compress(b"[" + b" " * (64 * 2 ** 20) + b"]", 9)  # ~64 KB that inflates to 64 MiB
    with pytest.raises(InputError, match=r"gzip content amounts to more than 6,\d{3},\d{3} bytes"):
        _read(tmp_path / "bomb.json.gz", bomb)
    p = tmp_path / "bomb.sqlite.gz"
    p.write_bytes(bomb)
    out = tmp_path / "out"
    with open(out, "wb") as dst, pytest.raises(InputError, match="amounts to more than"):
        inflate.gunzip_file(p, dst)
    assert out.stat().st_size <= inflate.cap_for(len(bomb))  # the disk gets at most the cap


@pytest.mark.parametrize("fmt, name, start, end", [
    ("kineto", "rank0.json.gz", b'{"traceEvents": [', b"]}"),
    ("rocprof-json", "r_results.json.gz", b'{"rocprofiler-sdk-tool": [', b"]}"),
    ("rocprof-csv", "1_kernel_trace.csv.gz", b"Kernel_Name,Correlation_Id,Start_Timestamp,End_Timestamp\n", b""),
])
def test_a_bomb_through_the_importers(monkeypatch, tmp_path, fmt, name, start, end):
    """rocprofv3's JSON and CSV were inflated whole, without the cap."""
    monkeypatch.setattr(limits, "MIN_CAP_BYTES", 4 * 2 ** 20)
    p = tmp_path / name
    p.write_bytes(gzip.compress(start + b" " * (64 * 2 ** 20) + end, 9))
    with pytest.raises(InputError, match="amounts to more than"):
        importers.import_traces([p], fmt)


def test_corrupt_or_blank_gzip_is_not_called_empty(tmp_path):
    corrupt = tmp_path / "c.json.gz"
    corrupt.write_bytes(b"\x1f\x8b\x08\x00garbagegarbage")
    with pytest.raises(InputError, match="damaged gzip file"):
        importers.detect_format(corrupt)
    blank = tmp_path / "b.json.gz"
    blank.write_bytes(gzip.compress(b" " * 100_000))
    with pytest.raises(InputError, match=r"first 65,536 bytes \(unpacked\) are only whitespace"):
        importers.detect_format(blank)
    empty = tmp_path / "e.json"
    empty.write_bytes(b"")
    with pytest.raises(InputError, match="the file is empty"):
        importers.detect_format(empty)
