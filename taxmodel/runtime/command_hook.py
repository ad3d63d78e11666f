"""The step hook that ``taxmodel profile -- COMMAND`` arms in every Python process of the command.

Why a hook and not an edit: a user's job reaches the ledger only when its trace has shapes, one
``ProfilerStep#N`` range per step and no Python stacks, from every rank; written by hand each of
those is a place to get it wrong. The command runs unchanged: the runner (``command.py``) puts a
``sitecustomize`` on ``PYTHONPATH`` that imports this module, calls ``arm`` and then runs the
``sitecustomize`` that was next on the path. Everything here
runs inside the user's processes, so it imports only the standard library until the process
imports torch itself, never raises into the user's code (a failure is written to the process's
status file and the hook stands down), and writes only into the run's capture directory.

What it does, per process:

- nothing at all, unless the process imports torch: ``arm`` only adds an import finder that
  waits for ``torch`` (and for the ``--step-fn`` module);
- once torch is imported, it registers the process (``procs/<pid>.json``: pid, start time), so
  that the runner can stop every rank even when a launcher put them in sessions of their own;
- a *step* ends with each call of the first optimizer's ``step()`` (torch's global optimizer
  post-hook), or of the ``--step-fn`` function; step ``i`` runs from the end of call ``i - 1``
  to the end of call ``i``, as a loop that calls ``prof.step()`` after ``optimizer.step()``;
- ``trace`` mode: at the end of call ``skip - 1`` it starts ``torch.profiler`` (CPU, plus CUDA
  when there is one; shapes recorded, no stacks) with one warm-up step (discarded: the first
  traced step after the tracer starts runs slow) and ``steps`` active ones; the trace is written
  to ``traces/rank<R>.json.gz`` when the last one ends. A process that ends while tracing (an
  exception, ``sys.exit``, SIGTERM while no handler of the user's is installed) writes what it
  traced so far, and its status says how many steps are complete;
- ``counters`` mode (the second pass of ``--counters``, under Nsight Compute): the first traced
  step runs between ``cudaProfilerStart`` and ``cudaProfilerStop``; nothing is traced.

The status file (``status/<pid>.json``) is what the runner reads: rank, world size, steps ended,
the state (``skipping``, ``tracing``, ``written``, ``partial``, ``counting``, ``counted``,
``failed``) and how the process ended.
"""
from __future__ import annotations

import atexit
import functools
import importlib.abc
import inspect
import json
import os
import signal
import socket
import sys
import threading
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

PLAN_ENV = "TAXMODEL_CAPTURE_PLAN"
"""The environment variable holding the run's ``Plan`` as JSON (inherited by every process)."""

STATUS_DIR = "status"
TRACE_DIR = "traces"
PROCS_DIR = "procs"
ERRORS_DIR = "errors"
TRACE_SUFFIX = ".json.gz"

OPTIMIZER_STEP = "torch.optim.Optimizer.step"
"""What a step is by default (named in messages)."""


@dataclass(frozen=True)
class Plan:
    """What the runner asks of every process: where to write, which steps, which function."""

    directory: str
    skip: int
    steps: int
    step_fn: str | None = None  # "module:qualname"; None: the optimizer's step()
    mode: str = "trace"  # trace | counters

    @property
    def warmup(self) -> int:
        """Traced warm-up steps before the first traced one (none when step 1 would be it: its
        start is somewhere in the program's set-up, which the hook cannot see)."""
        return 1 if self.skip >= 2 else 0

    @property
    def first(self) -> int:
        return self.skip + 1

    @property
    def last(self) -> int:
        return self.skip + self.steps

    @property
    def step_name(self) -> str:
        return self.step_fn or OPTIMIZER_STEP

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        return cls(**json.loads(text))


