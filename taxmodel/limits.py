"""The one size budget for what taxmodel reads: every decompressed or parsed input is held to it.

An input can claim far more than it is: a 2 MB ``.tar.gz`` whose member unpacks to gigabytes, a
1.5 MB ``.csv.gz`` of counters that inflates to 3 GB, a sparse file of 3 GiB that occupies no
disk, a SQLite view that yields rows for ever, a ten-byte config file nested a million deep. So
each reader asks this module before it commits memory, disk or time:

* ``input_budget()``: the most bytes one input may amount to once decompressed (a trace file, an
  archive's members together, an unpacked database), 4 GiB unless ``TAXMODEL_MAX_INPUT_BYTES``
  says otherwise (a real 2-rank job of 2 million kernels is 533 MB of JSON);
* ``decompressed_cap(n)``: what a compressed file of ``n`` bytes may inflate to: at most
  ``MAX_RATIO`` times its size (real traces compress 5-30x) with a floor for small files, and
  never more than the budget;
* ``check_size``: the one-line refusal, naming the file, the size and the budget;
* ``row_budget`` and ``query_seconds``: a query of a SQLite export yields at most as many rows
  as the file has bytes, and stops after ``TAXMODEL_MAX_QUERY_SECONDS`` (600 s);
* ``read_small_text``: settings files (``--config``, ``--hardware``), which are kilobytes: at
  most ``SMALL_FILE_BYTES``, UTF-8 text, else one line.

A legitimate input beyond the budget can still be read by raising it (the message says how).
This module is at the bottom layer (it imports only ``errors``).
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

from taxmodel.errors import InputError

BUDGET_ENV = "TAXMODEL_MAX_INPUT_BYTES"
DEFAULT_INPUT_BUDGET = 4 * 2 ** 30
MAX_RATIO = 100
MIN_CAP_BYTES = 256 * 2 ** 20
SMALL_FILE_BYTES = 16 * 2 ** 20
"""Settings files (regress.toml, a hardware JSON) are kilobytes; 16 MiB leaves room for comments."""


def input_budget() -> int:
    """Bytes one input may amount to once decompressed or parsed (``TAXMODEL_MAX_INPUT_BYTES``)."""
    text = os.environ.get(BUDGET_ENV, "").strip()
    if not text:
        return DEFAULT_INPUT_BUDGET
    try:
        value = int(float(text))
    except ValueError:
        raise InputError(f"{BUDGET_ENV}={text!r} is not a number of bytes") from None
    if value <= 0:
        raise InputError(f"{BUDGET_ENV}={text!r} must be a positive number of bytes")
    return value


QUERY_SECONDS_ENV = "TAXMODEL_MAX_QUERY_SECONDS"
DEFAULT_QUERY_SECONDS = 600.0
MIN_ROW_BUDGET = 1_000_000


def query_seconds() -> float:
    """How long one query of an input database may run (``TAXMODEL_MAX_QUERY_SECONDS``)."""
    text = os.environ.get(QUERY_SECONDS_ENV, "").strip()
    try:
        value = float(text) if text else DEFAULT_QUERY_SECONDS
    except ValueError:
        raise InputError(f"{QUERY_SECONDS_ENV}={text!r} is not a number of seconds") from None
    if not value > 0:
        raise InputError(f"{QUERY_SECONDS_ENV}={text!r} must be a positive number of seconds")
    return value


def row_budget(path: str | os.PathLike) -> int:
    """The most rows one query of the database file ``path`` may yield: a row takes at least a
    byte on disk, so a table never holds more rows than the file has bytes."""
    try:
        size = os.stat(path).st_size
    except OSError:
        size = 0
    return max(MIN_ROW_BUDGET, size)


def decompressed_cap(compressed_bytes: int) -> int:
    """The most a compressed input of ``compressed_bytes`` may inflate to."""
    return min(input_budget(), max(MIN_CAP_BYTES, MAX_RATIO * int(compressed_bytes)))


def check_size(path: str | os.PathLike, n_bytes: int, what: str = "input", cap: int | None = None) -> None:
    """InputError (one line) when ``n_bytes`` of ``what`` exceed ``cap`` (default: the budget)."""
    budget = input_budget() if cap is None else cap
    if n_bytes > budget:
        raise InputError(f"{path}: {what} amounts to more than {budget:,} bytes, the most taxmodel reads of one such "
                         f"input; it is damaged or not what it claims to be (for a real input that big, raise {BUDGET_ENV})")


def read_small_text(path: str | os.PathLike, what: str = "settings file") -> str:
    """The UTF-8 text of a small settings file; InputError (one line) when it is larger than
    ``SMALL_FILE_BYTES``, not text, or cannot be read."""
    path = Path(path)
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block the read for ever, a device never end
            raise InputError(f"{path}: is not a regular file; a {what} must be one")
        with open(path, "rb") as f:
            data = f.read(SMALL_FILE_BYTES + 1)
    except OSError as exc:
        raise InputError(f"{path}: the {what} cannot be read ({exc.strerror or exc})") from exc
    check_size(path, len(data), what, SMALL_FILE_BYTES)
    if b"\x00" in data:
        raise InputError(f"{path}: is a binary file, not a {what} (text)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: is not UTF-8 text (byte {exc.start}); not a {what}") from exc
