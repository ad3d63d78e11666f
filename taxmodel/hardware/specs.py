"""Hardware numbers the ledger and the predictor divide by: peak FLOP/s, HBM and link bandwidth.

Presets come from vendor datasheets (``source="datasheet"``) and ship as JSON under
``taxmodel/data/hardware/``; ``taxmodel calibrate`` writes the same JSON format with measured
numbers (``source="calibrated"``). A datasheet peak is an upper bound that real kernels rarely
reach, so a ledger computed with it shows a smaller ``useful`` share than a calibrated one; the
ledger says which source it used. A GPU with no preset gets a spec estimated from what its trace
recorded (``source="estimated"``, ``estimate.py``), its basis in its notes.

Names (docs/hardware.md): every shipped spec has one **key** per part and source (``h200``,
``h200-calibrated``), which ``--hardware`` takes; its display name (``"H200 SXM"``) names the same
spec, case and punctuation ignored. A trace's device name ("NVIDIA H200") names the *part*: its
calibration when one ships with taxmodel, else its datasheet preset.
"""
from __future__ import annotations

import difflib
import json
import os
import re
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

from taxmodel.errors import InputError
from taxmodel.fsutil import atomic_write
from taxmodel.limits import read_small_text
from taxmodel.hardware import estimate
from taxmodel.hardware.gpu_names import normalized_name
from taxmodel.trace import bundle_meta as types

SOURCES = ("datasheet", "calibrated", "estimated", "nominal")  # nominal: placeholder numbers for CPU emulation

#: PCIe transfer rate per lane (GT/s) and line-code efficiency per generation (PCI-SIG base
#: specifications: 8b/10b for 1-2, 128b/130b for 3-5, 242/256 FLIT for 6)
PCIE_LANE_RATE = {1: (2.5e9, 8 / 10), 2: (5e9, 8 / 10), 3: (8e9, 128 / 130), 4: (16e9, 128 / 130), 5: (32e9, 128 / 130),
                  6: (64e9, 242 / 256)}


def pcie_bytes_per_s(gen: int, lanes: int) -> float:
    """Raw bandwidth of a PCIe link in one direction (bytes/s): lanes x transfer rate x line-code
    efficiency / 8; 0 for an unknown generation. Packet headers take a further 5-15% in practice,
    so a copy's floor at this rate is a lower bound."""
    rate = PCIE_LANE_RATE.get(int(gen))
    return rate[0] * rate[1] / 8 * int(lanes) if rate and lanes > 0 else 0.0


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
    #: GPU-side gap between consecutive kernels of one replayed CUDA graph (``taxmodel calibrate``'s
    #: launch step); 0 when not measured (the model then uses ``kernel_gap_s`` in graphs too).
    graph_kernel_gap_s: float = 0.0
    host_launch_s: float = 0.0
    flag_roundtrip_s: float = 0.0
    num_sms: int = 0
    #: Capacity of the cache that every SM shares in front of HBM (NVIDIA: the L2), bytes; 0 when the
    #: data sheet does not give it. The analytic model's locality uses it (docs/model.md).
    l2_bytes: int = 0
    aliases: tuple[str, ...] = ()
    notes: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)
    #: The one name ``--hardware`` takes for this spec (``h200``, ``h200-calibrated``); a shipped
    #: file without one is keyed by its file name; "" for a file given by its path.
    key: str = ""
    #: Architecture, to estimate parts without a preset from their relatives: NVIDIA's compute
    #: capability ("8.6"), AMD's gfx target ("gfx90a"); "" unknown.
    arch: str = ""
    #: Memory size as the data sheet gives it (GB); tells variants of one part apart (GH200 96/144 GB).
    memory_gb: float = 0.0
    #: Link between host memory and the GPU ("pcie", "nvlink-c2c", "integrated": host memory is
    #: device memory; "" unknown), its PCIe generation and width, or its rate in one direction.
    host_link: str = ""
    pcie_gen: int = 0
    pcie_lanes: int = 0
    host_link_bytes_per_s: float = 0.0
    #: What ``link_bytes_per_s`` runs over ("nvlink", "pcie", "infinity fabric"; "" unknown).
    peer_link: str = ""
    #: Fields that are estimates, not data-sheet numbers (e.g. "peak_flops.bf16"); the notes give the basis.
    estimated: tuple[str, ...] = ()
    #: The clock the peaks are given at (Hz; 0 when the data sheet does not say), to scale them to
    #: the clock a trace of a related part records (``estimate.py``).
    boost_clock_hz: float = 0.0

    @property
    def label(self) -> str:
        """The name with where its numbers come from, said once (a calibrated spec's name already says so)."""
        return self.name if f"({self.source})" in self.name else f"{self.name} ({self.source})"

    @property
    def shown(self) -> str:
        """``label`` with the key that selects this spec (``h200: H200 SXM (datasheet)``)."""
        return f"{self.key}: {self.label}" if self.key else self.label

    @property
    def host_bytes_per_s(self) -> float:
        """Host link bandwidth in one direction (bytes/s): given, else from the PCIe generation and
        width; 0 when unknown (``host_link_of`` then looks at the datasheet preset of the same part)."""
        if self.host_link_bytes_per_s > 0:
            return float(self.host_link_bytes_per_s)
        return pcie_bytes_per_s(self.pcie_gen, self.pcie_lanes) if self.host_link == "pcie" else 0.0

    @property
    def host_link_text(self) -> str:
        """The host link in words ("PCIe Gen4 x16", "NVLink-C2C"); "" when unknown."""
        if self.host_link == "pcie" and self.pcie_gen:
            return f"PCIe Gen{self.pcie_gen} x{self.pcie_lanes}"
        return {"nvlink-c2c": "NVLink-C2C", "integrated": "shared memory (integrated GPU)"}.get(self.host_link, self.host_link)

    def __post_init__(self) -> None:
        if not isinstance(self.source, str) or not self.source:
            raise InputError(f"hardware '{self.name}': field 'source' must name where the numbers come from, e.g. {SOURCES}")
        for key in ("hbm_bytes_per_s", "link_bytes_per_s"):
            if not float(getattr(self, key)) > 0:
                raise InputError(f"hardware '{self.name}': field '{key}' must be a positive number")
        if not self.peak_flops or any(not float(v) > 0 for v in self.peak_flops.values()):
            raise InputError(f"hardware '{self.name}': field 'peak_flops' must map dtypes to positive FLOP/s")
        if self.host_link == "pcie" and self.pcie_gen and self.pcie_gen not in PCIE_LANE_RATE:
            raise InputError(f"hardware '{self.name}': field 'pcie_gen' must be one of {sorted(PCIE_LANE_RATE)}")

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
        d["estimated"] = list(self.estimated)
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
        values["estimated"] = tuple(str(a) for a in d.get("estimated", ()))
        try:
            return HardwareSpec(**values)
        except TypeError as exc:
            raise InputError(f"{where}: {exc}") from exc


