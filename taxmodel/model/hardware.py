"""Hardware numbers the ledger and the predictor divide by: peak FLOP/s, HBM and link bandwidth.

Presets come from vendor datasheets (``source="datasheet"``) and ship as JSON under
``taxmodel/data/hardware/``; ``taxmodel calibrate`` writes the same JSON format with measured
numbers (``source="calibrated"``). A datasheet peak is an upper bound that real kernels rarely
reach, so a ledger computed with it shows a smaller ``useful`` share than a calibrated one; the
ledger says which source it used.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

from taxmodel.errors import InputError
from taxmodel.fsutil import atomic_write
from taxmodel.limits import read_small_text
from taxmodel.trace import bundle_meta as types

SOURCES = ("datasheet", "calibrated", "nominal")  # nominal: placeholder numbers for CPU emulation


@dataclass(frozen=True)
class HardwareSpec:
    """One GPU model's throughput and latency numbers (SI units: FLOP/s, bytes/s, seconds).

    ``link_bytes_per_s`` is the bandwidth with which one GPU can receive from its peers (one
    direction), the denominator of a workload's declared ``link_bytes``.
    """

    name: str
    vendor: str
    source: str
    peak_flops: Mapping[str, float]
    hbm_bytes_per_s: float
    link_bytes_per_s: float
    link_latency_s: float = 0.0
    launch_latency_s: float = 0.0
    kernel_gap_s: float = 0.0
    host_launch_s: float = 0.0
    flag_roundtrip_s: float = 0.0
    num_sms: int = 0
    #: Capacity of the cache that every SM shares in front of HBM (NVIDIA: the L2), bytes; 0 when the
    #: data sheet does not give it. The analytic model's locality uses it (docs/model.md).
    l2_bytes: int = 0
    aliases: tuple[str, ...] = ()
    notes: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """The name with where its numbers come from, said once (a calibrated spec's name already says so)."""
        return self.name if f"({self.source})" in self.name else f"{self.name} ({self.source})"

    def __post_init__(self) -> None:
        if not isinstance(self.source, str) or not self.source:
            raise InputError(f"hardware '{self.name}': field 'source' must name where the numbers come from, e.g. {SOURCES}")
        for key in ("hbm_bytes_per_s", "link_bytes_per_s"):
            if not float(getattr(self, key)) > 0:
                raise InputError(f"hardware '{self.name}': field '{key}' must be a positive number")
        if not self.peak_flops or any(not float(v) > 0 for v in self.peak_flops.values()):
            raise InputError(f"hardware '{self.name}': field 'peak_flops' must map dtypes to positive FLOP/s")

    def flops_per_s(self, dtype: str) -> float:
        """Peak FLOP/s for ``dtype``; raise InputError listing the known dtypes otherwise."""
        key = _DTYPE_ALIASES.get(dtype.lower(), dtype.lower())
        if key not in self.peak_flops:
            raise InputError(
                f"hardware '{self.name}' has no peak FLOP/s for dtype '{dtype}'; known: {', '.join(sorted(self.peak_flops))}. "
                "Add it to the hardware JSON (see `taxmodel calibrate`) or declare the cost in another dtype."
            )
        return float(self.peak_flops[key])

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["peak_flops"] = dict(self.peak_flops)
        d["aliases"] = list(self.aliases)
        d["extra"] = dict(self.extra)
        return d

    @staticmethod
    def from_dict(d: Mapping[str, Any], where: str = "hardware") -> "HardwareSpec":
        known = {f for f in HardwareSpec.__dataclass_fields__}
        missing = [k for k in ("name", "vendor", "source", "peak_flops", "hbm_bytes_per_s", "link_bytes_per_s") if k not in d]
        if missing:
            raise InputError(f"{where}: field '{missing[0]}' is missing (see taxmodel/data/hardware/*.json for the format)")
        types.check_fields(d, HARDWARE_FIELDS, where)
        values = {k: v for k, v in d.items() if k in known}
        values["extra"] = {**dict(d.get("extra") or {}), **{k: v for k, v in d.items() if k not in known}}
        values["peak_flops"] = {str(k).lower(): float(v) for k, v in dict(d["peak_flops"]).items()}
        values["aliases"] = tuple(str(a) for a in d.get("aliases", ()))
        try:
            return HardwareSpec(**values)
        except TypeError as exc:
            raise InputError(f"{where}: {exc}") from exc


HARDWARE_FIELDS = {
    "name": types.text, "vendor": types.text, "source": types.text, "peak_flops": types.values(types.number(0)),
    "hbm_bytes_per_s": types.number(0), "link_bytes_per_s": types.number(0), "link_latency_s": types.number(0),
    "launch_latency_s": types.number(0), "kernel_gap_s": types.number(0), "host_launch_s": types.number(0),
    "flag_roundtrip_s": types.number(0), "num_sms": types.integer(0), "l2_bytes": types.integer(0), "aliases": types.list_of(types.text),
    "notes": types.text, "extra": types.optional(types.mapping),
}
"""JSON types of a hardware file's fields (a wrong type is one line naming the field, not a traceback)."""


_DTYPE_ALIASES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32",
                  "float8": "fp8", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8"}


def presets() -> dict[str, HardwareSpec]:
    """The datasheet presets shipped with taxmodel, by name."""
    out = {}
    folder = resources.files("taxmodel") / "data" / "hardware"
    for entry in sorted(folder.iterdir(), key=lambda p: p.name):
        if entry.name.endswith(".json"):
            spec = HardwareSpec.from_dict(json.loads(entry.read_text()), where=f"preset {entry.name}")
            out[spec.name] = spec
    return out


def load_hardware(path: str | os.PathLike) -> HardwareSpec:
    """Read a hardware JSON file (a preset's format; `taxmodel calibrate` writes it)."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such hardware file")
    try:
        data = json.loads(read_small_text(path, "hardware file"))
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not valid JSON ({exc})") from exc
    except RecursionError as exc:
        raise InputError(f"{path}: nested too deeply to be a hardware file") from exc
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object")
    return HardwareSpec.from_dict(data, where=str(path))


def save_hardware(spec: HardwareSpec, path: str | os.PathLike) -> Path:
    """Write ``spec`` as JSON atomically (temp file + rename)."""
    path = Path(path)
    atomic_write(path, json.dumps(spec.to_dict(), indent=2, sort_keys=True) + "\n", what="hardware file")
    return path


def normalized_name(name: str) -> str:
    """A GPU name as presets are matched: lower case, punctuation and spaces as single spaces."""
    return re.sub(r"[^a-z0-9]+", " ", name.lower()).strip()


def find_preset(name: str) -> HardwareSpec | None:
    """The preset whose name or alias matches ``name`` (case and punctuation ignored), or whose
    alias occurs in it (so 'NVIDIA H200 141GB HBM3e' finds 'H200 SXM'); None when none does."""
    want = normalized_name(name)
    specs = presets()
    for spec in specs.values():
        if want in {normalized_name(spec.name), *(normalized_name(a) for a in spec.aliases)}:
            return spec
    # Longest alias first, so that 'h200' is not matched by a shorter 'h20'-style alias.
    candidates = sorted(((len(normalized_name(a)), spec) for spec in specs.values() for a in (spec.name, *spec.aliases)
                         if re.search(rf"\b{re.escape(normalized_name(a))}\b", want)), key=lambda t: -t[0])
    return candidates[0][1] if candidates else None


#: AMD GPUs report their gfx architecture as a CUDA-style compute capability in Kineto's deviceProperties
_AMD_ARCH_BY_CAPABILITY = {"9.0": "gfx90a", "9.4": "gfx942", "9.5": "gfx950"}


def device_arch(hw: Mapping[str, Any]) -> str | None:
    """The recorded device's architecture (``gcnArchName``, or an AMD GPU's compute capability as
    its gfx name), used to pick a preset when the device's name is not one; None otherwise."""
    arch = hw.get("arch")
    if isinstance(arch, str) and arch:
        return arch.split(":")[0]
    if hw.get("vendor") == "amd":
        return _AMD_ARCH_BY_CAPABILITY.get(str(hw.get("compute_capability", "")))
    return None


