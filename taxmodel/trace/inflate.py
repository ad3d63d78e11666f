"""Gzip input, inflated in chunks with a cap on the result, so that a small damaged or hostile
file (1 MB of gzip that inflates to 1 GiB) costs at most the cap before a clear error, not
memory or disk in proportion to what it claims to hold.

The cap is the one input budget's (``taxmodel.limits.decompressed_cap``): relative to the
compressed size (real traces compress 5-30x) with a floor for small files, never above the budget.
"""
from __future__ import annotations

import os
import zlib
from pathlib import Path
from typing import BinaryIO

from taxmodel.errors import InputError
from taxmodel.limits import check_size, decompressed_cap as cap_for

GZIP_MAGIC = b"\x1f\x8b"
CHUNK = 1 << 20


def _chunks(src: BinaryIO | bytes, path: Path, cap: int):
    """Inflated chunks of a (possibly multi-member) gzip stream; InputError on damage, on
    truncation, or beyond ``cap`` bytes."""
    data = memoryview(src) if isinstance(src, (bytes, bytearray)) else None
    pos, total, in_member = 0, 0, False
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        while True:
            if data is not None:
                chunk, pos = bytes(data[pos:pos + CHUNK]), pos + CHUNK
            else:
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


def gunzip_bytes(data: bytes, path: str | os.PathLike) -> bytes:
    """Inflate the gzip ``data`` read from ``path`` (the name is for messages), capped."""
    return b"".join(_chunks(data, Path(path), cap_for(len(data))))


def gunzip_file(path: str | os.PathLike, dst: BinaryIO) -> int:
    """Inflate the gzip file ``path`` into ``dst`` chunk by chunk, capped; return the bytes written."""
    path = Path(path)
    n = 0
    with open(path, "rb") as src:
        for out in _chunks(src, path, cap_for(path.stat().st_size)):
            dst.write(out)
            n += len(out)
    return n


def iter_gunzip(path: str | os.PathLike):
    """The inflated chunks of the gzip file ``path``, capped (for readers that stream)."""
    path = Path(path)
    with open(path, "rb") as src:
        yield from _chunks(src, path, cap_for(path.stat().st_size))
