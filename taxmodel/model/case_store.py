"""The measured cases under a directory, and their predictions, computed once and in parallel:
what lets ``taxmodel validate`` over every committed bundle take seconds instead of minutes.

A bundle's ``Case`` (its measured ledger, reduced to what the model is checked against), or the
reason it cannot be validated, depends only on the bundle's files, the calibrated hardware files
that may be matched with it and taxmodel's own code. So it is kept on disk (``cache_dir``) as JSON
under a key made of all three, and a changed bundle, hardware file or taxmodel (any of its source
or data files) computes it anew. A prediction is kept the same way, keyed by its case and the
fitted parameters. What is not kept is computed by ``jobs`` worker processes when there is enough
of it to pay for their start, else here. Worker processes are spawned (fresh interpreters), so a
script that asks for them needs Python's ``if __name__ == "__main__":`` guard; the default is one
job, in this process (``taxmodel validate`` uses every CPU).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import json
import os
import re
import sys
from concurrent.futures import Executor
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence, TypeVar

from taxmodel.errors import InputError, TaxmodelError
from taxmodel.fsutil import atomic_write
from taxmodel.model.cases import Case, load_case, predict_case
from taxmodel.hardware.specs import HardwareSpec, calibrated_files

CACHE_ENV = "TAXMODEL_CACHE_DIR"
"""Where the cache lives (default ``$XDG_CACHE_HOME/taxmodel``, else ``~/.cache/taxmodel``)."""

#: what the name of a cache directory of one taxmodel version looks like (``code_fingerprint``); the
#: pruning removes nothing else, whatever else $TAXMODEL_CACHE_DIR holds
FINGERPRINT_NAME = re.compile(r"^[0-9a-f]{16}$")

#: fewest cases to compute before worker processes pay for their start (each imports torch for the
#: kernels' plans: seconds)
MIN_PARALLEL = 24

T = TypeVar("T")


def cache_dir() -> Path:
    """The directory cached cases and predictions are kept in."""
    given = os.environ.get(CACHE_ENV)
    if given:
        return Path(given)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "taxmodel"


def default_jobs() -> int:
    """The CPUs this process may run on."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # not on Linux
        return max(os.cpu_count() or 1, 1)


def code_roots() -> list[Path]:
    """taxmodel's own folders: its package (data files included) and the kernels (``taxmodel.kernels``,
    a folder of its own in an editable install)."""
    spec = importlib.util.find_spec("taxmodel.kernels")
    roots = [Path(__file__).resolve().parents[1], *(Path(p).resolve() for p in (spec.submodule_search_locations or []))]
    return list(dict.fromkeys(roots))


