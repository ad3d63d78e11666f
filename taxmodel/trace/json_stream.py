"""A Chrome-trace JSON document read as a stream: the ``traceEvents`` array in batches, the rest of
the top-level object as a dict, never the whole document in memory.

Why: ``json.loads`` of a 266 MB trace builds every event as a dict at once (about 1 KB each, so
gigabytes for a million kernels) before the importer keeps a few fields of each. Here the
importer sees one batch of a few thousand events at a time and keeps only its columns.

How: the text is decoded in chunks (a gzip file inflated under the one input budget, a plain
file held to it by its size). The top-level object's keys are parsed one by one; inside
``traceEvents`` a window of text is cut after a ``}`` followed by ``,`` and parsed as one JSON
array (C speed). If the cut was not between two events (a ``},`` inside a string), that parse
fails and the window is parsed again one value at a time with ``raw_decode``, which is always
right. Numbers with a fraction stay decimal text (``parse_float=str``), as the importer needs
them for exact nanoseconds; ``NaN``/``Infinity`` become None.
"""
from __future__ import annotations

import codecs
import gc
import json
import os
from pathlib import Path
from typing import Any, Iterator

from taxmodel.errors import InputError
from taxmodel.trace import inflate

CHUNK_BYTES = 8 << 20
WINDOW_CHARS = 2 << 20
LOOKAHEAD = 64
MAX_VALUE_CHARS = 256 << 20
"""One event (or top-level value) larger than this is not a trace: refused instead of buffered."""

_WS = " \t\n\r"


def _decoder() -> json.JSONDecoder:
    return json.JSONDecoder(parse_float=str, parse_constant=lambda _: None)


