"""``taxmodel profile``: check the request here, then run it on N local ranks.

Everything that can be wrong with the request (unknown workload, variant, preset, shape key,
tracer, injection; more ranks than GPUs) is reported here, before any rank starts, as an
InputError. The run itself is ``launcher.launch_workers`` over ``worker.py``; its failures come
back as RunError naming the rank and phase.
"""
from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from taxmodel.errors import InputError
from taxmodel.runtime import launcher
from taxmodel.runtime.inject import Fault, Injection
from taxmodel.runtime.spec import ProfileSpec, bundle_path, import_workload_modules, resolve_device, shape_tag
from taxmodel.trace.capture_meta import AUTO_ALIGN, default_alignment
from taxmodel.trace.bundle import prepare_output

ProfileRequest = ProfileSpec
"""What ``profile()`` takes: the run's settings (``taxmodel.runtime.spec``)."""


@dataclass
class ProfileOutcome:
    bundles: list[Path]
    skipped: dict[str, str]
    shape: dict[str, int]
    world_size: int
    device: str
    wall_s: float
    graph_fallbacks: list[str] = field(default_factory=list)  # variants profiled eagerly despite --graph, and why
    replaced: list[Path] = field(default_factory=list)  # earlier bundles this run replaced (--force)


def default_world_size(device: str) -> int:
    if device == "cuda":
        import torch

        return max(torch.cuda.device_count(), 1)
    return 2


def build_spec(req: ProfileSpec) -> tuple[dict[str, Any], int, str]:
    """Check ``req`` on this host and return (the spec sent to the ranks, world size, device kind)."""
    req.check()
    device = resolve_device(req.device)
    world = int(req.world_size or default_world_size(device))
    if device == "cuda":
        import torch

        if torch.cuda.device_count() < world:
            raise InputError(f"--world-size {world} needs {world} GPUs on this host, {torch.cuda.device_count()} visible; "
                             "use fewer ranks, or torchrun across nodes (see `python -m taxmodel.runtime.worker -h`)")
    spec = resolve_spec(dataclasses.replace(req, device=device, world_size=world))
    return spec.to_dict(), world, device


def resolve_spec(spec: ProfileSpec) -> ProfileSpec:
    """Check ``spec`` against its workload and return it resolved: preset chosen, module and output
    paths absolute. ``spec.device`` is resolved and ``spec.world_size`` set (the whole run's ranks).

    Everything that can be wrong with a request (unknown workload, variant, preset, shape key, a
    shape the workload cannot run at this world size, tracer, injection, graph mode) is an
    InputError here, before any rank starts; the ranks do not check again.
    """
    from taxmodel.workload import get_workload
    from taxmodel.trace.capture import get_tracer

    spec.check()
    device, world = spec.device, int(spec.world_size or 1)
    modules = [str(Path(m).resolve()) if m.endswith(".py") else m for m in spec.workload_modules]
    if device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # kernel modules imported below see it
    import_workload_modules(modules)
    workload = get_workload(spec.workload)
    preset = spec.preset or (workload.cpu_preset if device == "cpu" else workload.default_preset)
    for one in preset.split(","):  # several presets run in one process group
        workload.shape(one, **spec.shape)  # an unknown preset or a bad value is an InputError here
        unknown_keys = sorted(set(spec.shape) - set(workload.presets[one]) - set(workload.option_keys))
        if unknown_keys:
            options = f"; options: {', '.join(workload.option_keys)}" if workload.option_keys else ""
            raise InputError(f"{workload.name}: unknown shape key(s) {', '.join(unknown_keys)}; "
                             f"the shape has {', '.join(workload.presets[one])}{options}")
    variants = workload.variants()
    unknown = [v for v in (spec.variants or []) if v not in variants]
    if unknown:
        raise InputError(f"{workload.name}: unknown variant(s) {', '.join(unknown)}; choose from {', '.join(variants)}")
    inj = Injection.parse(spec.inject)
    if inj.sleep_rank is not None and inj.sleep_rank >= world:
        raise InputError(f"--inject sleep_rank={inj.sleep_rank}: there are only {world} ranks")
    for fault in Fault.parse(spec.inject):
        fault.check(world)
    _check_shapes(workload, preset, spec.shape, spec.variants or list(variants), world)
    get_tracer(spec.tracer)
    _check_graph_request(spec, workload, variants, device)
    if not spec.counters_pass:  # the counters pass re-runs a finished capture and writes nothing
        for path in planned_bundles(spec.out, workload, preset, spec.shape, spec.variants or list(variants)):
            prepare_output(path, force=spec.force)
    align = default_alignment(device) if spec.align == AUTO_ALIGN else spec.align
    return dataclasses.replace(spec, workload=workload.name, workload_modules=modules, preset=preset,
                               shape=dict(spec.shape), out=str(Path(spec.out).resolve()),
                               inject=list(spec.inject), instrument=bool(spec.instrument),
                               gate_hold_us=float(spec.gate_hold_us), align=align)