def process_start_time(pid: int) -> str | None:
    """The kernel's start time of a live ``pid`` (field 22 of /proc/PID/stat), to tell a process
    from a later one that reuses its pid; None when it is gone, a zombie, or /proc is not there."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return None
    if len(fields) < 20 or fields[0] in ("Z", "X"):
        return None
    return fields[19]


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` to ``path`` atomically (a pid-named temporary renamed onto it)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


# --- arming: runs in every Python process of the command ----------------------------------------


def arm() -> None:
    """Called by the run's ``sitecustomize`` in every Python process of the command: wait for
    torch (and the ``--step-fn`` module). Without the plan in the environment, nothing."""
    text = os.environ.get(PLAN_ENV)
    if not text:
        return
    try:
        _Hook(Plan.from_json(text)).arm()
    except Exception:  # noqa: BLE001 - never break the user's program; say why in the capture directory
        _record_error(text, traceback.format_exc())


def _record_error(plan_text: str, text: str) -> None:
    try:
        directory = Path(json.loads(plan_text)["directory"]) / ERRORS_DIR
        directory.mkdir(exist_ok=True)
        (directory / f"{os.getpid()}.txt").write_text(text)
    except Exception:  # noqa: BLE001 - nowhere left to say it
        pass


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs callbacks right after a module's code has run (before its importer sees it), without
    importing anything itself: it asks the other finders for the module's spec and wraps that
    spec's loader for this one execution."""

    def __init__(self) -> None:
        self.waiting: dict[str, list[Callable[[Any], None]]] = {}

    def add(self, name: str, callback: Callable[[Any], None]) -> None:
        if name in sys.modules:
            callback(sys.modules[name])
            return
        self.waiting.setdefault(name, []).append(callback)
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        callbacks = self.waiting.get(fullname)
        if not callbacks:
            return None
        spec = None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        del self.waiting[fullname]
        if not self.waiting:
            sys.meta_path[:] = [f for f in sys.meta_path if f is not self]
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module: Any) -> None:
            try:
                original(module)
            finally:
                loader.__dict__.pop("exec_module", None)
            for callback in callbacks:
                callback(module)

        loader.exec_module = exec_module
        return spec


_FINDER = _AfterImport()


# --- the hook: one per process ---------------------------------------------------------------------


