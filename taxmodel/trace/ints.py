"""Whole numbers read from a trace's fields (ids, ranks, sizes, counts), by one rule per kind of field.

Tools write them as JSON numbers, as text, or as text with words around; a damaged trace writes
anything. Every rule here refuses a number of 2^62 or more in magnitude (None): a trace's ids and
sizes are far smaller, and int64 sums and products of such a number would wrap.

- ``whole``: an int (not a bool), or the decimal digits of one in a string (a leading '-' and
  white space around allowed); nothing else (a float, other text) is a whole number;
- ``nonneg``: ``whole`` when it is 0 or more, else a default (-1: not recorded);
- ``whole_in_text``: ``whole``, else the first run of digits in a string ("stream 7"), for
  Kineto's ids, which some tools write with words around;
- ``literal``: an integer as C or Python code writes it (``42``, ``0x2a``, ``1_000``), for API
  arguments recorded as their source text (RCCL's in rocprofv3);
- ``truncated``: an int, or a finite number's text truncated toward zero (``json_stream`` keeps a
  number with a fraction or an exponent as its text), for Kineto's op arguments (``flops``).
"""
from __future__ import annotations

import math
import re
from typing import Any

LIMIT = 1 << 62
_DIGITS = re.compile(r"\d+")


def whole(v: Any) -> int | None:
    """``v`` as a whole number (the module docstring), else None."""
    if type(v) is str:
        s = v.strip()
        digits = s[1:] if s[:1] == "-" else s
        if not (digits.isdecimal() and len(digits) < 19):  # 18 digits are below LIMIT
            return None
        return int(s)
    return v if type(v) is int and -LIMIT < v < LIMIT else None


def nonneg(v: Any, default: Any = -1) -> Any:
    """``whole(v)`` when it is 0 or more, else ``default``."""
    n = whole(v)
    return n if n is not None and n >= 0 else default


def whole_in_text(v: Any) -> int | None:
    """``whole(v)``, else for a string the first run of its digits; None when there is none."""
    n = whole(v)
    if n is None and type(v) is str:
        m = _DIGITS.search(v)
        n = int(m.group()) if m and len(m.group()) < 19 else None
    return n


def literal(v: Any) -> int | None:
    """``v`` read as an integer literal of C or Python code (decimal, ``0x``/``0o``/``0b``, digits
    grouped by ``_``, a sign), else None."""
    try:
        n = int(str(v).strip(), 0)
    except ValueError:
        return None
    return n if -LIMIT < n < LIMIT else None


def truncated(v: Any) -> int | None:
    """``v`` when it is an int, else the number a string writes truncated toward zero (``"1.5e9"``);
    None for anything else, and for no finite number."""
    if type(v) is str:
        try:
            f = float(v)
        except ValueError:
            return None
        v = int(f) if math.isfinite(f) else None
    return v if type(v) is int and -LIMIT < v < LIMIT else None
