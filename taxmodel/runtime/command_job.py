"""The user's command as one job: started in a session of its own, watched, and stopped as a whole.

Why a session of its own: a stop must reach every rank, and the terminal's Ctrl-C must come to
taxmodel first (which then stops the job and says what was captured) rather than kill both at
once. Why a registry on top of the process group: launchers start ranks in sessions of their
own (torchrun does), so the command's group does not hold them; every process that imported
torch registered itself with the step hook (``procs/<pid>.json``, with its kernel start time so
that a reused pid is never signalled), and a stop signals those too.

Stopping: SIGTERM (SIGINT for Ctrl-C, which the command would have had from the terminal) to the
command's group and to every registered process (each process once: ``once_per_group``), a grace
period, then SIGKILL; once every rank's
trace is written, SIGKILL at once (``run_job``). The command's processes never outlive the call,
however it ended.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from taxmodel.errors import InputError, Interrupted
from taxmodel.runtime.command_hook import PROCS_DIR, process_start_time
from taxmodel.runtime.launcher import KILL_GRACE_S, POLL_S, signals_held, signals_raise_interrupted


@dataclass
class JobEnd:
    """How the command ended: its exit status as a shell reports it (128 + the signal that ended
    it), and why taxmodel stopped it, if it did (``captured``: every rank's trace was written;
    ``timeout``)."""

    code: int
    stopped: str | None
    wall_s: float


def exit_status(returncode: int) -> int:
    """Popen's returncode as a shell shows it: -N (killed by signal N) becomes 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def registered(capture_dir: Path) -> list[int]:
    """The pids of the job's processes that imported torch and are still the same processes."""
    pids = []
    for f in sorted((capture_dir / PROCS_DIR).glob("*.json")):
        try:
            info = json.loads(f.read_text())
            pid = int(info["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        start = process_start_time(pid)
        if start is not None and start == info.get("start_time") and pid != os.getpid():
            pids.append(pid)
    return pids


def _signal(pid: int, sig: int, *, group: bool) -> None:
    """``sig`` to ``pid``'s process group when ``group`` and it leads one other than ours, else to ``pid``."""
    try:
        if group and os.getpgid(pid) == pid and pid != os.getpgid(0):
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def once_per_group(pids: Sequence[int]) -> list[int]:
    """``pids`` less repeats and less those a listed group leader's signal already reaches
    (``_signal`` signals a leader's whole group), so that each process gets the stop signal once: a
    second SIGINT arriving while a rank writes its trace interrupted the writing, and nothing was
    kept (the command, a group leader, is also a registered process). Gone processes are left out."""
    groups = {}
    for pid in dict.fromkeys(pids):
        try:
            groups[pid] = os.getpgid(pid)
        except ProcessLookupError:
            continue
    ours = os.getpgid(0)
    leaders = {pid for pid, pgid in groups.items() if pgid == pid and pid != ours}
    return [pid for pid, pgid in groups.items() if pid in leaders or pgid not in leaders]


def stop_job(child: subprocess.Popen, capture_dir: Path, sig: int, grace_s: float, *, spare_child: bool = False) -> None:
    """Stop the job: ``sig`` to the command's group (unless ``spare_child``: then the command, a
    tool such as ncu, is left to end by itself once its target processes are gone) and to every
    registered process; after ``grace_s``, SIGKILL to all of them; then reap the command."""
    with signals_held():
        for target in once_per_group(([] if spare_child else [child.pid]) + registered(capture_dir)):
            _signal(target, sig, group=True)
            _signal(target, signal.SIGCONT, group=True)  # a stopped process must run to act on it
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and (child.poll() is None or registered(capture_dir)):
            time.sleep(0.05)
        for target in [child.pid] + registered(capture_dir):
            _signal(target, signal.SIGKILL, group=True)
        child.wait()


def run_job(command: Sequence[str], env: Mapping[str, str], capture_dir: Path, *, done: Callable[[], bool],
            run_to_end: bool, timeout_s: float | None, grace_s: Callable[[], float],
            after_capture: int = signal.SIGKILL, spare_child_after_capture: bool = False,
            after_capture_grace_s: float = KILL_GRACE_S) -> JobEnd:
    """Run ``command`` until it ends; or, unless ``run_to_end``, until ``done()`` says every rank
    has what was asked (then the job is stopped with ``after_capture``); or until ``timeout_s``.
    Ctrl-C, SIGTERM or SIGHUP stop the job and raise Interrupted. ``grace_s()``: how long a
    stopped job gets before SIGKILL (longer while a rank may still be writing its trace).

    Why SIGKILL once every trace is written: nothing is left to save, and the job's own shutdown
    would only add noise (torchrun prints a traceback for SIGTERM) or side effects (a trainer's
    checkpoint-on-preemption handler writing the user's files)."""
    t0 = time.monotonic()
    with signals_raise_interrupted():
        try:
            child = subprocess.Popen(list(command), env=dict(env), start_new_session=True)
        except OSError as exc:
            raise InputError(f"{command[0]}: cannot run the command ({exc.strerror or exc})") from exc
        try:
            while True:
                code = child.poll()
                if code is not None:
                    leftovers = registered(capture_dir)  # ranks a dead launcher left behind
                    if leftovers:
                        stop_job(child, capture_dir, signal.SIGTERM, KILL_GRACE_S)
                    return JobEnd(exit_status(code), None, time.monotonic() - t0)
                if not run_to_end and done():
                    stop_job(child, capture_dir, after_capture, after_capture_grace_s,
                             spare_child=spare_child_after_capture)
                    return JobEnd(exit_status(child.returncode), "captured", time.monotonic() - t0)
                if timeout_s is not None and time.monotonic() - t0 > timeout_s:
                    stop_job(child, capture_dir, signal.SIGTERM, grace_s())
                    return JobEnd(exit_status(child.returncode), "timeout", time.monotonic() - t0)
                time.sleep(POLL_S)
        except KeyboardInterrupt as exc:
            code = getattr(exc, "exit_code", 130)
            stop_job(child, capture_dir, signal.SIGINT if code == 130 else signal.SIGTERM, grace_s())
            raise Interrupted(code - 128, "interrupted: the command and every rank were stopped") from None
        finally:
            if child.poll() is None:  # an error of ours: the job must not outlive the call
                stop_job(child, capture_dir, signal.SIGTERM, KILL_GRACE_S)