class _Hook:
    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.root = Path(plan.directory)
        self.status_path = self.root / STATUS_DIR / f"{os.getpid()}.json"
        self.calls = 0  # step calls ended in this process
        self.state = "waiting"
        self.active = True
        self.prof: Any = None
        self.trace_file: str | None = None
        self.complete = 0  # traced steps complete in the written trace
        self.optimizer: Any = None  # weak reference to the optimizer whose steps count
        self.depth = 0  # nesting of --step-fn calls (recursion counts once)
        self.on_sigterm: Any = None  # our SIGTERM handler while it is installed
        self.in_boundary = False
        self.sigterm_pending = False  # SIGTERM came inside boundary(): acted on at its end
        self.pid = os.getpid()  # a forked child inherits this object: it must do nothing with it
        self.lock = threading.RLock()
        self.error: str | None = None
        self.identity: tuple[int, int] | None = None  # (rank, world size) as torch.distributed said
        self.counted: list[int] = []  # counters mode: the step calls that opened and closed the counted range

    # arming ---------------------------------------------------------------------------------------

    def arm(self) -> None:
        _FINDER.add("torch", self._guard(self.torch_imported))
        if self.plan.step_fn:
            module, _, _ = self.plan.step_fn.partition(":")
            if module not in ("__main__", "__mp_main__"):
                _FINDER.add(module, self._guard(self.step_module_imported))

    def torch_imported(self, _torch: Any) -> None:
        (self.root / PROCS_DIR).mkdir(exist_ok=True)
        write_json(self.root / PROCS_DIR / f"{os.getpid()}.json",
                   {"pid": os.getpid(), "start_time": process_start_time(os.getpid()), "argv": sys.argv[:4]})
        if not self.plan.step_fn:
            from torch.optim.optimizer import register_optimizer_step_post_hook

            register_optimizer_step_post_hook(self._guard(self.optimizer_stepped))
            return
        module, _, _ = self.plan.step_fn.partition(":")
        if module in ("__main__", "__mp_main__"):
            self._watch_main()
        elif module in sys.modules:
            self.step_module_imported(sys.modules[module])

    def step_module_imported(self, module: Any) -> None:
        if "torch" in sys.modules:  # else when torch comes (torch_imported): inert without torch
            self._wrap_step_fn(module)

    def _watch_main(self) -> None:
        """``__main__:name``: the script defines its step function after torch was imported;
        wrap it as soon as the script's namespace holds it (checked on each function call until
        then, on this thread only, then the watch is gone)."""
        main = sys.modules.get("__main__")
        if main is None:
            return
        head = self.plan.step_fn.partition(":")[2].split(".")[0]
        namespace = main.__dict__
        if head in namespace:
            self._wrap_step_fn(main)
            return
        if sys.getprofile() is not None:
            raise RuntimeError(f"--step-fn {self.plan.step_fn}: another profiler (sys.setprofile) is active in this "
                               "process; name a function of an importable module instead")

        def watch(_frame: Any, _event: str, _arg: Any) -> None:
            if head in namespace:
                sys.setprofile(None)
                self._guard(self._wrap_step_fn)(main)

        sys.setprofile(watch)

    def _wrap_step_fn(self, module: Any) -> None:
        qualname = self.plan.step_fn.partition(":")[2]
        *owners, name = qualname.split(".")
        try:
            owner = module
            for part in owners:
                owner = getattr(owner, part)
            # a class's own attribute as defined (a staticmethod stays one), also when inherited
            raw = inspect.getattr_static(owner, name) if isinstance(owner, type) else getattr(owner, name)
        except AttributeError:
            raise AttributeError(f"--step-fn {self.plan.step_fn}: {module.__name__} has no {qualname}") from None
        kind = type(raw) if isinstance(raw, (staticmethod, classmethod)) else None
        fn = raw.__func__ if kind else raw
        if getattr(fn, "__taxmodel_step__", False):
            return
        if not callable(fn):
            raise TypeError(f"--step-fn {self.plan.step_fn}: {qualname} is not a function")
        hook = self

        @functools.wraps(fn)
        def step(*args: Any, **kwargs: Any) -> Any:
            hook.depth += 1
            try:
                out = fn(*args, **kwargs)
            finally:
                hook.depth -= 1
            if hook.depth == 0:
                hook._guard(hook.boundary)()
            return out

        step.__taxmodel_step__ = True  # type: ignore[attr-defined]
        setattr(owner, name, kind(step) if kind else step)

    def optimizer_stepped(self, optimizer: Any, _args: Any, _kwargs: Any) -> None:
        import weakref

        if self.optimizer is None or self.optimizer() is None:
            self.optimizer = weakref.ref(optimizer)
        if self.optimizer() is optimizer:  # several optimizers: the first one's calls are the steps
            self.boundary()

    # steps ----------------------------------------------------------------------------------------

    def boundary(self) -> None:
        """The end of step call ``self.calls``."""
        if not self.active or os.getpid() != self.pid:
            return
        with self.lock:
            self.in_boundary = True
            try:
                self.calls += 1
                c, plan = self.calls, self.plan
                if c == 1:
                    atexit.register(self._guard(self.at_exit))
                    self.state = "skipping"
                    self.write_status()
                if plan.mode == "counters":
                    self._counters_boundary(c)
                else:
                    self._trace_boundary(c)
            finally:
                self.in_boundary = False
        if self.sigterm_pending:
            self._terminate()

    def _trace_boundary(self, c: int) -> None:
        plan = self.plan
        if c == plan.skip - plan.warmup:
            self._start_profiler()
        elif self.prof is not None and c <= plan.last:
            self.prof.step()
            if c == plan.last:
                self._stop_profiler(complete=plan.steps)

    def _start_profiler(self) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile, schedule

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        self.prof = profile(activities=activities, record_shapes=True, with_stack=False,
                            schedule=schedule(wait=0, warmup=self.plan.warmup, active=self.plan.steps, repeat=1),
                            on_trace_ready=self._guard(self._export))
        self.prof.start()
        self.state = "tracing"
        self._catch_sigterm()
        self.write_status()

    def _stop_profiler(self, complete: int) -> None:
        """Stop the profiler (which writes the trace through ``_export`` when it was recording)."""
        prof, self.prof = self.prof, None
        self.complete = complete
        self._release_sigterm()
        prof.stop()
        if self.trace_file is None:  # stopped in the warm-up step: nothing was recorded
            self.state = "skipping"
        else:
            self.state = "written" if complete >= self.plan.steps else "partial"
        self.write_status()

    def _export(self, prof: Any) -> None:
        rank, _ = self.rank_and_world()
        traces = self.root / TRACE_DIR
        traces.mkdir(exist_ok=True)
        name = f"rank{rank}{TRACE_SUFFIX}"
        if (traces / name).exists():  # two processes say they are the same rank: keep both
            name = f"rank{rank}.pid{os.getpid()}{TRACE_SUFFIX}"
        raw = traces / f".{name}.{os.getpid()}.json"
        try:
            prof.export_chrome_trace(str(raw))
            import gzip
            import shutil

            packed = traces / f".{name}.{os.getpid()}.tmp"
            with open(raw, "rb") as src, gzip.open(packed, "wb", compresslevel=3) as dst:
                shutil.copyfileobj(src, dst)
            os.replace(packed, traces / name)
        finally:
            raw.unlink(missing_ok=True)
        self.trace_file = name

    def _counters_boundary(self, c: int) -> None:
        import torch

        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        if c == self.plan.skip:
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.profiler.start()
            self.state = "counting"
            self.counted = [c]
            self.write_status()
        elif c == self.plan.first:
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.profiler.stop()
            self.state = "counted"
            self.complete = 1
            self.counted.append(c)
            self.write_status()

    # ending -----------------------------------------------------------------------------------------

    def at_exit(self) -> None:
        if os.getpid() != self.pid:
            return
        with self.lock:
            if self.prof is not None:  # ended inside the traced steps: keep what is complete
                self._stop_profiler(complete=max(self.calls - self.plan.skip, 0))
            self.write_status(ended=True)

    def _catch_sigterm(self) -> None:
        """While tracing, SIGTERM (a launcher stopping the job) first writes what was traced, then
        ends the process as SIGTERM would have; only where the program left SIGTERM alone."""
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return

        def on_sigterm(_signum: int, _frame: Any) -> None:
            if self.in_boundary:  # inside a profiler transition: finish it first
                self.sigterm_pending = True
            else:
                self._terminate()

        signal.signal(signal.SIGTERM, on_sigterm)
        self.on_sigterm = on_sigterm

    def _terminate(self) -> None:
        """Write what was traced, then die of SIGTERM as the process would have without us."""
        self._guard(self.at_exit)()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    def _release_sigterm(self) -> None:
        """Put SIG_DFL back, unless the program installed a handler of its own meanwhile."""
        if self.on_sigterm is not None and threading.current_thread() is threading.main_thread():
            if signal.getsignal(signal.SIGTERM) is self.on_sigterm:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
            self.on_sigterm = None

    # reporting ----------------------------------------------------------------------------------

    def rank_and_world(self) -> tuple[int, int]:
        """torch.distributed's rank and world size (remembered: a process that destroyed its group
        at the end is still that rank), else the launcher's RANK/WORLD_SIZE, else 0 of 1."""
        dist = sys.modules.get("torch.distributed")
        try:
            if dist is not None and dist.is_available() and dist.is_initialized():
                self.identity = (int(dist.get_rank()), int(dist.get_world_size()))
        except Exception:  # noqa: BLE001 - a group being torn down: what was seen before, or the environment
            pass
        if self.identity is not None:
            return self.identity
        try:
            return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
        except ValueError:
            return 0, 1

    def write_status(self, ended: bool = False) -> None:
        rank, world = self.rank_and_world()
        torch = sys.modules.get("torch")
        cuda = bool(torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized())
        (self.root / STATUS_DIR).mkdir(exist_ok=True)
        write_json(self.status_path, {
            "pid": os.getpid(), "host": socket.gethostname(), "rank": rank, "world_size": world,
            "device": "cuda" if cuda else "cpu", "calls": self.calls, "state": self.state,
            "trace": self.trace_file, "complete_steps": self.complete, "counted_between_calls": self.counted,
            "ended": ended, "error": self.error,
            "time": time.time()})

    def _guard(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` that never raises into the user's program: a failure stands the hook down and
        is written to the status file."""
        @functools.wraps(fn)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001
                self.active = False
                self.state = "failed"
                self.error = f"{type(exc).__name__}: {exc}"
                try:
                    self.write_status()
                except Exception:  # noqa: BLE001 - no status: the traceback, where the runner looks too
                    _record_error(self.plan.to_json(), traceback.format_exc())
                return None
        return guarded
