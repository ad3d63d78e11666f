"""The `taxmodel` command line: argument handling and printing only; the work lives in the library.

Every command turns a TaxmodelError into one line on stderr and its exit code (2 for bad
input), so scripts and CI can tell bad input from a regression (exit 1).
"""
from __future__ import annotations

import sys

import click

from taxmodel import safetext
from taxmodel.version import __version__
from taxmodel.errors import TaxmodelError
from taxmodel.trace.capture_meta import AUTO_ALIGN, DEFAULT_GATE_HOLD_US, START_ALIGNMENTS


def _echo(message: object = "", **kwargs) -> None:
    """``click.echo`` of text that may hold names from traces: control characters and escape
    sequences are shown, never obeyed by the terminal (``safetext.terminal``)."""
    click.echo(safetext.terminal("" if message is None else message), **kwargs)


class _BundlePath(click.Path):
    """An existing bundle, archive or directory of bundles. A bundle that a killed replacement
    left aside between its two renames is put back first (``fsutil.recover_dir``), so the path
    the user named exists again before it is checked."""

    def convert(self, value, param, ctx):
        from taxmodel.fsutil import recover_dir

        try:
            recover_dir(value)
        except (OSError, ValueError):  # a name no file can have: the check below says so
            pass
        return super().convert(value, param, ctx)


_BUNDLES = _BundlePath(exists=True)
_BUNDLES_DIR = _BundlePath(exists=True, file_okay=False)

INTERNAL_ERROR_EXIT = 70
"""Exit code of an error taxmodel did not foresee (a bug): neither 1 (regression) nor 2 (bad input)."""


class _Group(click.Group):
    """A click group that reports TaxmodelError as one clear line instead of a traceback.

    Last-resort net: an OSError (a full disk, a permission) is the user's environment: one line
    naming the file, exit 2. Any other unexpected exception is a bug: one line with its type,
    exit 70; ``TAXMODEL_TRACEBACK=1`` shows the traceback for the report. (An EOFError would
    otherwise reach click, which prints "Aborted!".)"""

    def make_context(self, info_name, args, parent=None, **extra):  # the group's own options
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.UsageError as exc:
            _usage_error(exc)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:  # a command's arguments: one line, like every other error
            _usage_error(exc)
        except TaxmodelError as exc:
            _echo("taxmodel: error: " + " ".join(str(exc).split()), err=True)  # one line, always
            sys.exit(exc.exit_code)
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM/SIGHUP (errors.Interrupted): 128 + signal, not 1
            _echo(f"taxmodel: {exc or 'interrupted'}", err=True)
            sys.exit(getattr(exc, "exit_code", 130))
        except (click.exceptions.ClickException, click.exceptions.Abort, click.exceptions.Exit):
            raise
        except Exception as exc:
            import os

            if os.environ.get("TAXMODEL_TRACEBACK"):
                raise
            detail = " ".join(str(exc).split())[:300]
            if isinstance(exc, BrokenPipeError):  # the reader went away (`| head`): stop quietly
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                sys.exit(141)
            if isinstance(exc, OSError):
                where = f"{exc.filename}: " if exc.filename else ""
                _echo(f"taxmodel: error: {where}{exc.strerror or detail}", err=True)
                sys.exit(2)
            _echo(f"taxmodel: internal error: {type(exc).__name__}: {detail} (a bug in taxmodel; "
                       "run again with TAXMODEL_TRACEBACK=1 and report the traceback)", err=True)
            sys.exit(INTERNAL_ERROR_EXIT)


def _usage_error(exc: click.UsageError) -> None:
    """A wrong option or argument as one line naming the command to ask for help, exit 2 (a
    bare group still prints its help, as click does)."""
    if type(exc).__name__ == "NoArgsIsHelpError":
        raise exc
    where = exc.ctx.command_path if exc.ctx is not None else "taxmodel"
    _echo(f"taxmodel: error: {' '.join(exc.format_message().split())} (see '{where} --help')", err=True)
    sys.exit(exc.exit_code)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="taxmodel")
def cli() -> None:
    """Where the time of multi-GPU kernels goes: the Three Taxes, measured and predicted.

    \b
    Typical session:
      taxmodel profile ag_gemm --world-size 4 -o runs/   # run + trace every variant
      taxmodel analyze runs/ag_gemm/*                     # split time into the taxes
      taxmodel report runs/ag_gemm/* -o report.html       # figures and headline
    Bring your own traces:
      taxmodel import rank*.json.gz -o my_bundle          # torch.profiler / nsys / rocprof
      taxmodel analyze my_bundle
    """


# --- trace: import, show -------------------------------------------------------------------

@cli.command("import")
@click.argument("traces", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(file_okay=False),
              help="Bundle directory to write (atomically). It must be new or empty, or hold a bundle and --force be "
                   "given; anything else there (your files, the input traces) is refused, never deleted.")
@click.option("--force", is_flag=True, help="Replace the bundle already at -o (the output says so).")
@click.option("--format", "fmt", default="auto", show_default=True, metavar="FORMAT",
              help="auto (decide by content), or a format name such as kineto; a wrong name lists the known ones.")
@click.option("--iteration-pattern", default=None, metavar="REGEX",
              help="Marker names that delimit iterations, one group capturing the number (default for kineto: ProfilerStep#N).")
@click.option("--keep-raw/--no-keep-raw", default=True, show_default=True, help="Copy the original traces into the bundle's raw/.")
@click.option("--allow-missing-ranks", is_flag=True, help="Accept traces of only some ranks of the run (e.g. only rank 0 was profiled).")
@click.option("--world-size", type=click.IntRange(min=1), default=None,
              help="Ranks the run had, where the traces do not record it (default: inferred from the highest rank).")
@click.option("--counters", "counters", default=None, type=click.Path(dir_okay=False, exists=True),
              help="Per-kernel hardware counters of the same run, exported by `ncu --csv --metrics "
                   "dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,gpu__time_duration.sum` "
                   "(or a .ncu-rep where Nsight Compute's Python module is importable): DRAM bytes per kernel, "
                   "matched by order and name; a file from another run is refused.")