HARDWARE_FIELDS = {
    "name": types.text, "vendor": types.text, "source": types.text, "peak_flops": types.values(types.number(0)),
    "hbm_bytes_per_s": types.number(0), "link_bytes_per_s": types.number(0), "link_latency_s": types.number(0),
    "launch_latency_s": types.number(0), "kernel_gap_s": types.number(0), "graph_kernel_gap_s": types.number(0),
    "host_launch_s": types.number(0),
    "flag_roundtrip_s": types.number(0), "num_sms": types.integer(0), "l2_bytes": types.integer(0), "aliases": types.list_of(types.text),
    "notes": types.text, "extra": types.optional(types.mapping), "key": types.text, "arch": types.text,
    "memory_gb": types.number(0), "host_link": types.text, "pcie_gen": types.integer(0, 6), "pcie_lanes": types.integer(0, 32),
    "host_link_bytes_per_s": types.number(0), "peer_link": types.text, "estimated": types.list_of(types.text),
    "boost_clock_hz": types.number(0),
}
"""JSON types of a hardware file's fields (a wrong type is one line naming the field, not a traceback)."""


_DTYPE_ALIASES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32",
                  "float8": "fp8", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8"}


# --- the shipped files -----------------------------------------------------------------------------

@lru_cache(maxsize=1)
def _shipped() -> tuple[HardwareSpec, ...]:
    """Every hardware file shipped with taxmodel, keyed (a file without a key by its name)."""
    out: list[HardwareSpec] = []
    folder = resources.files("taxmodel") / "data" / "hardware"
    for entry in sorted(folder.iterdir(), key=lambda p: p.name):
        if entry.name.endswith(".json"):
            spec = HardwareSpec.from_dict(json.loads(entry.read_text()), where=f"preset {entry.name}")
            stem = entry.name[:-5].lower().replace("_", "-")
            taken = {s.key for s in out}
            # a file without a key, or whose key another file took first (a calibration copied from
            # another), is keyed by its file name
            out.append(spec if spec.key and spec.key not in taken else replace(spec, key=stem))
    return tuple(out)


