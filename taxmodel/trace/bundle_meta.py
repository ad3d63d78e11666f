"""The JSON types of a bundle's ``meta.json`` fields, checked where a bundle is loaded or written.

Every reader of a bundle (the ledger, the model, reports, comparisons, summaries) trusts these
types; a damaged or hand-edited ``meta.json`` (a list where a mapping belongs, text where a
number belongs) must stop at the door with one line naming the file and the field, not deep
inside a reader as a traceback. Only the fields taxmodel reads are checked; unknown keys are
kept as they are. A field may be absent unless listed in ``REQUIRED``; JSON null is accepted where a
reader treats it as "unknown" (``optional``), because bundles written by older versions and by
importers leave unknown fields empty.
"""
from __future__ import annotations

import json
import math
import re
from typing import Any, Callable, Mapping

from taxmodel.errors import BundleError, InputError

EXACT_NS = 2 ** 53
"""Times and offsets beyond this many ns lose exactness in the ledger's float sums (104 days)."""

MAX_RANKS = 1 << 20
"""A rank or world size beyond this is damage, not a cluster (the Kineto importer's limit too);
readers size per-rank arrays by the world size."""

# A check returns None when the value is fine, else what was expected (for the message).
Check = Callable[[Any], "str | None"]


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return (_is_int(v) or isinstance(v, float)) and math.isfinite(v)


INT64_MAX = 2 ** 63 - 1


def integer(lo: int | None = None, hi: int = INT64_MAX) -> Check:
    """An integer in [lo, hi]; by default within int64, as every reader stores it in numpy."""
    low = -INT64_MAX - 1 if lo is None else lo

    def check(v: Any) -> str | None:
        if _is_int(v) and low <= v <= hi:
            return None
        return f"an integer from {low} to {hi}" if (lo is not None or hi != INT64_MAX) else "an integer (64-bit)"
    return check


def regex(v: Any) -> str | None:
    if not isinstance(v, str):
        return "a string (a regular expression)"
    try:
        re.compile(v)
    except (re.error, RecursionError, OverflowError):
        return "a valid regular expression"
    return None


def number(lo: float | None = None) -> Check:
    def check(v: Any) -> str | None:
        if _is_num(v) and (lo is None or v >= lo):
            return None
        return "a finite number" + (f" >= {lo}" if lo is not None else "")
    return check


def text(v: Any) -> str | None:
    return None if isinstance(v, str) else "a string"


def boolean(v: Any) -> str | None:
    return None if isinstance(v, bool) else "true or false"


def mapping(v: Any) -> str | None:
    return None if isinstance(v, dict) else "a JSON object"


def scalar(v: Any) -> str | None:
    return None if v is None or isinstance(v, (str, bool)) or _is_num(v) else "a string, number or boolean"


def optional(check: Check) -> Check:
    def opt(v: Any) -> str | None:
        return None if v is None else check(v)
    return opt


def list_of(check: Check) -> Check:
    def lst(v: Any) -> str | None:
        if not isinstance(v, list):
            return "a JSON list"
        bad = next((check(x) for x in v if check(x)), None)
        return f"a JSON list whose items are each {bad}" if bad else None
    return lst


def int_keyed(check: Check) -> Check:
    """An object whose keys are integers written as text (ranks) and whose values pass ``check``."""
    def obj(v: Any) -> str | None:
        if not isinstance(v, dict):
            return "a JSON object"
        for k, x in v.items():
            if not str(k).lstrip("-").isdigit() or check(x):
                return f"a JSON object from rank numbers to {check(x) or 'values'}"
        return None
    return obj


def values(check: Check) -> Check:
    def obj(v: Any) -> str | None:
        if not isinstance(v, dict):
            return "a JSON object"
        bad = next((check(x) for x in v.values() if check(x)), None)
        return f"a JSON object whose values are each {bad}" if bad else None
    return obj