@click.option("--shapes-from", "shapes_from", multiple=True, type=click.Path(exists=True), metavar="EAGER_TRACE",
              help="An eager capture of the same program (trace files, one per rank, repeat the option; or a bundle): "
                   "kernels of CUDA-graph replays take their shapes from its steps, matched by name, launch dims and "
                   "place in the step (docs/ledger.md 5a). The trace's own eager steps are used without it.")
@click.option("--scheduler", default=None, metavar="ADDRESS|local[:N]",
              help="Read the traces on Dask (pip install 'taxmodel[distributed]'): a scheduler's address, or local[:N] "
                   "worker processes on this machine. The bundle is the same. A file no worker can read is a missing "
                   "rank; today's importers read all files in one task, on a worker that sees them all (README, "
                   "'On a cluster'). --keep-raw needs the traces here too.")
def import_cmd(traces, counters, output, force, fmt, iteration_pattern, keep_raw, allow_missing_ranks, world_size,
               shapes_from, scheduler) -> None:
    """Import torch.profiler (and other) traces, one file per rank, into a profile bundle."""
    from taxmodel.trace import importers, replay_shapes, summary
    from taxmodel.trace.bundle import prepare_output

    replaces = prepare_output(output, force=force,
                              inputs=[*traces, *shapes_from, *([counters] if counters else [])])  # refuse early
    options = dict(keep_raw=keep_raw, counters=counters, allow_missing_ranks=allow_missing_ranks, force=force,
                   world_size=world_size, shapes_from=shapes_from)
    if scheduler:  # the files may be on the workers' nodes only: the format is detected there
        from taxmodel.trace.dask_run import close, connect
        from taxmodel.trace.import_dask import import_bundle_dask

        client = connect(scheduler)
        try:
            bundle, found = import_bundle_dask(traces, output, client, fmt, iteration_pattern, **options)
        finally:
            close(client)
        _echo(f"format: {found} ({'detected on the Dask workers' if fmt == 'auto' else 'as given'})")
        fmt = found
    else:
        if fmt == "auto":  # every file is checked again inside the import; this is for the message
            _echo(f"format: {importers.detect_format(traces[0])} (detected from the content of {traces[0]})")
        else:
            _echo(f"format: {fmt} (as given)")
        bundle, fmt = importers.import_bundle(traces, output, fmt, iteration_pattern, **options)
    _echo(f"wrote {output}" + (" (replaced the bundle that was there: --force)" if replaces else ""))
    _echo(summary.describe(bundle, fmt))
    if (line := replay_shapes.describe(bundle.meta)) is not None:
        _echo(line)


@cli.command("show")
@click.argument("bundles", nargs=-1, required=True, type=_BUNDLES)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--top", default=10, show_default=True, type=click.IntRange(min=1),
              help="How many of the longest-running kernels to list.")
def show_cmd(bundles, as_json, top) -> None:
    """Summarize BUNDLES (directories of bundles are searched, as analyze takes them): ranks,
    iterations, kernels by role and rank, top kernels, metadata."""
    import json

    from taxmodel.report.build import expand_bundle_paths

    found = expand_bundle_paths(bundles)
    if len(found) > 1 and as_json:
        from taxmodel.trace import summary
        from taxmodel.trace.importers import open_bundle

        _echo(json.dumps([summary.to_json(open_bundle(p), top) for p in found], indent=2, default=str))
        return
    for i, path in enumerate(found):
        if i:
            _echo("")
        _show_one(path, as_json, top)


def _show_one(bundle, as_json: bool, top: int) -> None:
    import json

    from taxmodel.trace import summary
    from taxmodel.trace.importers import open_bundle

    b = open_bundle(bundle)
    if as_json:
        _echo(json.dumps(summary.to_json(b, top), indent=2, default=str))
        return
    o = summary.overview(b)
    iters = o["iterations"]
    _echo(f"{b.label}: {len(o['ranks'])} of {o['world_size']} ranks, {o['repetitions']} repetition(s), "
               f"{len(iters)} iteration(s){f' ({iters[0]}..{iters[-1]})' if iters else ''}, "
               f"{o['kernels']} kernels, {o['collectives']} collectives\n")
    _echo(summary.meta_table(b).to_string(index=False, header=False) + "\n")
    roles = summary.role_table(b)
    _echo("GPU time by rank and role (us):")
    _echo(_us_columns(roles, ["total_ns", "mean_ns"]).to_string(index=False) + "\n")
    _echo(f"Top {top} GPU activities by total time over all ranks (us):")
    _echo(_us_columns(summary.top_kernels(b, top), ["total_ns", "mean_ns"])
               .to_string(index=False, formatters={"pct": "{:.1f}".format, "name": lambda s: s[:70]}))


def _note(line: str) -> None:
    """One line on stderr (what --lenient skipped), so stdout stays the command's output."""
    _echo(f"taxmodel: {line}", err=True)


def _us_columns(df, columns):
    """Times in ns shown as us with 3 decimals (exact: the ns digits), renamed *_us."""
    out = df.copy()
    for c in columns:
        out[c] = out[c].map(lambda ns: f"{ns / 1000:.3f}")
    return out.rename(columns={c: c.replace("_ns", "_us") for c in columns})

# --- runtime: profile, workloads -----------------------------------------------------------