def planned_bundles(out: str, workload: Any, presets: str, overrides: Mapping[str, int], variants: list[str]) -> list[Path]:
    """The bundle paths a run writes (one per preset and variant). Before any rank starts, each is
    checked by ``trace.bundle.prepare_output``: a path holding anything but an earlier bundle is refused,
    an earlier bundle is replaced only with ``--force``."""
    return [bundle_path(out, workload.name, v, workload.shape(one, **overrides)) for one in presets.split(",") for v in variants]


def _check_shapes(workload: Any, presets: str, overrides: dict[str, int], variants: list[str], world: int) -> None:
    """Every shape the ranks would run, costed here for every variant: a shape the workload cannot
    run at this world size (M not a multiple of the ranks...) is an InputError before any rank starts."""
    for one in presets.split(","):
        shape = workload.shape(one, **overrides)
        for v in variants:
            try:
                workload.cost(shape, world, v)
            except InputError:
                raise
            except (ValueError, ArithmeticError, KeyError, TypeError) as exc:
                raise InputError(f"{workload.name}/{v}: the shape {shape_tag(shape)} cannot run on {world} rank(s) "
                                 f"({type(exc).__name__}: {exc}); change --shape, --preset or --world-size") from None


def _check_graph_request(req: ProfileSpec, workload: Any, variants: dict[str, Any], device: str) -> None:
    """``--graph-strict`` that cannot be honoured stops here, before any rank starts (exit 2)."""
    import torch

    from taxmodel.runtime.graph import check_mode, get_backend

    check_mode(req.graph)
    backend = get_backend(req.graph_backend, torch.device(device))
    if req.graph != "require":
        return
    why = backend.unavailable_reason()
    if why:
        raise InputError(f"--graph-strict: {why}; use --graph to profile with eager launches (bundles then say "
                         "capture.graph=false), or run on GPUs")
    unsafe = [v for v in (req.variants or list(variants)) if not getattr(variants[v], "graph_safe", False)]
    if unsafe:
        safe = [v for v in variants if getattr(variants[v], "graph_safe", False)]
        raise InputError(f"--graph-strict: {workload.name} variant(s) {', '.join(unsafe)} are not graph-safe (their run() "
                         "keeps per-iteration state on the host); choose graph-safe variants with --variants "
                         f"({', '.join(safe) or 'none here'}), or use --graph to profile the others with eager launches")


def profile(req: ProfileSpec, *, quiet: bool = False, started_unix: float | None = None) -> ProfileOutcome:
    """Run the request on local ranks; return the bundles written (one per variant).

    ``req.timeout_s`` counts from ``started_unix`` (the command's start; default: this call's),
    so the checks here (imports of torch and the workloads) count too."""
    started = time.time() if started_unix is None else started_unix
    spec, world, device = build_spec(req)
    replaced = _earlier_bundles(spec)
    result = launcher.launch_workers(spec, world, timeout_s=req.timeout_s, device=device, quiet=quiet,
                                     started_unix=started)
    info = result.result
    return ProfileOutcome(bundles=[Path(p) for p in info.get("bundles", [])], skipped=dict(info.get("skipped", {})),
                          shape=dict(next(iter(info.get("shapes", {}).values()), {})), world_size=world, device=device,
                          wall_s=result.wall_s, graph_fallbacks=list(info.get("graph_fallbacks", [])),
                          replaced=[p for p in replaced if p in {Path(b) for b in info.get("bundles", [])}])


def _earlier_bundles(spec: dict[str, Any]) -> list[Path]:
    """The bundles of an earlier run at this run's paths (only there with --force: see planned_bundles)."""
    from taxmodel.trace.bundle import META_FILE
    from taxmodel.workload import get_workload

    workload = get_workload(spec["workload"])
    paths = planned_bundles(spec["out"], workload, spec["preset"], spec["shape"], spec["variants"] or list(workload.variants()))
    return [p for p in paths if (p / META_FILE).is_file()]


def describe_workloads(workload_modules: list[str] | None = None) -> str:
    """A plain-text listing of every registered workload: presets (shapes) and variants."""
    from taxmodel.workload import all_workloads

    import_workload_modules(list(workload_modules or []))
    lines: list[str] = []
    for name, cls in sorted(all_workloads().items()):
        wl = cls()
        lines.append(f"{name}: {wl.description}".rstrip(": "))
        for preset, shape in wl.presets.items():
            marks = [m for m, p in (("default", wl.default_preset), ("cpu", wl.cpu_preset)) if p == preset]
            tag = f" ({', '.join(marks)})" if marks else ""
            lines.append(f"  preset {preset}{tag}: " + " ".join(f"{k}={v}" for k, v in shape.items()))
        try:
            variants = wl.variants()
        except Exception as exc:  # noqa: BLE001 - a broken workload must not hide the others
            lines.append(f"  variants: cannot be listed ({type(exc).__name__}: {exc})")
            continue
        for vname, v in variants.items():
            kind = "fine-grained" if v.fine_grained else "bulk-synchronous"
            lines.append(f"  variant {vname} [{kind}{', symmetric heap' if v.needs_heap else ''}]: {v.description}".rstrip(": "))
    return "\n".join(lines) if lines else "no workloads registered"