def resolve_hardware(meta: Mapping[str, Any] | None, name_or_path: str | os.PathLike | None = None, *,
                     prefer_calibrated: bool = False, search: tuple[str | os.PathLike, ...] = ()) -> HardwareSpec:
    """The spec to analyze a bundle with (``choose_hardware``'s spec): an explicit ``name_or_path``
    (a preset name or a JSON file) wins; else the bundle's ``meta["hardware"]``. The ledger asks
    without the calibrated preference; InputError says how to choose one when nothing names a known GPU."""
    return choose_hardware(name_or_path, meta, prefer_calibrated=prefer_calibrated, search=search)[0]


def calibrated_files(extra_dirs: tuple[str | os.PathLike, ...] = ()) -> list[Path]:
    """Calibrated hardware files that ship with taxmodel (``taxmodel/data/hardware/*calibrated*.json``)
    or lie in ``extra_dirs`` (e.g. ``profiles/``)."""
    out: list[Path] = []
    folder = resources.files("taxmodel") / "data" / "hardware"
    for entry in folder.iterdir():
        if entry.name.endswith(".json") and "calibrated" in entry.name:
            out.append(Path(str(entry)))
    for d in extra_dirs:
        p = Path(d)
        if p.is_dir():
            out.extend(sorted(q for q in p.glob("**/*calibrated*.json")))
    return sorted(set(out))


