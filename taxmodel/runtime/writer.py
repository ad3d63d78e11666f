"""Rank 0's last phase: one variant's gathered traces imported and written as a bundle, with its meta.

The meta literal here is the capture's record of itself (what ran, where, how it was traced,
what was injected); ``trace.capture_meta`` defines the shared parts of its schema.
"""
from __future__ import annotations

import datetime as _dt
import tempfile
from pathlib import Path
from typing import Any, Mapping

from taxmodel.kernels.revisions import KERNEL_REVISION
from taxmodel.runtime.environment import hardware as _hardware, versions as _versions
from taxmodel.runtime.spec import bundle_path
from taxmodel.trace.capture_meta import GATE_ROLES, alignment_meta


def write_variant_bundle(session: Any, gathered: list[Any] | None, gathered_records: list[Any] | None,
                         graph: Mapping[str, Any] | None = None) -> Path:
    """Import ``gathered`` (every rank's raw traces of the session's variant) and write its bundle
    atomically under ``spec.out``; returns its path."""
    from taxmodel.runtime.inject import INJECTED_ROLES
    from taxmodel.trace.bundle import write_bundle
    from taxmodel.trace.capture import finish_events, iter_trace_files

    run = session.run
    spec, workload, vname, variant, shape = run.spec, run.workload, session.vname, session.variant, session.shape
    preset, world, device, cost, clock = session.preset, run.world, run.device, session.cost, run.clock
    injection, injector, tracer_cls = run.injection, session.injector, run.tracer_cls
    discarded_repetitions = session.discarded
    roles = {**INJECTED_ROLES, **GATE_ROLES, **dict(variant.roles)}

    emulated = device.type != "cuda"
    out = bundle_path(spec.out, workload.name, vname, shape)
    with tempfile.TemporaryDirectory(prefix="taxmodel-traces-") as tmp:
        per_rep, imported_meta, raw_files = [], {}, []
        for paths in iter_trace_files(Path(tmp), gathered, tracer_cls.file_suffix):
            events, imported_meta = tracer_cls.read(paths)
            per_rep.append(events)
            raw_files.extend(paths)
        events = finish_events(per_rep, roles, emulated=emulated)
        graph = dict(graph or {"graph": False, "graph_mode": "off"})
        records_info = None
        if gathered_records is not None:
            events, records_info = _merge_records(events, gathered_records, bool(graph["graph"]))
        hardware = {**(imported_meta.get("hardware") or {}), **_hardware(device, world)}
        software = {**(imported_meta.get("software") or {}), **_versions()}
        notes = _notes(imported_meta, injector, events, graph, emulated)
        meta = {
            "source": "capture",
            "workload": workload.name,
            "variant": vname,
            "description": variant.description,
            "workload_config": (workload.config_summary(device, shape=shape, world=world, variant=vname)
                                if hasattr(workload, "config_summary") else None),
            "fine_grained": bool(variant.fine_grained),
            "shape": dict(shape),
            "preset": preset,
            "dtype": cost.dtype,
            "world_size": world,
            "ranks": list(range(world)),
            "hardware": hardware,
            "software": software,
            "clock_offsets_ns": clock["offsets_ns"],
            "clock": {k: v for k, v in clock.items() if k != "offsets_ns"},
            "capture": {
                "tracer": spec.tracer,
                "warmup": int(spec.warmup),
                "traced_warmup": session.traced_warmup_steps,
                "discarded_repetitions": int(discarded_repetitions),
                "replay_step_us": session.replay_step_us,
                "replay_method": session.replay_method,
                "replay_note": session.replay_note,
                "kernel_revision": KERNEL_REVISION,
                "iterations": int(spec.iterations),
                "repetition": int(spec.repeat),
                "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                "emulated_gpu": emulated,
                # Offsets come from the capture itself: 0 on one host (one clock), ping-pongs across hosts.
                "clock_offsets_source": "measured",
                "clock_uncertainty_ns": int(clock.get("uncertainty_ns", 0) or 0),
                "device": device.type,
                "inject": injection.to_dict() if injection.active else None,
                "roles": dict(roles),
                "iteration_pattern": r"^ProfilerStep#(\d+)$",
                "instrument": gathered_records is not None,
                **alignment_meta(spec.align, spec.gate_hold_total_us(session.traced_warmup_steps)),
                **graph,
            },
            "repetitions": int(spec.repeat),
            "cost": cost.to_dict(),
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "notes": notes,
        }
        if records_info is not None:
            meta["records"] = records_info
        return write_bundle(out, events, meta, raw_files=raw_files if spec.keep_raw else (), overwrite=spec.force)


def _merge_records(events: Any, gathered_records: list[Any], graph: bool) -> tuple[Any, dict[str, Any]]:
    """The ranks' in-kernel records merged into ``events`` (``records.merge_gathered``), and the
    bundle's ``meta.records``. Under a CUDA graph a rank keeps one record buffer per repetition, so
    each record is first placed in the traced launch it fits at its rank's clock offset."""
    from taxmodel.runtime.records import merge_gathered

    per_rank = [g[0] for g in gathered_records]
    unplaced = 0
    if graph:  # one buffer per repetition: iterations told apart by time
        from taxmodel.runtime.graph import assign_graph_record_iterations

        placed = []
        for frames in per_rank:
            row = []
            for frame in frames:
                frame, n = assign_graph_record_iterations(events, frame)
                unplaced += n
                row.append(frame)
            placed.append(row)
        per_rank = placed
    events, records_info = merge_gathered(events, per_rank, [g[1] for g in gathered_records])
    if graph:
        records_info["iterations_from"] = ("one buffer per repetition under a graph: each record placed in the traced "
                                           "launch it fits at its rank's clock offset")
        records_info["unplaced"] = unplaced
    return events, records_info


def _notes(imported_meta: Mapping[str, Any], injector: Any, events: Any, graph: Mapping[str, Any],
           emulated: bool) -> list[str]:
    """The bundle's ``meta.notes``: the tracer's, the injector's, and what a reader must know of
    how it was captured (a CPU capture, a CUDA graph, --graph that fell back to eager launches)."""
    notes = list(imported_meta.get("notes") or []) + (injector.notes if injector is not None else [])
    if emulated:
        notes.append("CPU capture: kernel rows are the host ranges of kernels run synchronously in Triton's "
                     "interpreter or torch on CPU, collectives are gloo's; times say nothing about GPUs")
    if graph["graph"]:
        from taxmodel.runtime.graph import GRAPH_NOTE, graph_trace_notes

        notes.append(GRAPH_NOTE)
        notes.extend(graph_trace_notes(events, str(graph.get("graph_backend"))))
    elif graph.get("graph_note"):
        notes.append(f"profiled with eager launches although --graph was given: {graph['graph_note']}")
    return notes
