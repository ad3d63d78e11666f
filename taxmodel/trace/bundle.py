"""The profile bundle: the one exchange format between capture, import, model and report.

A bundle is a directory holding ``events.parquet`` (see ``schema.py``) and ``meta.json``, and
optionally ``raw/`` (the original traces). A single ``.tar.gz``/``.tgz``/``.tar`` archive of
such a directory loads the same way. Writes are atomic: everything is written into a temporary
sibling directory that is renamed into place only when complete, so a crash never leaves a
half-written bundle and never damages an existing one until the new one is whole.
"""
from __future__ import annotations

import json
import os
import shutil
import tarfile
import tempfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd

from taxmodel import fsutil
from taxmodel.fsutil import replace_dir  # the one directory swap (regress/baseline.py imports it from here)
from taxmodel import limits
from taxmodel.errors import BundleError, InputError, TaxmodelError
from taxmodel.trace import memory, schema
from taxmodel.trace.bundle_meta import EXACT_NS, check_meta

EVENTS_FILE = "events.parquet"
META_FILE = "meta.json"
RAW_DIR = "raw"

# meta.json keys every bundle has; importers and capture fill what they know, the rest stays at
# these defaults. `cost` is the workload's declared cost per rank and iteration (see
# taxmodel.workload.Cost.to_dict); the ledger reads it without importing any workload.
META_DEFAULTS: dict[str, Any] = {
    "schema_version": schema.SCHEMA_VERSION,
    "source": "unknown",  # kineto | nsys | rocprof | rocpd | capture | synthetic
    "workload": None,
    "variant": None,
    "shape": {},
    "world_size": None,
    "ranks": [],
    "hardware": {},  # name, vendor, num_sms, memory_bytes, ... as captured
    "software": {},  # versions: torch, triton, cuda/hip, nccl, iris, taxmodel
    "clock_offsets_ns": {},  # str(rank) -> ns to add to that rank's times to align them
    "capture": {},  # warmup, iterations, tracer, dtype, injected taxes...
    "repetitions": 1,
    "cost": None,
    "created": None,  # ISO 8601 date-time of capture or import
    "notes": [],
}
RAW_MANIFEST = "raw_files"
"""meta key listing the files ``write_bundle`` copied into ``raw/``: what a replacement (``--force``)
may delete there; anything else in ``raw/`` was put there by someone else."""


@dataclass
class Bundle:
    """Events plus metadata. ``path`` is where it was loaded from (None when built in memory)."""

    events: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None

    @property
    def ranks(self) -> list[int]:
        return sorted(int(r) for r in self.events["rank"].unique())

    @property
    def world_size(self) -> int:
        ws = self.meta.get("world_size")
        return int(ws) if ws else len(self.ranks)

    @property
    def label(self) -> str:
        """Short human name: workload/variant/shape, or the directory name."""
        parts = [self.meta.get("workload"), self.meta.get("variant")]
        shape = self.meta.get("shape") or {}
        if shape:
            parts.append("x".join(f"{k}{v}" for k, v in shape.items()))
        parts = [str(p) for p in parts if p]
        if parts:
            return "/".join(parts)
        return self.path.name if self.path else "bundle"

    def gpu_events(self, columns: list[str] | None = None) -> pd.DataFrame:
        """The GPU rows (kernel, memcpy, memset); of ``columns`` only when given (a copy of the
        columns asked for, not of every column)."""
        gpu = self.events["kind"].isin(schema.GPU_KINDS).to_numpy()
        return self.events[gpu] if columns is None else self.events.loc[gpu, columns]


def make_meta(**values: Any) -> dict[str, Any]:
    """Complete metadata: defaults overridden by ``values``; unknown keys are kept."""
    meta = json.loads(json.dumps(META_DEFAULTS))
    meta.update(values)
    return meta


BUNDLE_ENTRIES = frozenset({EVENTS_FILE, META_FILE, RAW_DIR})
"""What a bundle directory holds; anything else in it was put there by someone else."""


def is_bundle_dir(path: str | os.PathLike) -> bool:
    path = Path(path)
    return path.is_dir() and not path.is_symlink() and (path / META_FILE).is_file()


