"""SQLite exports read safely (issue 38): a path is a path, never URI syntax; the file is only
read; a view that never ends stops at the row budget, a query that runs too long at its deadline,
and Ctrl-C is honoured while SQLite is inside a query."""
from __future__ import annotations

import shutil
import signal
import sqlite3
import threading
from pathlib import Path

import pytest

from taxmodel import limits
from taxmodel.errors import InputError
from taxmodel.trace import importers
from taxmodel.trace import sqlite_input as sq

DATA = Path(__file__).resolve().parent.parent / "data" / "nsys"


@pytest.mark.parametrize("name", ["r#0.sqlite", "%41.sqlite", "a?mode=rwc.sqlite", "b&immutable=0.sqlite"])
def test_uri_characters_in_a_name_are_the_name(tmp_path, name):
    """`r#0.sqlite` used to create a stray `r` (and drop read-only mode); `%41.sqlite` read `A.sqlite`."""
    path = tmp_path / name
    shutil.copy(DATA / "rank0.sqlite", path)
    (tmp_path / "A.sqlite").write_bytes(b"SQLite format 3\x00" + b"\x00" * 200)  # a decoy, not a database
    before = sorted(p.name for p in tmp_path.iterdir())
    events, _, fmt = importers.import_traces([path])
    assert fmt == "nsys" and len(events) > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing created beside it


def test_the_connection_cannot_write(tmp_path):
    path = tmp_path / "x.sqlite"
    shutil.copy(DATA / "rank0.sqlite", path)
    with sq.sqlite_connection(path) as conn, pytest.raises(sqlite3.OperationalError):
        conn.execute("CREATE TABLE t (x)")


def _endless(tmp_path: Path, table: str = "CUPTI_ACTIVITY_KIND_KERNEL") -> Path:
    """An nsys export whose ``table`` is a view that never ends."""
    path = tmp_path / "endless.sqlite"
    shutil.copy(DATA / "rank0.sqlite", path)
    with sqlite3.connect(path) as conn:
        cols = [r[1] for r in conn.execute(f'PRAGMA table_info("{table}")')]
        assert cols, f"the fixture has no {table}"
        conn.execute(f'DROP TABLE "{table}"')
        select = ", ".join(f"x AS \"{c}\"" for c in cols)
        conn.execute(f'CREATE VIEW "{table}" AS WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL '
                     f'SELECT x + 1 FROM c) SELECT {select} FROM c')
    return path


@pytest.mark.parametrize("table", ["CUPTI_ACTIVITY_KIND_KERNEL", "ENUM_CUDA_MEM_KIND", "TARGET_INFO_GPU"])
def test_a_view_that_never_ends_stops_at_the_row_budget(tmp_path, monkeypatch, table):
    """Every query of the export, the memory kinds' and the GPU's too (they bypassed the budget)."""
    monkeypatch.setattr(limits, "MIN_ROW_BUDGET", 50_000)
    monkeypatch.setenv(limits.QUERY_SECONDS_ENV, "20")  # a query that escapes the budget ends here, not in minutes
    with pytest.raises(InputError, match=r"yields more than 50,000 rows.*a view that never ends"):
        importers.import_traces([_endless(tmp_path, table)], "nsys")


def test_a_query_that_runs_too_long_stops_at_its_deadline(tmp_path, monkeypatch):
    monkeypatch.setenv(limits.QUERY_SECONDS_ENV, "0.3")
    path = _endless(tmp_path)
    with pytest.raises(InputError, match="ran longer than 0.3 s"), sq.sqlite_connection(path) as conn:
        with sq.sqlite_errors(path, "nsys"):
            conn.execute('SELECT count(*) FROM "CUPTI_ACTIVITY_KIND_KERNEL"').fetchone()


def test_ctrl_c_stops_a_query_inside_sqlite(tmp_path):
    path = _endless(tmp_path)
    timer = threading.Timer(0.3, lambda: signal.raise_signal(signal.SIGINT))
    with pytest.raises(KeyboardInterrupt), sq.sqlite_connection(path) as conn:
        timer.start()
        with sq.sqlite_errors(path, "nsys"):
            conn.execute('SELECT count(*) FROM "CUPTI_ACTIVITY_KIND_KERNEL"').fetchone()
    timer.cancel()
