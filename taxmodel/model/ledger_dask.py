"""The ledger of a bundle computed on a Dask cluster, for jobs too large for one process.

``compute_ledger`` runs four phases (``model/ledger.py``); here the two per-rank ones run as
Dask tasks, each reading only its rank's row groups of ``events.parquet`` on the worker
(``trace.bundle.load_rank_events``), and the small global reduce runs on the client:

    (a) summarize_rank, one task per rank  ->  (b) plan_ledger on the client
    ->  (c) rank_ledger, one task per rank  ->  (d) assemble_ledger on the client

so no process holds more than one rank's events at a time (plus the concatenated ledger parts
and per-kernel rows on the client). The result is the single-process ledger, to the
nanosecond: the same functions run on the same rows in the same order.

Dask is an optional dependency (``pip install taxmodel[distributed]``); the default install
runs ``compute_ledger`` in one process and needs none. A bundle's directory must be readable
at the same path on every worker (a shared file system, or the same layout on each node).
"""
from __future__ import annotations

import logging
import os
import uuid
from pathlib import Path
from typing import Any

from taxmodel.errors import AnalysisError, InputError, TaxmodelError
from taxmodel.model import ledger as led
from taxmodel.model.hardware import HardwareSpec, resolve_hardware
from taxmodel.model import ledger_kernels as per_kernel
from taxmodel.trace import schema
from taxmodel.trace.bundle import Bundle, bundle_rank_ids, load_bundle_meta, load_rank_events, make_meta

INSTALL_HINT = "--scheduler needs Dask: pip install 'taxmodel[distributed]'"


def connect(scheduler: str) -> Any:
    """A ``dask.distributed.Client`` for ``scheduler``: ``local`` (one worker process per core),
    ``local:N`` (N worker processes on this machine) or a scheduler address (``tcp://host:8786``).
    InputError with the install line when Dask is not installed."""
    try:
        from dask.distributed import Client, LocalCluster
    except ImportError:
        raise InputError(INSTALL_HINT) from None
    if scheduler == "local" or scheduler.startswith("local:"):
        n = scheduler.partition(":")[2]
        try:
            workers = int(n) if n else (os.cpu_count() or 1)
        except ValueError:
            raise InputError(f"--scheduler {scheduler}: expected local, local:N (N workers) or a scheduler address") from None
        if workers < 1:
            raise InputError(f"--scheduler {scheduler}: N must be at least 1")
        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None,
                               silence_logs=logging.CRITICAL)
        return Client(cluster)
    try:
        return Client(scheduler, timeout="20s")
    except OSError as exc:
        raise InputError(f"--scheduler {scheduler}: cannot reach the Dask scheduler ({exc}); start one with "
                         "`dask scheduler` and `dask worker ADDRESS` on each node, or use --scheduler local") from None


def close(client: Any) -> None:
    """Close the client, and the local cluster it started."""
    cluster = getattr(client, "cluster", None)
    client.close()
    if cluster is not None:
        cluster.close()


def _summarize(path: str, rank: int) -> led.RankSummary:
    events, pos = load_rank_events(path, rank)
    return led.summarize_rank(led.RankEvents(rank, events, pos))


def _rank_ledger(path: str, rank: int, plan: led.LedgerPlan) -> led.RankLedger:
    events, pos = load_rank_events(path, rank)
    return led.rank_ledger(led.RankEvents(rank, events, pos), plan)


def _gather(client: Any, futures: dict[Any, int], phase: str) -> dict[int, Any]:
    """Results per rank; a task's own error (a damaged rank file, data that cannot be
    analyzed) is raised as it is, a worker lost on the way as one AnalysisError naming the rank
    and the worker. The other tasks are cancelled, so nothing partial is returned."""
    from dask.distributed import as_completed

    out: dict[int, Any] = {}
    try:
        for fut in as_completed(list(futures)):
            rank = futures[fut]
            if fut.status != "finished":
                exc = fut.exception()
                if isinstance(exc, TaxmodelError):
                    raise exc
                worker = getattr(getattr(exc, "last_worker", None), "address", None)
                what = (f"the Dask worker {worker} died" if worker else
                        f"a Dask worker failed ({type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]})")
                raise AnalysisError(f"rank {rank}: {what} while computing the ledger's {phase}; nothing was written. "
                                    "Check that worker's memory and log, then run again")
            out[rank] = fut.result()
    finally:
        client.cancel([f for f in futures if not f.done()])
    return out


def compute_ledger_dask(path: str | os.PathLike, client: Any, hardware: HardwareSpec | str | None = None,
                        lenient: bool = False) -> tuple[Bundle, led.Ledger]:
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
    ranks = led.ledger_ranks(meta, present)
    where = str(path.resolve())
    run = uuid.uuid4().hex[:8]
    summaries = _gather(client, {client.submit(_summarize, where, r, key=f"taxmodel-summary-{r}-{run}", pure=False): r
                                 for r in ranks}, "first phase (per-rank summary)")
    plan = led.plan_ledger([summaries[r] for r in ranks], meta, ranks, hardware, lenient)
    [plan_f] = client.scatter([plan], broadcast=True, hash=False)
    pieces = _gather(client, {client.submit(_rank_ledger, where, r, plan_f, key=f"taxmodel-rank-{r}-{run}", pure=False): r
                              for r in ranks}, "second phase (per-rank ledger)")
    bundle = Bundle(events=schema.empty_events(), meta=meta, path=path)
    label = per_kernel.job_label(meta, path) or bundle.label
    return bundle, led.assemble_ledger(plan, [pieces[r] for r in ranks], label, hardware)
