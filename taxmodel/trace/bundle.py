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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from taxmodel.errors import BundleError, InputError
from taxmodel.trace import schema

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

    def gpu_events(self) -> pd.DataFrame:
        return self.events[self.events["kind"].isin(schema.GPU_KINDS)]


def make_meta(**values: Any) -> dict[str, Any]:
    """Complete metadata: defaults overridden by ``values``; unknown keys are kept."""
    meta = json.loads(json.dumps(META_DEFAULTS))
    meta.update(values)
    return meta


def write_bundle(path: str | os.PathLike, events: pd.DataFrame, meta: dict[str, Any],
                 raw_files: Iterable[str | os.PathLike] = (), overwrite: bool = True) -> Path:
    """Normalize, validate and atomically write a bundle directory; return its path.

    With ``overwrite=False`` an existing bundle at ``path`` is an error. Nothing is written
    when validation fails.
    """
    path = Path(path)
    if path.exists() and not overwrite:
        raise InputError(f"{path}: a bundle already exists there; choose another -o or remove it first")
    events = schema.normalize_events(events)
    schema.validate_events(events)
    meta = make_meta(**meta)
    if meta.get("schema_version") != schema.SCHEMA_VERSION:
        raise BundleError(f"meta: field 'schema_version' is {meta.get('schema_version')}, this taxmodel writes {schema.SCHEMA_VERSION}")
    if not meta.get("ranks"):
        meta["ranks"] = sorted(int(r) for r in events["rank"].unique())
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        events.to_parquet(tmp / EVENTS_FILE, index=False)
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True, default=_json_default) + "\n")
        raw_files = list(raw_files)
        if raw_files:
            (tmp / RAW_DIR).mkdir()
            for f in raw_files:
                shutil.copy2(f, tmp / RAW_DIR / Path(f).name)
        replace_dir(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def replace_dir(new: Path, target: Path) -> None:
    """Move ``new`` to ``target``; an existing ``target`` is swapped out only after ``new`` is whole."""
    if not target.exists():
        os.replace(new, target)
        return
    old = target.with_name(f".{target.name}.old.{os.getpid()}")
    os.replace(target, old)
    try:
        os.replace(new, target)
    except BaseException:
        os.replace(old, target)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


def load_bundle(path: str | os.PathLike) -> Bundle:
    """Load a bundle directory or archive; raise BundleError naming what is wrong."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such bundle (expected a directory with {EVENTS_FILE} and {META_FILE}, or an archive of one)")
    if path.is_file():
        return _load_archive(path)
    meta_path, events_path = path / META_FILE, path / EVENTS_FILE
    for p in (meta_path, events_path):
        if not p.exists():
            raise BundleError(f"{path}: not a bundle, {p.name} is missing")
    try:
        meta = json.loads(meta_path.read_text())
    except json.JSONDecodeError as exc:
        raise BundleError(f"{meta_path}: not valid JSON ({exc})") from exc
    if not isinstance(meta, dict):
        raise BundleError(f"{meta_path}: expected a JSON object")
    version = meta.get("schema_version")
    if version != schema.SCHEMA_VERSION:
        raise BundleError(f"{meta_path}: field 'schema_version' is {version!r}; this taxmodel reads version {schema.SCHEMA_VERSION}")
    try:
        events = pd.read_parquet(events_path)
    except Exception as exc:  # pyarrow raises several types for damaged files
        raise BundleError(f"{events_path}: cannot be read as parquet ({exc})") from exc
    try:
        schema.validate_events(events)
    except BundleError as exc:
        raise BundleError(f"{path}: {exc}") from exc
    return Bundle(events=events, meta=make_meta(**meta), path=path)


def _load_archive(path: Path) -> Bundle:
    if not tarfile.is_tarfile(path):
        raise BundleError(f"{path}: not a bundle directory and not a tar archive of one")
    with tempfile.TemporaryDirectory(prefix="taxmodel-bundle-") as tmp:
        with tarfile.open(path) as tar:
            tar.extractall(tmp, filter="data")
        roots = [p.parent for p in Path(tmp).rglob(META_FILE)]
        if len(roots) != 1:
            raise BundleError(f"{path}: archive holds {len(roots)} bundles; expected exactly one")
        bundle = load_bundle(roots[0])
        bundle.events = bundle.events.copy()
        bundle.path = path
        return bundle


def archive_bundle(bundle_dir: str | os.PathLike, archive: str | os.PathLike) -> Path:
    """Pack a bundle directory into one ``.tar.gz`` (atomically)."""
    bundle_dir, archive = Path(bundle_dir), Path(archive)
    load_bundle(bundle_dir)  # refuse to pack something that is not a valid bundle
    tmp = archive.with_name(f".{archive.name}.tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        tar.add(bundle_dir, arcname=bundle_dir.name)
    os.replace(tmp, archive)
    return archive


def find_bundles(root: str | os.PathLike) -> list[Path]:
    """Every bundle directory below ``root`` (``root`` itself if it is one), sorted."""
    root = Path(root)
    if (root / META_FILE).exists():
        return [root]
    return sorted(p.parent for p in root.rglob(META_FILE) if not any(part.startswith(".") for part in p.parts[len(root.parts):]))