def prepare_output(path: str | os.PathLike, *, force: bool = False,
                   inputs: Iterable[str | os.PathLike] = ()) -> bool:
    """Check that a bundle may be written at ``path``; return True when it replaces one there.

    The rule every bundle writer follows (``import -o``, ``profile``'s one bundle per variant,
    ``Profile.save``), so that a run never deletes what the tool did not write:
      * nothing there, or an empty directory: fine;
      * a bundle there (``meta.json`` + only ``events.parquet``/``raw/`` beside it): replaced only
        with ``force`` (the caller says so), else InputError;
      * anything else (a file, a link, a device, a directory holding other things, a bundle with
        files of the user's beside it): InputError, even with ``force``;
      * ``path`` equal to, or containing, one of ``inputs`` (the traces being imported): InputError.
    """
    path = Path(path)
    fsutil.check_parent(path, "bundle")
    for p in inputs:
        p = Path(p)
        try:
            inside = p.resolve().is_relative_to(path.resolve())
        except OSError:
            inside = False
        if inside:
            raise InputError(f"{path}: holds the input {p}; write the bundle to a new directory "
                             "(a bundle output is replaced as a whole)")
    kind = fsutil.describe(path)
    if kind is None:
        return False
    if kind != "a directory":
        raise InputError(f"{path}: is {kind}, not a bundle directory; choose a new directory for -o "
                         "(taxmodel never replaces what it did not write)")
    entries = sorted(e.name for e in os.scandir(path))
    if not entries:
        return False
    if META_FILE not in entries:
        raise InputError(f"{path}: is a directory holding other things ({', '.join(entries[:3])}"
                         f"{', ...' if len(entries) > 3 else ''}), not a bundle; choose a new directory for -o "
                         "(taxmodel never replaces what it did not write)")
    foreign = [e for e in entries if e not in BUNDLE_ENTRIES]
    if foreign:
        raise InputError(f"{path}: holds a bundle and also {', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}, "
                         "which taxmodel did not write; move those away or choose another -o")
    if not force:
        raise InputError(f"{path}: a bundle already exists there; pass --force to replace it, or choose another -o")
    if RAW_DIR in entries:
        _check_raw_is_ours(path)
    return True


def _check_raw_is_ours(path: Path) -> None:
    """InputError when the bundle's ``raw/`` holds anything its writer did not put there: the
    files its meta lists (``RAW_MANIFEST``, or the imported traces' names in ``inputs``); in a
    bundle written before the manifest, any regular file. Directories, links and special files
    are never ours."""
    raw = path / RAW_DIR
    if fsutil.describe(raw) != "a directory":
        raise InputError(f"{raw}: is {fsutil.describe(raw)}, which taxmodel did not write; move it away or choose another -o")
    meta_path = path / META_FILE
    try:  # (a meta.json that is no regular file is read as none: a FIFO would block the read)
        meta = _meta_json(meta_path) if fsutil.describe(meta_path) == "a regular file" else {}
    except (OSError, ValueError, RecursionError):
        meta = {}
    meta = meta if isinstance(meta, dict) else {}
    listed = meta.get(RAW_MANIFEST)
    inputs = meta.get("inputs") if isinstance(meta.get("inputs"), list) else []
    names = {str(i.get("file")) for i in inputs if isinstance(i, dict)}
    if isinstance(listed, list):
        names |= {str(n) for n in listed}
    foreign = sorted(e.name for e in os.scandir(raw)
                     if fsutil.describe(e.path) != "a regular file" or ((listed is not None or names) and e.name not in names))
    if foreign:
        raise InputError(f"{raw}: holds {', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}, which taxmodel "
                         "did not write; move those away or choose another -o (--force replaces only what taxmodel wrote)")


