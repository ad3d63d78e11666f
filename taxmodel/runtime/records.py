"""Host side of in-kernel trace records: device buffers, the drain, and the clock alignment that
turns them into bundle rows of kind ``record`` (device side: ``kernels/device/trace.py``; docs/records.md).

Why per-iteration buffers instead of copying after every iteration: a copy or a reset issued
inside the traced loop is GPU activity of its own (a memcpy and a memset in the trace) that the
ledger would count as busy time. So before a repetition's traced loop ``RecordBook.arm`` allocates
one zeroed buffer per iteration and per instrumented kernel, ``set_iteration`` points the kernels
at the iteration's buffer (a kernel argument, no GPU work), and ``drain`` -- after the tracer
stopped -- copies every buffer to the host, decodes the records and frees the buffers, so the next
repetition starts from empty slots. Outside a traced loop (warm-up, checks) kernels write into a
scratch buffer whose records are never read.

Clocks: records hold %globaltimer ns (NVIDIA), s_memrealtime 10-ns ticks (AMD, scaled here) or the
host's monotonic ns (Triton's interpreter); kernel rows hold the tracer's clock. A record keeps its
end in full and the low 48 bits of its start (``decode`` restores the start from the end), so the
records of every rank carry absolute device times, as the per-rank offsets below need. ``merge_records``
aligns each instrumented kernel launch separately: the span of its records [first start, last
end] is centred in the kernel's [start, end] from the trace, then clipped to it. The residual
(how far the per-kernel offsets stray from one constant offset per rank, and how many spans were
longer than their kernel) goes into the bundle's meta under ``records``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import pandas as pd
import torch

from taxmodel.kernels.device import sync, trace

RECORD_COLUMNS = ("rank", "repetition", "iteration", "name", "cta", "phase", "start_ns", "end_ns")
"""Columns of a drained record frame (times on the device clock, ns)."""


def new_buffer(layout: trace.RecordLayout | int, device: torch.device | str, append: bool = False) -> torch.Tensor:
    """A zeroed record buffer with ``layout``'s slots (an int: that many CTA ids with the default
    records per id), its sizes in the header (layout: kernels/device/trace.py). ``append``: one cursor
    for every record (CUDA-graph slots that collect several launches) instead of fixed slots."""
    layout = as_layout(layout)
    buf = torch.zeros(trace.HEADER + trace.RECORD_WORDS * layout.slots, dtype=torch.int64, device=device)
    buf[trace.CTAS_WORD] = layout.ctas
    buf[trace.PER_CTA_WORD] = layout.per_cta
    buf[trace.APPEND_WORD] = int(append)
    return buf


def as_layout(layout: trace.RecordLayout | int) -> trace.RecordLayout:
    return layout if isinstance(layout, trace.RecordLayout) else trace.RecordLayout(int(layout))


def clear_buffer(buf: torch.Tensor) -> None:
    """Empty ``buf`` in place (same address, e.g. frozen in a CUDA graph), keeping its header sizes."""
    head = buf[trace.CTAS_WORD:trace.APPEND_WORD + 1].clone()
    buf.zero_()
    buf[trace.CTAS_WORD:trace.APPEND_WORD + 1] = head


def unwrap_start(start_low: np.ndarray, end: np.ndarray) -> np.ndarray:
    """A phase's start from the low ``CLOCK_BITS`` bits a record keeps, given its full end:
    ``end - ((end - start) mod 2^CLOCK_BITS)`` (exact for phases shorter than 2^48 ticks)."""
    mask = np.int64((1 << trace.CLOCK_BITS) - 1)
    return end - ((end - start_low) & mask)


def decode(buf: torch.Tensor, mode: int) -> tuple[pd.DataFrame, int]:
    """The records in ``buf`` as (cta, phase, start_ns, end_ns) and the number dropped for lack of room.

    Reads the buffer (a host sync on a GPU) and only its written slots (phase word != 0), in slot
    order (fixed slots: by CTA id, then the CTA's record order). Phase ids become names; AMD ticks
    become ns.
    """
    host = buf.detach().to("cpu").numpy()
    first, ctas, per_cta, append = (int(x) for x in host[:trace.APPEND_WORD + 1])
    slots = max(ctas, 0) * max(per_cta, 0)
    rec = host[trace.HEADER:trace.HEADER + trace.RECORD_WORDS * slots].reshape(-1, trace.RECORD_WORDS)
    if append:
        rec = rec[:min(max(first, 0), len(rec))]
        dropped = max(first - slots, 0)
    else:
        dropped = max(first, 0)
    rec = rec[rec[:, 1] != 0]
    scale = 10 if mode == sync.SYNC_AMD else 1
    phase_id = rec[:, 1] - 1
    names = np.asarray(trace.PHASES, dtype=object)
    known = (phase_id >= 0) & (phase_id < len(names))
    end = rec[:, 3].astype(np.int64)
    start = unwrap_start(rec[:, 2].astype(np.int64), end)
    frame = pd.DataFrame({
        "cta": rec[:, 0].astype(np.int64),
        "phase": np.where(known, names[np.clip(phase_id, 0, len(names) - 1)], "unknown"),
        "start_ns": start * scale,
        "end_ns": end * scale,
    })
    return frame, dropped


@dataclass
class RecordBuffer:
    """The record buffers of one instrumented kernel on one rank.

    ``tensor()`` is what the kernel gets as its record pointer at each launch: the current
    iteration's buffer while a traced loop runs, else a scratch buffer nobody reads.
    """

    name: str
    layout: trace.RecordLayout
    device: torch.device
    mode: int
    append: bool = False  # the kernel reads layout and mode from the header (graph profiling)
    scratch: torch.Tensor = field(init=False)
    slots: list[torch.Tensor] = field(default_factory=list)
    current: int = -1

    def __post_init__(self) -> None:
        self.scratch = new_buffer(self.layout, self.device)

    @property
    def code(self) -> int:
        """The kernel's ``INSTRUMENT`` constexpr (``kernels.device.trace.mark``): this layout as constants
        (fixed slots, no header loads), or 1 (read the header: the append mode of graph captures)."""
        return 1 if self.append else self.layout.code

    def tensor(self) -> torch.Tensor:
        if 0 <= self.current < len(self.slots):
            return self.slots[self.current]
        return self.scratch


class RecordBook:
    """Every instrumented kernel's buffers on one rank (``RankContext.records``)."""

    def __init__(self, append: bool = False) -> None:
        self.buffers: dict[str, RecordBuffer] = {}
        self.dropped: dict[str, int] = {}
        # Graph profiling (runtime/graph.GraphRecordSlots) swaps in append-mode buffers after the
        # kernels were set up, so their kernels must read the header: set before any setup.
        self.append = append

    def buffer(self, name: str, layout: trace.RecordLayout | int, device: torch.device | str,
               mode: int) -> RecordBuffer:
        """The buffer of kernel ``name`` (the name its rows carry in the trace), made on first use;
        ``layout``: its logical CTA ids and records per id (an int: CTA ids, default records per
        id), grown if a later setup needs more."""
        layout = as_layout(layout).rounded()
        buf = self.buffers.get(name)
        if buf is None or buf.device != torch.device(device) or buf.layout.union(layout) != buf.layout:
            if buf is not None and buf.device == torch.device(device):
                layout = buf.layout.union(layout)
            buf = RecordBuffer(name, layout, torch.device(device), mode, self.append)
            self.buffers[name] = buf
        return buf

    def arm(self, iterations: int) -> None:
        """Allocate one zeroed buffer per iteration for every kernel (before the traced loop)."""
        for buf in self.buffers.values():
            buf.slots = [new_buffer(buf.layout, buf.device) for _ in range(iterations)]
            buf.current = -1

    def clear(self, iteration: int) -> None:
        """Empty ``iteration``'s armed buffers in place (e.g. after a warm-up step wrote into them)."""
        for buf in self.buffers.values():
            clear_buffer(buf.slots[iteration])

    def set_iteration(self, iteration: int) -> None:
        """Kernels launched from now on write into ``iteration``'s buffers (no GPU work)."""
        for buf in self.buffers.values():
            buf.current = iteration

    def drain(self, rank: int, repetition: int = 0) -> pd.DataFrame:
        """Every armed iteration's records (device clock), then free the buffers: the next ``arm``
        starts from empty slots. Columns ``RECORD_COLUMNS``."""
        frames = []
        for buf in self.buffers.values():
            for it, slot in enumerate(buf.slots):
                frame, dropped = decode(slot, buf.mode)
                if dropped:
                    self.dropped[buf.name] = self.dropped.get(buf.name, 0) + dropped
                frames.append(frame.assign(rank=rank, repetition=repetition, iteration=it, name=buf.name))
            buf.slots = []
            buf.current = -1
        if not frames:
            return empty_records()
        return pd.concat(frames, ignore_index=True)[list(RECORD_COLUMNS)]


def empty_records() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series([], dtype=object if c in ("name", "phase") else np.int64) for c in RECORD_COLUMNS})


