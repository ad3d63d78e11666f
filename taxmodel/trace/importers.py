"""Trace formats in: detect the format by content, read with its importer, check what every
format must satisfy, and write a bundle.

Each importer module (listed in ``IMPORTER_MODULES``; adding a format is one line there) exposes

    FORMAT: str                                    # "kineto", "nsys", ...
    sniff(path: Path, head: bytes, tables: set[str]) -> bool   # by content: head = first 64 KiB, gunzipped;
                                                               # tables = a SQLite file's tables and views, else empty
    read(paths: list[Path], *, iteration_pattern: str | None = None) -> (events, meta)

``read`` returns events in any column order (``schema.normalize_events`` is applied here) and
partial meta. An importer may also read a run one file at a time, which ``taxmodel import
--scheduler`` runs as one Dask task per file on a worker that sees it (``trace/import_dask.py``):

    parse(path: Path, index: int, *, iteration_pattern: str | None = None) -> part   # picklable
    combine(parts: list, *, iteration_pattern: str | None = None) -> (events, meta)

such that ``read(paths) == combine([parse(p, i) for i, p in enumerate(paths)])`` (``index``: the
file's position, for formats that number ranks by it). One without them is read by ``read``, in
one task. (None of the built-in importers has them yet.) To let the checks below name the offending *file*, meta should carry
``inputs``: one entry per file, ``{"file": name, "ranks": [rank, ...], "world_size": int | None}``
(extra keys are kept). Without it the checks still run and name ranks instead of files.

The cross-file checks live here, not in the importers, so that every format gets them:
no GPU events, ranks missing or duplicated, mixed world sizes, durations that are negative
(zero-length GPU activities get 1 ns, see ``widen_instants``), and timestamps going backwards (see
``check_stream_order``). Helpers every importer shares for iterations (``compile_iteration_pattern``,
``iteration_numbers``, ``assign_iterations``) live here too.
"""
from __future__ import annotations

import datetime as _dt
import importlib
import os
import re
import sqlite3
import zlib
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from taxmodel.errors import InputError, TaxmodelError
from taxmodel.trace import memory, replay_shapes, schema, sqlite_input, unsupported
from taxmodel.trace.bundle import Bundle, load_bundle, prepare_output, write_bundle

IMPORTER_MODULES: list[str] = [
    "taxmodel.trace.kineto",
    "taxmodel.trace.nsys",
    "taxmodel.trace.rocpd",
    "taxmodel.trace.rocprof",
    "taxmodel.trace.rocprof_csv",
]
"""Importer modules, in the order ``detect_format`` asks them; the first whose ``sniff`` says yes wins."""

HEAD_BYTES = 64 * 1024


# --- formats -----------------------------------------------------------------------------------


_IMPORT_FAILURES: dict[str, str] = {}


def importer_modules() -> list[ModuleType]:
    """The importer modules that can be imported here. A module whose import fails (a missing
    optional dependency) is skipped, so that one format never takes the others down; the
    reason is kept and shown when the user asks for a format that is not available."""
    mods = []
    for name in IMPORTER_MODULES:
        try:
            mods.append(importlib.import_module(name))
        except ImportError as exc:
            _IMPORT_FAILURES[name] = f"{type(exc).__name__}: {exc}"
    return mods


def available_formats() -> list[str]:
    return [m.FORMAT for m in importer_modules()]


def importer_for(fmt: str) -> ModuleType:
    for mod in importer_modules():
        if mod.FORMAT == fmt:
            return mod
    failed = "".join(f"; {name} could not be loaded ({why})" for name, why in _IMPORT_FAILURES.items())
    raise InputError(f"unknown trace format {fmt!r}; known formats: {', '.join(available_formats())}{failed}")


def read_head(path: Path, n: int = HEAD_BYTES) -> bytes:
    """The first ``n`` bytes of a file, gunzipped when it is gzip; never fails on truncation."""
    try:
        with open(path, "rb") as f:
            raw = f.read(n)
    except OSError as exc:
        raise InputError(f"{path}: cannot be read ({exc.strerror or exc})") from exc
    if raw[:2] != b"\x1f\x8b":
        return raw
    out = b""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        with open(path, "rb") as f:
            while len(out) < n and not d.eof:
                chunk = f.read(HEAD_BYTES)
                if not chunk:
                    break
                out += d.decompress(chunk, n - len(out))
                while d.unconsumed_tail and len(out) < n:
                    out += d.decompress(d.unconsumed_tail, n - len(out))
    except zlib.error as exc:
        if not out:  # nothing readable: say so here, not "the file is empty"
            raise InputError(f"{path}: damaged gzip file ({exc}); copy or export the trace again") from exc
        # else: sniff what was readable; read() reports the damage
    if not out and not d.eof:
        raise InputError(f"{path}: truncated gzip file (it ends before any content); copy or export the trace again")
    return out[:n]


