"""One message for a failed run: which rank failed or hung first, how (error, signal, exit code), and where.

When one rank dies, its peers fail a moment later in their next collective ("Connection reset by
peer"), so the first failure is the cause and the rest are echoes. A rank that reported an error
has a time on it (its status file); a rank that died without a word (SIGKILL, the OOM killer,
``os._exit``) has only the moment the launcher saw it gone, which is up to one poll late. So a
silent death counts as having happened one poll (plus some slack) before it was seen.
"""
from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Any, Mapping

SILENT_DEATH_SLACK_S = 0.5
"""How much earlier than it was seen a rank that died without a word may have died (poll + scheduling)."""


@dataclass(frozen=True)
class RankExit:
    """How one rank process ended: ``code`` for a normal exit, ``signal`` for a kill."""

    rank: int
    code: int | None = None
    signal: int | None = None
    seen_at: float = 0.0  # time.time() when the launcher saw it gone

    @property
    def failed(self) -> bool:
        return self.signal is not None or (self.code or 0) != 0

    def describe(self) -> str:
        if self.signal is not None:
            try:
                name = signal.Signals(self.signal).name
            except ValueError:
                name = f"signal {self.signal}"
            return f"was killed by {name}"
        return f"exited with code {self.code}"


def _where(s: Mapping[str, Any]) -> str:
    w = f"phase '{s.get('phase', '?')}'"
    if s.get("variant"):
        w += f" of variant '{s['variant']}'"
    return w + (s.get("at") or "")


def diagnose(statuses: Mapping[int, Mapping[str, Any]], world_size: int, *, timed_out: bool,
             timeout_s: float | None = None, exits: Mapping[int, RankExit] | None = None) -> str:
    """One message naming the rank that failed or hung first, the phase it was in, and how it ended.

    ``statuses`` are the ranks' status files; ``exits`` the ranks that ended before the launcher
    stopped the run (ranks it killed itself are not in it); ``timed_out`` that the launcher's own
    deadline passed.
    """
    exits = dict(exits or {})
    missing = [r for r in range(world_size) if r not in statuses]
    errors = {r: s for r, s in statuses.items() if s.get("error") and not s.get("timed_out")}
    silent = {r: e for r, e in exits.items() if e.failed and r not in errors
              and not statuses.get(r, {}).get("timed_out")}
    # The first failure is the cause; later ones usually failed because of it.
    firsts = [(float(s.get("time", 0.0)), r, "error") for r, s in errors.items()]
    firsts += [(e.seen_at - SILENT_DEATH_SLACK_S, r, "silent") for r, e in silent.items()]
    if firsts:
        _, r, kind = min(firsts)
        others = sorted((set(errors) | set(silent)) - {r})
        tail = f" (rank(s) {', '.join(map(str, others))} failed after it)" if others else ""
        if kind == "error":
            how = f" ({exits[r].describe()})" if r in exits and exits[r].signal is not None else ""
            return f"rank {r} failed in {_where(errors[r])}: {errors[r]['error']}{how}{tail}"
        s = statuses.get(r)
        where = f" in {_where(s)}" if s else " before it reported (at start-up)"
        hint = " (out of memory? killed by hand or by the batch system?)" if exits[r].signal is not None else ""
        return f"rank {r} {exits[r].describe()}{where} without an error message{hint}{tail}"
    unfinished = {r: s for r, s in statuses.items() if s.get("phase") != "done"}
    if timed_out or any(s.get("timed_out") for s in statuses.values()):
        limits = [s["timeout_s"] for s in statuses.values() if s.get("timed_out") and s.get("timeout_s")]
        limit = f" after {min(limits):g} s" if limits else (f" after {timeout_s:g} s" if timeout_s else "")
        busy = sorted(r for r, s in unfinished.items() if not s.get("waiting"))
        waiting = sorted(r for r, s in unfinished.items() if s.get("waiting"))
        if busy:
            msg = "; ".join(f"rank {r} hung in {_where(unfinished[r])}" for r in busy)
            if waiting:
                msg += f" (rank(s) {', '.join(map(str, waiting))} were waiting for it)"
        elif waiting:
            msg = f"ranks {', '.join(map(str, waiting))} all waiting in a barrier ({_where(unfinished[waiting[0]])})"
        else:
            msg = "no rank reported progress"
        if missing:
            msg += f"; rank(s) {', '.join(map(str, missing))} never started"
        return (f"run timed out{limit}: {msg}. Raise --timeout if the run is just slow; otherwise a rank is stuck "
                "(a spin-wait or a collective the others never joined)")
    if missing:
        return f"rank(s) {', '.join(map(str, missing))} never reported (crashed at start-up?); see the output above"
    if unfinished:
        dead = sorted(unfinished)
        return f"rank(s) {', '.join(map(str, dead))} stopped in {_where(unfinished[dead[0]])} without an error message"
    return "ranks failed after finishing; see the output above"
