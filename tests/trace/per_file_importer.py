"""A test importer that reads one file at a time (``parse``/``combine``, the protocol in
``trace/importers.py``), over Kineto traces: ``import --scheduler``'s per-file tasks are tested
with it while no built-in importer has a per-file step. Its ``read`` is ``combine`` of ``parse``,
as the protocol requires, so a one-process import of it is the reference."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from taxmodel.trace import kineto

FORMAT = "kineto-per-file"
MODULE = __name__


def sniff(path: Path, head: bytes, tables: set[str]) -> bool:
    return False  # named with --format only


def parse(path: Path, index: int, *, iteration_pattern: str | None = None) -> tuple[pd.DataFrame, dict]:
    return kineto.read([Path(path)], iteration_pattern=iteration_pattern)


def combine(parts: list, *, iteration_pattern: str | None = None) -> tuple[pd.DataFrame, dict]:
    metas = [m for _, m in parts]
    meta = dict(metas[0], source=FORMAT, inputs=[i for m in metas for i in m["inputs"]],
                ranks=sorted(r for m in metas for r in m["ranks"]), notes=[n for m in metas for n in m["notes"]])
    return pd.concat([e for e, _ in parts], ignore_index=True), meta


def read(paths: list[Path], *, iteration_pattern: str | None = None) -> tuple[pd.DataFrame, dict]:
    return combine([parse(p, i, iteration_pattern=iteration_pattern) for i, p in enumerate(paths)],
                   iteration_pattern=iteration_pattern)