def write_bundle(path: str | os.PathLike, events: pd.DataFrame, meta: dict[str, Any],
                 raw_files: Iterable[str | os.PathLike] = (), overwrite: bool = True) -> Path:
    """Normalize, validate and atomically write a bundle directory; return its path.

    ``prepare_output`` decides what may be at ``path``, checked once, right before the new bundle
    takes its place: with ``overwrite=False`` an existing bundle is an error; a path holding
    anything but a bundle is always an error. Nothing is written when validation fails. A
    caller with long work before this (``import``, ``profile``) checks the path first itself.
    """
    path = Path(path)
    raw_files = [Path(f) for f in raw_files]
    fsutil.recover_dir(path)  # a replacement killed half-way: the old bundle first goes back where it was
    events = schema.normalize_events(events)
    schema.validate_events(events)
    check_time_range(events, "events")
    meta = make_meta(**meta)
    if meta.get("schema_version") != schema.SCHEMA_VERSION:
        raise BundleError(f"meta: field 'schema_version' is {meta.get('schema_version')}, this taxmodel writes {schema.SCHEMA_VERSION}")
    if not meta.get("ranks"):
        meta["ranks"] = sorted(int(r) for r in events["rank"].unique())
    if raw_files:
        meta[RAW_MANIFEST] = sorted(f.name for f in raw_files)
    else:
        meta.pop(RAW_MANIFEST, None)
    check_meta(json.loads(json.dumps(meta, default=_json_default)), "meta")
    fsutil.make_dirs(path.parent, "bundle")
    tmp = fsutil.make_temp_dir(path)
    try:
        write_events(tmp / EVENTS_FILE, events)
        (tmp / META_FILE).write_text(meta_text(meta))
        if raw_files:
            (tmp / RAW_DIR).mkdir()
            for f in raw_files:
                shutil.copy2(f, tmp / RAW_DIR / f.name)
        prepare_output(path, force=overwrite, inputs=raw_files)
        replace_dir(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def check_time_range(events: pd.DataFrame, where: str) -> None:
    """BundleError when the events' times span 2**53 ns or more: times are int64 ns, but the
    ledger's shares are float64 sums, exact only below 2**53 ns (104 days); a bundle whose events
    span more is damaged (a wrapped or garbage timestamp)."""
    if events.empty:
        return
    lo = min(int(events["start_ns"].min()), int(events["end_ns"].min()))
    hi = max(int(events["start_ns"].max()), int(events["end_ns"].max()))
    if hi - lo >= EXACT_NS:
        first = events.iloc[int((events["end_ns"] - events["start_ns"]).abs().to_numpy().argmax())]
        raise BundleError(f"{where}: times span {hi - lo} ns (more than 2**53 ns, 104 days), e.g. {first['kind']} "
                          f"{str(first['name'])[:60]!r} from {first['start_ns']} to {first['end_ns']} ns; "
                          "a timestamp is damaged: import or capture the trace again")


def meta_text(meta: dict[str, Any]) -> str:
    """meta.json's text: every object's keys sorted (one meta, one file), but the shape's, which
    keep the workload's order: the order of the bundle's folder name (``bsp-M96xN40xK40xtp0``) and
    of every heading that names the shape."""
    def sort(obj: Any, keep: bool = False) -> Any:
        if isinstance(obj, dict):
            items = obj.items() if keep else sorted(obj.items(), key=lambda kv: str(kv[0]))
            return {k: sort(v) for k, v in items}
        if isinstance(obj, (list, tuple)):
            return [sort(v) for v in obj]
        return obj

    ordered = {k: sort(v, keep=k == "shape") for k, v in sorted(meta.items())}
    return json.dumps(ordered, indent=2, default=_json_default) + "\n"


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


META_MAX_BYTES = 256 * 2 ** 20
"""A meta.json is kilobytes (a 1,024-rank job's, with one input per rank, well under a megabyte);
one larger than this is not a bundle's (a sparse file of gigabytes would be read whole)."""


def load_bundle_meta(path: Path) -> dict[str, Any]:
    """The checked meta.json of a bundle directory (whose events.parquet must exist too), as
    stored (``make_meta`` completes it), its shape in its folder's order (``folder_order``)."""
    meta_path, events_path = path / META_FILE, path / EVENTS_FILE
    for p in (meta_path, events_path):
        if not p.is_file():
            raise BundleError(f"{path}: not a bundle, {p.name} is missing")
    try:
        meta = _meta_json(meta_path)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise BundleError(f"{meta_path}: not valid JSON ({exc})") from exc
    except OSError as exc:
        raise BundleError(f"{meta_path}: cannot be read ({exc.strerror or exc})") from exc
    if not isinstance(meta, dict):
        raise BundleError(f"{meta_path}: expected a JSON object")
    version = meta.get("schema_version")
    if version != schema.SCHEMA_VERSION:
        raise BundleError(f"{meta_path}: field 'schema_version' is {version!r}; this taxmodel reads version {schema.SCHEMA_VERSION}")
    check_meta(meta, str(meta_path))
    if "shape" in meta:
        meta["shape"] = folder_order(meta["shape"], path.name, meta.get("variant"))
    return meta


def _meta_json(meta_path: Path) -> Any:
    """The parsed meta.json at ``meta_path``: InputError when it is larger than ``META_MAX_BYTES``."""
    limits.check_size(meta_path, meta_path.stat().st_size, "meta.json", META_MAX_BYTES)
    return json.loads(meta_path.read_bytes())


def read_events_file(events_path: Path) -> pd.DataFrame:
    """``events.parquet`` as a DataFrame, each Arrow column released as soon as it is converted
    (``self_destruct``), so a large bundle is not held twice while it loads."""
    import pyarrow.parquet as pq

    table = pq.read_table(events_path)
    events = table.to_pandas(split_blocks=True, self_destruct=True)
    del table
    memory.release_freed()  # the Arrow columns converted to strings were freed as they went
    return events


def check_parquet_size(events_path: Path) -> None:
    """InputError when ``events.parquet`` says it unpacks to more than the input budget (its row
    groups' uncompressed sizes, from the footer): a small file of well-compressed columns can claim
    billions of rows, which ``read_parquet`` would try to hold."""
    import pyarrow.parquet as pq

    try:
        md = pq.ParquetFile(events_path).metadata
    except Exception as exc:  # pyarrow raises several types for damaged files
        raise BundleError(f"{events_path}: cannot be read as parquet ({exc})") from exc
    limits.check_size(events_path, sum(md.row_group(i).total_byte_size for i in range(md.num_row_groups)),
                      "the events (unpacked)")


def load_bundle(path: str | os.PathLike) -> Bundle:
    """Load a bundle directory or archive; raise BundleError naming what is wrong."""
    path = Path(path)
    if not fsutil.recover_dir(path):
        raise InputError(f"{path}: no such bundle (expected a directory with {EVENTS_FILE} and {META_FILE}, or an archive of one)")
    if path.is_file():
        return _load_archive(path)
    if not path.is_dir():
        raise InputError(f"{path}: is {fsutil.describe(path)}, not a bundle directory or archive")
    meta, events_path = load_bundle_meta(path), path / EVENTS_FILE
    check_parquet_size(events_path)
    try:
        events = schema.add_missing_columns(read_events_file(events_path))
    except Exception as exc:  # pyarrow raises several types for damaged files
        raise BundleError(f"{events_path}: cannot be read as parquet ({exc})") from exc
    try:
        schema.validate_events(events)
        check_time_range(events, str(events_path))
    except BundleError as exc:
        raise BundleError(f"{path}: {exc}") from exc
    return Bundle(events=events, meta=make_meta(**meta), path=path)


def folder_order(shape: Any, folder: str, variant: Any) -> Any:
    """``shape`` in the order of the bundle's folder name (``bsp-M96xN40xK40xtp0``, what ``taxmodel
    profile`` names it), where the name lists exactly its keys: bundles written before meta.json
    kept the shape's order hold it sorted (K, M, N), and every heading names the shape in the
    order the folder does. Anything else is returned as it is."""
    prefix = f"{variant}-"
    if not isinstance(shape, dict) or not shape or not folder.startswith(prefix):
        return shape
    by_tag = {f"{k}{v}": k for k, v in shape.items()}
    keys = [by_tag.get(t) for t in folder[len(prefix):].split("x")]
    if None in keys or sorted(map(str, keys)) != sorted(map(str, shape)):
        return shape
    return {k: shape[k] for k in keys}


def _load_archive(path: Path) -> Bundle:
    """Unpack only the archive's meta.json and events.parquet (raw traces are not needed to
    load) into a temporary directory, refusing links, devices, paths that leave it, and members
    that together unpack to more than the input budget allows for an archive of this size
    (``limits.decompressed_cap``: a 2 MB archive does not write gigabytes to the disk). Errors
    name the archive and the member, never the temporary directory."""
    try:
        tar = tarfile.open(path)
    except tarfile.ReadError as exc:
        raise BundleError(f"{path}: not a bundle directory and not a tar archive of one") from exc
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        raise BundleError(f"{path}: the archive cannot be opened ({type(exc).__name__}: {exc})") from exc
    try:
        with tempfile.TemporaryDirectory(prefix="taxmodel-bundle-") as tmp:
            with tar:
                members = [m for m in tar if Path(m.name).name in (META_FILE, EVENTS_FILE)
                           and RAW_DIR not in Path(m.name).parts[:-1]]
                for m in members:
                    if not m.isfile():
                        raise BundleError(f"{path}: archive member {m.name!r} is not a regular file; "
                                          "pack the bundle again with `tar czf`")
                limits.check_size(path, sum(m.size for m in members), "the bundle inside the archive",
                                  limits.decompressed_cap(path.stat().st_size))
                tar.extractall(tmp, members=members, filter="data")
            roots = sorted({(Path(tmp) / m.name).parent for m in members if Path(m.name).name == META_FILE})
            if len(roots) != 1:
                raise BundleError(f"{path}: archive holds {len(roots)} bundles; expected exactly one")
            try:
                bundle = load_bundle(roots[0])
            except TaxmodelError as exc:  # name the archive's member, not the temporary copy
                message = str(exc).replace(str(Path(tmp)) + os.sep, f"{path}:").replace(str(Path(tmp)), str(path))
                raise type(exc)(message) from None
            bundle.events = bundle.events.copy()
            bundle.path = path
            return bundle
    except tarfile.FilterError as exc:
        raise BundleError(f"{path}: unsafe archive ({type(exc).__name__}: {exc}); a bundle archive holds plain "
                          "files inside one folder") from exc
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        raise BundleError(f"{path}: the archive is damaged or truncated ({type(exc).__name__}: {' '.join(str(exc).split())}); "
                          "copy or pack it again") from exc


def archive_bundle(bundle_dir: str | os.PathLike, archive: str | os.PathLike) -> Path:
    """Pack a bundle directory into one ``.tar.gz`` (atomically)."""
    bundle_dir, archive = Path(bundle_dir), Path(archive)
    load_bundle(bundle_dir)  # refuse to pack something that is not a valid bundle
    with fsutil.atomic_path(archive, "archive") as tmp:
        with tarfile.open(tmp, "w:gz") as tar:
            tar.add(bundle_dir, arcname=bundle_dir.name)
    return archive


def bundle_inputs(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """What a command that reads ``paths`` (bundles, archives, directories of bundles) reads:
    every archive and bundle directory among or below them. Outputs go through
    ``fsutil.check_output_file(..., inputs=bundle_inputs(...))``: a file may be written beside
    bundles, never over an archive or inside a bundle."""
    out: list[Path] = []
    for p in map(Path, paths):
        out += find_bundles(p) if p.is_dir() else [p]
    return out


def find_bundles(root: str | os.PathLike) -> list[Path]:
    """Every bundle directory below ``root`` (``root`` itself if it is one), sorted."""
    root = Path(root)
    if (root / META_FILE).exists():
        return [root]
    return sorted(p.parent for p in root.rglob(META_FILE) if not any(part.startswith(".") for part in p.parts[len(root.parts):]))


ROW_GROUP_ROWS = 1024 * 1024
"""The most rows in one Parquet row group: pyarrow's default, which every bundle was written with."""


def write_events(path: Path, events: pd.DataFrame) -> None:
    """Write normalized events (sorted by rank) with each Parquet row group holding one rank's
    rows only, so that one rank's events can be read alone (``load_rank_events``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rank = events["rank"].to_numpy()
    cuts = np.r_[0, np.flatnonzero(rank[1:] != rank[:-1]) + 1, len(rank)] if len(rank) else np.zeros(1, np.int64)
    # one row group at a time into Arrow: the whole frame (or one rank's) is never held twice
    schema = pa.Table.from_pandas(events.iloc[:1] if len(events) else events, preserve_index=False).schema
    with pq.ParquetWriter(path, schema) as writer:
        if len(rank) == 0:
            writer.write_table(pa.Table.from_pandas(events, schema=schema, preserve_index=False))
        for a, b in zip(cuts[:-1], cuts[1:]):
            for first in range(int(a), int(b), ROW_GROUP_ROWS):
                rows = events.iloc[first:min(first + ROW_GROUP_ROWS, int(b))]
                writer.write_table(pa.Table.from_pandas(rows, schema=schema, preserve_index=False),
                                   row_group_size=ROW_GROUP_ROWS)


def _rank_row_groups(pf: Any) -> dict[int, list[tuple[int, int]]] | None:
    """Per rank, its row groups (index, first row) when every row group holds one rank; None
    for bundles written before (one row group of all ranks)."""
    col = pf.schema_arrow.get_field_index("rank")
    out: dict[int, list[tuple[int, int]]] = {}
    first = 0
    for i in range(pf.metadata.num_row_groups):
        rg = pf.metadata.row_group(i)
        st = rg.column(col).statistics
        if rg.num_rows and (st is None or not st.has_min_max or st.min != st.max):
            return None
        if rg.num_rows:
            out.setdefault(int(st.min), []).append((i, first))
        first += rg.num_rows
    return out


def bundle_rank_ids(path: str | os.PathLike) -> list[int]:
    """The ranks that have events in a bundle directory, read from the Parquet metadata (or the
    rank column of an older bundle), without loading the events."""
    import pyarrow.parquet as pq

    events_path = Path(path) / EVENTS_FILE
    try:
        pf = pq.ParquetFile(events_path)
        groups = _rank_row_groups(pf)
        if groups is not None:
            return sorted(groups)
        return sorted(int(r) for r in np.unique(pf.read(columns=["rank"]).column("rank").to_numpy()))
    except (OSError, ValueError) as exc:
        raise BundleError(f"{events_path}: cannot be read as parquet ({exc})") from exc


def load_rank_events(path: str | os.PathLike, rank: int) -> tuple[pd.DataFrame, np.ndarray]:
    """One rank's events of a bundle directory, indexed by their positions in the whole
    ``events.parquet`` (the index ``load_bundle`` gives them), and those positions. Reads only
    that rank's row groups; an older bundle (one row group) is filtered on its rank column."""
    import pyarrow.parquet as pq

    events_path = Path(path) / EVENTS_FILE
    try:
        pf = pq.ParquetFile(events_path)
        groups = _rank_row_groups(pf)
        if groups is not None:
            mine = groups.get(int(rank), [])
            table = pf.read_row_groups([i for i, _ in mine]) if mine else pf.schema_arrow.empty_table()
            sizes = [pf.metadata.row_group(i).num_rows for i, _ in mine]
            pos = np.concatenate([np.arange(f, f + n, dtype=np.int64) for (_, f), n in zip(mine, sizes)]) if mine else np.zeros(0, np.int64)
        else:
            ranks = pf.read(columns=["rank"]).column("rank").to_numpy()
            pos = np.flatnonzero(ranks == rank).astype(np.int64)
            table = pq.read_table(events_path, filters=[("rank", "==", int(rank))])
        events = schema.add_missing_columns(table.to_pandas())
    except (OSError, ValueError) as exc:
        raise BundleError(f"{events_path}: cannot be read as parquet ({exc})") from exc
    try:
        schema.validate_events(events)
    except BundleError as exc:
        raise BundleError(f"{path} (rank {rank}): {exc}") from exc
    events.index = pos
    return events, pos
