"""Revisions of the built-in kernels where what they do changed what the analytic model must assume.

A capture records the revision it ran (``meta.capture.kernel_revision``); a bundle captured before
that field existed gets the revision that was current at its capture time (``meta.created``),
read from this log. The model predicts a bundle with its own revision's mechanisms, so that
bundles of an older kernel stay validated as what they are. Like ``names``, this module imports
nothing.
"""
from __future__ import annotations

#: (revision, the first commit time (UTC, ISO 8601) a capture can have run it, what changed).
REVISIONS: tuple[tuple[int, str, str], ...] = (
    (1, "", "the first kernels: GEMM+RS's GEMM signals each pushed tile with a system-scope release that "
            "waits for that tile's stores, so a program's pushes do not overlap its next tile"),
    (2, "2026-11-27T23:10:03+00:00", "one GEMM engine for every fine-grained variant (kernels/device/tile_gemm.py); "
            "GEMM+RS's programs release their flags once, after their last tile (commit 10cf4fb)"),
    (3, "2026-11-28T11:14:00+00:00", "AG+GEMM's copy engines move a peer's slab in max(W, 4) copies, one flag "
            "each, instead of one copy and flag per M-block; the fine-grained kernels keep their epochs in "
            "per-program slots"),
    (4, "2026-11-28T15:25:00+00:00", "AG+GEMM pull on the copy engines pulls peer by peer on one stream (all of "
            "rank+1's slab, then rank+2's, ...) where the GEMM has at most 4096 columns per rank "
            "(GemmConfig.ce_order 'auto'); the GEMM takes the blocks in that order"),
    (5, "2026-11-28T16:00:00+00:00", "AG+GEMM pull on the copy engines takes 128x128 tiles where the own slab's 128x256 tiles fill "
            "less than half a wave, and pull there goes peer by peer (gemm_tiles.first_wave_tiles: M=1024 on 4 ranks)"),
    (6, "2026-11-28T18:30:00+00:00", "GEMM+RS's GEMM takes its tiles in rounds of one block of every peer and, a round "
            "behind, one own block (RsConfig.spread), so its pushes spread over the whole kernel instead of its "
            "first (W-1)/W"),
)
KERNEL_REVISION = REVISIONS[-1][0]
#: The first revision whose GEMM+RS GEMM takes its tiles in the spread order (RsConfig.spread).
RS_SPREAD_REVISION = 6


def revision_at(created: object) -> int:
    """The revision current at capture time ``created`` (an ISO 8601 UTC string as ``meta.created``
    holds it); the current one when the time is missing or unreadable (a capture with no date is
    taken as a new one)."""
    text = str(created or "")
    if len(text) < 10 or not text[:4].isdigit():
        return KERNEL_REVISION
    stamp = _utc(text)
    rev = REVISIONS[0][0]
    for number, since, _ in REVISIONS[1:]:
        if stamp >= _utc(since):
            rev = number
    return rev


def _utc(text: str) -> str:
    """``text`` comparable as a string: 'YYYY-MM-DDTHH:MM:SS' in UTC (a '+00:00' or 'Z' suffix dropped,
    a date alone taken as its midnight)."""
    body = text.strip().replace(" ", "T").removesuffix("Z").removesuffix("+00:00")
    return (body + "T00:00:00")[:19] if len(body) == 10 else body[:19]