class _CommandAfterDashes(click.Command):
    """``profile``: what follows ``--`` is the command to profile, kept whole (its own options
    included) in ``ctx.meta["command"]``; before it, profile's own options."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            i = args.index("--")
            ctx.meta["command"] = args[i + 1:]
            args = args[:i]
        return super().parse_args(ctx, args)

    def collect_usage_pieces(self, ctx: click.Context) -> list[str]:
        return ["[OPTIONS] WORKLOAD  |  taxmodel profile [OPTIONS] -- COMMAND [ARGS]..."]


_COMMAND_ONLY = ("steps", "skip", "step_fn", "run_to_end")
_SHARED = ("out", "force", "counters", "timeout_s")


@cli.command("profile", cls=_CommandAfterDashes)
@click.argument("workload", required=False)
@click.option("--variants", default=None, help="Comma-separated variants (default: every one available here; others are skipped with the reason).")
@click.option("--preset", default=None, help="Shape preset, or several comma-separated (run in one start-up) (default: the workload's CPU preset on CPU, its default on GPUs).")
@click.option("--shape", "shape", multiple=True, metavar="K=V", help="Override one shape value, e.g. --shape M=4096 (repeatable).")
@click.option("-n", "--world-size", type=int, default=None, help="Ranks to start on this host (default: every GPU; 2 on CPU).")
@click.option("--iterations", type=int, default=5, show_default=True, help="Profiled iterations per repetition.")
@click.option("--warmup", type=int, default=2, show_default=True, help="Untimed iterations first (compiles every kernel). Each repetition also runs one traced step before its first profiled one, and the first variant of a run one whole traced repetition that is thrown away (meta capture.traced_warmup, capture.discarded_repetitions): both absorb one-time costs of the tracer and of the first traced collective.")
@click.option("--repeat", type=int, default=1, show_default=True, help="Independent repetitions (separate timed loops).")
@click.option("--inject", multiple=True, metavar="TAX", help="Inject a known tax: sleep_rank=R:US, extra_launches=K, extra_copy=1; or a fault that ends the run "
                   "(to test crash and hang handling): kill_rank=R@PHASE (SIGKILL), hang_rank=R@PHASE (SIGSTOP), PHASE "
                   "one of setup, compile, check, graph, capture, gather, write (repeatable).")
@click.option("--tracer", default="torch", show_default=True, help="Tracer to record with.")
@click.option("--device", type=click.Choice(["auto", "cuda", "cpu"]), default="auto", show_default=True,
              help="cpu runs kernels in Triton's interpreter with gloo (emulated GPUs).")
@click.option("--timeout", "timeout_s", type=float, default=600.0, show_default=True,
              help="Seconds for the whole run; a hung rank is then named and the run ended. With -- COMMAND: none "
                   "unless given.")
@click.option("--spin-timeout", "spin_timeout_s", type=float, default=60.0, show_default=True,
              help="Seconds an in-kernel wait on a peer's flag may last before the kernel gives up and the run "
                   "names the rank, peer and flag (raise it if a peer is still compiling its kernels).")
@click.option("--workload-module", "workload_modules", multiple=True, metavar="MODULE",
              help="Import a module (name or .py file) that registers your own workload (repeatable).")
@click.option("--heap-size", "heap_bytes", type=int, default=None, help="Bytes of symmetric heap per rank (default 4 GiB on GPUs, 256 MiB on CPU).")
@click.option("-o", "--out", default="runs", show_default=True, type=click.Path(file_okay=False),
              help="Bundles go to OUT/WORKLOAD/VARIANT-SHAPE/. With -- COMMAND, OUT is the bundle (default: "
                   "runs/<the script's name>).")
@click.option("--force", is_flag=True, default=False,
              help="Replace the bundles of an earlier run at the same paths (without it such a run is refused before "
                   "any rank starts). A path holding anything but a bundle is refused even with --force.")
@click.option("--instrument", is_flag=True, default=False,
              help="Fused kernels write in-kernel trace records (flag waits, phases per CTA): see docs/records.md.")
@click.option("--graph", is_flag=True, default=False,
              help="Each traced iteration replays one captured CUDA graph (as decode loops run), so the trace is not "
                   "host-bound by the profiler. Variants that are not graph-safe, a failed capture, and CPU runs "
                   "(no CUDA graphs) use eager launches instead, with a message; each bundle says which in "
                   "meta capture.graph (true/false) and capture.graph_note. ag_gemm's pull/push are graph-safe with the "
                   "Triton copy-kernel transport: set TAXMODEL_AG_GEMM_TRANSPORT=sm (the default, copy engines, is not).")
@click.option("--graph-strict", is_flag=True, default=False,
              help="Like --graph, but never fall back: exit 2 before starting if a chosen variant is not graph-safe "
                   "or this is a CPU run, and fail if a capture fails.")
@click.option("--align", type=click.Choice((AUTO_ALIGN,) + START_ALIGNMENTS), default=AUTO_ALIGN, show_default=True,
              help="How traced steps start: host = after a host barrier (ranks start as skewed as their hosts leave "
                   "it: tens of us under the profiler); device = also behind a device gate, a one-program kernel that "
                   "releases every rank's GPU together (within a flag's latency), so the trace shows the workload's "
                   "own skew, not the harness's; back-to-back = one gate per repetition, then its steps run back to "
                   "back on every GPU with no barrier between them, as a decode loop or an un-profiled benchmark "
                   "runs them. auto: back-to-back on GPUs, host on CPU. Each bundle records it in meta capture.align.")
@click.option("--gate-hold-us", type=float, default=DEFAULT_GATE_HOLD_US, show_default=True,
              help="With --align device: how long the gate still holds its GPU after every rank arrived, so each "
                   "host has enqueued the step (a graph launch; eager launches for that long) before its GPU starts "
                   "(back-to-back: that long for every step of a repetition). "
                   "Under the profiler a rank's host needs 60-100 us from the gate to its graph launch (2x H200), so "
                   "the default leaves room; the hold is outside every traced step.")
@click.option("--allow-gpu-sizes", is_flag=True, default=False,
              help="On CPU, run a shape sized for GPUs (more than 100x the work of the workload's CPU preset) all the "
                   "same: days in Triton's interpreter; without it such a run is refused at once, with its cost.")
@click.option("--counters", is_flag=True, default=False,
              help="After the timed pass, run every variant once more under Nsight Compute (ncu) and attach each "
                   "kernel's DRAM bytes read/written and L2 hit rate to the bundles (one GPU: -n 1). The timed "
                   "pass never runs under ncu; the counters pass takes about a minute per bundle. With -- COMMAND: "
                   "the command runs once more under ncu, counting the first traced step's kernels (a one-GPU job).")
@click.option("--steps", type=click.IntRange(min=1), default=5, show_default=True,
              help="With -- COMMAND: steps to trace in every rank.")
@click.option("--skip", type=click.IntRange(min=1), default=5, show_default=True,
              help="With -- COMMAND: steps to run untraced first (the last of them traced and discarded, as the "
                   "tracer's own warm-up).")
@click.option("--step-fn", default=None, metavar="MODULE:QUALNAME",
              help="With -- COMMAND: a step ends with each call of this function instead of the optimizer's step() "
                   "(inference loops, custom trainers), e.g. my_trainer:Trainer.train_step, or __main__:decode_step "
                   "for a function of the script itself.")
@click.option("--run-to-end", is_flag=True, default=False,
              help="With -- COMMAND: let it finish after the traced steps (default: it is stopped once every rank's "
                   "trace is written, as nsys ends a capture range).")
@click.pass_context
def profile_cmd(ctx, workload, counters, variants, preset, shape, world_size, iterations, warmup, repeat, inject, tracer,
                device, timeout_s, spin_timeout_s, workload_modules, heap_bytes, out, force, instrument, graph,
                graph_strict, align, gate_hold_us, allow_gpu_sizes, steps, skip, step_fn, run_to_end) -> None:
    """Run WORKLOAD on N local ranks and capture one bundle per variant; or run your own job
    (-- COMMAND) unchanged and capture its steps in every rank.

    \b
    Your own job (torchrun, or any launcher whose ranks are Python processes):
      taxmodel profile -o my_job -- torchrun --nproc-per-node 8 train.py --lr 3e-4
      taxmodel analyze my_job
    Across nodes, start the same worker with torchrun on every node:
      torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
          -m taxmodel.runtime.worker --workload ag_gemm --preset small -o runs/
    """
    import time

    given = {p.name for p in ctx.command.params if ctx.get_parameter_source(p.name).name in ("COMMANDLINE", "ENVIRONMENT")}
    if "command" in ctx.meta:
        wrong = sorted(given - set(_COMMAND_ONLY) - set(_SHARED) - {"workload"})
        if workload is not None or wrong:
            what = f"WORKLOAD ({workload})" if workload is not None else "--" + wrong[0].replace("_", "-")
            raise click.UsageError(f"{what} applies to a built-in workload, not to a command after --")
        _profile_command(ctx.meta["command"], out if "out" in given else None, steps, skip, step_fn, force, counters,
                         timeout_s if "timeout_s" in given else None, run_to_end)
        return
    if workload is None:
        raise click.UsageError("Missing argument 'WORKLOAD' (or -- COMMAND to profile your own job)")
    wrong = sorted(given & set(_COMMAND_ONLY))
    if wrong:
        raise click.UsageError(f"--{wrong[0].replace('_', '-')} applies to a command after -- (a workload's steps are "
                               "--iterations and --warmup)")

    started = time.time()  # --timeout counts from here: importing torch and the workloads takes seconds
    from taxmodel.runtime.profile import ProfileRequest, profile
    from taxmodel.runtime.worker import parse_shape

    req = ProfileRequest(workload=workload, variants=[v for v in variants.split(",") if v] if variants else None,
                         preset=preset, shape=parse_shape(list(shape)), world_size=world_size, iterations=iterations,
                         warmup=warmup, repeat=repeat, inject=list(inject), tracer=tracer, out=out, force=force, device=device,
                         timeout_s=timeout_s, spin_timeout_s=spin_timeout_s, heap_bytes=heap_bytes, workload_modules=list(workload_modules),
                         instrument=instrument, graph="require" if graph_strict else "auto" if graph else "off",
                         align=align, gate_hold_us=gate_hold_us, allow_gpu_sizes=allow_gpu_sizes)
    if counters:  # refuse before the timed pass (a CPU run, several ranks, no ncu)
        from taxmodel.runtime.counters import check_profile_request

        check_profile_request(req)
    outcome = profile(req, started_unix=started, say=_note)
    for v, why in outcome.skipped.items():
        _echo(f"skipped {workload}/{v}: {why}")
    for line in outcome.graph_fallbacks:
        _echo(f"--graph: {line}")
    for path in outcome.bundles:
        _echo(f"wrote {path}" + (" (replaced the earlier bundle there: --force)" if path in outcome.replaced else ""))
    _echo(f"{len(outcome.bundles)} bundle(s), {outcome.world_size} rank(s) on {outcome.device}, {outcome.wall_s:.1f} s"
          + (f"; {outcome.ranks_output}" if outcome.ranks_output else ""), err=True)
    if counters and outcome.bundles:
        from taxmodel.runtime.counters import counters_pass

        done = counters_pass(req, outcome.bundles, timeout_s=timeout_s)
        _echo(f"--counters: DRAM counters of {done.kernels} kernel(s) attached to {len(done.bundles)} bundle(s) "
                   f"in {done.wall_s:.1f} s (ncu, one step per variant)", err=True)


def _profile_command(command, out, steps, skip, step_fn, force, counters, timeout_s, run_to_end) -> None:
    """``profile -- COMMAND``: run it under the step hook, then the bundle's summary and ledger."""
    from taxmodel.report.build import load_cases
    from taxmodel.report.terminal import render_analysis
    from taxmodel.runtime.command import CommandRequest, profile_command
    from taxmodel.trace import summary

    req = CommandRequest(command=list(command), out=out, skip=skip, steps=steps, step_fn=step_fn, force=force,
                         counters=counters, timeout_s=timeout_s, run_to_end=run_to_end)
    outcome = profile_command(req, say=_note)
    for line in outcome.lines:
        _note(line)
    if outcome.stopped:
        _note("stopped the command once every rank's trace was written (--run-to-end lets it finish)")
    if outcome.bundle is not None:
        _echo(f"wrote {outcome.out}" + (" (replaced the bundle that was there: --force)" if outcome.replaced else ""))
        if outcome.counters:
            _echo(f"--counters: {outcome.counters}")
        _echo(summary.describe(outcome.bundle, outcome.fmt) + "\n")
        try:
            _echo(render_analysis([led for _, led in load_cases([str(outcome.out)])]), nl=False)
        except TaxmodelError as exc:
            _note(f"the ledger of {outcome.out} cannot be computed: {' '.join(str(exc).split())}")
            outcome.exit_code = outcome.exit_code or exc.exit_code
    if outcome.counters_error is not None:
        raise outcome.counters_error
    sys.exit(outcome.exit_code)


