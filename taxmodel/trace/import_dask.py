"""``taxmodel import --scheduler``: a run's trace files read on a Dask cluster, where they live, and
the bundle written here; the bundle is the one-process import's (``importers.import_bundle``).

    where: each worker says which of the paths it can read (one ``client.run``)
    -> format: ``detect_format`` of each file, a task on a worker that sees it (``--format auto``)
    -> parse: ``parse`` of each file, a task on a worker that sees it, when the importer reads one
       file at a time (``importers.reads_per_file``); else its ``read`` of all files, one task on
       a worker that sees them all
    -> on the client: ``combine``, the checks across files (``importers.finish_import``: ranks,
       world size, same run, stream order) and ``write_bundle``, as the one-process import does.

Traces on each node's local disk are read there: give the paths as the workers see them (absolute
paths, or relative to a directory that is the same on every node and here). A file that no worker
can read is a missing rank: refused, or with ``--allow-missing-ranks`` left out with a note.
``--keep-raw`` copies the traces into the bundle from this machine, so it needs them here too.
"""
from __future__ import annotations

import importlib
import os
import uuid
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from taxmodel.errors import AnalysisError, InputError
from taxmodel.trace import importers
from taxmodel.trace.bundle import Bundle
from taxmodel.trace.dask_run import from_cluster, gather


def import_bundle_dask(paths: Sequence[str | os.PathLike], output: str | os.PathLike, client: Any, fmt: str = "auto",
                       iteration_pattern: str | None = None, *, keep_raw: bool = True, allow_missing_ranks: bool = False,
                       force: bool = False, world_size: int | None = None,
                       counters: str | os.PathLike | None = None,
                       shapes_from: Sequence[str | os.PathLike] = ()) -> tuple[Bundle, str]:
    """``importers.import_bundle`` with the traces read on ``client``'s workers (``raw/`` holds
    the traces that were imported)."""
    paths = [Path(p) for p in paths]
    if keep_raw:  # before the (long) import
        here = next((p for p in paths if not p.is_file()), None)
        if here is not None:
            raise InputError(f"{here}: not on this machine, so --keep-raw cannot copy it into the bundle's raw/; "
                             "pass --no-keep-raw (the traces stay on their nodes)")
    importers.check_import_options(paths, iteration_pattern, world_size)
    seen, lost = locate(client, paths, allow_missing_ranks)

    def read(kept: list[Path], fmt: str, iteration_pattern: str | None, **checks: Any) -> tuple[pd.DataFrame, dict, str]:
        return _import(client, kept, seen, lost, fmt, iteration_pattern, **checks)

    return importers.import_bundle([p for p in paths if p not in lost], output, fmt, iteration_pattern, keep_raw=keep_raw,
                                   force=force, allow_missing_ranks=allow_missing_ranks, world_size=world_size,
                                   counters=counters, shapes_from=shapes_from, read=read)


def import_traces_dask(client: Any, paths: Sequence[str | os.PathLike], fmt: str = "auto",
                       iteration_pattern: str | None = None, *, allow_missing_ranks: bool = False,
                       world_size: int | None = None) -> tuple[pd.DataFrame, dict, str]:
    """``importers.import_traces`` with each file detected and parsed on a worker that can read it."""
    paths = importers.check_import_options(paths, iteration_pattern, world_size)
    seen, lost = locate(client, paths, allow_missing_ranks)
    return _import(client, [p for p in paths if p not in lost], seen, lost, fmt, iteration_pattern,
                   allow_missing_ranks=allow_missing_ranks, world_size=world_size)


def locate(client: Any, paths: list[Path], allow_missing_ranks: bool) -> tuple[dict[Path, list[str]], list[Path]]:
    """Per path the workers that can read it, and the paths that none can: a missing rank,
    refused unless ``allow_missing_ranks`` (and always when no file at all can be read)."""
    seen = _workers_seeing(client, paths)
    lost = [p for p in paths if not seen[p]]
    if lost and (not allow_missing_ranks or len(lost) == len(paths)):
        n = len(client.scheduler_info().get("workers", {}))
        more = f" (+{len(lost) - 1} more)" if len(lost) > 1 else ""
        hint = ", or pass --allow-missing-ranks to import the ranks that can be read" if len(lost) < len(paths) else ""
        raise InputError(f"{lost[0]}{more}: no such file on any of the {n} Dask workers (each looked at that path on "
                         f"its node); put each trace at that path on a node whose worker reads it{hint}")
    return seen, lost


