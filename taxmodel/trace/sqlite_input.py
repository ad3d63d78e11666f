"""SQLite inputs (Nsight Systems and rocpd exports), opened read-only under the input limits.

A connection (``sqlite_connection``) unpacks a gzipped database under the one input budget
(``inflate``), stops a query at ``limits.query_seconds`` and on Ctrl-C, and a query read through
``SqliteSchema`` yields at most ``limits.row_budget`` rows (a view can yield rows for ever).
``sqlite_object_names`` gives a file's tables and views, by which formats are told apart.
"""
from __future__ import annotations

import contextlib
import re
import shutil
import sqlite3
import tempfile
from pathlib import Path
from typing import Iterator

import pandas as pd

from taxmodel import limits
from taxmodel.errors import InputError
from taxmodel.trace import inflate

SQLITE_MAGIC = b"SQLite format 3\x00"


@contextlib.contextmanager
def sqlite_connection(path: Path) -> Iterator[sqlite3.Connection]:
    """A read-only connection to a SQLite file (a gzipped one is unpacked to a temp file)."""
    path = shown = Path(path)
    tmpdir = None
    try:
        with open(path, "rb") as fh:
            magic = fh.read(len(SQLITE_MAGIC))
        if magic.startswith(inflate.GZIP_MAGIC):
            tmpdir = tempfile.mkdtemp(prefix="taxmodel-sqlite-")
            target = Path(tmpdir) / path.name.removesuffix(".gz")
            with open(target, "wb") as dst:
                inflate.gunzip_file(path, dst)  # in chunks, capped: a small hostile gzip cannot fill the disk
            with open(target, "rb") as fh:
                magic = fh.read(len(SQLITE_MAGIC))
            path = target
        if magic != SQLITE_MAGIC:
            raise InputError(f"{shown}: not a SQLite database (the file does not start with the SQLite header)")
        # the path as a percent-encoded file: URI ('#', '?' and '%' in a name are the name's, not the
        # URI's fragment, query or escapes), opened read-only
        conn = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True, factory=_GuardedConnection)
        try:
            conn.execute("PRAGMA query_only = ON")
            conn.guard(limits.query_seconds())
            with conn.noting_interrupts():
                yield conn
        except BaseException as exc:
            if conn.stopped == "interrupted":  # Ctrl-C during a query: a Ctrl-C, not a damaged file
                raise KeyboardInterrupt from exc
            if conn.stopped == "deadline":
                raise InputError(f"{shown}: a query of the database ran longer than {limits.query_seconds():g} s "
                                 "(a view that never ends?); export the trace again, or raise "
                                 f"{limits.QUERY_SECONDS_ENV} for a database that big") from exc
            raise
        finally:
            conn.close()
    finally:
        if tmpdir:
            shutil.rmtree(tmpdir, ignore_errors=True)


class _GuardedConnection(sqlite3.Connection):
    """A connection whose queries stop at a deadline and on Ctrl-C.

    SQLite runs a query in C: without a progress handler Python never gets to run its SIGINT
    handler until the query ends, so a never-ending view ignored Ctrl-C. The handler below runs
    every few thousand virtual-machine steps, which lets Python's signal handlers run; a Ctrl-C
    (noted by ``noting_interrupts``: the exception raised inside the callback is swallowed by
    sqlite3) or a passed deadline makes it return 1, which aborts the query, and ``stopped``
    says why."""

    stopped = ""

    @contextlib.contextmanager
    def noting_interrupts(self) -> Iterator[None]:
        """While the connection is in use, a SIGINT is noted in ``stopped`` before the handler
        that was there runs (and raises KeyboardInterrupt, as it would have)."""
        import signal
        import threading

        previous = signal.getsignal(signal.SIGINT)
        if threading.current_thread() is not threading.main_thread() or not callable(previous):
            yield  # signals go to the main thread only; an ignored SIGINT stays ignored
            return

        def note(signum, frame):
            self.stopped = "interrupted"
            previous(signum, frame)

        signal.signal(signal.SIGINT, note)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    def guard(self, seconds: float) -> None:
        import time

        deadline = time.monotonic() + seconds

        def check() -> int:
            if self.stopped:
                return 1
            if time.monotonic() > deadline:
                self.stopped = "deadline"
                return 1
            return 0

        self.set_progress_handler(check, 20_000)