@cli.command("workloads")
@click.option("--workload-module", "workload_modules", multiple=True, metavar="MODULE", help="Also list the workloads this module registers.")
def workloads_cmd(workload_modules) -> None:
    """List the workloads, their shape presets and variants."""
    from taxmodel.runtime.profile import describe_workloads

    _echo(describe_workloads(list(workload_modules)))


# --- model: analyze, calibrate, predict, validate ------------------------------------------

@cli.command("hardware")
@click.argument("key", required=False)
def hardware_cmd(key: str | None) -> None:
    """List the hardware specs --hardware takes (one key per part and source), or show one in full."""
    from taxmodel.hardware.specs import describe

    _echo(describe(key))


@cli.command("analyze")
@click.argument("bundles", nargs=-1, required=True, type=_BUNDLES)
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable JSON document instead of tables.")
@click.option("--lenient", is_flag=True, help="Skip (and list) iterations that cannot be analyzed instead of failing.")
@click.option("--hardware", default=None, metavar="NAME|FILE",
              help="Hardware preset (H100 SXM, H200 SXM, MI300X, B200) or a JSON file from `taxmodel calibrate`.")
@click.option("--per-rank", is_flag=True, help="Also show the ledger of every rank.")
@click.option("--wide", is_flag=True, help="Show every column of the tables, however wide (else they fit 120 characters).")
@click.option("--scheduler", default=None, metavar="ADDRESS|local[:N]",
              help="Run the per-rank work on Dask (pip install 'taxmodel[distributed]'): a scheduler's address, or "
                   "local[:N] worker processes on this machine. The ledger is the same.")