# field -> check; "a.b" names a field of the object "a" (checked when "a" is an object).
FIELDS: dict[str, Check] = {
    "source": optional(text),
    "workload": optional(text),
    "variant": optional(text),
    "shape": optional(values(integer())),
    "world_size": optional(integer(1, MAX_RANKS)),
    "ranks": optional(list_of(integer(0, MAX_RANKS - 1))),
    "hardware": optional(mapping),
    "hardware.name": optional(text),
    "hardware.vendor": optional(text),
    "hardware.num_sms": optional(integer(1)),
    "hardware.memory_bytes": optional(integer(0)),
    "hardware.warp_size": optional(integer(1)),
    "hardware.emulated": optional(boolean),
    "software": optional(values(scalar)),
    "clock_offsets_ns": optional(int_keyed(integer(-EXACT_NS, EXACT_NS))),
    "clock": optional(mapping),
    "clock.method": optional(text),
    "clock.uncertainty_ns": optional(number(0)),
    "capture": optional(mapping),
    "capture.graph": optional(boolean),
    "capture.graph_note": optional(text),
    "capture.align": optional(text),
    "capture.gate_hold_us": optional(number(0)),
    "capture.replay_step_us": optional(number(0)),
    "capture.replay_method": optional(text),
    "capture.replay_note": optional(text),
    "capture.clock_offsets_source": optional(text),
    "capture.clock_uncertainty_ns": optional(number(0)),
    "capture.emulated_gpu": optional(boolean),
    "capture.inject": optional(mapping),
    "capture.instrument": optional(boolean),
    "capture.iteration_pattern": optional(text),
    "capture.roles": optional(values(text)),
    "capture.tracer": optional(text),
    "capture.warmup": optional(integer(0)),
    "capture.iterations": optional(integer(0)),
    "repetitions": optional(integer(1)),
    "cost": optional(mapping),
    "cost.flops": number(0),
    "cost.hbm_bytes": number(0),
    "cost.link_bytes": number(0),
    "cost.dtype": text,  # may be absent (bf16), not null: readers call .lower() on it
    "cost.intermediates": optional(list_of(mapping)),
    "created": optional(text),
    "notes": optional(list_of(text)),
    "records": optional(mapping),
    "workload_config": optional(mapping),
    "inputs": optional(list_of(mapping)),
}

REQUIRED = frozenset({"cost.flops", "cost.hbm_bytes", "cost.link_bytes"})
"""Fields that must be present when their object is (a cost without its floors means nothing);
any other field may be absent, and is checked when present."""

INTERMEDIATE_FIELDS: dict[str, Check] = {"name": text, "bytes": integer(0), "producer": regex, "consumer": regex}


def _show(value: Any) -> str:
    try:
        s = json.dumps(value)
    except (TypeError, ValueError):
        s = repr(value)
    return s if len(s) <= 60 else s[:57] + "..."


def check_fields(data: Mapping[str, Any], fields: Mapping[str, Check], where: str,
                 error: type[Exception] = InputError) -> None:
    """``error`` naming ``where`` and the first field of ``fields`` present in ``data`` with a
    wrong type (for other JSON inputs: hardware files)."""
    for name, check in fields.items():
        if name in data:
            want = check(data[name])
            if want:
                raise error(f"{where}: field '{name}' must be {want}, not {_show(data[name])}")


def check_meta(meta: Mapping[str, Any], where: str) -> None:
    """Raise BundleError naming ``where`` (the meta.json) and the first field of a wrong type."""
    for name, check in FIELDS.items():
        parent, _, child = name.rpartition(".")
        obj = meta.get(parent) if parent else meta
        if not isinstance(obj, dict) or (child not in obj and name not in REQUIRED):
            continue
        value = obj.get(child)
        want = check(value)
        if want:
            raise BundleError(f"{where}: field '{name}' must be {want}, not {_show(value)}; "
                              "the bundle is damaged or was edited by hand: fix the field, or import/capture it again")
    for i, inter in enumerate((meta.get("cost") or {}).get("intermediates") or []):
        for key, check in INTERMEDIATE_FIELDS.items():
            want = check(inter.get(key))
            if want:
                raise BundleError(f"{where}: field 'cost.intermediates[{i}].{key}' must be {want}, not "
                                  f"{_show(inter.get(key))}; fix the field, or capture the bundle again")


