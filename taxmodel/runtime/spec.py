"""What one ``taxmodel profile`` run is asked to do: the one list of its settings.

``ProfileSpec`` is that list, with its defaults: the CLI fills it from its options, the library's
``profile()`` takes it, ``build_spec`` checks it once on the host and sends it to the ranks as
JSON (``to_dict``/``from_dict``), and the worker's own command line (for ``torchrun`` across
nodes) is generated from its fields (``add_arguments``/``from_arguments``), so a new setting is
one new field here.

The checks that need nothing but the spec itself live here (``check``); those that need the
workload (presets, shape keys, variants) or the host (GPUs) live in ``profile.build_spec``.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping

from taxmodel.errors import InputError
from taxmodel.trace.capture_meta import AUTO_ALIGN, DEFAULT_GATE_HOLD_US, START_ALIGNMENTS, gate_hold_for

GRAPH_MODES = ("off", "auto", "require")


def _opt(default: Any, flag: str | None = None, help: str = "", **kw: Any) -> Any:  # noqa: A002 - argparse's word
    """A field that the worker's command line offers as ``flag`` (None: only through --spec)."""
    meta = {"flag": flag, "help": help}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta, **kw)
    return field(default=default, metadata=meta, **kw)


@dataclass
class ProfileSpec:
    workload: str = _opt(None, "--workload", "registered workload to run")
    variants: list[str] | None = _opt(None, "--variants", "comma-separated (default: every one available here)")
    preset: str | None = _opt(None, "--preset", "shape preset, or several comma-separated")
    shape: dict[str, int] = _opt({}, "--shape", "K=V, repeatable")
    world_size: int | None = _opt(None)  # local ranks (the host's launcher); torchrun's WORLD_SIZE on a rank
    iterations: int = _opt(5, "--iterations", "profiled iterations per repetition")
    warmup: int = _opt(2, "--warmup", "untimed iterations first")
    repeat: int = _opt(1, "--repeat", "independent repetitions")
    inject: list[str] = _opt([], "--inject", "a tax or a fault (taxmodel.runtime.inject), repeatable")
    tracer: str = _opt("torch", "--tracer")
    out: str = _opt("runs", "-o", "bundles go to OUT/WORKLOAD/VARIANT-SHAPE/")
    force: bool = _opt(False, "--force", "replace bundles of an earlier run at the same paths")
    device: str = _opt("auto", "--device", "auto, cuda or cpu")
    timeout_s: float = _opt(600.0, "--timeout", "seconds for the whole run (every rank's watchdog)")
    spin_timeout_s: float = _opt(60.0, "--spin-timeout", "seconds an in-kernel wait on a flag may last")
    heap_bytes: int | None = _opt(None, "--heap-size", "bytes of symmetric heap per rank")
    workload_modules: list[str] = _opt([], "--workload-module", "module or .py file registering a workload, repeatable")
    keep_raw: bool = _opt(True)
    progress: bool = _opt(True)
    instrument: bool = _opt(False, "--instrument", "in-kernel trace records from fused kernels (docs/records.md)")
    graph: str = _opt("off", "--graph", "replay one captured CUDA graph per iteration: auto falls back to eager "
                      "launches, require stops instead (taxmodel profile --graph/--graph-strict)")
    graph_backend: str = _opt("cuda")  # tests register a fake one (taxmodel.runtime.graph.register_backend)
    align: str = _opt(AUTO_ALIGN, "--align", "auto (back-to-back on GPUs, host on CPU), host (a host barrier before "
                      "each traced step), device (also a device gate before each) or back-to-back (one gate, then the "
                      "repetition's steps back to back)")
    gate_hold_us: float = _opt(DEFAULT_GATE_HOLD_US, "--gate-hold-us", "the device gate's hold per step (us)")
    allow_gpu_sizes: bool = _opt(False, "--allow-gpu-sizes", "on CPU, run shapes sized for GPUs all the same")
    deadline_unix: float | None = _opt(None)  # set by the local launcher: every rank's watchdog fires at this time
    counters_pass: bool = _opt(False)  # taxmodel.runtime.counters: one step under ncu, nothing traced or written

    def check(self) -> None:
        """InputError for a setting that is wrong whatever the workload (counts, modes, timeouts)."""
        if not self.workload:
            raise InputError("give a workload (taxmodel workloads lists them)")
        if self.world_size is not None and int(self.world_size) < 1:
            raise InputError(f"--world-size {self.world_size}: give 1 or more ranks (or leave it out: every GPU, 2 on CPU)")
        for name, value in (("iterations", self.iterations), ("repeat", self.repeat)):
            if value < 1:
                raise InputError(f"--{name} must be at least 1")
        if self.warmup < 0:
            raise InputError("--warmup must be 0 or more")
        if self.align not in (AUTO_ALIGN,) + START_ALIGNMENTS:
            raise InputError(f"--align {self.align!r}: choose one of {', '.join((AUTO_ALIGN,) + START_ALIGNMENTS)}")
        if self.gate_hold_us < 0:
            raise InputError("--gate-hold-us must be 0 or more")
        if self.timeout_s <= 0:
            raise InputError("--timeout must be positive")
        if self.spin_timeout_s <= 0:
            raise InputError("--spin-timeout must be positive")
        if self.heap_bytes is not None and int(self.heap_bytes) < 1:
            raise InputError(f"--heap-size {self.heap_bytes}: give the bytes of symmetric heap per rank (1 or more), "
                             "or leave it out (4 GiB on GPUs, 256 MiB on CPU)")

    def gate_hold_total_us(self, traced_warmup_steps: int) -> float:
        """The device gate's hold in this capture (``capture_meta.gate_hold_for``): per step, or for
        every step of a back-to-back repetition, its ``traced_warmup_steps`` included."""
        return gate_hold_for(str(self.align), float(self.gate_hold_us), int(traced_warmup_steps) + int(self.iterations))

    # --- to and from the ranks -------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ProfileSpec":
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise InputError(f"spec: unknown setting(s) {', '.join(unknown)} (a spec from another taxmodel version?)")
        return cls(**dict(data))

    # --- the worker's command line (torchrun across nodes) -----------------------------------

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """One option per field that has a flag; every default is None (= the spec's, or --spec's)."""
        for f in fields(cls):
            flag = f.metadata.get("flag")
            if not flag:
                continue
            kw: dict[str, Any] = {"dest": f.name, "help": f.metadata.get("help") or None, "default": None}
            if f.name in ("shape", "inject", "workload_modules"):
                kw["action"] = "append"
            elif f.name in ("instrument", "allow_gpu_sizes"):
                kw["action"] = "store_const"
                kw["const"] = True
            elif f.name == "graph":
                kw["choices"] = GRAPH_MODES
            elif f.name == "align":
                kw["choices"] = (AUTO_ALIGN,) + START_ALIGNMENTS
            elif f.type in ("int", "int | None") or f.name == "heap_bytes":
                kw["type"] = int
            elif f.type in ("float", "float | None"):
                kw["type"] = float
            parser.add_argument(*([flag, "--out"] if flag == "-o" else [flag]), **kw)

    def with_arguments(self, args: argparse.Namespace) -> "ProfileSpec":
        """This spec with the options given on the worker's command line applied (lists add up)."""
        changes: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(args, f.name, None)
            if value is None:
                continue
            if f.name == "variants":
                value = [v for v in value.split(",") if v]
            elif f.name == "shape":
                value = {**self.shape, **parse_shape(value)}
            elif f.name in ("inject", "workload_modules"):
                value = list(getattr(self, f.name)) + list(value)
            changes[f.name] = value
        return dataclasses.replace(self, **changes)


