"""Gzip input, inflated in chunks with a cap on the result, so that a small damaged or hostile
file (1 MB of gzip that inflates to 1 GiB) costs at most the cap before a clear error, not
memory or disk in proportion to what it claims to hold.

The cap is the one input budget's (``taxmodel.limits.decompressed_cap``): relative to the
compressed size (real traces compress 5-30x) with a floor for small files, never above the budget.
``input_chunks`` and ``open_input_text`` read a file that may or may not be gzipped: inflated
under the cap, or held to the budget by its size.
"""
from __future__ import annotations

import io
import os
import zlib
from pathlib import Path
from typing import BinaryIO, Generator, Iterator

from taxmodel.errors import InputError
from taxmodel.limits import check_size, decompressed_cap as cap_for

GZIP_MAGIC = b"\x1f\x8b"
CHUNK = 1 << 20


def _chunks(src: BinaryIO, path: Path, cap: int) -> Iterator[bytes]:
    """Inflated chunks of a (possibly multi-member) gzip stream; InputError on damage, on
    truncation, or beyond ``cap`` bytes."""
    total, in_member = 0, False
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        while True:
            chunk = src.read(CHUNK)
            if not chunk:
                break
            while chunk:
                in_member = True
                out = d.decompress(chunk, CHUNK)
                total += len(out)
                check_size(path, total, "its gzip content", cap)
                if out:
                    yield out
                chunk = d.unconsumed_tail
                if d.eof:  # another gzip member may follow (concatenated .gz files); zero padding may too
                    chunk = d.unused_data  # (everything after the member's end; unconsumed_tail repeats it)
                    d, in_member = zlib.decompressobj(16 + zlib.MAX_WBITS), False
                    if not chunk.strip(b"\x00"):
                        chunk = b""
    except zlib.error as exc:
        raise InputError(f"{path}: damaged gzip file ({exc}); copy or export the trace again") from exc
    if in_member:
        raise InputError(f"{path}: truncated gzip file (it ends before its end-of-stream marker); "
                         "copy or export the trace again")


def gunzip_file(path: str | os.PathLike, dst: BinaryIO) -> None:
    """Inflate the gzip file ``path`` into ``dst`` chunk by chunk, capped."""
    path = Path(path)
    with open(path, "rb") as src:
        for out in _chunks(src, path, cap_for(path.stat().st_size)):
            dst.write(out)


def input_chunks(path: str | os.PathLike, what: str, chunk: int = CHUNK) -> Iterator[bytes]:
    """The content of the file ``path`` in chunks (of ``chunk`` bytes where it is not gzip): a
    gzip file inflated under its cap, any other held to the input budget by its size (``what``
    names it in that refusal)."""
    path = Path(path)
    with open(path, "rb") as src:
        gz = src.read(2) == GZIP_MAGIC
        src.seek(0)
        size = os.fstat(src.fileno()).st_size
        if gz:
            yield from _chunks(src, path, cap_for(size))
            return
        check_size(path, size, what)
        while data := src.read(chunk):
            yield data


def open_input_text(path: str | os.PathLike, what: str) -> io.TextIOWrapper:
    """``input_chunks`` of ``path`` as UTF-8 text (newlines as they are), for readers that take a file."""
    return io.TextIOWrapper(io.BufferedReader(_ChunkReader(input_chunks(path, what)), CHUNK), encoding="utf-8",
                            newline="")


class _ChunkReader(io.RawIOBase):
    """A raw binary stream over an iterator of byte chunks."""

    def __init__(self, chunks: Generator[bytes, None, None]):
        self._chunks, self._chunk, self._pos = chunks, memoryview(b""), 0

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        while self._pos == len(self._chunk):
            data = next(self._chunks, None)
            if data is None:
                return 0
            self._chunk, self._pos = memoryview(data), 0
        n = min(len(buf), len(self._chunk) - self._pos)
        buf[:n] = self._chunk[self._pos:self._pos + n]
        self._pos += n
        return n

    def close(self) -> None:
        self._chunks.close()  # the file under the chunks
        super().close()