def detect_format(path: str | Path) -> str:
    """The format of one trace file, decided by its content (never by its name)."""
    path = Path(path)
    _check_file(path)
    head = read_head(path)
    if not head:
        raise InputError(f"{path}: the file is empty; export the trace again")
    if not head.strip():
        raise InputError(f"{path}: its first {len(head):,} bytes{' (unpacked)' if _is_gzip(path) else ''} are only "
                         "whitespace; this is not a trace, export it again")
    tables = sqlite_input.sqlite_object_names(path, head)  # once: the refusals and sniffers all look at them
    refuse_unsupported(path, head, tables)
    for mod in importer_modules():
        try:
            claims = mod.sniff(path, head, tables)
        except Exception:  # a sniffer that chokes on foreign bytes simply does not claim them
            claims = False
        if claims:
            return mod.FORMAT
    raise InputError(f"{path}: format not recognized (known: {', '.join(available_formats())}); "
                     "check the file, or name the format with --format")


def import_hint(path: str | os.PathLike) -> str | None:
    """For a trace given where a bundle belongs (``taxmodel show trace.json.gz``): a sentence
    saying which format it is and the import that makes it a bundle. For a directory without
    bundles, the same for the traces in it (the first ``HINT_FILES`` files are looked at). None
    when ``path`` holds no trace this taxmodel reads."""
    p = Path(path)
    files = [p] if p.is_file() else sorted(q for q in p.iterdir() if q.is_file())[:HINT_FILES] if p.is_dir() else []
    found: dict[Path, str] = {}
    for f in files:
        try:
            found[f] = detect_format(f)
        except TaxmodelError:
            continue
    if not found:
        return None
    first, fmt = next(iter(found.items()))
    if p.is_file():
        return (f"{p} is a {fmt} trace, not a bundle: import it first, with the other ranks' files of the run "
                f"(`taxmodel import {p} ... -o my_job`), then give my_job")
    suffix = "".join(first.suffixes[-2:]) if first.name.endswith(".gz") else first.suffix
    return (f"it holds traces, not bundles ({len(found)} file(s) such as {first.name}, a {fmt} trace): import one run's "
            f"traces first (`taxmodel import {p}/*{suffix} -o my_job`), then give my_job")


#: how many files of a directory ``import_hint`` looks at
HINT_FILES = 50


def open_bundle(path: str | os.PathLike) -> Bundle:
    """``load_bundle``, except that a trace given where a bundle belongs is refused with the
    import that makes it one (``import_hint``)."""
    try:
        return load_bundle(path)
    except TaxmodelError as exc:
        hint = import_hint(path) if Path(path).is_file() else None
        if hint is None:
            raise
        raise InputError(hint) from exc


def refuse_unsupported(path: Path, head: bytes | None = None, tables: set[str] | None = None) -> None:
    """InputError in one line for a profiler output taxmodel recognizes but does not read
    (``unsupported.py``: an .nsys-rep, an nvprof or RPD database, an nsys export without CUDA
    activity), saying how to get a supported one; nothing for any other file. ``head`` and
    ``tables`` as ``sniff`` gets them, read here when not given."""
    head = read_head(path) if head is None else head
    tables = sqlite_input.sqlite_object_names(path, head) if tables is None else tables
    why = unsupported.refusal(path, head, tables)
    if why:
        raise InputError(why)


def _is_gzip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def _check_file(path: Path) -> None:
    if not path.exists():
        raise InputError(f"{path}: no such file")
    if not path.is_file():
        raise InputError(f"{path}: not a file (pass trace files, e.g. rank*.json.gz)")


# --- import ------------------------------------------------------------------------------------