def presets() -> dict[str, HardwareSpec]:
    """The specs shipped with taxmodel (datasheet presets and calibrations), by name."""
    return {s.name: s for s in _shipped()}


def specs_by_key() -> dict[str, HardwareSpec]:
    """The specs shipped with taxmodel by key (``h200``, ``h200-calibrated``, ``t4``, ...)."""
    return {s.key: s for s in _shipped()}


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


# --- names ---------------------------------------------------------------------------------------

def find_preset(name: str, num_sms: int | None = None) -> HardwareSpec | None:
    """The shipped spec ``name`` names: a key (``h200-calibrated``) or a display name ("H200 SXM")
    exactly, else the part a device name names (``find_part``); None when none does."""
    return _named(name) or find_part(name, num_sms)


def _named(name: str) -> HardwareSpec | None:
    """The shipped spec whose key or display name is ``name``; spaces, case and punctuation
    ignored ('RTX4090', 'rtx_4090' and 'GeForce RTX 4090' name rtx-4090)."""
    want = normalized_name(str(name)).replace(" ", "")
    for spec in _shipped():
        if want in (normalized_name(spec.key).replace(" ", ""), normalized_name(spec.name).replace(" ", "")):
            return spec
    return None


def find_part(name: str, num_sms: int | None = None) -> HardwareSpec | None:
    """The datasheet preset of the part a device name names: a preset whose alias is the name
    (case and punctuation ignored), else whose longest alias occurs in it as words (so 'NVIDIA
    H200 141GB HBM3e' finds 'H200 SXM' and 'NVIDIA GH200 144G HBM3e' the 144 GB GH200, not
    'h200'). Calibrations are not parts. With the device's SM count (``num_sms``), a preset that
    has another count is a different part ('RTX 3080 Ti' is not an 'RTX 3080') and is skipped."""
    want = normalized_name(str(name))
    parts = [s for s in _shipped() if s.source != "calibrated"]

    def fits(spec: HardwareSpec) -> bool:
        return not (num_sms and spec.num_sms and int(num_sms) != spec.num_sms)

    for spec in parts:
        if want in {normalized_name(a) for a in (spec.name, *spec.aliases)} and fits(spec):
            return spec
    candidates = sorted(((len(normalized_name(a)), spec) for spec in parts for a in (spec.name, *spec.aliases)
                         if re.search(rf"\b{re.escape(normalized_name(a))}\b", want) and fits(spec)), key=lambda t: -t[0])
    return candidates[0][1] if candidates else None


def suggest(name: str, n: int = 3) -> list[str]:
    """Keys close to a mistyped name, for "did you mean" (keys and display names are compared)."""
    want = normalized_name(str(name))
    options = {normalized_name(s.key): s.key for s in _shipped()}
    options.update({normalized_name(s.name): s.key for s in _shipped()})
    close = difflib.get_close_matches(want, list(options), n=n, cutoff=0.6)
    return list(dict.fromkeys(options[c] for c in close))


def known_keys() -> str:
    """The keys ``--hardware`` takes, for messages."""
    return ", ".join(sorted(s.key for s in _shipped()))


def describe(key: str | None = None) -> str:
    """What ``taxmodel hardware`` prints: every shipped spec by key (source, bf16/fp16 and fp32
    peaks, HBM, peer and host links), or one spec's fields, sources and notes in full."""
    if key is not None:
        spec = find_preset(key)
        if spec is None:
            close = suggest(key)
            raise InputError(f"unknown hardware '{key}'{'; did you mean ' + ' or '.join(close) + '?' if close else ''} "
                             f"(keys: {known_keys()})")
        d = spec.to_dict()
        lines = [f"{spec.shown}"] + [f"  {k}: {v}" for k, v in d.items() if k not in ("notes", "extra", "key") and v not in ("", 0, 0.0, [], {})]
        lines += [f"  {k}: {v}" for k, v in (spec.extra or {}).items()] + [f"  notes: {spec.notes}"]
        return "\n".join(lines)
    rows = ["key               name                      source      bf16/fp16 TF  fp32 TF  HBM GB/s  peer GB/s  host link",
            "----------------  ------------------------  ----------  ------------  -------  --------  ---------  ------------------"]
    for spec in sorted(_shipped(), key=lambda s: s.key):
        tensor = spec.peak_flops.get("bf16") or spec.peak_flops.get("fp16") or 0.0
        rows.append(f"{spec.key:<16}  {spec.name[:24]:<24}  {spec.source:<10}  {tensor / 1e12:>12,.1f}  "
                    f"{spec.peak_flops.get('fp32', 0.0) / 1e12:>7,.1f}  {spec.hbm_bytes_per_s / 1e9:>8,.0f}  "
                    f"{spec.link_bytes_per_s / 1e9:>9,.1f}  {host_link_of(spec)[1] or 'unknown'}")
    rows.append("taxmodel hardware KEY: one spec in full (its data sheet and notes); --hardware takes a key, a name or a FILE.json")
    return "\n".join(rows)


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