def choose_hardware(name_or_path: str | os.PathLike | None, meta: Mapping[str, Any] | None = None, *,
                    prefer_calibrated: bool, search: tuple[str | os.PathLike, ...] = ()) -> tuple[HardwareSpec, str]:
    """The one hardware resolver, for the ledger and for predictions alike: the spec for an explicit
    ``name_or_path`` or for the bundle ``meta``, and a sentence saying which one was used and why.

    1. A JSON path (or any existing file) is loaded as it is.
    2. A name (``name_or_path``, else the bundle's ``meta["hardware"]["name"]``) is matched against
       the presets (``find_preset``); a bundle's device whose name matches none (AMD's runtime calls
       an MI300X "AMD Radeon Graphics") is matched by its architecture (``device_arch``: gfx942).
    3. ``prefer_calibrated`` (what predictions ask, to be compared with measured time): a calibrated
       file for the same GPU, shipped with taxmodel or under ``search``, wins over the datasheet
       preset, unless the name is a datasheet preset's own ("H200 SXM" asks for the datasheet). The
       ledger asks without it: its useful floor stays on the preset the name matches.
    InputError says how to choose a spec when nothing names a known GPU."""
    if name_or_path is not None and (str(name_or_path).endswith(".json") or Path(str(name_or_path)).is_file()):
        spec = load_hardware(name_or_path)
        return spec, f"hardware: {spec.name} from {name_or_path} ({spec.source})"
    given = name_or_path is not None
    hw = {} if given else (meta or {}).get("hardware") or {}
    name = str(name_or_path) if given else (hw.get("name") if isinstance(hw, Mapping) else str(hw))
    preset = find_preset(str(name)) if name else None
    by_arch = ""
    if preset is None and not given and isinstance(hw, Mapping):
        arch = device_arch(hw)
        preset = find_preset(arch) if arch else None
        if preset is not None:
            by_arch = f", chosen by the device's architecture {arch} (the trace calls it '{name or '?'}')"
    if prefer_calibrated and (name or preset is not None):
        # Naming a datasheet preset by its own name ("H200 SXM") asks for the datasheet.
        asked_for_datasheet = preset is not None and preset.source == "datasheet" and bool(name) \
            and normalized_name(str(name)) == normalized_name(preset.name)
        for path in ([] if asked_for_datasheet else calibrated_files(search)):
            try:
                spec = load_hardware(path)
            except InputError:
                continue
            if spec.source != "calibrated":
                continue
            if (name and _same_name(spec, str(name))) or \
                    (preset is not None and any(_same_name(spec, a) for a in (preset.name, *preset.aliases))):
                return spec, f"hardware: {spec.name}, calibrated ({path.name}) in preference to the datasheet preset{by_arch}"
    if preset is None:
        choose = f"{', '.join(presets())}; or pass a JSON file written by `taxmodel calibrate`"
        if given:
            raise InputError(f"unknown hardware '{name}'; presets: {choose}")
        if name:
            raise InputError(f"the bundle's hardware '{name}' is not a known preset ({', '.join(presets())}); "
                             "pass --hardware NAME or --hardware FILE.json")
        if meta is None:
            raise InputError(f"no hardware given; pass --hardware with one of {', '.join(presets())} or a JSON file")
        raise InputError(f"the bundle does not say which GPU it ran on; pass --hardware with one of "
                         f"{', '.join(presets())} or a JSON file")
    if preset.source == "calibrated":
        why = " in preference to the datasheet preset" if prefer_calibrated else ""
        return preset, f"hardware: {preset.name}, calibrated (shipped with taxmodel){why}{by_arch}"
    if prefer_calibrated:
        return preset, (f"hardware: {preset.name} datasheet preset{by_arch} (no calibrated file for it; run "
                        "`taxmodel calibrate`)")
    return preset, f"hardware: {preset.name} {preset.source} preset{by_arch}"


def _same_name(spec: HardwareSpec, name: str) -> bool:
    return normalized_name(name) in {normalized_name(spec.name), *(normalized_name(a) for a in spec.aliases)}