def import_traces(paths: Sequence[str | Path], fmt: str = "auto", iteration_pattern: str | None = None,
                  *, allow_missing_ranks: bool = False, world_size: int | None = None,
                  shapes_from: Sequence[str | Path] = ()) -> tuple[pd.DataFrame, dict, str]:
    """Read trace files (one or many ranks) into normalized events, meta and the format used.

    Raises InputError naming the file and problem for anything the checks reject. With
    ``allow_missing_ranks`` a subset of a run's ranks (e.g. only rank 0 was profiled) is
    accepted and noted in meta instead of rejected. ``world_size`` says how many ranks the run
    had where the traces do not record it (it must agree with them where they do).
    ``shapes_from``: an eager capture of the same program (``attach_shapes_from``).
    """
    paths = check_import_options(paths, iteration_pattern, world_size)
    for p in paths:
        _check_file(p)
    if fmt == "auto":
        fmt = one_format({p: detect_format(p) for p in paths})
    else:  # a named format does not make an nvprof database an nsys export
        for p in paths:
            refuse_unsupported(p)
    events, meta = read_with(importer_for(fmt), paths, iteration_pattern)
    return finish_import(events, meta, fmt, paths, allow_missing_ranks=allow_missing_ranks, world_size=world_size,
                         shapes_from=shapes_from)


def check_import_options(paths: Sequence[str | Path], iteration_pattern: str | None,
                         world_size: int | None) -> list[Path]:
    """The paths, once the options that need no file are checked (before any file is read)."""
    if world_size is not None and world_size <= 0:
        raise InputError(f"--world-size {world_size} is not positive")
    paths = [Path(p) for p in paths]
    if not paths:
        raise InputError("no trace files given")
    if iteration_pattern is not None:
        compile_iteration_pattern(iteration_pattern)
    return paths


def one_format(found: dict[Path, str]) -> str:
    """The one format of a run's files (each file's, as detected); InputError when they differ."""
    kinds = sorted(set(found.values()))
    if len(kinds) > 1:
        example = ", ".join(f"{p.name} is {f}" for p, f in list(found.items())[:4])
        raise InputError(f"traces of different formats given together ({example}); import one run's traces at a time")
    return kinds[0]


