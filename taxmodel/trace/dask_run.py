"""Running taxmodel's per-rank work on a Dask cluster (``--scheduler``): connecting, and gathering
the tasks' results so that whatever the cluster does to a run ends in one line.

``ledger/on_dask.py`` (analyze) and ``trace/import_dask.py`` (import) submit one task per rank
or trace file and gather them here. A task's own error (a damaged file, data that cannot be
analyzed) reaches the user as it would in one process; anything from Dask itself (a worker that
died, a task cancelled because the cluster lost it, a scheduler that went away) becomes one
``AnalysisError`` naming the task's rank or file and the worker, from the scheduler's record of
removed workers, never a ``distributed`` exception or a traceback.

Dask is an optional dependency (``pip install taxmodel[distributed]``): it is imported only when a
``--scheduler`` is given.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import time
from typing import Any, Callable, Hashable

from taxmodel.errors import AnalysisError, InputError, TaxmodelError

INSTALL_HINT = "--scheduler needs Dask: pip install 'taxmodel[distributed]'"

DASK_MODULES = ("distributed", "dask", "tornado")
"""Exceptions whose class comes from these packages are the cluster's, not a task's."""
CLOCK_SLACK_S = 5.0
"""How far the scheduler's clock may be behind this machine's when matching its records to a run."""


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


def worker_address() -> str:
    """Inside a task: the address of the worker running it (for messages that must say where)."""
    try:
        from distributed import get_worker

        return str(get_worker().address)
    except (ImportError, ValueError):  # not in a Dask task: run in this process
        return "this process"


def from_cluster(exc: BaseException) -> bool:
    """Whether ``exc`` comes from Dask (a lost worker or task, a closed connection), not from a task's code."""
    if isinstance(exc, (concurrent.futures.CancelledError, asyncio.CancelledError)):
        return True
    return type(exc).__module__.split(".")[0] in DASK_MODULES


def gather(client: Any, futures: dict[Any, Hashable], label: Callable[[Hashable], str], phase: str) -> dict[Hashable, Any]:
    """The result of every future (``futures`` maps each to its item, e.g. a rank), by item.

    A task's TaxmodelError is raised as it is, and so is any other error of a task's own code (a
    bug, reported as one). A failure of the cluster is one AnalysisError: ``label(item)`` of the
    task that failed, the worker (``worker_failure``) and ``phase``. The tasks still pending are
    cancelled, so nothing partial is returned."""
    from dask.distributed import as_completed

    out: dict[Hashable, Any] = {}
    started = time.time()
    try:
        for fut in as_completed(list(futures)):
            try:
                out[futures[fut]] = fut.result()
            except TaxmodelError:
                raise
            except Exception as exc:
                if not from_cluster(exc):
                    raise
                raise worker_failure(client, futures, fut, exc, label, phase, started) from None
    except TaxmodelError:
        raise
    except Exception as exc:  # the client lost the scheduler while waiting
        if not from_cluster(exc):
            raise
        raise AnalysisError(f"the Dask scheduler went away during {phase} ({type(exc).__name__}: {_first_line(exc)}); "
                            "nothing was written. Check the scheduler, then run again") from None
    finally:
        _cancel(client, [f for f in futures if not f.done()])
    return out


def _cancel(client: Any, futures: list[Any]) -> None:
    if not futures:
        return
    try:
        client.cancel(futures)
    except Exception as exc:  # the scheduler is gone: nothing left to cancel there
        if not from_cluster(exc) and not isinstance(exc, OSError):
            raise


def worker_failure(client: Any, futures: dict[Any, Hashable], fut: Any, exc: BaseException,
                   label: Callable[[Hashable], str], phase: str, started: float) -> AnalysisError:
    """One line for a task the cluster failed (``fut``, with ``exc``): which item and which worker.

    Dask fails a task (``KilledWorker``) once it was on ``allowed-failures + 1`` workers that died,
    but every task queued on a dying worker counts, and a task whose input was lost is cancelled
    instead; so the scheduler's record of removed workers (``remove_workers``) decides: the task
    of this run that was on the most of them killed them; on a tie (a task queued behind it on
    each), the one submitted first, which a worker runs first, and the message names the other.
    With no such record, the worker that took ``fut`` or its input, else the last one removed
    since the phase ``started`` (a time.time())."""
    keys = {f.key: item for f, item in futures.items()}
    removals = remove_workers(client, set(keys), started - CLOCK_SLACK_S)
    counts = {k: sum(k in r["processing"] for r in removals) for k in keys}
    most = max(counts.values(), default=0)
    suspects = [k for k, n in counts.items() if most and n == most]  # in the order submitted
    key = suspects[0] if suspects else fut.key
    on = [r["worker"] for r in removals if key in r["processing"] or key in r["lost"]] or [r["worker"] for r in removals]
    last = getattr(getattr(exc, "last_worker", None), "address", None)  # KilledWorker's
    worker = last if key == fut.key and last else (on[-1] if on else None)
    if worker is None:  # no worker was removed: cancelled by someone, or the scheduler restarted
        return AnalysisError(f"{label(keys[key])}: the Dask cluster lost this task during {phase} ({type(exc).__name__}: "
                             f"{_first_line(exc)}); nothing was written. Check the scheduler's log, then run again")
    if most:
        others = [label(keys[k]) for k in suspects[1:]]
        what = f"the Dask worker {worker} died while running this task"
        if most > 1 or others:
            what += (f" ({most} worker{'s' if most > 1 else ''} died running it" +
                     (f"; {', '.join(others)} was queued on {'each of them' if most > 1 else 'it'} too" if others else "") + ")")
    else:
        what = f"the Dask worker {worker} died and took this task or its input with it"
    return AnalysisError(f"{label(keys[key])}: {what}, during {phase}; nothing was written. Check that worker's log "
                         "and memory, then run again")


def remove_workers(client: Any, keys: set, since: float) -> list[dict]:
    """The scheduler's record of workers removed while they held any of ``keys``, or after
    ``since`` (the scheduler's time.time()), oldest first: ``worker``, ``processing`` (keys
    running or queued there) and ``lost`` (results or scattered data it took with it). Empty when
    the scheduler cannot say."""

    def removals(dask_scheduler: Any = None) -> list:
        # runs on the scheduler (pickled by value: the scheduler needs no taxmodel); only these
        # records travel back, not the whole event log, which may hold what cannot be pickled
        return [(when, msg.get("worker"), list(msg.get("processing-tasks") or ()),
                 list(msg.get("lost-computed-tasks") or ()) + list(msg.get("lost-scattered-tasks") or ()))
                for when, msg in dask_scheduler.get_events("all")
                if isinstance(msg, dict) and msg.get("action") == "remove-worker"]

    try:
        records = client.run_on_scheduler(removals)
    except Exception as exc:
        if not from_cluster(exc) and not isinstance(exc, OSError):
            raise
        return []
    out = []
    for when, worker, processing, lost in records:
        if (set(processing) | set(lost)) & keys or when >= since:
            out.append({"worker": worker, "processing": set(processing), "lost": set(lost)})
    return out


def _first_line(exc: BaseException) -> str:
    return ((str(exc).splitlines() or [""])[0])[:200]