def _import(client: Any, paths: list[Path], seen: dict[Path, list[str]], lost: list[Path], fmt: str,
            iteration_pattern: str | None, *, allow_missing_ranks: bool = False, world_size: int | None = None,
            shapes_from: Sequence[str | os.PathLike] = ()) -> tuple[pd.DataFrame, dict, str]:
    """Detect, parse or read on the workers, then combine and check here; ``lost``: files left out."""
    run = uuid.uuid4().hex[:8]
    if fmt == "auto":
        found = _per_file(client, paths, seen, "format", run, _detect)
        fmt = importers.one_format({p: found[p] for p in paths})
    mod = importers.importer_for(fmt)
    if importers.reads_per_file(mod):
        parts = _per_file(client, paths, seen, "parse", run, _parse, mod.__name__, iteration_pattern)
        ordered = [parts[p] for p in paths]
        del parts  # combine takes the parts over and releases each frame once joined
        events, meta = importers.combine_with(mod, ordered, paths, iteration_pattern)
    else:
        events, meta = _read_together(client, paths, seen, run, mod.__name__, iteration_pattern)
    events, meta, fmt = importers.finish_import(events, meta, fmt, paths, allow_missing_ranks=allow_missing_ranks,
                                                world_size=world_size, shapes_from=shapes_from)
    if lost:
        meta["notes"].append(f"import: on no Dask worker's node, so left out (--allow-missing-ranks): "
                             f"{', '.join(map(str, lost))}")
    return events, meta, fmt


def _readable(paths: list[str]) -> list[bool]:
    """On a worker: which of ``paths`` are files it can read."""
    return [os.path.isfile(p) and os.access(p, os.R_OK) for p in paths]


def _workers_seeing(client: Any, paths: list[Path]) -> dict[Path, list[str]]:
    """Per path, the workers that can read it (at that path, absolute as resolved here)."""
    try:
        answers = client.run(_readable, [str(p.absolute()) for p in paths])
    except Exception as exc:
        if not from_cluster(exc) and not isinstance(exc, OSError):
            raise
        raise AnalysisError(f"the Dask workers could not be asked where the traces are ({type(exc).__name__}: "
                         f"{' '.join(str(exc).split())[:200]}); check the cluster, then run again") from None
    return {p: sorted(w for w, ok in answers.items() if ok[i]) for i, p in enumerate(paths)}


def _detect(path: str, index: int) -> str:
    return importers.detect_format(path)


def _parse(path: str, index: int, module: str, iteration_pattern: str | None) -> Any:
    mod = importlib.import_module(module)
    return importers.parse_with(mod, Path(path), index, iteration_pattern)


def _read(paths: list[str], module: str, iteration_pattern: str | None) -> tuple[pd.DataFrame, dict]:
    return importers.read_with(importlib.import_module(module), [Path(p) for p in paths], iteration_pattern)


def _per_file(client: Any, paths: list[Path], seen: dict[Path, list[str]], step: str, run: str, fn: Any,
              *args: Any) -> dict[Path, Any]:
    """``fn(path, index, *args)`` for each path, one task per file on the workers that see it (any,
    where all do). The paths are given to workers as absolute paths; what comes back is keyed by
    the path as the user gave it."""
    everyone = len(client.scheduler_info().get("workers", {}))
    futures = {}
    for i, p in enumerate(paths):
        futures[client.submit(fn, str(p.absolute()), i, *args, key=f"taxmodel-{step}-{i}-{run}", pure=False,
                              workers=None if len(seen[p]) >= everyone else seen[p], allow_other_workers=False)] = p
    return gather(client, futures, str, f"the import's {step} step (a task per trace file)")


def _read_together(client: Any, paths: list[Path], seen: dict[Path, list[str]], run: str, module: str,
                   iteration_pattern: str | None) -> tuple[pd.DataFrame, dict]:
    """The importer's ``read`` of all files, one task on a worker that sees them all: the
    importer combines what it reads of each file inside ``read``, so its files cannot be split."""
    common = set.intersection(*(set(seen[p]) for p in paths))
    if not common:
        raise InputError(f"{module.rpartition('.')[2]} traces are read together (the importer has no per-file step), "
                         f"and no Dask worker can read all {len(paths)} files; put them on one node or a shared file "
                         "system, or import without --scheduler")
    fut = client.submit(_read, [str(p.absolute()) for p in paths], module, iteration_pattern,
                        key=f"taxmodel-read-{run}", pure=False, workers=sorted(common), allow_other_workers=False)
    where = f"{paths[0]}" + (f" (+{len(paths) - 1} more)" if len(paths) > 1 else "")
    return gather(client, {fut: where}, str, "the import's read (one task for all files)")[where]