def analyze_cmd(bundles: tuple[str, ...], as_json: bool, lenient: bool, hardware: str | None, per_rank: bool,
                wide: bool, scheduler: str | None) -> None:
    """Split each bundle's measured time into useful work and the three taxes (docs/ledger.md)."""
    import json

    from taxmodel.report.build import load_cases
    from taxmodel.report.terminal import analysis_document, render_analysis

    ledgers = [led for _, led in load_cases(bundles, hardware=hardware, lenient=lenient, on_skip=_note, scheduler=scheduler)]
    if as_json:
        _echo(json.dumps(analysis_document(ledgers), indent=2, default=float))
    else:
        _echo(render_analysis(ledgers, per_rank=per_rank, wide=wide), nl=False)


@cli.command("advise")
@click.argument("bundles", nargs=-1, required=True, type=_BUNDLES)
@click.option("--top", type=click.IntRange(min=1), default=10, show_default=True, help="How many candidates to list (largest bound first).")
@click.option("--json", "as_json", is_flag=True, help="Print the candidates as JSON.")
@click.option("--wide", is_flag=True, help="Every column (what to do, the ops, each tax, the model, what it could not use), "
                                           "however wide; else the table fits 120 characters.")
@click.option("--hardware", default=None, metavar="NAME|FILE",
              help="Hardware preset or a JSON file from `taxmodel calibrate` (default: from the bundle).")
@click.option("--lenient", is_flag=True, help="Skip (and list) iterations that cannot be analyzed instead of failing.")
def advise_cmd(bundles, top, as_json, wide, hardware, lenient) -> None:
    """Which kernels to fuse and what it would buy: fusion candidates ranked by the taxes on their boundaries
    (docs/advise.md), for each of BUNDLES (directories of bundles are searched)."""
    import json

    from taxmodel.api import Profile
    from taxmodel.report.advice import advice_document, render_advice
    from taxmodel.report.build import expand_bundle_paths

    docs, texts = [], []
    for path in expand_bundle_paths(bundles):
        p = Profile.from_path(path, hardware=hardware, lenient=lenient)
        table = p.advise(top=top)
        window_us = p.window_ns / 1e3
        docs.append(advice_document(table, p.label, window_us))
        texts.append(render_advice(table, p.label, window_us, wide=wide))
    if as_json:
        _echo(json.dumps(docs[0] if len(docs) == 1 else docs, indent=2, default=float))
    else:
        _echo("\n".join(texts), nl=False)


@cli.command("calibrate")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, writable=True), help="Hardware JSON file to write.")
@click.option("-n", "--world-size", type=int, default=None,
              help="GPUs to measure collectives and peer access over (default: every GPU here). With --only collectives "
                   "--update FILE, a world size other than the file's adds a curve for it (collectives_by_world).")
@click.option("--timeout", "timeout_s", type=float, default=600.0, show_default=True, help="Seconds before the run is stopped.")
@click.option("--only", default=None, metavar="STEP[,STEP]",
              help="Run only these steps: hbm, gemm, launch, collectives, barrier, peer, flag, p2p, combine, sync, "
                   "tile_gemm, copy_share, rs_gemm, ll, fused_combine, reduce (default: all). Without hbm and gemm it needs "
                   "--update; combine (the flash decode combine's serial step), sync (one wait on a set flag), tile_gemm, "
                   "fused_combine (the fused flash decode's in-kernel local combine, at one rank) and reduce "
                   "need one GPU, e.g. -n 1 --only combine,sync --update FILE; copy_share (the copy kernel in pull and push "
                   "mode beside the tile GEMM), rs_gemm and ll measure every rank at once "
                   "(on one GPU, a second half of its memory stands in for the peer).")
@click.option("--update", type=click.Path(exists=True, dir_okay=False), default=None, metavar="FILE",
              help="An earlier calibration's hardware JSON: the steps not run keep its measurements and every number is "
                   "refit, e.g. --only collectives --update taxmodel/data/hardware/h200-calibrated.json "
                   "(add -n 2 on a 2-GPU machine to add the 2-rank curve beside the file's own). The result goes to "
                   "-o, which must be another file: FILE itself is never overwritten.")
@click.option("--device", type=click.Choice(["cuda", "cpu"]), default="cuda", hidden=True,
              help="cpu: the collectives step on gloo ranks (what the CPU tests run).")
