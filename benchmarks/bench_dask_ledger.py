"""The ledger of a many-rank synthetic job, single process vs a Dask LocalCluster (issue 30).

    python benchmarks/bench_dask_ledger.py --ranks 256 --kernels-per-rank 2000 --workers 2
    python benchmarks/bench_dask_ledger.py --import-ranks 64 --kernels-per-rank 2000 --workers 2

Writes the bundle (``large_synthetic_bundle``: per rank and iteration one all-gather and seven
compute kernels, each with its launch call) to a temporary directory, then

* single process: ``taxmodel analyze``'s path (load_bundle + compute_ledger) in a fresh
  subprocess: wall time and its peak RSS;
* Dask: a LocalCluster of ``--workers`` worker processes (one thread each), the client in this
  process: wall time, each worker's peak RSS and the client's;
* equality of the two ledgers (parts, windows, intervals, per-kernel table, caveats), exact;
* per-rank cost of each phase, measured in this process on a few ranks (read one rank's row
  groups, phase a, phase c), the reduce (phase b) and the assembly (phase d), and a projection
  from them to ``--project-ranks`` x ``--project-events`` on N workers.

With ``--import-ranks N``, ``taxmodel import`` instead: the same synthetic job exported as N
Kineto JSON traces (``bench_ledger.export_kineto``), imported

* in one process (``importers.import_bundle``) and with ``--scheduler`` (``import_bundle_dask``)
  on the LocalCluster: the built-in Kineto importer has no per-file step, so that is one task;
* as per-file tasks: the test importer ``tests/trace/per_file_importer.py`` (Kineto's ``read`` of
  each file, then a concatenation), one process vs the cluster, standing in for a Kineto importer
  with ``parse``/``combine``;
* the CLI end to end, ``taxmodel import --scheduler local:W``, cluster start included;

and checks that each pair of bundles is equal (events.parquet bytes, meta.json but its creation time).

Prints a Markdown report (benchmarks/results/dask_ledger.md holds one run).
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _rss_mib() -> float:
    """This process's peak RSS (VmHWM: unlike ru_maxrss it does not carry over a parent's peak
    into a spawned worker)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024.0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _single_process(path: Path) -> dict:
    code = ("import json,time\n"
            "from taxmodel.trace.bundle import load_bundle\n"
            "from taxmodel.ledger.compute import compute_ledger\n"
            f"t=time.perf_counter(); b=load_bundle({str(path)!r}); t1=time.perf_counter(); led=compute_ledger(b); "
            "t2=time.perf_counter()\n"
            "led.parts.to_pickle('" + str(path.parent / "single_parts.pkl") + "')\n"
            "hwm=[l for l in open('/proc/self/status') if l.startswith('VmHWM:')][0].split()[1]\n"
            "print(json.dumps({'load_s': t1-t, 'ledger_s': t2-t1, 'rss_mib': int(hwm)/1024}))\n")
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    res = json.loads(out.strip().splitlines()[-1])
    res["wall_s"] = time.perf_counter() - t
    return res


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=256)
    p.add_argument("--kernels-per-rank", type=int, default=2000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--project-ranks", type=int, default=1024)
    p.add_argument("--project-events", type=int, default=100_000, help="events per rank in the projection")
    p.add_argument("--project-workers", type=int, nargs="+", default=[2, 64, 256])
    p.add_argument("--import-ranks", type=int, default=0, help="benchmark `taxmodel import` on this many rank files instead")
    args = p.parse_args()
    if args.import_ranks:
        return bench_import(args.import_ranks, args.kernels_per_rank, args.workers)

    import numpy as np
    import pandas as pd
    from dask.distributed import Client, LocalCluster

    from taxmodel.ledger.assemble import assemble_ledger
    from taxmodel.ledger.compute import compute_ledger
    from taxmodel.ledger.plan import plan_ledger
    from taxmodel.ledger.rank_summary import RankEvents, summarize_rank
    from taxmodel.ledger.sweep import rank_ledger
    from taxmodel.ledger.on_dask import compute_ledger_dask
    from taxmodel.trace.bundle import load_bundle, load_rank_events

    cluster = LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address=None)
    client = Client(cluster)
    base = client.run(_rss_mib)
    tmp = Path(tempfile.mkdtemp(prefix="bench_dask_ledger_"))
    t = time.perf_counter()
    path = tmp / "job"
    build = ("from taxmodel.testing.synthetic import large_synthetic_bundle\n"
             "from taxmodel.trace.bundle import write_bundle\n"
             f"b = large_synthetic_bundle(world_size={args.ranks}, kernels={args.ranks * args.kernels_per_rank})\n"
             f"write_bundle({str(path)!r}, b.events, b.meta)\nprint(len(b.events))\n")
    # built in a subprocess: this process (the Dask client) never holds the whole job
    n_events = int(subprocess.run([sys.executable, "-c", build], check=True, capture_output=True, text=True).stdout.split()[-1])
    write_s = time.perf_counter() - t
    size_mib = (path / "events.parquet").stat().st_size / 2**20
    load_before = os.getloadavg()

    single = _single_process(path)

    client_before = _rss_mib()
    try:  # reset this process's peak RSS, so that the client's peak below is the run's (Linux >= 4.0)
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass
    t = time.perf_counter()
    _, dled = compute_ledger_dask(path, client)
    dask_s = time.perf_counter() - t
    worker_rss = client.run(_rss_mib)
    client.close()
    cluster.close()
    client_rss = _rss_mib()

    # equality with the single-process ledger (recomputed here: the subprocess kept only its parts)
    sparts = pd.read_pickle(path.parent / "single_parts.pkl")
    same_parts = sparts.equals(dled.parts)
    sled = compute_ledger(load_bundle(path))
    same_all = all(getattr(sled, f).equals(getattr(dled, f)) for f in ("parts", "windows", "intervals", "kernels")) and \
        (sled.caveats, sled.clock.to_dict()) == (dled.caveats, dled.clock.to_dict())
    del sled

    # per-rank phase costs, in this process, on a few ranks (median)
    sample = list(np.linspace(0, args.ranks - 1, 8).astype(int))
    cost = {"read": [], "a": [], "c": []}
    events = {}
    for r in sample:
        t = time.perf_counter()
        ev, pos = load_rank_events(path, int(r))
        cost["read"].append(time.perf_counter() - t)
        events[r] = RankEvents(int(r), ev, pos)
        cost["a"].append(_timed(summarize_rank, events[r]))
    all_summaries = [summarize_rank(RankEvents(r, *load_rank_events(path, r))) for r in range(args.ranks)]
    meta = load_bundle(path).meta
    t = time.perf_counter()
    plan = plan_ledger(all_summaries, meta, list(range(args.ranks)))
    plan_s = time.perf_counter() - t
    for r in sample:
        cost["c"].append(_timed(rank_ledger, events[r], plan))
    all_pieces = [rank_ledger(RankEvents(r, *load_rank_events(path, r)), plan) for r in range(args.ranks)]
    assemble_s = _timed(assemble_ledger, plan, all_pieces, "x")
    per_rank = {k: float(np.median(v)) for k, v in cost.items()}
    ev_rank = n_events / args.ranks
    load_after = os.getloadavg()

    print(f"# Ledger on Dask vs one process: {args.ranks} ranks x {ev_rank:,.0f} events ({n_events:,} events, "
          f"events.parquet {size_mib:.1f} MiB, written in {write_s:.1f} s)\n")
    print(f"machine: {os.cpu_count()} cores; load average before {load_before[0]:.2f}, after {load_after[0]:.2f} "
          "(other work shares the cores)\n")
    print("| path | wall s | peak RSS per process (MiB) |\n|---|---:|---|")
    print(f"| single process (load {single['load_s']:.1f} s + ledger {single['ledger_s']:.1f} s) | {single['wall_s']:.1f} "
          f"| {single['rss_mib']:.0f} |")
    print(f"| LocalCluster, {args.workers} worker processes x 1 thread | {dask_s:.1f} | workers "
          + ", ".join(f"{v:.0f}" for v in worker_rss.values()) + f" (idle {', '.join(f'{v:.0f}' for v in base.values())}); "
          f"client {client_rss:.0f} ({client_before:.0f} before the run) |")
    print(f"\nledgers identical: parts {same_parts}, parts+windows+intervals+kernels+caveats+clock {same_all}\n")
    print("| step | measured |\n|---|---:|")
    print(f"| read one rank's row groups | {per_rank['read'] * 1e3:.1f} ms |")
    print(f"| phase a (summary) per rank | {per_rank['a'] * 1e3:.1f} ms |")
    print(f"| phase c (rank ledger) per rank | {per_rank['c'] * 1e3:.1f} ms |")
    print(f"| phase b (plan) for {args.ranks} ranks | {plan_s * 1e3:.0f} ms |")
    print(f"| phase d (assembly) for {args.ranks} ranks | {assemble_s * 1e3:.0f} ms |")
    scale = args.project_events / ev_rank
    task = (2 * per_rank["read"] + per_rank["a"] + per_rank["c"]) * scale
    grow = args.project_ranks / args.ranks
    print(f"\nprojection to {args.project_ranks} ranks x {args.project_events:,} events (per-rank work linear in events, "
          f"x{scale:.1f}; reduce and assembly linear in ranks x iterations, x{grow * scale:.1f}):\n")
    print("| workers | per-rank work s | reduce + assembly s | total s |\n|---:|---:|---:|---:|")
    for w in args.project_workers:
        work = task * args.project_ranks / w
        glob = (plan_s + assemble_s) * grow * scale
        print(f"| {w} | {work:.0f} | {glob:.0f} | {work + glob:.0f} |")
    return 0 if same_all else 1