@contextlib.contextmanager
def sqlite_errors(path: Path, tool: str) -> Iterator[None]:
    """Turn SQLite's own errors while reading an export (a file cut short, a page that is not
    a database page) into one InputError naming the file."""
    try:
        yield
    except sqlite3.Error as exc:
        raise InputError(f"{path}: the {tool} SQLite export cannot be read ({exc}); it may be truncated or "
                         "damaged -- export it again") from exc


def sqlite_object_names(path: Path, head: bytes) -> set[str]:
    """Names of the tables and views of a SQLite file, for format sniffing.

    Opens the file when it can; for a file it cannot open (gzipped, damaged) falls back to the
    names visible in the schema text of ``head``.
    """
    if not head.startswith(SQLITE_MAGIC):
        return set()
    try:
        with sqlite_connection(path) as conn:
            return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table','view')")}
    except (sqlite3.Error, InputError, OSError):
        text = head.decode("latin-1")
        return set(re.findall(r"CREATE\s+(?:TABLE|VIEW)\s+(?:IF\s+NOT\s+EXISTS\s+)?[\"`\[]?(\w+)", text, re.IGNORECASE))


class SqliteSchema:
    """What a SQLite export holds: its tables/views and their columns (via PRAGMA table_info),
    so that importers read what is there and name what is missing."""

    def __init__(self, conn: sqlite3.Connection, path: Path, tool: str):
        self.conn, self.path, self.tool = conn, Path(path), tool
        self.names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table','view')")}
        self._columns: dict[str, set[str]] = {}

    def has(self, name: str) -> bool:
        return name in self.names

    def columns(self, name: str) -> set[str]:
        if name not in self._columns:
            self._columns[name] = {r[1] for r in self.conn.execute(f'PRAGMA table_info("{name}")')} if self.has(name) else set()
        return self._columns[name]

    def require_columns(self, name: str, needed: tuple[str, ...], hint: str = "") -> None:
        """Raise InputError naming the table and every needed column it lacks."""
        if not self.has(name):
            raise InputError(f"{self.path}: {self.tool} table '{name}' is missing{hint}")
        missing = [c for c in needed if c not in self.columns(name)]
        if missing:
            raise InputError(
                f"{self.path}: {self.tool} table '{name}' lacks column(s) {', '.join(repr(c) for c in missing)}"
                f" (columns present: {', '.join(sorted(self.columns(name)))}){hint}"
            )

    def first_column(self, name: str, candidates: tuple[str, ...]) -> str | None:
        cols = self.columns(name)
        return next((c for c in candidates if c in cols), None)

    def fetchall(self, sql: str, params: tuple = ()) -> list[tuple]:
        """The rows of a query, at most ``limits.row_budget`` of the file (a table cannot hold more
        rows than the file has bytes; a view that yields more is not data): InputError beyond."""
        return self._fetch(sql, params)[1]

    def _fetch(self, sql: str, params: tuple = ()) -> tuple[list[str], list[tuple]]:
        cur = self.conn.execute(sql, params)
        budget = limits.row_budget(self.path)
        rows: list[tuple] = []
        while batch := cur.fetchmany(100_000):
            rows += batch
            if len(rows) > budget:
                raise InputError(f"{self.path}: a query of the {self.tool} database yields more than {budget:,} rows, more "
                                 "than a database of its size can hold (a view that never ends?); export the trace again")
        return [d[0] for d in cur.description or ()], rows

    def query(self, sql: str, params: tuple = ()) -> pd.DataFrame:
        """A query's rows as a DataFrame (``fetchall``'s budget; what ``pd.read_sql_query`` gives)."""
        try:
            columns, rows = self._fetch(sql, params)
            return pd.DataFrame.from_records(rows, columns=columns, coerce_float=True)
        except (sqlite3.Error, pd.errors.DatabaseError) as exc:
            raise InputError(f"{self.path}: cannot read the {self.tool} database ({exc})") from exc
