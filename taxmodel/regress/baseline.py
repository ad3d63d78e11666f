"""Updating a baseline directory: never silently, always whole, always logged.

``plan_update`` says, per row, what would change (old vs new latency and taxes); the CLI prints
it and asks for confirmation, all of it inside ``update_lock`` (one update of a baseline
directory at a time: two at once would each start from the same old directory, and the second
rename would drop the first one's row and log line). A baseline directory that a killed update
left aside between its two renames is put back before anything is read, so the next update
replaces (and logs) the old rows instead of "adding" them. ``apply_update`` then builds the new directory as a temporary
sibling (the old baselines that stay, the candidate bundles under canonical names, the log
with one more line) and swaps it into place with one rename, so a reader sees either the old
baselines or the new ones, never a mixture. The log (``baseline-log.jsonl`` inside the
baseline directory, one JSON object per update) records when, by whom, from what, and what
changed.
"""
from __future__ import annotations

import datetime as _dt
import getpass
import json
import re
import shutil
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from taxmodel.version import __version__
from taxmodel.errors import InputError
from taxmodel.fsutil import describe, directory_lock, make_temp_dir, recover_dir
from taxmodel.ledger.categories import TAXES
from taxmodel.regress.config import LATENCY, resolve_config
from taxmodel.regress.samples import RowKey, RowSamples, describe_meta, load_side
from taxmodel.regress.stats import shortfall
from taxmodel.trace.bundle import load_bundle, replace_dir, write_bundle  # one atomic swap, shared with bundles

LOG_NAME = "baseline-log.jsonl"
SUMMARY_METRICS: tuple[str, ...] = (LATENCY, *TAXES)


@dataclass
class UpdatePlan:
    baseline_dir: Path
    candidate: str
    changes: pd.DataFrame  # row, action (add|replace|keep), then old_/new_ medians in us per SUMMARY_METRICS
    new_rows: dict[RowKey, RowSamples] = field(default_factory=dict)
    old_rows: dict[RowKey, RowSamples] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    @property
    def writes(self) -> bool:
        return bool((self.changes["action"] != "keep").any())


def update_lock(baseline_dir: str | Path, wait_s: float | None = None):
    """The lock to hold from ``plan_update`` to ``apply_update`` (``fsutil.directory_lock``)."""
    return directory_lock(baseline_dir, "baseline update", wait_s)


def plan_update(candidate: str | Path, baseline_dir: str | Path,
                ledger_fn: Callable[[Any], Any] | None = None, *, pool: bool = False) -> UpdatePlan:
    """What ``apply_update`` would do: every candidate row added or replaced, the others kept.

    InputError when a candidate row is too thin to gate (``stats.shortfall`` under the config
    that ``compare`` will read for this baseline), or has several bundles without ``pool``."""
    baseline_dir = Path(baseline_dir)
    recover_dir(baseline_dir)  # a killed update's old directory goes back first
    if baseline_dir.is_symlink():  # the swap would replace the link, not the directory it points to
        raise InputError(f"{baseline_dir}: is a symbolic link; pass the directory it points to "
                         f"({os.path.realpath(baseline_dir)}) as --baseline")
    if baseline_dir.exists() and not baseline_dir.is_dir():
        raise InputError(f"{baseline_dir}: --baseline must be a directory of bundles")
    if (baseline_dir / "meta.json").exists():
        raise InputError(f"{baseline_dir}: is a bundle itself; --baseline must be the directory that holds the "
                         "baseline bundles (e.g. profiles/h200)")
    new = load_side(candidate, "candidate", ledger_fn, pool=pool)
    cfg = resolve_config(baseline_dir)
    for row in new.values():
        short = shortfall(len(row.table), cfg.statistics)
        if short:
            raise InputError(f"candidate {row.key.label}: {short} (min_samples from {cfg.source}); a baseline this thin "
                             "could never judge a comparison: profile more iterations (--iterations) or repetitions "
                             "(--repeat) and update with that capture")
    for row in new.values():  # before the plan is shown and confirmed
        for p in row.paths:
            check_plain_tree(Path(p))
    has_old = baseline_dir.is_dir() and any(baseline_dir.rglob("meta.json"))
    old = load_side(baseline_dir, "baseline", ledger_fn, pool=True) if has_old else {}
    lines, warnings = [], []
    for key in list(new) + [k for k in old if k not in new]:
        line: dict[str, Any] = {"row": key.label, "action": "keep" if key not in new else "replace" if key in old else "add"}
        for metric in SUMMARY_METRICS:
            line[f"old_{metric}_us"] = _median_us(old.get(key), metric)
            line[f"new_{metric}_us"] = _median_us(new.get(key), metric)
        lines.append(line)
        if key in new and key in old:
            before, after = describe_meta(old[key].metas[0]), describe_meta(new[key].metas[0])
            for name in ("device", "world_size"):
                if before[name] != after[name]:
                    warnings.append(f"{key.label}: {name} changes from {before[name]} to {after[name]}")
    return UpdatePlan(baseline_dir, str(candidate), pd.DataFrame(lines), new, old, warnings)