@click.option("--sizes", default=None, hidden=True, metavar="B[,B]", help="Collective message sizes in bytes.")
@click.option("--refit", type=click.Path(exists=True, dir_okay=False), default=None, metavar="FILE",
              help="Measure nothing (no GPU needed): refit every number of FILE, a file `taxmodel calibrate` wrote, from "
                   "the raw measurements it keeps, with this taxmodel's fits, into -o (after the fits improved, e.g. "
                   "the split-KV kernel's L2-resident line).")
def calibrate_cmd(output, world_size, timeout_s, only, update, device, sizes, refit) -> None:
    """Measure this machine's GPUs (GEMM rates, HBM, collectives, peer loads, flags, launches, the flash decode
    combine's step, a wait on a set flag, and the workloads' own kernels alone: the tile GEMM against cuBLAS by M,
    the copy kernel beside it, GEMM+RS's GEMM pushing, LL pushes and merges, the reduction program) into a
    hardware file."""
    if refit:
        from taxmodel.model.calibration import refit_file

        if only or update:
            raise click.UsageError("--refit measures nothing: it takes neither --only nor --update")
        _echo(f"wrote {refit_file(refit, output)}: every number refit from {refit}'s raw measurements")
        return
    from taxmodel.runtime.calibrate import run_calibration

    spec = run_calibration(output, world_size=world_size, timeout_s=timeout_s, only=only, update=update, device=device,
                           sizes=sizes)
    _echo(f"wrote {output}: {spec.label}; use it with --hardware {output}")


def _shape_option(values: tuple[str, ...]) -> dict[str, int]:
    from taxmodel.runtime.worker import parse_shape

    return parse_shape(list(values))


@cli.command("predict")
@click.argument("workload")
@click.option("--variant", "variants_", default=None, help="Comma-separated variants (default: every modeled one).")
@click.option("-n", "--world-size", type=int, default=4, show_default=True, help="GPUs (what-if sizes welcome: 8, 16, 72...).")
@click.option("--hardware", default="h200-calibrated", show_default=True, metavar="NAME|FILE",
              help="Preset (h100, h200, mi300x, b200; a calibrated file for it wins when one ships) or a calibrate JSON.")
@click.option("--shape", "shape", multiple=True, metavar="K=V[,K=V]", help="Shape values, e.g. --shape M=8192,N=8192,K=8192.")
@click.option("--preset", default=None, help="The workload's shape preset (default: its default preset).")
@click.option("--sweep", "sweep_", default=None, metavar="KEY=LO:HI[:STEP]", help="Predict a curve over one shape key.")
@click.option("--plot", type=click.Path(dir_okay=False, writable=True), default=None, help="With --sweep: write a figure (PNG/SVG/PDF).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@click.option("--graph", "graph_launch", is_flag=True,
              help="Each iteration is one CUDA graph launch (as `taxmodel profile --graph` captures it): no host launch "
                   "cost between kernels.")
@click.option("--transport", type=click.Choice(["ce", "sm", "direct"]), default=None,
              help="ag_gemm fine-grained transport: copy engines (default), a Triton copy kernel, or direct peer loads.")
@click.option("--align", type=click.Choice(START_ALIGNMENTS), default="back-to-back", show_default=True,
              help="How ranks start each iteration: after a host barrier (calibrated skew), released together by a "
                   "device gate (as `taxmodel profile --align device` captures it), or back to back behind one gate "
                   "(`taxmodel profile`'s default on GPUs).")
@click.option("--fitted/--no-fitted", "use_fitted", default=True, show_default=True,
              help="Use the parameters `taxmodel validate` fitted on the measured bundles of this hardware "
                   "(taxmodel/data/fitted.json), or only the documented defaults and the calibration.")
def predict_cmd(workload, variants_, world_size, hardware, shape, preset, sweep_, plot, as_json, graph_launch,
                transport, align, use_fitted) -> None:
    """Predicted ledger (latency and each tax) of WORKLOAD from shapes and hardware, with its assumptions."""
    import json

    from pathlib import Path

    from taxmodel.fsutil import check_output_file
    from taxmodel.model import analytic
    from taxmodel.model.analytic.report import plot_sweep, render_prediction, render_sweep
    from taxmodel.workload import get_workload

    if plot and not sweep_:
        raise click.UsageError("--plot draws the curve of a --sweep: give --sweep KEY=LO:HI[:STEP] too")
    if plot:  # before the work
        check_output_file(plot, "figure", [hardware] if Path(hardware).is_file() else [])
    wl = get_workload(workload)
    shp = wl.shape(preset, **_shape_option(shape))
    hw, note = analytic.resolve_model_hardware(hardware)
    names = [v for v in variants_.split(",") if v] if variants_ else list(analytic.variants(workload))
    settings = analytic.CaptureSettings(graph_launch=graph_launch or None, transport=transport, align=align)
    params, fitted_note = analytic.model_params(hw, settings, None if use_fitted else {})
    if sweep_:
        key, values = analytic.parse_range(sweep_)
        tables = {v: analytic.sweep(workload, v, shp, world_size, hw, key, values, params) for v in names}
        if as_json:
            _echo(json.dumps({"hardware": note, "fitted": fitted_note,
                                   "sweep": {v: t.to_dict(orient="records") for v, t in tables.items()}}, indent=2))
        else:
            _echo(note)
            if fitted_note:
                _echo(fitted_note)
            _echo(render_sweep(tables, key), nl=False)
        if plot:
            _echo(f"wrote {plot_sweep(tables, key, plot, title=f'{workload}, {world_size} x {hw.name}')}")
        return
    preds = [analytic.predict(workload, v, shp, world_size, hw, params) for v in names]
    preds[0].assumptions[:] = analytic.with_hardware_note(preds[0].assumptions, note)
    if fitted_note:
        preds[0].assumptions.insert(1, fitted_note)
    if as_json:
        _echo(json.dumps([p.to_dict() for p in preds], indent=2, default=float))
    else:
        _echo(render_prediction(preds), nl=False)


@cli.command("validate")
@click.argument("profiles_dir", default="profiles", type=click.Path(file_okay=False))
@click.option("--markdown", type=click.Path(dir_okay=False, writable=True), default=None, help="Also write the table as Markdown.")
@click.option("--update-docs", is_flag=True, help="Rewrite the table in benchmarks/results/model_validation.md (between its validation markers) "
                                                   "and the fitted parameters that predict uses (taxmodel/data/fitted.json).")