def book_for(ctx: Any) -> RecordBook:
    """The context's record book, made on first use (callers that copy the context, e.g. with
    ``dataclasses.replace``, must do so after this, or they get a book nobody drains)."""
    book = getattr(ctx, "records", None)
    if book is None:
        book = RecordBook()
        ctx.records = book
    return book


def record_buffer(ctx: Any, name: str, layout: trace.RecordLayout | int,
                  device: torch.device | str) -> RecordBuffer | None:
    """For a kernel's setup: its record buffer when ``ctx.instrument`` is set, else None (the
    kernel then compiles with ``INSTRUMENT=False``). ``layout``: the logical CTA ids the kernel
    records under and the most records one id writes per launch (``kernels.device.trace.RecordLayout``;
    an int: that many CTA ids, ``trace.RECORDS_PER_CTA`` records each)."""
    if not getattr(ctx, "instrument", False):
        return None
    return book_for(ctx).buffer(name, layout, device, sync.sync_mode(device))


# --- turning drained records into bundle rows ---------------------------------------------------


def merge_records(events: pd.DataFrame, records: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Align drained ``records`` (device clock) to their kernels in ``events`` and append them as
    rows of kind ``record``; return (events, summary for meta['records']).

    A launch is matched by (rank, repetition, iteration, kernel name); when a kernel ran several
    times in one iteration its records are aligned to the envelope of those launches. Records of
    launches missing from the trace are dropped (counted), as are records that end up empty.
    """
    info: dict[str, Any] = {"alignment": "per kernel launch: record span centred in the kernel's interval, then clipped",
                            "records": 0, "unmatched": 0, "empty_after_clip": 0, "spans_longer_than_kernel": 0,
                            "residual_ns": {}, "offset_ns": {}}
    if records.empty:
        return events, info
    key = ["rank", "repetition", "iteration", "name"]
    kern = events[events["kind"] == "kernel"]
    kspan = kern.groupby(key, as_index=False).agg(k_start=("start_ns", "min"), k_end=("end_ns", "max"),
                                                  device=("device", "first"), stream=("stream", "first"),
                                                  role=("role", "first"))
    rspan = records.groupby(key, as_index=False).agg(r_start=("start_ns", "min"), r_end=("end_ns", "max"))
    spans = rspan.merge(kspan, on=key, how="inner")
    k_mid2 = spans["k_start"].to_numpy(np.int64) + spans["k_end"].to_numpy(np.int64)
    r_mid2 = spans["r_start"].to_numpy(np.int64) + spans["r_end"].to_numpy(np.int64)
    spans["offset"] = (k_mid2 - r_mid2) // 2
    slack = (spans["k_end"] - spans["k_start"]) - (spans["r_end"] - spans["r_start"])
    info["spans_longer_than_kernel"] = int((slack < 0).sum())
    for r, g in spans.groupby("rank"):
        med = int(g["offset"].median())
        info["offset_ns"][str(int(r))] = med
        info["residual_ns"][str(int(r))] = int((g["offset"] - med).abs().max())
    rec = records.merge(spans[key + ["offset", "k_start", "k_end", "device", "stream", "role"]], on=key, how="inner")
    info["unmatched"] = int(len(records) - len(rec))
    start = np.clip(rec["start_ns"].to_numpy(np.int64) + rec["offset"].to_numpy(np.int64),
                    rec["k_start"].to_numpy(np.int64), rec["k_end"].to_numpy(np.int64))
    end = np.clip(rec["end_ns"].to_numpy(np.int64) + rec["offset"].to_numpy(np.int64),
                  rec["k_start"].to_numpy(np.int64), rec["k_end"].to_numpy(np.int64))
    keep = end > start
    info["empty_after_clip"] = int((~keep).sum())
    rows = pd.DataFrame({
        "rank": rec["rank"].to_numpy()[keep], "device": rec["device"].to_numpy()[keep],
        "stream": rec["stream"].to_numpy()[keep], "kind": "record", "role": rec["role"].to_numpy()[keep],
        "name": rec["name"].to_numpy()[keep], "start_ns": start[keep], "end_ns": end[keep],
        "repetition": rec["repetition"].to_numpy()[keep], "iteration": rec["iteration"].to_numpy()[keep],
        "cta": rec["cta"].to_numpy()[keep], "phase": rec["phase"].to_numpy()[keep],
    })
    info["records"] = int(keep.sum())
    return pd.concat([events, rows], ignore_index=True), info


def merge_gathered(events: pd.DataFrame, gathered: Sequence[Sequence[pd.DataFrame]],
                   dropped: Sequence[dict[str, int]] = ()) -> tuple[pd.DataFrame, dict[str, Any]]:
    """``merge_records`` over what rank 0 gathered: ``gathered[rank][repetition]`` frames."""
    frames = [f for per_rank in gathered for f in per_rank if f is not None and len(f)]
    records = pd.concat(frames, ignore_index=True) if frames else empty_records()
    events, info = merge_records(events, records)
    lost: dict[str, int] = {}
    for d in dropped:
        for name, n in (d or {}).items():
            lost[name] = lost.get(name, 0) + int(n)
    info["dropped_for_capacity"] = lost
    return events, info
