"""The ledger of a bundle computed on a Dask cluster, for jobs too large for one process.

``compute_ledger`` runs four phases (``compute.py``); here the two per-rank ones run as
Dask tasks, each reading only its rank's row groups of ``events.parquet`` on the worker
(``trace.bundle.load_rank_events``), and the small global reduce runs on the client:

    (a) summarize_rank, one task per rank  ->  (b) plan_ledger on the client
    ->  (c) rank_ledger, one task per rank  ->  (d) assemble_ledger on the client

so no process holds more than one rank's events at a time (plus the concatenated ledger parts
and per-kernel rows on the client). The result is the single-process ledger, to the
nanosecond: the same functions run on the same rows in the same order.

Dask is an optional dependency (``pip install taxmodel[distributed]``); the default install
runs ``compute_ledger`` in one process and needs none. A bundle's directory must be readable
at the same path on every worker (a shared file system, or the same layout on each node); a
worker where it is not fails the run with one line naming the rank, the worker and the path.
A worker that dies, in either phase, is one line naming the rank and the worker
(``trace/dask_run.gather``); Dask's own retries (``distributed.scheduler.allowed-failures``) apply
first, and lose nothing: each task carries all it needs.
"""
from __future__ import annotations

import errno
import os
import uuid
from pathlib import Path
from typing import Any

from taxmodel.errors import BundleError, InputError
from taxmodel.hardware.specs import HardwareSpec, resolve_hardware
from taxmodel.ledger import per_kernel, rank_summary, sweep
from taxmodel.ledger.assemble import assemble_ledger
from taxmodel.ledger.plan import LedgerPlan, plan_ledger
from taxmodel.ledger.rank_summary import RankEvents, RankSummary, ledger_ranks
from taxmodel.ledger.result import Ledger
from taxmodel.trace import schema
from taxmodel.trace.bundle import (EVENTS_FILE, Bundle, bundle_rank_ids, load_bundle_meta, load_rank_events,
                                   make_meta)
from taxmodel.trace.dask_run import INSTALL_HINT, close, connect, gather, worker_address

__all__ = ["INSTALL_HINT", "close", "compute_ledger_dask", "connect"]

NOT_HERE = (errno.ENOENT, errno.ENOTDIR, errno.EACCES, errno.EPERM)
"""Errors that mean a worker's node has no readable file at the bundle's path (not a damaged file)."""


def _rank_events(path: str, rank: int) -> RankEvents:
    """One rank's events, read on the worker running the task. A bundle that is not at ``path``
    on this worker's node is one line naming the rank, the worker and the path (the file being
    damaged is the same error as in one process)."""
    try:
        events, pos = load_rank_events(path, rank)
    except BundleError as exc:
        cause = exc.__cause__
        if isinstance(cause, OSError) and cause.errno in NOT_HERE:
            raise InputError(f"rank {rank}: {Path(path) / EVENTS_FILE} cannot be read on the Dask worker {worker_address()} "
                             f"({os.strerror(cause.errno)}); --scheduler reads the bundle at the same path on every "
                             "worker: copy it to that path on each node or put it on a shared file system, or run "
                             "without --scheduler") from None
        raise
    return RankEvents(rank, events, pos)


def _summarize(path: str, rank: int) -> RankSummary:
    return rank_summary.summarize_rank(_rank_events(path, rank))


def _rank_ledger(path: str, rank: int, plan: LedgerPlan) -> sweep.RankLedger:
    return sweep.rank_ledger(_rank_events(path, rank), plan)


def _rank_label(rank: Any) -> str:
    return f"rank {rank}"


def compute_ledger_dask(path: str | os.PathLike, client: Any, hardware: HardwareSpec | str | None = None,
                        lenient: bool = False) -> tuple[Bundle, Ledger]:
    """``compute_ledger`` of the bundle directory ``path`` with the per-rank phases on ``client``'s
    workers; ``hardware`` a spec, or a preset name or file for ``resolve_hardware``. Returns the
    bundle (meta only: its events stay on the workers) and the ledger."""
    path = Path(path)
    if not path.is_dir():
        raise InputError(f"{path}: --scheduler analyzes bundle directories (unpack an archive with `tar xf` first)")
    meta = make_meta(**load_bundle_meta(path))
    if isinstance(hardware, str):
        hardware = resolve_hardware(meta, hardware)
    present = bundle_rank_ids(path)
    ranks = ledger_ranks(meta, present)
    where = str(path.resolve())
    run = uuid.uuid4().hex[:8]
    # the plan travels inside each phase-(c) task (a few KB to a few hundred KB: it grows with
    # iterations and collectives, not events) rather than scattered once: scattered data lives
    # only on workers, and a worker dying with the last copy would cancel every task waiting on it
    summaries = gather(client, {client.submit(_summarize, where, r, key=f"taxmodel-summary-{r}-{run}", pure=False): r
                                for r in ranks}, _rank_label, "the ledger's first phase (per-rank summary)")
    plan = plan_ledger([summaries[r] for r in ranks], meta, ranks, hardware, lenient)
    pieces = gather(client, {client.submit(_rank_ledger, where, r, plan, key=f"taxmodel-rank-{r}-{run}", pure=False): r
                             for r in ranks}, _rank_label, "the ledger's second phase (per-rank ledger)")
    bundle = Bundle(events=schema.empty_events(), meta=meta, path=path)
    label = per_kernel.job_label(meta, path) or bundle.label
    return bundle, assemble_ledger(plan, [pieces[r] for r in ranks], label, hardware)