def find_by_arch(arch: str, num_sms: int | None = None) -> HardwareSpec | None:
    """The datasheet preset of an architecture (an AMD gfx target) with the device's compute-unit
    count when the trace records one (gfx90a: an MI250 die and an MI210 have 104, an MI250X die
    110; between parts of one count, whose peaks are the same, the MI250: ROCm names an MI210 by
    its name but an MI250 'AMD Radeon Graphics'), else the first preset of it that its aliases name."""
    parts = [s for s in _shipped() if s.source == "datasheet" and (s.arch == arch or normalized_name(arch) in
                                                                   {normalized_name(a) for a in s.aliases})]
    if num_sms:
        same = [s for s in parts if s.num_sms == int(num_sms)]
        if same:
            return max(same, key=lambda s: s.key)
        return None if any(s.num_sms for s in parts) else (parts[0] if parts else None)
    named = [s for s in parts if normalized_name(arch) in {normalized_name(a) for a in s.aliases}]
    return (named or parts or [None])[0]


def _device_sms(hw: Mapping[str, Any]) -> int | None:
    """The recorded SM (CU) count of a GPU; None for a CPU run, whose ``num_sms`` counts host cores."""
    if hw.get("emulated") or str(hw.get("vendor", "")).lower() == "cpu":
        return None
    v = hw.get("num_sms")
    return int(v) if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def match_device(hw: Mapping[str, Any]) -> tuple[HardwareSpec | None, str]:
    """The part a bundle's recorded device is, and how it was found ("" by its name, else a clause
    naming the architecture); (None, "") when no preset is that part."""
    name = hw.get("name") if isinstance(hw.get("name"), str) else ""
    sms = _device_sms(hw)
    part = (_named(name) or find_part(name, sms)) if name else None
    if part is not None:
        return part, ""
    arch = device_arch(hw)
    part = find_by_arch(arch, sms) if arch else None
    if part is None:
        return None, ""
    cus = f" and {sms} compute units" if sms else ""
    return part, f", chosen by the device's architecture {arch}{cus} (the trace calls it '{name or '?'}')"


def host_link_of(hw: HardwareSpec) -> tuple[float, str]:
    """The host link of ``hw`` (bytes/s one direction, in words): its own, else that of the
    datasheet preset of the same part (a calibration does not measure it); (0, "") when unknown."""
    if hw.host_bytes_per_s > 0:
        return hw.host_bytes_per_s, hw.host_link_text
    part = _datasheet_part(hw)
    if part is not None and part.host_bytes_per_s > 0:
        return part.host_bytes_per_s, part.host_link_text
    return 0.0, ""


def _datasheet_part(hw: HardwareSpec) -> HardwareSpec | None:
    for name in (hw.name.replace(" (calibrated)", ""), *hw.aliases):
        part = find_part(name)
        if part is not None and part is not hw:
            return part
    return None


# --- choosing a spec -----------------------------------------------------------------------------