def tree_digest(roots: Sequence[Path]) -> str:
    """A digest of every file below ``roots`` (names and contents; compiled bytecode left out)."""
    h = hashlib.sha256()
    for root in roots:
        for p in sorted(root.rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc":
                h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """A digest of taxmodel's own files (``code_roots``): any change to the code that computes a
    case makes every cached one stale."""
    return tree_digest(code_roots())


def files_digest(paths: Iterable[Path], root: Path | None = None) -> str:
    """A digest of the files' names (relative to ``root``; else their own names: where they are
    does not count) and contents."""
    h = hashlib.sha256()
    for p in paths:
        h.update((p.relative_to(root).as_posix() if root else p.name).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def bundle_digest(path: Path) -> str:
    """A digest of everything in a bundle (a directory, or an archive file)."""
    if path.is_file():
        return files_digest([path], path.parent)
    return files_digest(sorted(p for p in path.rglob("*") if p.is_file()), path)


def case_to_json(case: Case, path: Path | None = None) -> dict[str, Any]:
    """A Case as plain JSON (its in-sample marks left out: ``fitting.mark_in_sample`` sets them per
    run), its path left out when it is ``path`` (the cache keeps it where the bundle is)."""
    d = {f.name: getattr(case, f.name) for f in dataclasses.fields(case) if f.name not in ("path", "hardware", "fits")}
    return {**d, "path": None if path is not None and case.path == path else str(case.path),
            "hardware": case.hardware.to_dict()}


def case_from_json(d: Mapping[str, Any], path: Path | None = None) -> Case:
    where = Path(d["path"]) if d.get("path") is not None else path
    return Case(**{**d, "path": where, "hardware": HardwareSpec.from_dict(d["hardware"])})


def _reason_to_json(reason: str, path: Path) -> dict[str, str]:
    """Why a bundle is skipped, its path left out (the cache keeps it where the bundle is)."""
    prefix = f"{path}: "
    return {"skip_here": reason[len(prefix):]} if reason.startswith(prefix) else {"skip": reason}


def _entry_to_json(value: Case | str, path: Path) -> dict[str, Any]:
    return _reason_to_json(value, path) if isinstance(value, str) else {"case": case_to_json(value, path)}


def _entry_from_json(d: Mapping[str, Any], path: Path) -> Case | str:
    if "skip_here" in d:
        return f"{path}: {d['skip_here']}"
    return d["skip"] if "skip" in d else case_from_json(d["case"], path)


def _case_or_reason(path: Path, root: Path, hardware: Any = None) -> Case | str:
    """The Case of one bundle under ``root`` (measured and predicted with ``hardware`` when given),
    or why it cannot be validated (a one-rank capture of a variant that needs peers, a workload
    without a model...): such a bundle is skipped with its reason, never the end of a whole
    validation run."""
    try:
        got = load_case(path, search=(root,), hardware=hardware)
    except TaxmodelError as exc:
        return f"{path}: {exc}"
    if isinstance(got, str):
        return got
    try:
        predict_case(got, {}).details  # the model's plans: where a case the model cannot take says so
    except TaxmodelError as exc:
        return f"{got.path}: the model cannot predict it: {exc}"
    return got


def _predicted_taxes(case: Case, fitted: Mapping[str, float], borrowed_from: str | None) -> dict[str, float]:
    return predict_case(case, fitted, borrowed_from).taxes_ns()


class CaseStore:
    """Cases and predictions of one run: cached on disk unless ``cache`` is False, computed on
    ``jobs`` processes (None: one per CPU), with a progress bar on stderr when ``progress`` (and
    stderr is a terminal)."""

    #: cache directories of other taxmodel versions kept beside this one's (the newest ones)
    KEEP_VERSIONS = 3

    def __init__(self, *, jobs: int | None = 1, cache: bool = True, progress: bool = False) -> None:
        self.jobs = default_jobs() if jobs is None else max(int(jobs), 1)
        self.dir = cache_dir() / code_fingerprint() if cache else None
        self.progress = progress
        self._pool: Executor | None = None

    def __enter__(self) -> "CaseStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    # --- the two things it computes ------------------------------------------------------------

    def cases(self, root: str | os.PathLike, hardware: Any = None) -> tuple[list[Case], list[str]]:
        """One Case per bundle under ``root`` that the model can be checked against, and the
        reasons the others cannot (in the order ``find_bundles`` lists them); ``hardware``: the
        name or file every bundle is measured and predicted with (``cases.load_case``)."""
        from taxmodel.trace.bundle import find_bundles

        root = Path(root)
        if not root.exists():
            raise InputError(f"{root}: no such directory; pass the directory that holds the profile bundles")
        paths = find_bundles(root)
        # by content, not by where: the same bundles reached by another path are the same cases
        specs = files_digest(calibrated_files((root,)))
        given = "" if hardware is None else (files_digest([Path(hardware)]) if Path(str(hardware)).is_file()
                                            else f"name:{hardware}")
        keys = [_key(p.relative_to(root).as_posix(), bundle_digest(p), specs, given) for p in paths]
        got = self._computed("cases", keys, _case_or_reason, [(p, root, hardware) for p in paths], "measured ledgers",
                             to_json=lambda c, args: _entry_to_json(c, args[0]),
                             from_json=lambda d, args: _entry_from_json(d, args[0]))
        return [c for c in got if not isinstance(c, str)], [c for c in got if isinstance(c, str)]

    def predicted_taxes(self, cases: Sequence[Case],
                        fitted: Sequence[tuple[Mapping[str, float], str | None]]) -> list[dict[str, float]]:
        """``predict_case(case, values, borrowed_from).taxes_ns()`` for each case and its fitted
        parameters (their values, and the GPU they were borrowed from, None for its own)."""
        keys = [_key(json.dumps(case_to_json(c, c.path), sort_keys=True, default=str),
                     json.dumps([dict(values), lender], sort_keys=True))
                for c, (values, lender) in zip(cases, fitted)]  # a prediction does not depend on where its bundle is
        args = [(c, dict(values), lender) for c, (values, lender) in zip(cases, fitted)]
        return self._computed("predictions", keys, _predicted_taxes, args, "predictions",
                              to_json=lambda t, _: t, from_json=lambda d, _: {k: float(v) for k, v in d.items()})

    # --- cache and workers ---------------------------------------------------------------------

    def _computed(self, kind: str, keys: list[str], fn: Callable[..., T], args: list[tuple], what: str, *,
                  to_json: Callable[[T, tuple], Any], from_json: Callable[[Any, tuple], T]) -> list[T]:
        """``fn(*a)`` for each ``a`` of ``args``, from the cache where ``keys`` hold it, else computed
        (and kept); ``to_json``/``from_json`` convert a value with its arguments."""
        out: list[Any] = [self._read(kind, k, lambda d, a=a: from_json(d, a)) for k, a in zip(keys, args)]
        todo = [i for i, v in enumerate(out) if v is None]
        if not todo:
            return out
        from tqdm import tqdm

        with tqdm(total=len(todo), desc=f"validate: {what}", unit="bundle" if kind == "cases" else "case",
                  file=sys.stderr, disable=None if self.progress else True, leave=False) as bar:
            for i, value in zip(todo, self._map(fn, [args[i] for i in todo])):
                out[i] = value
                self._write(kind, keys[i], to_json(value, args[i]))
                bar.update(1)
        return out

    def _map(self, fn: Callable[..., T], args: list[tuple]) -> Iterable[T]:
        if self.jobs < 2 or len(args) < MIN_PARALLEL:
            return (fn(*a) for a in args)
        if self._pool is None:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            # spawn: a fresh interpreter per worker, never a fork of a process whose threads (torch's) hold locks
            self._pool = ProcessPoolExecutor(max_workers=self.jobs, mp_context=multiprocessing.get_context("spawn"))
        return self._pool.map(fn, *zip(*args), chunksize=max(1, len(args) // (self.jobs * 8)))

    def _path(self, kind: str, key: str) -> Path | None:
        return None if self.dir is None else self.dir / kind / f"{key}.json"

    def _read(self, kind: str, key: str, from_json: Callable[[Any], T]) -> T | None:
        path = self._path(kind, key)
        if path is None:
            return None
        try:
            return from_json(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError, TaxmodelError):  # absent or damaged: computed anew
            return None

    def _write(self, kind: str, key: str, payload: Any) -> None:
        path = self._path(kind, key)
        if path is None:
            return
        try:
            if not self.dir.exists():
                self._prune_versions()
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, json.dumps(payload, default=str), what="cache entry")
        except (OSError, TaxmodelError):  # a cache that cannot be written costs time, never the run
            self.dir = None

    def _prune_versions(self) -> None:
        """Remove the cache directories of all but the ``KEEP_VERSIONS`` newest other versions of
        taxmodel (a new one starts with every code change): only directories named as a version's
        (``FINGERPRINT_NAME``), never anything else the cache's folder holds (``$TAXMODEL_CACHE_DIR``
        may name a folder of the user's own)."""
        import shutil

        parent = self.dir.parent
        others = [d for d in parent.iterdir() if d != self.dir and FINGERPRINT_NAME.match(d.name)
                  and d.is_dir() and not d.is_symlink()] if parent.is_dir() else []
        for d in sorted(others, key=lambda d: d.stat().st_mtime, reverse=True)[self.KEEP_VERSIONS:]:
            shutil.rmtree(d, ignore_errors=True)


def _key(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def find_cases(root: str | os.PathLike, hardware: Any = None, *, jobs: int | None = 1, cache: bool = True,
               progress: bool = False) -> tuple[list[Case], list[str]]:
    """Every bundle under ``root`` as a Case, and the reasons for those that cannot be one
    (``CaseStore.cases``)."""
    with CaseStore(jobs=jobs, cache=cache, progress=progress) as store:
        return store.cases(root, hardware=hardware)