def _same_bundle(a: Path, b: Path) -> bool:
    meta = [json.loads((p / "meta.json").read_text()) for p in (a, b)]
    for m in meta:
        m.pop("created")
    return (a / "events.parquet").read_bytes() == (b / "events.parquet").read_bytes() and meta[0] == meta[1]


def _timed(fn, *args, **kwargs) -> float:
    t = time.perf_counter()
    fn(*args, **kwargs)
    return time.perf_counter() - t


def bench_import(ranks: int, kernels_per_rank: int, workers: int) -> int:
    """``taxmodel import`` of ``ranks`` Kineto files, one process vs a LocalCluster (see the docstring)."""
    here = Path(__file__).resolve().parent
    sys.path[:0] = [str(here), str(here.parent / "tests" / "trace")]  # bench_ledger, the per-file test importer
    from dask.distributed import Client, LocalCluster

    import per_file_importer
    from bench_ledger import build, export_kineto
    from taxmodel.trace import importers
    from taxmodel.trace.bundle import write_bundle
    from taxmodel.trace.import_dask import import_bundle_dask

    tmp = Path(tempfile.mkdtemp(prefix="bench_dask_import_"))
    t = time.perf_counter()
    build(tmp, ranks * kernels_per_rank, ranks)
    export_kineto(tmp)
    files = sorted((tmp / "kineto").glob("rank*.json.gz"), key=lambda f: int(f.name[4:].split(".")[0]))
    export_s = time.perf_counter() - t
    size_mib = sum(f.stat().st_size for f in files) / 2**20
    importers.IMPORTER_MODULES.append(per_file_importer.MODULE)
    load_before = os.getloadavg()
    cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None)
    client = Client(cluster)
    for module in ("taxmodel.trace.import_dask", "taxmodel.trace.kineto", per_file_importer.MODULE):
        client.run(importlib.import_module, module)  # warm workers: module imports are not the import's cost
    rows = []
    for label, fmt in (("kineto (one task: no per-file step)", "kineto"), ("per-file tasks (test importer)", per_file_importer.FORMAT)):
        one = _timed(importers.import_bundle, files, tmp / f"one-{fmt}", fmt, keep_raw=False)
        many = _timed(import_bundle_dask, files, tmp / f"dask-{fmt}", client, fmt, keep_raw=False)
        rows.append((label, one, many, _same_bundle(tmp / f"one-{fmt}", tmp / f"dask-{fmt}")))
    client.close()
    cluster.close()
    t = time.perf_counter()  # where one process spends its time: the read, and what the client does on Dask too
    events, meta = importers.read_with(importers.importer_for("kineto"), files, None)
    read_s = time.perf_counter() - t
    events, meta, _ = importers.finish_import(events, meta, "kineto", files)
    checks_s = time.perf_counter() - t - read_s
    write_s = _timed(write_bundle, tmp / "split", events, meta)
    del events
    cli = [sys.executable, "-m", "taxmodel", "import", *map(str, files), "--no-keep-raw", "-o"]
    t = time.perf_counter()
    subprocess.run(cli + [str(tmp / "cli-one")], check=True, capture_output=True)
    cli_one = time.perf_counter() - t
    t = time.perf_counter()
    subprocess.run(cli + [str(tmp / "cli-dask"), "--scheduler", f"local:{workers}"], check=True, capture_output=True)
    cli_many = time.perf_counter() - t
    load_after = os.getloadavg()
    print(f"# taxmodel import: {ranks} Kineto files x {kernels_per_rank:,} kernels (+ launches), {size_mib:.1f} MiB "
          f"gzipped (exported in {export_s:.1f} s)\n")
    print(f"machine: {os.cpu_count()} cores; load average before {load_before[0]:.2f}, after {load_after[0]:.2f}\n")
    print(f"| importer | one process s | LocalCluster {workers} x 1 thread s | bundles equal |\n|---|---:|---:|---|")
    for label, one, many, same in rows:
        print(f"| {label} | {one:.1f} | {many:.1f} | {same} |")
    print(f"| CLI end to end (kineto), cluster start included | {cli_one:.1f} | {cli_many:.1f} | "
          f"{_same_bundle(tmp / 'cli-one', tmp / 'cli-dask')} |")
    print(f"\none process, kineto: read (parse every file) {read_s:.1f} s, checks across files {checks_s:.1f} s, "
          f"write {write_s:.1f} s; on Dask the checks and the write stay on the client")
    return 0 if all(r[3] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