def finish_import(events: pd.DataFrame, meta: dict, fmt: str, paths: Sequence[Path], *,
                  allow_missing_ranks: bool = False, world_size: int | None = None,
                  shapes_from: Sequence[str | Path] = ()) -> tuple[pd.DataFrame, dict, str]:
    """What every import does with what its importer read (``import_traces``'s second half, also
    run by ``import --scheduler`` after its tasks): meta completed, events normalized, the
    checks across files, and the CUDA-graph replays' work from eager steps (the trace's own, and
    ``shapes_from``'s when given: one pass); ``paths`` as the user gave them, for the messages."""
    meta = dict(meta)
    meta.setdefault("source", fmt)
    meta["notes"] = list(meta.get("notes") or [])
    if "created" not in meta or meta.get("created") is None:
        meta["created"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    events = schema.normalize_events(events)
    shown = {p.name: str(p) for p in paths}  # name files in messages as the user gave them
    check_same_run(meta, shown=shown)
    check_ranks(events, meta, allow_missing=allow_missing_ranks, shown=shown, world_size=world_size)
    events = widen_instants(events, meta)
    check_events(events, meta, shown=shown)
    note_long_spans(events, meta, shown=shown)
    meta["ranks"] = sorted(int(r) for r in events["rank"].unique())
    if shapes_from:
        events, meta = attach_shapes_from(events, meta, shapes_from)
    else:
        events, meta = replay_shapes.attach_replay_shapes(events, meta)  # from the trace's own eager steps, if any
    return events, meta, fmt


def attach_shapes_from(events: pd.DataFrame, meta: dict, paths: Sequence[str | Path]) -> tuple[pd.DataFrame, dict]:
    """The work of ``events``' CUDA-graph replays from the eager steps of another capture of the
    same program (``import --shapes-from``): trace files (one per rank, any format) or a bundle
    directory (``trace/replay_shapes.py``)."""
    paths = [Path(p) for p in paths]
    if len(paths) == 1 and paths[0].is_dir():
        reference = load_bundle(paths[0]).events
    else:
        reference, _, _ = import_traces(paths, allow_missing_ranks=True)
    if not (reference["kind"].eq("kernel") & reference["graph_id"].lt(0)).any():
        raise InputError(f"{', '.join(str(p) for p in paths)}: no eager kernels (all are CUDA-graph replays, or none): "
                         "--shapes-from needs a trace of the program run eagerly, captured with record_shapes=True")
    return replay_shapes.attach_replay_shapes(events, meta, reference, ", ".join(p.name for p in paths))


READ_FAILURES = (sqlite3.Error, ValueError, KeyError, TypeError, IndexError, AttributeError, OverflowError,
                 EOFError, zlib.error, UnicodeError, RecursionError, OSError)
"""What a parser can raise on input it did not foresee (a partly copied SQLite file, a NULL in a
numeric column, a field of the wrong type)."""


def read_with(mod: ModuleType, paths: list[Path], iteration_pattern: str | None) -> tuple[pd.DataFrame, dict]:
    """``mod.read``, with a last-resort net: an error the importer did not turn into an
    InputError itself becomes one line naming the files, the format and the original error
    (the importer's own checks name the field; this only keeps a traceback from the user)."""
    return _netted(mod, paths, lambda: mod.read(paths, iteration_pattern=iteration_pattern))


def reads_per_file(mod: ModuleType) -> bool:
    """Whether the importer reads one file at a time (``parse`` and ``combine``, see the module docstring)."""
    return callable(getattr(mod, "parse", None)) and callable(getattr(mod, "combine", None))


def parse_with(mod: ModuleType, path: Path, index: int, iteration_pattern: str | None) -> Any:
    """``mod.parse`` of one file, with ``read_with``'s net."""
    return _netted(mod, [path], lambda: mod.parse(path, index, iteration_pattern=iteration_pattern))


def combine_with(mod: ModuleType, parts: list, paths: list[Path], iteration_pattern: str | None) -> tuple[pd.DataFrame, dict]:
    """``mod.combine`` of the files' parts (in the order of ``paths``), with ``read_with``'s net."""
    return _netted(mod, paths, lambda: mod.combine(parts, iteration_pattern=iteration_pattern))


def _netted(mod: ModuleType, paths: list[Path], read: Callable[[], Any]) -> Any:
    try:
        return read()
    except TaxmodelError:
        raise
    except READ_FAILURES as exc:
        names = ", ".join(str(p) for p in paths[:3]) + (f" (+{len(paths) - 3} more)" if len(paths) > 3 else "")
        detail = " ".join(str(exc).split())[:200]
        raise InputError(f"{names}: cannot be read as {mod.FORMAT} ({type(exc).__name__}: {detail}); the file is "
                         "damaged or not what its content looked like: export it again, or name the format with --format") from exc


def import_bundle(paths: Sequence[str | Path], output: str | Path, fmt: str = "auto",
                  iteration_pattern: str | None = None, *, keep_raw: bool = True,
                  allow_missing_ranks: bool = False, force: bool = False,
                  world_size: int | None = None, counters: str | Path | None = None,
                  shapes_from: Sequence[str | Path] = (),
                  read: Callable[..., tuple[pd.DataFrame, dict, str]] | None = None) -> tuple[Bundle, str]:
    """Import traces and write them as a bundle at ``output`` (atomically); return (Bundle, format).
    ``keep_raw`` copies the original files into the bundle's ``raw/``. An existing bundle at
    ``output`` is replaced only with ``force``; anything else there is refused
    (``bundle.prepare_output``). ``counters``: an ncu export of the same run, attached per kernel
    (``counter_match``); one that does not match is refused and nothing is written. ``read``:
    what reads the traces, with ``import_traces``'s arguments (``import --scheduler`` reads them
    on Dask); by default ``import_traces``. ``shapes_from``: an eager capture of the same program
    whose steps give the CUDA-graph replays' kernels their work (``attach_shapes_from``)."""
    paths = [Path(p) for p in paths]
    prepare_output(output, force=force, inputs=[*paths, *map(Path, shapes_from)])  # refuse before the (long) import
    events, meta, fmt = (read or import_traces)(paths, fmt, iteration_pattern, allow_missing_ranks=allow_missing_ranks,
                                                world_size=world_size, shapes_from=shapes_from)
    if counters is not None:
        from taxmodel.trace.counter_match import attach_counters_file

        events, meta = attach_counters_file(events, meta, counters)
    raw = []
    if keep_raw:
        names = [p.name for p in paths]
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup:
            raise InputError(f"two traces are named {dup!r}; rename one, or import with --no-keep-raw")
        raw = paths
    memory.release_freed()  # what reading and checking the traces freed: not held while the bundle is written
    written = write_bundle(output, events, meta, raw_files=raw, overwrite=force)
    del events  # the bundle read back is the one copy kept
    memory.release_freed()
    return load_bundle(written), fmt


# --- cross-file checks -------------------------------------------------------------------------


def _rank_files(meta: dict, shown: dict[str, str] | None = None) -> dict[int, str]:
    """rank -> the file it came from (as the user gave it, when ``shown`` maps names to paths)."""
    files = {}
    shown = shown or {}
    for inp in meta.get("inputs") or []:
        name = str(inp.get("file", ""))
        for r in inp.get("ranks") or []:
            files.setdefault(int(r), shown.get(name, name))
    return files


def _where(rank: int, files: dict[int, str]) -> str:
    return files.get(rank) or f"rank {rank}"


def check_ranks(events: pd.DataFrame, meta: dict, *, allow_missing: bool = False,
                shown: dict[str, str] | None = None, world_size: int | None = None) -> None:
    """Ranks duplicated across files, mixed world sizes, ranks missing or out of range.
    Sets ``meta['world_size']``: as the traces record it, else ``world_size`` (--world-size),
    else inferred -- the importer's guess, raised to the highest rank + 1 where a rank lies
    beyond it (a trace of rank 1 alone comes from a run of at least two ranks)."""
    inputs = meta.get("inputs") or []
    shown = shown or {}

    def name(inp: dict) -> str:
        return shown.get(str(inp.get("file")), str(inp.get("file")))

    seen: dict[int, str] = {}
    for inp in inputs:
        for r in inp.get("ranks") or []:
            if int(r) in seen:
                also = "the same file was given twice" if seen[int(r)] == name(inp) else f"also in {seen[int(r)]}"
                raise InputError(f"{name(inp)}: rank {r} is duplicated ({also}); give each rank's trace once")
            seen[int(r)] = name(inp)
    worlds = {}
    for inp in inputs:
        if inp.get("world_size") is not None:
            worlds.setdefault(int(inp["world_size"]), name(inp))
    if len(worlds) > 1:
        desc = ", ".join(f"{f} says {w}" for w, f in sorted(worlds.items()))
        raise InputError(f"traces from runs of different world sizes ({desc}); import one run's traces together")
    declared = next(iter(worlds), None)
    if world_size is not None and declared is not None and int(world_size) != declared:
        raise InputError(f"{worlds[declared]}: the trace records world size {declared}, but --world-size is {world_size}; "
                         "drop --world-size or import the traces of the run it describes")
    ranks = sorted(seen) if seen else sorted(int(r) for r in events["rank"].unique())
    world = declared or world_size
    if not world:
        world = int(meta.get("world_size") or len(ranks))
        if ranks and max(ranks) >= world:
            world = max(ranks) + 1
            meta.setdefault("notes", []).append(
                f"import: the traces record no world size; inferred {world} from the highest rank ({max(ranks)}); "
                "pass --world-size if the run had more ranks")
    world = int(world)
    if world <= 0:
        raise InputError(f"{next(iter(worlds.values()), 'traces')}: world size {world} is not positive; the trace is damaged")
    meta["world_size"] = world
    files = _rank_files(meta, shown)
    out_of_range = [r for r in ranks if r < 0 or r >= world]
    if out_of_range:
        r = out_of_range[0]
        raise InputError(f"{_where(r, files)}: rank {r} is outside world size {world}")
    missing = _missing_ranks(ranks, world)
    if missing:
        given = sorted(set(files.values())) or sorted(shown.values())
        where = given[0] + (f" (+{len(given) - 1} more)" if len(given) > 1 else "") if given else "traces"
        msg = f"{where}: ranks {_fmt_ranks(missing)} of world size {world} are missing (got {_fmt_ranks(ranks)})"
        if not allow_missing:
            raise InputError(f"{msg}; pass every rank's trace, or --allow-missing-ranks to import a subset")
        meta.setdefault("notes", []).append(f"import: {msg}; imported as a subset")


SAME_RUN_MAX_APART_NS = 7 * 24 * 3600 * 10**9
"""Captures of one run start within this of each other (a week: generous for long jobs)."""
EPOCH_CLOCK_NS = 10**18
"""Timestamps above this (2001 onwards, in ns since 1970) are wall-clock times comparable across hosts."""


def check_same_run(meta: dict, *, shown: dict[str, str] | None = None) -> None:
    """Refuse traces of different jobs given as one run: NCCL versions that differ, or
    wall-clock capture starts more than a week apart. Importers say what they know per file in
    ``meta['inputs']`` (optional keys ``nccl``, ``gpu``, ``start_ns``); GPU models that differ
    only get a note (mixed clusters exist)."""
    inputs = [i for i in meta.get("inputs") or [] if isinstance(i, dict)]
    if len(inputs) < 2:
        return
    shown = shown or {}

    def name(inp: dict) -> str:
        return shown.get(str(inp.get("file")), str(inp.get("file")))

    nccl = {str(i["nccl"]): name(i) for i in inputs if i.get("nccl")}
    if len(nccl) > 1:
        desc = ", ".join(f"{f} ran NCCL {v}" for v, f in sorted(nccl.items()))
        raise InputError(f"traces of different jobs given as one run ({desc}); import one run's traces together")
    starts = sorted((int(i["start_ns"]), name(i)) for i in inputs
                    if i.get("start_ns") is not None and int(i["start_ns"]) > EPOCH_CLOCK_NS)
    if len(starts) > 1 and starts[-1][0] - starts[0][0] > SAME_RUN_MAX_APART_NS:
        days = (starts[-1][0] - starts[0][0]) / (24 * 3600 * 1e9)
        raise InputError(f"traces of different jobs given as one run ({starts[0][1]} and {starts[-1][1]} were captured "
                         f"{days:.0f} days apart); import one run's traces together")
    gpus = sorted({str(i["gpu"]) for i in inputs if i.get("gpu")})
    if len(gpus) > 1:
        meta.setdefault("notes", []).append(f"import: the ranks ran on different GPU models ({', '.join(gpus)})")


def _missing_ranks(ranks: list[int], world: int, limit: int = 16) -> list[int]:
    """The first ``limit`` ranks of ``range(world)`` not in ``ranks`` (never builds range(world))."""
    have, out, r = set(ranks), [], 0
    while r < world and len(out) < limit:
        if r not in have:
            out.append(r)
        r += 1
    return out


def _fmt_ranks(ranks: Sequence[int], limit: int = 15) -> str:
    shown = ", ".join(str(r) for r in list(ranks)[:limit])
    return "{" + shown + (", ..." if len(ranks) > limit else "") + "}"


def check_events(events: pd.DataFrame, meta: dict, *, shown: dict[str, str] | None = None) -> None:
    """No GPU events (per file), bad durations, timestamps going backwards."""
    files = _rank_files(meta, shown)
    gpu = events["kind"].isin(schema.GPU_KINDS).to_numpy()
    with_gpu = set(events.loc[gpu, "rank"].unique().tolist())
    for r in sorted(set(files) | set(events["rank"].unique().tolist())):
        if int(r) not in with_gpu:
            raise InputError(f"{_where(int(r), files)}: no GPU events (kernels, memcpy, memset) in the trace; "
                             "profile with GPU activities on (torch.profiler ProfilerActivity.CUDA) on a GPU run")
    if not gpu.any():
        raise InputError("no GPU events (kernels, memcpy, memset) in the traces; profile a GPU run with GPU activities on")
    dur = events["end_ns"].to_numpy() - events["start_ns"].to_numpy()
    bad = dur < 0
    if bad.any():
        row = events.iloc[int(np.flatnonzero(bad)[0])]
        raise InputError(f"{_where(int(row['rank']), files)}: {row['kind']} {row['name']!r} at {row['start_ns']} ns has "
                         f"a negative duration ({int(row['end_ns'] - row['start_ns'])} ns); the trace is damaged")
    check_stream_order(events, files)
    check_launch_gaps(events, files)


MAX_LAUNCH_GAP_NS = 3600 * 10**9
"""A GPU activity starts at most this long (an hour) after the launch call that enqueued it ended.
Real queues delay work by milliseconds, a long synchronization by seconds; a kernel 103 days
after its launch means the host and GPU clocks of the trace disagree or a timestamp is damaged,
and every window and tax computed from it would be that long."""


def check_launch_gaps(events: pd.DataFrame, files: dict[int, str] | None = None) -> None:
    """InputError naming the first GPU activity that starts more than ``MAX_LAUNCH_GAP_NS`` after
    its launch call (same rank and correlation) ended."""
    corr = events["correlation"].to_numpy()
    kind = events["kind"].to_numpy()
    launch = (kind == "launch") & (corr >= 0)
    gpu = np.isin(kind, list(schema.GPU_KINDS)) & (corr >= 0)
    if not launch.any() or not gpu.any():
        return
    calls = pd.DataFrame({"rank": events["rank"].to_numpy()[launch], "correlation": corr[launch],
                          "call_end": events["end_ns"].to_numpy()[launch]}).drop_duplicates(["rank", "correlation"])
    work = pd.DataFrame({"rank": events["rank"].to_numpy()[gpu], "correlation": corr[gpu],
                         "start": events["start_ns"].to_numpy()[gpu], "row": np.flatnonzero(gpu)})
    linked = work.merge(calls, on=["rank", "correlation"], how="inner")
    late = linked[linked["start"] - linked["call_end"] > MAX_LAUNCH_GAP_NS]
    if len(late):
        first = late.iloc[0]
        row = events.iloc[int(first["row"])]
        gap_s = (int(first["start"]) - int(first["call_end"])) / 1e9
        raise InputError(f"{_where(int(row['rank']), files or {})}: {row['kind']} {str(row['name'])[:80]!r} (correlation "
                         f"{int(row['correlation'])}) starts {gap_s:,.0f} s ({gap_s / 86400:,.1f} days) after its launch "
                         "call ended; the trace's host and GPU clocks disagree or a timestamp is damaged: export it again")


LONG_SPAN_NS = 24 * 3600 * 10**9
"""GPU activity of one rank spanning more than a day is noted: a profiled trace covers seconds to
minutes, so a day points at a damaged timestamp that no launch links (a kernel without a
correlation id escapes ``check_launch_gaps``)."""


def note_long_spans(events: pd.DataFrame, meta: dict, *, shown: dict[str, str] | None = None) -> None:
    """A note in meta (shown by ``show`` and kept with the bundle) for every rank whose GPU activity
    spans more than ``LONG_SPAN_NS``, naming its longest gap between GPU activities."""
    files = _rank_files(meta, shown)
    gpu = events.loc[events["kind"].isin(schema.GPU_KINDS).to_numpy(), ["rank", "start_ns", "end_ns"]]
    for rank, g in gpu.groupby("rank", sort=True):
        lo, hi = int(g["start_ns"].min()), int(g["end_ns"].max())
        if hi - lo <= LONG_SPAN_NS:
            continue
        starts = np.sort(g["start_ns"].to_numpy())
        gap = int(np.diff(starts).max()) if len(starts) > 1 else 0
        meta.setdefault("notes", []).append(
            f"import: {_where(int(rank), files)}: GPU activity spans {(hi - lo) / 86400e9:,.1f} days, with a gap of "
            f"{gap / 86400e9:,.1f} days between two activities; a timestamp may be damaged (every window that "
            "contains the gap is that long)")


def widen_instants(events: pd.DataFrame, meta: dict) -> pd.DataFrame:
    """GPU activities recorded with zero duration get 1 ns, and a note says how many.

    Older Kineto writes integer microseconds, so a kernel shorter than 1 us is written as lasting
    0 (636 of 8,772 GPU events in a 2021 ResNet-50 trace). It ran; the bundle requires GPU work
    to take time, and 1 ns is below any trace's resolution, so nothing measurable moves."""
    gpu = events["kind"].isin(schema.GPU_KINDS).to_numpy()
    zero = gpu & (events["end_ns"].to_numpy() == events["start_ns"].to_numpy())
    if not zero.any():
        return events
    end = events["end_ns"].to_numpy().copy()
    end[zero] = events["start_ns"].to_numpy()[zero] + 1
    events = events.copy(deep=False)  # the other columns shared, not copied
    events["end_ns"] = end
    meta.setdefault("notes", []).append(
        f"import: {int(zero.sum())} of {int(gpu.sum())} GPU activities were recorded with zero duration (shorter "
        "than the trace's clock resolution); each is stored as lasting 1 ns")
    return events


def check_stream_order(events: pd.DataFrame, files: dict[int, str] | None = None) -> None:
    """Reject timestamps going backwards on a GPU stream.

    Definition: a GPU stream executes work in the order it was enqueued, and correlation ids
    grow in enqueue order. So among the GPU rows of one (rank, device, stream) that have a
    correlation id, taken in correlation order (ties -- e.g. the kernels of one graph launch --
    by start), no row may *start* before the previous row started. A violation means a
    corrupted trace or a broken clock, and every duration derived from it would be wrong.
    Overlap (a row starting before the previous one ended) is allowed: programmatic dependent
    launch lets kernels of one stream overlap legitimately. Rows without a correlation id are
    not checked.
    """
    cols = ["start_ns", "correlation", "stream", "device", "rank"]
    gpu = events.loc[events["kind"].isin(schema.GPU_KINDS) & (events["correlation"] >= 0), cols]
    if len(gpu) < 2:
        return
    keys = [gpu[c].to_numpy() for c in ("start_ns", "correlation", "stream", "device", "rank")]
    order = np.lexsort(keys)
    g = {c: gpu[c].to_numpy()[order] for c in ("rank", "device", "stream", "correlation", "start_ns")}
    same = (g["rank"][1:] == g["rank"][:-1]) & (g["device"][1:] == g["device"][:-1]) & (g["stream"][1:] == g["stream"][:-1])
    back = same & (g["start_ns"][1:] < g["start_ns"][:-1])
    if back.any():
        i = int(np.flatnonzero(back)[0]) + 1
        rank = int(g["rank"][i])
        raise InputError(
            f"{_where(rank, files or {})}: timestamps go backwards on device {g['device'][i]} stream {g['stream'][i]}: "
            f"the GPU activity with correlation {g['correlation'][i]} starts at {g['start_ns'][i]} ns, before the one "
            f"enqueued earlier (correlation {g['correlation'][i - 1]}) started at {g['start_ns'][i - 1]} ns; "
            "the trace is damaged or its clock jumped")


# --- iterations (shared by importers) ------------------------------------------------------------


def compile_iteration_pattern(pattern: str) -> re.Pattern:
    """A regex whose first group captures the iteration number; InputError if it cannot."""
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise InputError(f"--iteration-pattern {pattern!r} is not a valid regular expression ({exc})") from exc
    if compiled.groups < 1:
        raise InputError(f"--iteration-pattern {pattern!r} needs one group capturing the iteration number, e.g. 'step(\\d+)'")
    return compiled


def iteration_numbers(names: pd.Series, pattern: re.Pattern) -> np.ndarray:
    """Iteration number of each name matching ``pattern`` (its first group), else -1."""
    codes, uniques = pd.factorize(pd.Series(names, dtype=object).fillna(""))
    found = np.full(len(uniques), -1, dtype=np.int64)
    for i, name in enumerate(uniques):  # once per distinct name: a trace repeats few
        m = pattern.search(str(name))
        text = m.group(1) if m else None
        if text is not None and text.strip().isdigit() and len(text.strip()) < 10:
            found[i] = int(text)
    return found[codes] if len(codes) else np.zeros(0, dtype=np.int64)


def _containing(ranges: pd.DataFrame, rank: np.ndarray, t: np.ndarray) -> np.ndarray:
    """For each point (rank, t): the iteration of the range on that rank with start <= t < end
    (the latest-starting such range, i.e. the innermost when ranges nest), else -1."""
    out = np.full(len(t), -1, dtype=np.int64)
    if len(ranges) == 0 or len(t) == 0:
        return out
    for r, grp in ranges.groupby("rank", sort=False):
        grp = grp.sort_values("start_ns", kind="stable")
        starts, ends = grp["start_ns"].to_numpy(), grp["end_ns"].to_numpy()
        its = grp["iteration"].to_numpy()
        sel = np.flatnonzero(rank == r)
        if len(sel) == 0:
            continue
        pos = np.searchsorted(starts, t[sel], side="right") - 1
        ok = pos >= 0
        ok[ok] = t[sel][ok] < ends[pos[ok]]
        out[sel[ok]] = its[pos[ok]]
    return out


def assign_iterations(events: pd.DataFrame, host_ranges: pd.DataFrame,
                      gpu_ranges: pd.DataFrame | None = None) -> np.ndarray:
    """The iteration of every row (-1 outside any).

    ``events`` needs rank, kind, start_ns, correlation; the ranges need rank, start_ns, end_ns,
    iteration. Host rows belong to the host range containing their start. A GPU row belongs
    to the iteration of the launch call that enqueued it (same rank and correlation) -- the
    host range is what the user's step loop delimits -- and, when its launch was not recorded
    (e.g. enqueued before profiling started), to the GPU-side range containing its start.
    """
    rank = events["rank"].to_numpy()
    start = events["start_ns"].to_numpy()
    gpu = events["kind"].isin(schema.GPU_KINDS).to_numpy()
    it = np.full(len(events), -1, dtype=np.int64)
    it[~gpu] = _containing(host_ranges, rank[~gpu], start[~gpu])
    launches = pd.DataFrame({"rank": rank, "correlation": events["correlation"].to_numpy(), "it": it})
    launches = launches[(events["kind"] == "launch").to_numpy() & (launches["correlation"] >= 0).to_numpy()]
    launches = launches.drop_duplicates(["rank", "correlation"])
    gpu_rows = pd.DataFrame({"rank": rank[gpu], "correlation": events["correlation"].to_numpy()[gpu]})
    linked = gpu_rows.merge(launches, on=["rank", "correlation"], how="left")["it"].fillna(-1).to_numpy(dtype=np.int64, copy=True)
    if gpu_ranges is not None and len(gpu_ranges):
        unlinked = linked < 0
        idx = np.flatnonzero(gpu)[unlinked]
        linked[unlinked] = _containing(gpu_ranges, rank[idx], start[idx])
    it[gpu] = linked
    return it