def _median_us(row: RowSamples | None, metric: str) -> float:
    if row is None:
        return float("nan")
    return float(np.median(row.table[metric].to_numpy())) / 1e3


def plan_text(plan: UpdatePlan) -> str:
    """Per row: the action, and old -> new median latency and taxes."""
    out = [f"baseline update: {plan.candidate} -> {plan.baseline_dir}"]
    for _, r in plan.changes.iterrows():
        parts = []
        for metric in SUMMARY_METRICS:
            old, new = r[f"old_{metric}_us"], r[f"new_{metric}_us"]
            if np.isnan(old):
                parts.append(f"{metric} {new:,.1f} us")
            elif np.isnan(new):
                parts.append(f"{metric} {old:,.1f} us")
            else:
                rel = f" ({(new - old) / old * 100:+.1f}%)" if old else ""
                parts.append(f"{metric} {old:,.1f} -> {new:,.1f} us{rel}")
        out.append(f"  {r['action']:<8} {r['row']}: " + "; ".join(parts))
    out += [f"  warning: {w}" for w in plan.warnings]
    return "\n".join(out)


def bundle_dirname(key: RowKey) -> str:
    """A file-system-safe, stable directory name for a row's baseline bundle."""
    text = "__".join(p for p in (key.workload, key.variant, key.shape) if p)
    name = re.sub(r"[^A-Za-z0-9._=-]+", "_", text.replace(",", "_"))
    return re.sub(r"^[.]+", "_", name) or "bundle"  # a leading '.' would hide it (and find_bundles skips it)


def apply_update(plan: UpdatePlan, message: str = "") -> Path:
    """Write the planned baseline directory atomically and log the update; return its path."""
    target = plan.baseline_dir
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = make_temp_dir(target)
    new_dir = staging / target.name
    try:
        if target.is_dir():
            shutil.copytree(target, new_dir, symlinks=True)
        else:
            new_dir.mkdir()
        for key, row in plan.old_rows.items():  # drop the bundles the candidate replaces
            if key in plan.new_rows:
                for p in row.paths:
                    old = new_dir / Path(p).relative_to(target)
                    if old.is_dir():
                        shutil.rmtree(old)
                    else:
                        old.unlink(missing_ok=True)
        for key, row in plan.new_rows.items():
            for i, p in enumerate(row.paths):
                name = bundle_dirname(key) + (f"__{i}" if len(row.paths) > 1 else "")
                _copy_bundle(Path(p), new_dir / name)
        with open(new_dir / LOG_NAME, "a", encoding="utf-8") as log:
            log.write(json.dumps(_log_entry(plan, message), sort_keys=True) + "\n")
        replace_dir(new_dir, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def check_plain_tree(bundle: Path) -> None:
    """Refuse a candidate bundle directory that holds symbolic links or special files.

    Baselines are committed and shared: a link in ``raw/`` to a private file of the machine
    (a CI runner's credentials) copied as content would publish that file, and copied as a link
    it would point nowhere on the next machine. So links are refused, not followed or kept."""
    if not bundle.is_dir():
        return
    for root, dirs, files in os.walk(bundle):
        for name in dirs + files:
            p = Path(root) / name
            kind = describe(p)
            if kind not in ("a regular file", "a directory"):
                raise InputError(f"{p}: is {kind}; a baseline bundle may hold only regular files (copy the "
                                 "file it stands for into the bundle, or remove it) before updating the baseline")


def _copy_bundle(src: Path, dst: Path) -> None:
    if dst.exists():
        shutil.rmtree(dst)
    if src.is_dir():
        check_plain_tree(src)  # again: the tree may have changed since the plan
        shutil.copytree(src, dst, symlinks=True)
    else:  # an archive: store it unpacked so that find_bundles sees it
        bundle = load_bundle(src)
        write_bundle(dst, bundle.events, bundle.meta)


def _log_entry(plan: UpdatePlan, message: str) -> dict[str, Any]:
    changes = plan.changes[plan.changes["action"] != "keep"]
    return {
        "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "user": _user(),
        "candidate": plan.candidate,
        "commit": _git_commit(),
        "taxmodel": __version__,
        "message": message,
        "rows": [{k: (None if isinstance(v, float) and np.isnan(v) else v) for k, v in rec.items()}
                 for rec in changes.to_dict(orient="records")],
    }


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no user name in some containers
        return "unknown"


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def read_log(baseline_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(baseline_dir) / LOG_NAME
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