class TraceStream:
    """``batches()`` yields lists of ``traceEvents`` elements (any JSON value, in order);
    ``top`` holds the other top-level keys, complete once ``batches()`` is exhausted.
    ``found_events`` tells whether there were events: a ``traceEvents`` array, or a bare array
    document (Chrome's "JSON array format")."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.top: dict[str, Any] = {}
        self.found_events = False
        self._texts = self._text_chunks()
        self._buf = ""
        self._pos = 0
        self._eof = False
        self._lines_before = 0  # newlines in text already dropped from the buffer
        self._dec = _decoder()

    # --- input ---------------------------------------------------------------------------

    def _text_chunks(self) -> Iterator[str]:
        path = self.path
        try:
            decode = codecs.getincrementaldecoder("utf-8")()
            offset = 0
            for chunk in inflate.input_chunks(path, "the trace", CHUNK_BYTES):
                try:
                    yield decode.decode(chunk)
                except UnicodeDecodeError as exc:
                    raise InputError(f"{path}: not a text JSON file (byte {offset + exc.start} is not UTF-8); is it a "
                                     "trace?") from exc
                offset += len(chunk)
            yield decode.decode(b"", final=True)
        except UnicodeDecodeError as exc:
            raise InputError(f"{path}: not a text JSON file (it ends inside a UTF-8 character); is it a trace?") from exc
        except OSError as exc:
            raise InputError(f"{path}: cannot be read ({exc.strerror or exc})") from exc

    def _more(self) -> bool:
        """Append the next chunk of text (dropping what was consumed); False at the end."""
        if self._eof:
            return False
        try:
            text = next(self._texts)
        except StopIteration:
            self._eof = True
            return False
        if self._pos:
            self._lines_before += self._buf.count("\n", 0, self._pos)
            self._buf = self._buf[self._pos:]
            self._pos = 0
        if len(self._buf) > MAX_VALUE_CHARS:
            raise InputError(f"{self.path}: one value of the JSON document is longer than {MAX_VALUE_CHARS:,} "
                             "characters; this is not a trace")
        self._buf += text
        return True

    def _skip_ws(self) -> str:
        """The next non-whitespace character ('' at the end), with the position on it."""
        while True:
            buf, pos, n = self._buf, self._pos, len(self._buf)
            while pos < n and buf[pos] in _WS:
                pos += 1
            self._pos = pos
            if pos < n:
                return buf[pos]
            if not self._more():
                return ""

    # --- errors ----------------------------------------------------------------------------

    def _error(self, msg: str, pos: int) -> InputError:
        if self._eof and (pos >= len(self._buf.rstrip()) or msg.startswith("Unterminated string")):
            hint = "the file looks truncated"  # the text ended inside a value
        else:
            hint = "the file is not valid JSON"
        line = self._lines_before + self._buf.count("\n", 0, pos) + 1
        col = pos - self._buf.rfind("\n", 0, pos)
        return InputError(f"{self.path}: {hint} ({msg} at line {line} column {col}); export the trace again")

    def _expect(self, chars: str, what: str) -> str:
        c = self._skip_ws()
        if c == "" or c not in chars:
            raise self._error(f"Expecting {what}", self._pos)
        self._pos += 1
        return c

    def _value(self) -> Any:
        """One JSON value at the position, reading more text while it may be incomplete: an
        error or an end within ``LOOKAHEAD`` characters of the text read so far (a number cut
        by the chunk's end parses as a shorter number), or a string still open."""
        self._skip_ws()
        while True:
            buf, pos = self._buf, self._pos
            try:
                value, end = self._dec.raw_decode(buf, pos)
            except json.JSONDecodeError as exc:
                if (exc.msg.startswith("Unterminated string") or exc.pos >= len(buf) - LOOKAHEAD) and self._more():
                    continue
                raise self._error(exc.msg, exc.pos) from None
            except RecursionError as exc:
                raise InputError(f"{self.path}: cannot be parsed as JSON (nested too deeply)") from exc
            if end > len(buf) - LOOKAHEAD and self._more():
                continue
            self._pos = end
            return value

    # --- the document ------------------------------------------------------------------------

    def batches(self) -> Iterator[list]:
        enabled = gc.isenabled()
        gc.disable()  # millions of small objects: the cyclic collector would rescan them again and again
        try:
            yield from self._document()
        finally:
            if enabled:
                gc.enable()

    def _document(self) -> Iterator[list]:
        c = self._skip_ws()
        if c == "[":
            self.found_events = True
            self._pos += 1
            yield from self._array()
        elif c == "{":
            self._pos += 1
            if self._skip_ws() == "}":
                self._pos += 1
            else:
                while True:
                    if self._skip_ws() != '"':
                        raise self._error("Expecting property name enclosed in double quotes", self._pos)
                    key = self._value()
                    self._expect(":", "':' delimiter")
                    if key == "traceEvents" and self._skip_ws() == "[":
                        self.found_events = True
                        self._pos += 1
                        yield from self._array()
                    else:
                        self.top[key] = self._value()
                    if self._expect(",}", "',' delimiter") == "}":
                        break
        else:
            raise self._error("Expecting value", self._pos)
        if self._skip_ws() != "":
            raise self._error("Extra data", self._pos)

    def _array(self) -> Iterator[list]:
        """The elements of an array whose '[' was consumed, in batches; consumes its ']'."""
        if self._skip_ws() == "]":
            self._pos += 1
            return
        loads = self._dec.decode
        while True:
            # fast path: a window cut after a '}' that a ',' follows, parsed as one array
            while len(self._buf) - self._pos < WINDOW_CHARS and self._more():
                pass
            buf, pos = self._buf, self._pos
            cut = self._cut(buf, pos)
            if cut > pos:
                try:
                    batch = loads("[" + buf[pos:cut] + "]")
                except (json.JSONDecodeError, RecursionError):
                    batch = None
                if batch is not None:
                    self._pos = cut
                    self._expect(",", "',' delimiter")
                    yield batch
                    continue
            # slow path: one value at a time up to the cut (or one value when there is none)
            batch = []
            stop = max(cut, self._pos + 1)
            while True:
                batch.append(self._value())
                c = self._expect(",]", "',' delimiter")
                if c == "]":
                    yield batch
                    return
                if self._pos >= stop:
                    break
            yield batch

    @staticmethod
    def _cut(buf: str, pos: int) -> int:
        """A position after a '}' within the window that only whitespace and a ',' follow, else pos."""
        end = min(len(buf), pos + WINDOW_CHARS)
        for _ in range(8):
            i = buf.rfind("}", pos, end)
            if i < 0:
                return pos
            j = i + 1
            while j < len(buf) and buf[j] in _WS:
                j += 1
            if j < len(buf) and buf[j] == ",":
                return i + 1
            end = i
        return pos
