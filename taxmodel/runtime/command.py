"""``taxmodel profile [OPTIONS] -- COMMAND``: anyone's job, traced right, without editing it.

The command runs unchanged (``python train.py``, ``torchrun ... train.py``, any launcher whose
ranks are Python processes) with a ``sitecustomize`` on ``PYTHONPATH`` that arms the step hook
(``command_hook.py``) in every Python process; the hook traces ``--steps`` steps after
``--skip`` in every rank with the options the ledger needs (shapes, step markers, no stacks).
Once every rank's trace is written the job is stopped, as ``nsys profile`` stops an application
at the end of its capture range (``--run-to-end`` lets it finish; SIGKILL rather than nsys's
SIGTERM, see ``command_job.run_job``), and the traces become the
bundle at ``-o`` as ``taxmodel import`` would write it. ``--counters`` then runs the command once
more under Nsight Compute, counting the first traced step's kernels only, and attaches their DRAM
bytes as ``import --counters`` does; the timed run never runs under ncu.

Nothing is written outside ``-o`` but the run's capture directory, a hidden temporary beside
it (``.<name>.<pid>-XXXX.tmp``, as every bundle write uses) that is removed afterwards.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

from taxmodel import fsutil
from taxmodel.errors import InputError, Interrupted, RunError, TaxmodelError
from taxmodel.runtime.command_bundle import Assessment, Capture, assess, done, steps_text, write_capture_bundle
from taxmodel.runtime.command_hook import ERRORS_DIR, PLAN_ENV, Plan
from taxmodel.runtime.command_job import JobEnd, run_job
from taxmodel.runtime.launcher import KILL_GRACE_S

EXPORT_GRACE_S = 15.0
"""How long a job stopped while a rank traces gets to write what it traced before SIGKILL."""
NCU_FINISH_S = 120.0
"""How long ncu gets to write its counters once the counted ranks are stopped."""
SITE_DIR = "site"

SITECUSTOMIZE = '''\
"""Written by `taxmodel profile -- COMMAND` for one run, and removed after it: arms taxmodel's step
hook in each Python process of the command (taxmodel/runtime/command_hook.py), then runs the
sitecustomize that was next on the path, as Python would have."""


def _taxmodel_site(site_dir, package_root, errors_dir):
    import importlib.machinery
    import importlib.util
    import os
    import sys
    import traceback

    def here(p):
        try:
            return os.path.realpath(p or ".") == os.path.realpath(site_dir)
        except OSError:
            return False

    sys.path[:] = [p for p in sys.path if not here(p)]
    sys.path.insert(0, package_root)
    try:
        from taxmodel.runtime.command_hook import arm
        arm()
    except Exception:
        try:
            os.makedirs(errors_dir, exist_ok=True)
            with open(os.path.join(errors_dir, "%d.txt" % os.getpid()), "w") as f:
                f.write(traceback.format_exc())
        except OSError:
            pass
    finally:
        sys.path.remove(package_root)
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", sys.path)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            if sys.flags.verbose:
                sys.excepthook(*sys.exc_info())
            else:
                print("Error in sitecustomize; set PYTHONVERBOSE for traceback:\\n%s: %s" % (type(exc).__name__, exc),
                      file=sys.stderr)


_taxmodel_site({site_dir!r}, {package_root!r}, {errors_dir!r})
del _taxmodel_site
'''


@dataclass
class CommandRequest:
    """``taxmodel profile -- COMMAND``'s settings."""

    command: list[str]
    out: str | None = None  # default: runs/<the script's name>
    skip: int = 5
    steps: int = 5
    step_fn: str | None = None
    force: bool = False
    counters: bool = False
    timeout_s: float | None = None
    run_to_end: bool = False


@dataclass
class CommandOutcome:
    out: Path
    bundle: object | None = None  # trace.bundle.Bundle when one was written
    fmt: str = "kineto"
    replaced: bool = False
    lines: list[str] = field(default_factory=list)  # one per problem, for stderr
    stopped: bool = False  # the job was stopped once every rank's trace was written
    exit_code: int = 0
    counters: str | None = None  # what the counters pass attached
    counters_error: TaxmodelError | None = None  # why it attached nothing (the bundle stands without)


def default_output(command: Sequence[str]) -> Path:
    """``runs/<name>``: the first ``*.py`` argument's stem, the module after ``-m``, else the
    program's name (as nsys names its report after nothing better)."""
    args = list(command)
    for i, a in enumerate(args):
        if a == "-m" and i + 1 < len(args):
            return Path("runs") / args[i + 1]
        if a.endswith(".py"):
            return Path("runs") / Path(a).stem
    return Path("runs") / Path(args[0]).name


