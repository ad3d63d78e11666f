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
from typing import Any, Callable, Mapping

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
    ranks_output: str | None = None  # where what the ranks printed on stderr is kept, said as a sentence


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
    if device == "cpu" and not spec.allow_gpu_sizes:
        check_cpu_size(cpu_costs(workload, preset, spec.shape, spec.variants or list(variants), world, _runs(spec)))
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


#: A CPU run whose shape is more than this many times the work per iteration of its workload's
#: CPU preset is refused without ``--allow-gpu-sizes`` when its cost cannot be estimated (a
#: workload of the user's). The CPU presets are sized for Triton's interpreter; the GPU presets of
#: the built-in workloads are 10^2-10^7 times more work.
CPU_WORK_LIMIT = 100.0

#: Seconds per iteration of the built-in variants whose kernels run in Triton's interpreter on CPU,
#: at their workload's CPU preset on a 2-core machine (benchmarks/results/cpu_interpreter.md): what
#: a larger shape's cost is scaled from. The interpreter runs a kernel's programs one tile at a time,
#: so its time grows with the work at a fixed tile size. Variants of torch ops (ag_gemm's and
#: gemm_rs's bsp: ms at the CPU preset, all overhead) have no such scale and are left out.
CPU_PRESET_SECONDS = {"ag_gemm": {"pull": 0.28, "push": 0.32}, "flash_decode": {"bsp": 0.32, "fused": 0.52},
                      "gemm_rs": {"fused": 0.95}}

#: The longest a variant may take on CPU (estimated) without ``--allow-gpu-sizes``.
CPU_RUN_LIMIT_S = 600.0

#: From this many times its CPU preset's work, a CPU run says at once what it will cost.
CPU_NOTE_RATIO = 10.0


@dataclass(frozen=True)
class CpuCost:
    """What one preset of a CPU run costs: ``ratio`` times the work per iteration of the workload's
    CPU preset ``base``, and, where a variant's interpreter time was measured (``CPU_PRESET_SECONDS``),
    about ``seconds`` for the slowest one's ``runs`` iterations."""

    name: str
    base: str
    ratio: float
    runs: int
    seconds: float | None

    @property
    def refused(self) -> bool:
        return self.seconds > CPU_RUN_LIMIT_S if self.seconds is not None else self.ratio > CPU_WORK_LIMIT

    def sentence(self) -> str:
        head = f"{self.name} is {self.ratio:,.0f}x the work per iteration of the CPU preset '{self.base}'"
        if self.seconds is None:
            return head
        return (f"{head}: about {_duration(self.seconds / self.runs)} per iteration in Triton's interpreter, "
                f"{_duration(self.seconds)} for the {self.runs} iterations each variant runs (scaled from "
                f"benchmarks/results/cpu_interpreter.md, a 2-core machine)")


def cpu_costs(workload: Any, presets: str, overrides: Mapping[str, int], variants: list[str], world: int,
              runs: int) -> list[CpuCost]:
    """Per preset of a CPU run, its ``CpuCost`` (none when the workload has no CPU preset to measure
    against). The work is FLOPs or HBM bytes per iteration, the larger ratio; the time, the slowest
    variant's (those without a measured interpreter time, a user's or torch ops, are left out of it)."""
    base = workload.cpu_preset
    if not base or base not in workload.presets:
        return []
    measured = CPU_PRESET_SECONDS.get(workload.name, {})
    out = []
    for one in presets.split(","):
        shape = workload.shape(one, **overrides)
        ratios = {v: _work_ratio(workload, shape, workload.shape(base), world, v) for v in variants}
        seconds = [measured[v] * r * runs for v, r in ratios.items() if v in measured]
        name = f"{workload.name} preset {one}" + (f" with {shape_tag(dict(overrides))}" if overrides else "")
        out.append(CpuCost(name, base, max(ratios.values(), default=0.0), runs, max(seconds) if seconds else None))
    return out


def check_cpu_size(costs: list[CpuCost]) -> None:
    """InputError, before any rank starts, for a CPU run of a shape sized for GPUs (``CpuCost.refused``)."""
    for c in costs:
        if c.refused:
            raise InputError(f"{c.sentence()}: it is sized for GPUs. Profile it on GPUs, use --preset {c.base} here, or "
                             "pass --allow-gpu-sizes to run it on CPU all the same")


def _work_ratio(workload: Any, shape: Mapping[str, int], base: Mapping[str, int], world: int, variant: str) -> float:
    """How many times the work of ``base`` one iteration of ``shape`` is (FLOPs or HBM bytes, the larger)."""
    try:
        big, small = workload.cost(shape, world, variant), workload.cost(base, world, variant)
    except (InputError, ValueError, ArithmeticError, KeyError, TypeError):
        return 0.0  # the CPU preset does not run at this world size: no measure
    return max(big.flops / max(small.flops, 1), big.hbm_bytes / max(small.hbm_bytes, 1))


def _duration(seconds: float) -> str:
    for unit, size in (("days", 86400.0), ("hours", 3600.0), ("minutes", 60.0)):
        if seconds >= 2 * size:
            return f"{seconds / size:,.0f} {unit}"
    return f"{seconds:,.1f} s" if seconds < 10 else f"{seconds:,.0f} s"


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


def _runs(spec: ProfileSpec) -> int:
    """Iterations each variant runs: the warm-up, one traced warm-up step, the profiled ones."""
    return int(spec.warmup) + 1 + int(spec.iterations) * int(spec.repeat)


def profile(req: ProfileSpec, *, quiet: bool = False, started_unix: float | None = None,
            say: Callable[[str], None] | None = None) -> ProfileOutcome:
    """Run the request on local ranks; return the bundles written (one per variant).

    ``req.timeout_s`` counts from ``started_unix`` (the command's start; default: this call's),
    so the checks here (imports of torch and the workloads) count too. ``say`` gets, before any
    rank starts, what a CPU run of a shape well beyond its CPU preset will cost."""
    started = time.time() if started_unix is None else started_unix
    spec, world, device = build_spec(req)
    if device == "cpu" and say is not None:
        from taxmodel.workload import get_workload

        wl = get_workload(spec["workload"])
        for c in cpu_costs(wl, spec["preset"], spec["shape"], spec["variants"] or list(wl.variants()), world,
                           _runs(ProfileSpec.from_dict(spec))):
            if c.ratio >= CPU_NOTE_RATIO:
                say(f"{c.sentence()}; the CPU preset is --preset {c.base}")
    replaced = _earlier_bundles(spec)
    result = launcher.launch_workers(spec, world, timeout_s=req.timeout_s, device=device, quiet=quiet,
                                     started_unix=started)
    info = result.result
    return ProfileOutcome(bundles=[Path(p) for p in info.get("bundles", [])], skipped=dict(info.get("skipped", {})),
                          shape=dict(next(iter(info.get("shapes", {}).values()), {})), world_size=world, device=device,
                          wall_s=result.wall_s, graph_fallbacks=list(info.get("graph_fallbacks", [])),
                          replaced=[p for p in replaced if p in {Path(b) for b in info.get("bundles", [])}],
                          ranks_output=launcher.ranks_output_note(result.output)
                          if result.output is not None and result.output.log is not None else None)


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