def resolve_hardware(meta: Mapping[str, Any] | None, name_or_path: str | os.PathLike | None = None, *,
                     prefer_calibrated: bool = False, search: tuple[str | os.PathLike, ...] = ()) -> HardwareSpec:
    """The spec to analyze a bundle with (``choose_hardware``'s spec): an explicit ``name_or_path``
    (a key, a display name, a device name or a JSON file) wins; else the bundle's ``meta["hardware"]``.
    InputError says how to choose one when nothing names a known or estimable GPU."""
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
    ``name_or_path`` or for the bundle ``meta``, and one sentence saying which spec and why.

    1. A JSON path (or any existing file) is loaded as it is.
    2. A key (``h200``, ``h200-calibrated``) or a display name ("H200 SXM") is that spec, exactly.
    3. A device name (``name_or_path``, else the bundle's ``meta["hardware"]["name"]``) names a
       part (``match_device``: by name, else an AMD device by its architecture and CU count). The
       part's calibration wins over its datasheet when one ships with taxmodel, or, with
       ``prefer_calibrated`` (predictions), lies under ``search``.
    4. A bundle's device that is no part gets a spec estimated from what the trace recorded
       (``estimate_spec``), labelled ``estimated`` with its basis.
    InputError (with "did you mean" for a mistyped name) says how to choose a spec otherwise."""
    if name_or_path is not None and (str(name_or_path).endswith(".json") or Path(str(name_or_path)).is_file()):
        spec = load_hardware(name_or_path)
        return spec, f"hardware: {spec.label} from {name_or_path}"
    given = name_or_path is not None
    if given:
        exact = _named(str(name_or_path))
        if exact is not None:
            return exact, f"hardware: {exact.shown}, as named"
        hw: Mapping[str, Any] = {"name": str(name_or_path)}
    else:
        raw = (meta or {}).get("hardware") or {}
        hw = raw if isinstance(raw, Mapping) else {"name": str(raw)}
        named = _named(str(hw.get("name") or "")) if hw.get("name") else None
        if named is not None:  # a bundle that records a key or a display name (synthetic bundles, CPU runs)
            return named, f"hardware: {named.shown}, as the bundle names it"
    part, by_arch = match_device(hw)
    name = str(hw.get("name") or "")
    if part is None:
        if given:
            close = suggest(name)
            hint = f"did you mean {' or '.join(close)}? " if close else ""
            raise InputError(f"unknown hardware '{name}'; {hint}keys: {known_keys()} (a display name such as "
                             "'H200 SXM' works too), or a JSON file written by `taxmodel calibrate`")
        spec, why_not = estimate_spec(hw)
        if spec is not None:
            return spec, f"hardware: {spec.label} -- {spec.notes}"
        if name:
            raise InputError(f"the bundle's device '{name}' is no preset and cannot be estimated ({why_not}); "
                             f"pass --hardware KEY (one of {known_keys()}) or --hardware FILE.json")
        if meta is None:
            raise InputError(f"no hardware given; pass --hardware with one of {known_keys()} or a JSON file")
        raise InputError(f"the bundle does not say which GPU it ran on ({why_not}); pass --hardware with one of "
                         f"{known_keys()} or a JSON file")
    whose = f"'{name}'" if given else f"the trace's device '{name or '?'}'"
    for path in calibrated_files(search if prefer_calibrated else ()):
        try:
            spec = load_hardware(path)
        except InputError:
            continue
        if spec.source == "calibrated" and any(same_name(spec, a) for a in (part.name, *part.aliases)):
            key = spec.key or next((s.key for s in _shipped() if s.name == spec.name), "")
            spec = replace(spec, key=key) if key and not spec.key else spec
            where = "shipped with taxmodel" if _in_package(path) else f"{path.name}"
            return spec, (f"hardware: {spec.shown} ({where}) for {whose}, in preference to its datasheet "
                          f"(--hardware {part.key}){by_arch}")
    return part, f"hardware: {part.shown} for {whose}{by_arch}"


def estimate_spec(hw: Mapping[str, Any]) -> tuple[HardwareSpec | None, str]:
    """The spec estimated for a recorded device that is no preset (``estimate.py``), labelled
    ``estimated`` with its basis in its notes; (None, why not) when nothing ties it to a preset."""
    arch, arch_from = device_arch(hw) or "", "the trace's gfx target"
    if not arch:
        cc, hint = hw.get("compute_capability"), hw.get("arch_hint")
        if isinstance(cc, str) and cc:
            arch, arch_from = cc, "the trace's compute capability"
        elif isinstance(hint, Mapping) and isinstance(hint.get("arch"), str):
            arch, arch_from = hint["arch"], str(hint.get("basis") or "the kernels' names")
    if not arch:
        return None, "the trace records no compute capability or architecture"
    relatives = [s for s in _shipped() if s.source == "datasheet" and s.arch == arch]
    if not relatives:
        return None, f"no preset shares its architecture {arch}"
    fields = estimate.estimate_fields(hw, arch, arch_from, relatives)
    return HardwareSpec(**fields), fields["notes"]


def _in_package(path: Path) -> bool:
    folder = Path(str(resources.files("taxmodel") / "data" / "hardware"))
    return Path(path).parent.resolve() == folder.resolve()


def same_name(spec: HardwareSpec, name: str) -> bool:
    """Whether ``name`` is the spec's name or one of its aliases (case and punctuation ignored)."""
    return normalized_name(name) in {normalized_name(spec.name), *(normalized_name(a) for a in spec.aliases)}
