"""Which ranks of the run a ledger covers, and what the ones it lacks make unknowable.

A trace of only some ranks (``taxmodel import --allow-missing-ranks``: often only rank 0 was
profiled) still gives every imported rank's ledger, but a collective's wait for the ranks that
are not there cannot be seen: the imported rank's collective kernels run from its own arrival,
so their time counts as exposed communication (an upper bound) and skew_wait as 0 -- unknown,
not zero. The ledger says so in its caveats, its JSON (``missing_ranks``) and the report.
"""
from __future__ import annotations

from typing import Sequence


def missing_ranks(meta: dict, ranks: Sequence[int]) -> list[int]:
    """Ranks of ``range(world_size)`` that are not among ``ranks`` (empty when the world size
    is unknown or every rank is present)."""
    world = meta.get("world_size")
    try:
        world = int(world)
    except (TypeError, ValueError):
        return []
    have = {int(r) for r in ranks}
    if world <= len(have):
        return []
    return [r for r in range(world) if r not in have]


def ranks_text(ranks: Sequence[int], limit: int = 8) -> str:
    """``1-7`` for a run of consecutive ranks, else a short comma list."""
    ranks = sorted(ranks)
    if ranks and ranks[-1] - ranks[0] + 1 == len(ranks) and len(ranks) > 2:
        return f"{ranks[0]}-{ranks[-1]}"
    shown = ", ".join(map(str, ranks[:limit]))
    return shown + (f", ... ({len(ranks)} in all)" if len(ranks) > limit else "")


def coverage_caveat(meta: dict, ranks: Sequence[int]) -> str | None:
    """The caveat for a ledger of a subset of the run's ranks, or None."""
    missing = missing_ranks(meta, ranks)
    if not missing:
        return None
    head = f"only {len(ranks)} of {len(ranks) + len(missing)} ranks were imported (missing: {ranks_text(missing)}): "
    if len(ranks) == 1:
        return head + ("skew_wait cannot be measured without the others, so it reads 0 (unknown, not zero) and "
                       "collective time counts as exposed_comm (an upper bound)")
    return head + ("skew_wait covers only waits among the imported ranks; waits for the missing ones count as "
                   "exposed_comm (an upper bound)")