def parse_shape(items: list[str]) -> dict[str, int]:
    """``["M=4096", "N=8,K=2"]`` -> ``{"M": 4096, "N": 8, "K": 2}``; InputError naming a bad item."""
    out: dict[str, int] = {}
    for item in items:
        for part in filter(None, (s.strip() for s in item.split(","))):
            k, sep, v = part.partition("=")
            try:
                if not sep:
                    raise ValueError
                out[k.strip()] = int(v)
            except ValueError:
                raise InputError(f"--shape {part!r}: expected NAME=INTEGER, e.g. --shape M=4096") from None
    return out


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda`` where a GPU is visible, else ``cpu``; InputError for anything else."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cuda", "cpu"):
        raise InputError(f"--device {device}: choose auto, cuda or cpu")
    return device


def shape_tag(shape: Mapping[str, int]) -> str:
    """A shape as it appears in a bundle's directory name (``M96xN40xK40``)."""
    return "x".join(f"{k}{v}" for k, v in shape.items()) or "default"


def bundle_path(out: str | os.PathLike, workload: str, variant: str, shape: Mapping[str, int]) -> Path:
    """Where ``profile`` writes the bundle of one variant."""
    return Path(out) / workload / f"{variant}-{shape_tag(shape)}"


def import_workload_modules(modules: list[str]) -> None:
    """Import the user's workload modules (names on sys.path, or .py files) so that they register.
    A module that cannot be found, or that fails while it runs (a syntax error, an exception of its
    own), is the user's input: an InputError naming it and what it raised, not taxmodel's bug."""
    import importlib
    import importlib.util
    import sys
    from pathlib import Path

    for mod in modules:
        if mod.endswith(".py") and Path(mod).exists():
            name = f"taxmodel_user_workload_{Path(mod).stem}"
            spec = importlib.util.spec_from_file_location(name, mod)
            if spec is None or spec.loader is None:
                raise InputError(f"{mod}: cannot be imported as a workload module")
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            try:
                spec.loader.exec_module(module)
            except Exception as exc:  # noqa: BLE001 - the user's code: whatever it raises is bad input
                sys.modules.pop(name, None)
                raise InputError(f"--workload-module {mod}: importing it raised {_raised(exc)}") from exc
        else:
            try:
                importlib.import_module(mod)
            except ImportError as exc:
                raise InputError(f"--workload-module {mod}: cannot import it ({exc}); give a module name on sys.path or a .py file") from exc
            except Exception as exc:  # noqa: BLE001 - the user's code: whatever it raises is bad input
                raise InputError(f"--workload-module {mod}: importing it raised {_raised(exc)}") from exc


def _raised(exc: BaseException) -> str:
    """An exception as one line with the place it was raised (``RuntimeError: boom at wl.py:3``; a
    SyntaxError's own text names its file and line)."""
    import traceback

    text = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
    frames = traceback.extract_tb(exc.__traceback__)
    if frames and not isinstance(exc, SyntaxError):
        text += f" at {frames[-1].filename}:{frames[-1].lineno}"
    return text