def check_request(req: CommandRequest) -> Path:
    """Refuse what cannot run before anything starts; return the output path."""
    if not req.command:
        raise InputError("nothing after --: give the command to profile, e.g. taxmodel profile -- python train.py")
    exe = req.command[0]
    if shutil.which(exe) is None:
        raise InputError(f"{exe}: command not found (give the command after --, e.g. -- python train.py)")
    if req.skip < 1 or req.steps < 1:
        raise InputError(f"--skip {req.skip} --steps {req.steps}: both must be at least 1 (step 1 begins somewhere in "
                         "the program's set-up, where the hook cannot see it)")
    if req.step_fn is not None:
        module, sep, qualname = req.step_fn.partition(":")
        names = qualname.split(".")
        if not sep or not module or not all(n.isidentifier() for n in names) \
                or not all(p.isidentifier() for p in module.split(".")):
            raise InputError(f"--step-fn {req.step_fn!r}: expected MODULE:QUALNAME, e.g. my_trainer:Trainer.train_step "
                             "or __main__:train_step")
    if req.timeout_s is not None and req.timeout_s <= 0:
        raise InputError(f"--timeout {req.timeout_s:g}: must be positive")
    return Path(req.out) if req.out else default_output(req.command)


@contextlib.contextmanager
def capture_directory(out: Path) -> Iterator[Path]:
    """The run's private directory beside ``out`` (the hook's statuses and traces, the
    ``sitecustomize``), removed afterwards however the run ended."""
    fsutil.make_dirs(out.parent, "bundle")
    directory = fsutil.make_temp_dir(out)
    try:
        site = directory / SITE_DIR
        site.mkdir()
        root = str(Path(__file__).resolve().parents[2])  # the directory that holds this taxmodel package
        (site / "sitecustomize.py").write_text(SITECUSTOMIZE.format(
            site_dir=str(site), package_root=root, errors_dir=str(directory / ERRORS_DIR)))
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def hook_env(capture_dir: Path, plan: Plan, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The command's environment: the run's ``sitecustomize`` first on ``PYTHONPATH`` (the
    user's entries after it), the plan beside it."""
    env = dict(os.environ if base is None else base)
    site = str(capture_dir / SITE_DIR)
    env["PYTHONPATH"] = site + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env[PLAN_ENV] = plan.to_json()
    return env


def _grace(directory: Path) -> Callable[[], float]:
    """A stopped job's grace: long enough for a rank that is tracing to write what it has."""
    def grace() -> float:
        tracing = any(s.get("state") == "tracing" for s in Capture.read(directory).statuses)
        return EXPORT_GRACE_S if tracing else KILL_GRACE_S
    return grace


def profile_command(req: CommandRequest, *, say: Callable[[str], None] = lambda _: None) -> CommandOutcome:
    """Run ``req.command`` under the step hook and write its bundle (see the module docstring).
    ``say`` gets progress lines (the run's start, the counters pass)."""
    from taxmodel.trace.bundle import prepare_output

    out = check_request(req)
    replaced = prepare_output(out, force=req.force)
    if req.counters:
        from taxmodel.runtime.counters import find_ncu

        find_ncu()  # refuse before the timed run
    outcome = CommandOutcome(out=out, replaced=replaced)
    with capture_directory(out) as directory:
        plan = Plan(str(directory), req.skip, req.steps, req.step_fn, "trace")
        say(f"tracing {steps_text(plan.first, plan.steps)} of every rank (a step ends with each call of "
            f"{plan.step_name}()); the bundle goes to {out}")
        try:
            end = run_job(req.command, hook_env(directory, plan), directory, done=lambda: done(directory, plan),
                          run_to_end=req.run_to_end, timeout_s=req.timeout_s, grace_s=_grace(directory),
                          after_capture_grace_s=KILL_GRACE_S)
        except Interrupted as exc:
            a = assess(Capture.read(directory), plan, JobEnd(exc.exit_code, "interrupted", 0.0))
            kept = _write(a, plan, out, req, outcome, stopped=False) if a.traces else None
            raise Interrupted(exc.signum, f"{exc}; " + (f"wrote {out} with what was captured ({len(a.traces)} rank(s), "
                                                        f"{a.keep_steps} step(s))" if kept else "nothing was written")
                              ) from None
        a = assess(Capture.read(directory), plan, end)
        outcome.stopped = end.stopped == "captured"
        if end.stopped == "timeout":
            a.lines.insert(0, f"the command was stopped at --timeout {req.timeout_s:g} s")
        elif not outcome.stopped and end.code != 0:
            a.lines.insert(0, f"the command exited with status {end.code}"
                              + (" after the capture" if a.complete else ""))
        if a.traces:
            _write(a, plan, out, req, outcome, stopped=outcome.stopped)
        outcome.lines = a.lines
        if end.stopped == "timeout":
            outcome.exit_code = RunError.exit_code
        elif not outcome.stopped and end.code != 0:
            outcome.exit_code = end.code  # the command's own failure reaches the caller
        else:
            outcome.exit_code = 0 if a.complete else RunError.exit_code
        if req.counters and outcome.bundle is not None:
            try:
                outcome.counters = _counters(req, plan, a, out, directory, say)
            except TaxmodelError as exc:
                outcome.counters_error = exc
            except Interrupted as exc:
                raise Interrupted(exc.signum, f"{exc}; {out} is written, without counters") from None
    return outcome


def _write(a: Assessment, plan: Plan, out: Path, req: CommandRequest, outcome: CommandOutcome, *, stopped: bool) -> bool:
    """Write the bundle of ``a``; a failure to import the traces becomes one line (and keeps them)."""
    try:
        outcome.bundle, outcome.fmt = write_capture_bundle(a, plan, out, force=req.force, command=req.command,
                                                           stopped=stopped)
        return True
    except TaxmodelError as exc:
        why = " ".join(str(exc).split())
        for trace in a.traces.values():  # name the traces as they are kept, not by the capture directory
            why = why.replace(str(trace), trace.name)
        hint = (" (a CPU run: a CPU capture's kernels are its record_function('kernel::NAME') ranges)"
                if a.device == "cpu" and "no GPU events" in why else "")
        a.lines.append(f"the traces could not be made a bundle: {why}{hint}" + _keep_raw(list(a.traces.values()), out))
        a.complete = False
        return False


def _keep_raw(traces: list[Path], out: Path) -> str:
    """Keep traces that could not be imported in ``out/raw/`` when ``out`` is new or empty (an
    earlier bundle there is left as it was); the words that say where they are."""
    from taxmodel.trace.bundle import RAW_DIR

    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        return f"; {out} is left as it was and the traces were not kept"
    raw = fsutil.make_dirs(out / RAW_DIR, "traces")
    for t in traces:
        shutil.copy2(t, raw / t.name)
    return f"; the traces are kept in {raw} (taxmodel import {raw}/*.json.gz -o BUNDLE)"


def _counters(req: CommandRequest, plan: Plan, a: Assessment, out: Path, directory: Path,
              say: Callable[[str], None]) -> str:
    """The second pass under ncu, then its counters attached to the bundle at ``out``."""
    from taxmodel.runtime.command_counters import attach_pass_counters, ncu_command
    from taxmodel.runtime.counters import find_ncu

    if a.device != "cuda":
        raise InputError(f"--counters: the job ran no CUDA work (a CPU run), there is nothing for ncu to count; {out} "
                         "is written without counters")
    if a.world != 1:
        raise InputError(f"--counters: the job has {a.world} ranks, and ncu's kernel replay would stall their collectives "
                         f"waiting for peers; {out} is written without counters: run a one-GPU job for them")
    sub = directory / "counters"
    sub.mkdir()
    cplan = Plan(str(sub), plan.skip, plan.steps, plan.step_fn, "counters")
    csv = sub / "counters.csv"
    say(f"--counters: running the command again under ncu, counting step {plan.first} only")
    env = hook_env(directory, cplan)
    end = run_job(ncu_command(find_ncu(), req.command, csv), env, sub, done=lambda: done(sub, cplan),
                  run_to_end=req.run_to_end, timeout_s=req.timeout_s, grace_s=lambda: KILL_GRACE_S,
                  after_capture=signal.SIGTERM, spare_child_after_capture=True, after_capture_grace_s=NCU_FINISH_S)
    counted = [s for s in Capture.read(sub).statuses if s.get("state") == "counted"]
    how = "was stopped at --timeout" if end.stopped == "timeout" else f"ended (exit status {end.code})"
    if not counted:
        raise RunError(f"--counters: the run under ncu {how} before step {plan.first} was counted; {out} is written "
                       "without counters")
    if not csv.is_file() or not csv.stat().st_size:
        raise RunError(f"--counters: ncu wrote no counters (it {how}); {out} is written without counters"
                       + ("" if req.run_to_end else "; with --run-to-end the program ends by itself under ncu"))
    return attach_pass_counters(out, csv, command=req.command, step=plan.first, pass_s=end.wall_s)