@click.option("--docs", "docs_file", default="benchmarks/results/model_validation.md", show_default=True, type=click.Path(dir_okay=False))
@click.option("--no-fit", is_flag=True, help="Use the documented defaults; fit nothing from the bundles.")
@click.option("--fitted-from", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Fit nothing; use the parameters of this file (a fitted.json that --update-docs wrote, e.g. "
                   "taxmodel/data/fitted.json as committed before new bundles came), so every bundle is predicted "
                   "out of sample; another GPU's fits are borrowed, with a caveat, for what a GPU without fits of "
                   "its own did not calibrate.")
@click.option("--hardware", default=None, metavar="NAME|FILE",
              help="Predict and measure every bundle with this hardware (a `taxmodel calibrate` file of the machine "
                   "that captured them) instead of the spec each bundle's GPU resolves to; a file of another GPU is "
                   "used with a one-line caveat.")
@click.option("-j", "--jobs", type=click.IntRange(min=0), default=0, show_default=True,
              help="Processes that compute the measured ledgers and predictions (0: one per CPU).")
@click.option("--cache/--no-cache", default=True, show_default=True,
              help="Keep each bundle's measured ledger and each prediction on disk ($TAXMODEL_CACHE_DIR, else "
                   "~/.cache/taxmodel), keyed by the bundle's files and taxmodel's code, and reuse them.")
def validate_cmd(profiles_dir, markdown, update_docs, docs_file, no_fit, fitted_from, hardware, jobs, cache) -> None:
    """Compare the model's predictions with every measured bundle under PROFILES_DIR.

    Exit 0 when every validated comparison is within target (latency 15%, each tax 25% or 20 us), 1 otherwise.
    A locality row counts only where DRAM counters measured it (without them the bundle's locality is the
    model's own estimate: listed, not validated).
    """
    from taxmodel.fsutil import atomic_write, check_output_file
    from taxmodel.model import validate as val
    from taxmodel.model.analytic.fitted import FITTED_FILE
    from taxmodel.errors import InputError
    from taxmodel.model.validation_markdown import docs_table, markdown_table, update_docs as update_table
    from taxmodel.trace.bundle import bundle_inputs

    if fitted_from and (no_fit or update_docs):
        raise click.UsageError("--fitted-from fits nothing: it goes with neither --no-fit nor --update-docs")
    if markdown:  # before the work
        check_output_file(markdown, "Markdown table", bundle_inputs([profiles_dir]) + [docs_file])
    if update_docs:  # before the work: the document must hold the markers the table goes between
        docs_table(docs_file)
    v = val.validate(profiles_dir, fit=not no_fit, fitted_from=fitted_from, hardware=hardware, jobs=jobs or None,
                     cache=cache, progress=True)
    if update_docs and v.table.empty:
        raise InputError(f"--update-docs: no bundle under {profiles_dir} could be validated, so neither {docs_file} nor "
                         f"{FITTED_FILE.name} was rewritten (they would lose every row and fit); check the directory")
    text = markdown_table(v)
    _echo(text, nl=False)
    for s in v.skipped:
        _echo(f"skipped {s}", err=True)
    if markdown:
        atomic_write(markdown, text, what="Markdown table")
        _echo(f"wrote {markdown}")
    if update_docs:
        _echo(f"updated {update_table(docs_file, v)}")
        if not no_fit:
            _echo(f"updated {val.write_fitted(FITTED_FILE, v)} (the fitted parameters taxmodel predict uses)")
    sys.exit(0 if v.passed or v.table.empty else 1)


@cli.command("scaling")
@click.argument("profile_dirs", nargs=-1, required=True, type=_BUNDLES_DIR)
@click.option("--markdown", type=click.Path(dir_okay=False, writable=True), default=None, help="Also write the table as Markdown.")
def scaling_cmd(profile_dirs, markdown) -> None:
    """How the taxes and the fine-grained speedup change with the world size.

    For every (workload, shape, launch mode) captured at two or more world sizes under
    PROFILE_DIRS: per world size the bsp variant's latency and taxes (% of its step), the fastest
    fine-grained variant, and its speedup over bsp, measured and as the analytic model predicts
    it. Exit 1 when no such group is found.

    \b
    taxmodel scaling profiles/h200x4-graph-gate profiles/h200x8-graph-gate
    """
    from taxmodel.fsutil import atomic_write, check_output_file
    from taxmodel.model.scaling import markdown as scaling_markdown, scaling_rows
    from taxmodel.trace.bundle import bundle_inputs

    if markdown:  # before the work
        check_output_file(markdown, "Markdown table", bundle_inputs(profile_dirs))
    rows = scaling_rows(list(profile_dirs))
    if not rows:
        _echo("no (workload, shape, launch mode) with bsp and a fine-grained variant at two or more world sizes "
                   f"under {', '.join(profile_dirs)}", err=True)
        sys.exit(1)
    text = scaling_markdown(rows)
    _echo(text, nl=False)
    if markdown:
        atomic_write(markdown, text, what="Markdown table")
        _echo(f"wrote {markdown}")


# --- report: report, export-trace ----------------------------------------------------------

@cli.command("report")
@click.argument("bundles", nargs=-1, required=True, type=_BUNDLES)
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, writable=True),
              help="Report file: .html (self-contained) or .md (its PNGs in a folder beside it, REPORT-figures/).")
@click.option("--format", "fmt", type=click.Choice(["html", "md"]), default=None,
              help="Output format (default: from the output's suffix, else html).")
@click.option("--hardware", default=None, help="Hardware preset or spec JSON for the useful floor (default: from each bundle).")
@click.option("--lenient", is_flag=True, help="Skip what cannot be analyzed instead of stopping; the report lists what was skipped.")
def report_cmd(bundles, output, fmt, hardware, lenient) -> None:
    """Headline, ledger tables and figures for BUNDLES (directories of bundles are searched).

    Bundles are compared by (workload, shape) against the `bsp` variant and swept by
    (workload, variant) across shapes.
    """
    from taxmodel.fsutil import check_output_file
    from taxmodel.report.build import load_cases, write_report_files
    from taxmodel.report.headline import headlines
    from taxmodel.trace.bundle import bundle_inputs

    check_output_file(output, "report", bundle_inputs(bundles))  # before the work
    cases = load_cases(bundles, hardware=hardware, lenient=lenient, on_skip=_note)
    path, *figures = write_report_files(cases, output, fmt)
    for line in headlines([led for _, led in cases]):
        _echo(line)
    _echo(f"wrote {path}")
    if figures:
        folders = sorted({str(f.parent) for f in figures})
        _echo(f"wrote {len(figures)} figure(s) it links to, in {', '.join(f + '/' for f in folders)}")


@cli.command("export-trace")
@click.argument("bundles", nargs=-1, required=True, type=_BUNDLES)
@click.option("-o", "--output", required=True, type=click.Path(writable=True),
              help="Trace file (.json, or .json.gz) for one bundle; for several, a directory that gets one trace per "
                   "bundle, named after its folder. Open them in Perfetto's UI or chrome://tracing.")
@click.option("--hardware", default=None, help="Hardware preset or spec JSON for the useful floor (default: from the bundle).")
@click.option("--lenient", is_flag=True, help="Skip what cannot be analyzed instead of stopping.")
def export_trace_cmd(bundles, output, hardware, lenient) -> None:
    """Each bundle's events plus one track per rank and ledger part (taxes), as a Chrome/Perfetto trace
    (directories of bundles are searched)."""
    from taxmodel.report.build import export_traces

    for path in export_traces(bundles, output, hardware=hardware, lenient=lenient):
        _echo(f"wrote {path}")


# --- regress: compare, baseline ------------------------------------------------------------

_OUT_FILE = click.Path(dir_okay=False, writable=True)


@cli.command("compare")
@click.argument("baseline", type=_BUNDLES)
@click.argument("candidate", type=_BUNDLES)
@click.option("--config", type=click.Path(exists=True, dir_okay=False),
              help="Thresholds file (default: regress.toml beside BASELINE or in a parent, else built-in defaults).")
@click.option("--markdown", type=_OUT_FILE, help="Write a Markdown summary (PR comment / CI job summary).")
@click.option("--junit", type=_OUT_FILE, help="Write JUnit XML: one testcase per row and metric.")
@click.option("--json", "json_file", type=_OUT_FILE, help="Write every number as JSON.")
@click.option("--allow-missing", is_flag=True, help="Rows on one side only are reported but do not make the exit code 2.")
@click.option("--pool", is_flag=True,
              help="Pool several candidate bundles of one row as independent repetitions (without it they are refused: "
                   "one may be a stale copy of an earlier run).")
@click.option("-v", "--verbose", is_flag=True, help="List every metric, not only those beyond their thresholds.")
def compare_cmd(baseline, candidate, config, markdown, junit, json_file, allow_missing, pool, verbose) -> None:
    """Compare CANDIDATE bundles against BASELINE bundles (each a bundle or a directory of them).

    Rows are matched by (workload, variant, shape); each row's latency and every tax
    (and sub-part) get a bootstrap confidence interval of their change, resampling
    repetitions (`taxmodel profile --repeat N`) when there are several, else iterations.

    \b
    Exit codes: 0 no regression, 1 regression, 2 cannot compare (mismatched
    workloads, devices, world sizes or schema versions; rows on one side only).
    Example (CI):
      taxmodel compare profiles/h200 runs/ --markdown summary.md --junit junit.xml
    """
    from taxmodel.regress import compare_paths
    from taxmodel.regress.outputs import check_outputs, error_outputs, terminal_text, write_outputs
    from taxmodel.trace.bundle import bundle_inputs

    outputs = dict(markdown=markdown, junit=junit, json_path=json_file)

    check_outputs(outputs, inputs=bundle_inputs([baseline, candidate]) + ([config] if config else []))  # before any work
    try:
        result = compare_paths(baseline, candidate, config=config, allow_missing=allow_missing, pool=pool)
    except TaxmodelError as exc:  # still leave the reason in the requested reports (CI summaries)
        write_outputs(error_outputs(str(exc), baseline, candidate), **outputs)
        raise
    _echo(terminal_text(result, verbose=verbose))
    for path in write_outputs(result, **outputs):
        _echo(f"wrote {path}")
    sys.exit(result.exit_code)


def _stdin_is_terminal() -> bool:
    return sys.stdin.isatty()


@cli.group("baseline", cls=_Group)
def baseline_group() -> None:
    """Manage the CI baselines that `taxmodel compare` reads (never overwritten silently)."""


@baseline_group.command("update")
@click.argument("candidate", type=_BUNDLES)
@click.option("--baseline", "baseline_dir", required=True, type=click.Path(file_okay=False),
              help="Directory of baseline bundles to update, e.g. profiles/h200.")
@click.option("--yes", is_flag=True, help="Write without asking (needed when not run from a terminal).")
@click.option("-m", "--message", default="", help="Why the baseline changes; goes into the log.")
@click.option("--pool", is_flag=True, help="Pool several candidate bundles of one row (else refused: a stale copy?).")
def baseline_update_cmd(candidate, baseline_dir, yes, message, pool) -> None:
    """Replace the baselines of CANDIDATE's rows with CANDIDATE (atomically, logged).

    Prints old vs new latency and taxes per row first, then asks (or needs --yes).
    """
    from taxmodel.errors import InputError
    from taxmodel.regress.baseline import LOG_NAME, apply_update, plan_text, plan_update, update_lock

    with update_lock(baseline_dir):  # from the plan to the swap: one update at a time
        plan = plan_update(candidate, baseline_dir, pool=pool)
        _echo(plan_text(plan))
        if not yes:
            if not _stdin_is_terminal():
                raise InputError("not writing the baseline without confirmation: re-run with --yes")
            click.confirm("Write these baselines?", abort=True)
        target = apply_update(plan, message=message)
    _echo(f"updated {target} (logged in {target / LOG_NAME})")



def main() -> None:
    cli(prog_name="taxmodel")


if __name__ == "__main__":
    main()
