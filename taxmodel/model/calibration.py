"""Turn `taxmodel calibrate`'s raw measurements into a hardware file: pure functions (no GPU, no
torch), so that tests call them with made-up measurements and a calibration can be refit later
from the raw numbers a file keeps (``--only STEP --update FILE``).

``fit`` maps measurements to ``HardwareSpec`` fields, with the extra numbers the analytic model
needs under ``ModelParams`` names; ``update_spec`` merges a partial run into an earlier file and
refits; the collective curve helpers choose between eager and graph timing per op.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from taxmodel.errors import InputError
from taxmodel.fsutil import atomic_write
from taxmodel.model.analytic.costs import RESIDENT_FRACTION, STREAMED_FRACTION
from taxmodel.model.analytic.params import RAW_FEEDS, ModelParams
from taxmodel.hardware.specs import find_preset, load_hardware, normalized_name
from taxmodel.version import __version__
from taxmodel.vocabulary import ALLGATHER


def _l2_of(preset) -> int:
    """The L2 size of the GPU's datasheet preset (calibrate does not measure it); 0 when unknown."""
    return int(getattr(preset, "l2_bytes", 0) or 0) if preset is not None else 0


def _first(*values):
    for v in values:
        if v is not None:
            return v
    return None


def fit(meas: dict, device_name: str, num_sms: int, world: int, vendor: str | None = None) -> dict:
    """Turn raw measurements into a hardware file (the fields of ``HardwareSpec``; model parameters
    in extra fields named as in ``ModelParams``). Pure: tests call it with made-up measurements."""

    curves, eager_curve = collective_curves(meas, world)
    by_world = collectives_by_world(meas, world)
    ag = (curves or {}).get(ALLGATHER) or []
    link_bw = link_lat = None
    if world > 1 and ag:
        (_, small_s), (large_b, large_s) = ag[0], ag[-1]
        # all-gather receives (world-1) * bytes_per_rank per rank: the large message gives
        # bandwidth, the small one latency (per ring step).
        link_bw = (world - 1) * large_b / large_s
        link_lat = small_s / (world - 1)
    p2p = [r["bytes_per_s"] for r in meas.get("peer_copy", [])]
    peer = meas.get("peer") or {}
    launch = meas.get("launch") or {}
    preset = find_preset(device_name)
    if preset is not None and preset.source != "datasheet":  # name after the datasheet part, not an older calibration
        preset = find_preset(preset.name.replace(" (calibrated)", ""))
    name = f"{preset.name} (calibrated)" if preset is not None else device_name
    # The datasheet preset keeps its own name, so `--hardware "H200 SXM"` still selects the datasheet.
    # ... nor any alias that spells the datasheet's name (e.g. 'h200-sxm' for 'H200 SXM').
    aliases = sorted({a for a in (*(preset.aliases if preset is not None else ()), device_name)
                      if preset is None or normalized_name(a) != normalized_name(preset.name)})
    link = _first(link_bw, statistics.median(p2p) if p2p else None, peer.get("load_bytes_per_s"))
    link_note = ""
    if link is None and world == 1 and preset is not None:
        # one GPU has no peer to measure a link to, and nothing it runs crosses one
        link, link_note = preset.link_bytes_per_s, f" One GPU: link_bytes_per_s is the {preset.name} datasheet's."
    if link is None:
        raise ValueError("no link measurement (collectives, peer copies or peer loads): calibrate with --world-size 2 or more")
    spec = {
        "name": name,
        "key": f"{preset.key}-calibrated" if preset is not None and preset.key else "",
        "vendor": vendor or (preset.vendor if preset is not None else "nvidia"),
        "source": "calibrated",
        "aliases": aliases,
        "num_sms": int(num_sms),
        "peak_flops": {k: v["flops_per_s"] for k, v in meas["gemm"].items()},
        "hbm_bytes_per_s": meas["hbm"]["bytes_per_s"],
        "link_bytes_per_s": link,
        "link_latency_s": link_lat or 0.0,
        "launch_latency_s": _first(launch.get("launch_latency_s"), launch.get("graph_per_kernel_s"), 0.0),
        "kernel_gap_s": _first(launch.get("kernel_gap_s"), launch.get("graph_per_kernel_s"), 0.0),
        "graph_kernel_gap_s": launch.get("graph_kernel_gap_s"),  # absent where not measured
        "host_launch_s": _first(launch.get("host_launch_triton_s"), launch.get("host_launch_s"), 0.0),
        "flag_roundtrip_s": _first((meas.get("flag") or {}).get("roundtrip_s"), 0.0),
        "notes": (f"measured by `taxmodel calibrate` on {world} x {device_name}: GEMM peaks are cuBLAS rates on 8192^3 "
                  "(4096^3 for fp32), HBM a device copy, link the all-gather bandwidth at the largest size. "
                  + _curve_note(curves) + _by_world_note(by_world) + link_note + _not_measured_note(meas)),
        # model parameters (taxmodel.model.analytic.params.ModelParams names)
        "host_launch_torch_s": _first(launch.get("host_launch_torch_s"), launch.get("host_launch_s")),
        "p2p_copy_bytes_per_s": statistics.median(p2p) if p2p else None,
        "peer_load_bytes_per_s": peer.get("load_bytes_per_s"),
        "peer_load_latency_s": peer.get("load_latency_s"),
        "peer_store_bytes_per_s": peer.get("store_bytes_per_s"),
        "peer_store_bytes_per_s_per_sm": peer.get("store_bytes_per_s_per_sm"),
        "barrier_skew_s": (meas.get("barrier") or {}).get("barrier_skew_s"),
        "combine_step_s": combine_step_seconds(meas.get("combine"), ModelParams().kernel_overhead_s),
        "flag_wait_s": (meas.get("sync") or {}).get("flag_wait_sys_s"),
        "flag_wait_gpu_s": (meas.get("sync") or {}).get("flag_wait_gpu_s"),
        # the workloads' own kernels' microbenchmarks (issue 33; each None when its step did not run)
        "triton_gemm_speed_by_m": gemm_speed_by_m(meas.get("tile_gemm")),
        "narrow_tile_gemm_factor": narrow_tile_factor(meas.get("tile_gemm")),
        "rs_gemm_speed_by_m": gemm_speed_by_m(meas.get("rs_gemm"), "rs_s", RS_SPREAD),
        "rs_push_s_per_byte_by_m": rs_push_cost_by_m(meas.get("rs_gemm"), RS_SPREAD),
        "rs_gemm_speed_by_m_peers_first": gemm_speed_by_m(meas.get("rs_gemm"), "rs_s", RS_PEERS_FIRST),
        "rs_push_s_per_byte_by_m_peers_first": rs_push_cost_by_m(meas.get("rs_gemm"), RS_PEERS_FIRST),
        **copy_share_fit(meas.get("copy_share")),
        **split_kv_fit(meas.get("combine"), meas["hbm"]["bytes_per_s"], _l2_of(preset)),
        "ll_push_bytes_per_s": ll_push_rate(meas.get("ll_push")),
        "ll_merge_step_s": ll_merge_step(meas.get("ll_merge")),
        **fused_combine_fit(meas.get("fused_combine"), _l2_of(preset)),
        "reduce_program_bytes_per_s": reduce_rate(meas.get("reduce"),
                                                  (meas.get("sync") or {}).get("flag_wait_sys_s") or ModelParams().flag_wait_s),
        "collectives": curves,
        "collectives_eager": eager_curve,
        "collectives_by_world": by_world or None,
    }
    return {k: v for k, v in spec.items() if v is not None}


def _curve_points(rows: list[dict]) -> dict[str, list[list[float]]]:
    """op -> [[bytes per rank, seconds], ...] sorted by size, from measurement rows (ms): a row's
    traced kernel time (``kernel_ms``, graph rows measured since it existed) when it has one, else
    its per-call time (``ms``)."""
    out: dict[str, list[list[float]]] = {}
    for r in rows or []:
        ms = r.get("kernel_ms") if r.get("kernel_ms") else r.get("ms")
        if ms is not None and float(ms) > 0:
            out.setdefault(r["op"], []).append([r["bytes_per_rank"], float(ms) * 1e-3])
    return {op: sorted(pts) for op, pts in out.items()}


def collective_curves(meas: dict, world: int) -> tuple[dict | None, dict | None]:
    """(the model's curve, the eager curve kept for reference) in hardware-file form.

    The model's curve (``collectives``) is the collective's own device time: per op the graph
    measurement (``meas["collectives_graph"]``) when it has two sizes or more, else the eager one
    (``timing`` says which, per op). The eager curve (``collectives_eager``: host launch cost and
    rank skew included) is written beside it when some op has a graph curve; the model never uses
    it -- it adds launch costs and skew itself."""
    eager = _curve_points(meas.get("collectives", []))
    graph = _curve_points(meas.get("collectives_graph", []))
    model: dict = {"world_size": world, "timing": {}}
    traced = {op for op in graph
              if all(r.get("kernel_ms") for r in meas.get("collectives_graph", []) if r.get("op") == op)}
    for op in sorted(set(eager) | set(graph)):
        use, timing = (graph[op], "graph") if len(graph.get(op, [])) >= 2 else (eager.get(op, []), "eager")
        if len(use) >= 2:
            model[op], model["timing"][op] = use, timing
            if timing == "graph" and op in traced:  # the points are the traced kernels' time (else per call)
                model.setdefault("graph_points", {})[op] = "kernel"
    if not model["timing"]:
        return None, None
    has_graph = "graph" in model["timing"].values()
    return model, ({"world_size": world, "timing": "eager", **eager} if has_graph and eager else None)


def collectives_by_world(meas: dict, world: int) -> dict[str, dict]:
    """World size (a string key, as JSON has it) -> the model's curve measured on that many ranks,
    in the form of ``collectives`` (``collective_curves``), from the raw rows an update on another
    number of ranks stored under ``meas["collectives_at"]`` (``update_spec``). The file's own world
    size is left out: its curve is ``collectives``. The model interpolates each at its own world size."""
    out: dict[str, dict] = {}
    for key, rows in sorted((meas.get("collectives_at") or {}).items(), key=lambda kv: int(kv[0])):
        other = int(key)
        if other == world:
            continue
        curve, _ = collective_curves(rows or {}, other)
        if curve is not None:
            out[str(other)] = curve
    return out


def _by_world_note(by_world: dict) -> str:
    if not by_world:
        return ""
    return (f" Curves measured on other numbers of ranks (collectives_by_world, each used at its own world size): "
            f"{', '.join(by_world)} ranks.")


def _not_measured_note(meas: dict) -> str:
    """The raw steps this calibration did not measure itself: a step whose raw dict names its own
    ``source`` (rows entered by hand from a measurement made elsewhere) is said in the notes, with
    the fields it feeds, so that the file's "measured by `taxmodel calibrate`" does not claim them."""
    named = [(k, v["source"]) for k, v in sorted(meas.items())
             if isinstance(v, dict) and isinstance(v.get("source"), str) and v["source"].strip()]
    if not named:
        return ""
    return " Not measured by `taxmodel calibrate`: " + "; ".join(
        f"measured.raw.{k}" + (f" (feeds {', '.join(RAW_FEEDS[k])})" if k in RAW_FEEDS else "") + f": {src}"
        for k, src in named) + "."


def _curve_note(curves: dict | None) -> str:
    timing = set((curves or {}).get("timing", {}).values())
    if not timing:
        return "No collective curve."
    if timing == {"graph"}:
        kernel = set((curves or {}).get("graph_points", {})) == set(curves["timing"])
        return ("Collective curve (collectives): each collective's own device time, from N back-to-back calls "
                "replayed in one CUDA graph (no host launch cost, no rank skew; collectives_eager keeps the eager "
                "timing for reference); "
                + ("its kernels' traced time per call." if kernel else
                   "per call, the gap to the next call included (~2 us for NCCL; no traced kernel times)."))
    return ("Collective curve (collectives): "
            + ", ".join(f"{op} {t}" for op, t in sorted(curves["timing"].items()))
            + " -- an eager-timed op includes host launch cost and rank skew.")


def combine_step_seconds(measured: dict, kernel_overhead_s: float) -> float | None:
    """``combine_step_s`` from ``measure``'s rows: the median over the grid of (combine kernel -
    ``kernel_overhead_s``) / steps (None without rows). Pure: tests call it with made-up rows."""
    per_step = [max(float(r["combine_s"]) - kernel_overhead_s, 0.0) / int(r["steps"])
                for r in (measured or {}).get("rows", []) if int(r.get("steps", 0)) > 0]
    return float(statistics.median(per_step)) if per_step else None


# --- the workloads' own kernels, measured alone (issue 33): raw rows -> ModelParams values ---------


def _rows(measured: dict | None) -> list[dict]:
    rows = (measured or {}).get("rows") if isinstance(measured, dict) else None
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


def _positive(*values) -> bool:
    try:
        return all(float(v) > 0 for v in values)
    except (TypeError, ValueError):
        return False


#: GEMM+RS's GEMM tile orders an rs_gemm row can have measured (its ``order``; kernels/gemm_rs/tiles.py,
#: "Tile order"): the spread order (kernel revision 6 on) and every peer's tile first (before it; a
#: row without ``order`` was measured then).
RS_SPREAD, RS_PEERS_FIRST = "spread", "first"


def rs_order(spread: bool) -> str:
    """The ``order`` an rs_gemm row records for a kernel launched with ``spread``."""
    return RS_SPREAD if spread else RS_PEERS_FIRST


def _rs_rows(measured: dict | None, order: str | None) -> list[dict]:
    """The step's rows, only those of the tile ``order`` when one is given (no ``order``: peers first)."""
    rows = _rows(measured)
    return rows if order is None else [r for r in rows if (r.get("order") or RS_PEERS_FIRST) == order]


def gemm_speed_by_m(measured: dict | None, key: str = "tile_s", order: str | None = None) -> list[list[float]] | None:
    """``triton_gemm_speed_by_m`` from the tile_gemm step (``key`` "tile_s"), ``rs_gemm_speed_by_m``
    (``order`` "spread") and ``rs_gemm_speed_by_m_peers_first`` ("first") from the rs_gemm step
    ("rs_s"): per M, the vendor GEMM's time over the kernel's on the same shape (their speed
    ratio), sorted by M; None without rows."""
    pts = sorted([float(r["m"]), float(r["vendor_s"]) / float(r[key])] for r in _rs_rows(measured, order)
                 if _positive(r.get("m"), r.get("vendor_s"), r.get(key)))
    return [[m, round(s, 4)] for m, s in pts] or None


def narrow_tile_factor(measured: dict | None) -> float | None:
    """``narrow_tile_gemm_factor`` from the tile_gemm step: the tile GEMM's time with pull's narrow
    first-wave tiles (row ``narrow``) over its time with the shape's own tiles at the same M (the
    step's row of that M); None when the step has no narrow row (a calibration from before it)."""
    row = (measured or {}).get("narrow") if isinstance(measured, dict) else None
    if not isinstance(row, dict) or not _positive(row.get("m"), row.get("tile_s")):
        return None
    same = [r for r in _rows(measured) if _positive(r.get("tile_s")) and float(r.get("m", 0)) == float(row["m"])]
    return round(float(row["tile_s"]) / float(same[0]["tile_s"]), 4) if same else None


#: Where a kernel step's "peers" were when it ran on one GPU (rank 0 of 2, the second rank's memory
#: a second half of its own): its stores cross no link.
ONE_GPU_PEERS = "one GPU: a second half of its own memory as the peer"


def rs_push_cost_by_m(measured: dict | None, order: str | None = None) -> list[list[float]] | None:
    """``rs_push_s_per_byte_by_m`` (the rows of ``order``, every row when None) from the rs_gemm step:
    per M, GEMM+RS's GEMM kernel's time beyond
    the vendor GEMM on the same shard (never below 0) over the bytes each rank pushed into its peers
    ((W-1)/W of its M x N partial product, ``element_bytes`` each, bf16 where a row does not say);
    rows of one rank, and a step run on one GPU (its "peer" its own memory: no link crossed), give
    no point; None without points."""
    if isinstance(measured, dict) and measured.get("peers") == ONE_GPU_PEERS:
        return None
    pts = []
    for r in _rs_rows(measured, order):
        if not _positive(r.get("m"), r.get("n"), r.get("world"), r.get("rs_s"), r.get("vendor_s")) or int(r["world"]) < 2:
            continue
        w = int(r["world"])
        pushed = float(r["m"]) * float(r["n"]) * float(r.get("element_bytes") or 2) * (w - 1) / w
        pts.append([float(r["m"]), float(f"{max(float(r['rs_s']) - float(r['vendor_s']), 0.0) / pushed:.4g}")])
    return sorted(pts) or None


def copy_share_fit(measured: dict | None) -> dict:
    """From the copy_share step's rows: ``copy_program_bytes_per_s`` (one copy program's rate in pull
    mode while the GEMM shares its SM: the items one program moves, rounds of ``programs`` items,
    over the copy kernel's time beside the GEMM) and ``gemm_share_loss`` (the GEMM's time beside the
    copy minus alone, over the copy's time), medians over the pull rows (rows without a ``mode``:
    files from before the step measured push too); ``copy_program_push_bytes_per_s``, the same rate
    over the push rows. Each is left out without rows of its mode; {} without rows."""
    pull = [r for r in _rows(measured) if r.get("mode", "pull") == "pull"]
    push = [r for r in _rows(measured) if r.get("mode") == "push"]
    out = {}
    rates = _copy_program_rates(pull)
    if rates:
        out["copy_program_bytes_per_s"] = float(statistics.median(rates))
    losses = [max(float(r["gemm_shared_s"]) - float(r["gemm_alone_s"]), 0.0) / float(r["copy_shared_s"])
              for r in pull if _copy_row(r) and _positive(r.get("gemm_shared_s"), r.get("gemm_alone_s"))]
    if losses:
        out["gemm_share_loss"] = round(float(statistics.median(losses)), 4)
    push_rates = _copy_program_rates(push)
    if push_rates:
        out["copy_program_push_bytes_per_s"] = float(statistics.median(push_rates))
    return out


def _copy_row(r: dict) -> bool:
    return _positive(r.get("items"), r.get("programs"), r.get("item_bytes"), r.get("copy_shared_s"))


def _copy_program_rates(rows: list[dict]) -> list[float]:
    """Per copy_share row: the bytes one program moves (its rounds of items) over the copy's time beside the GEMM."""
    return [-(-int(r["items"]) // int(r["programs"])) * float(r["item_bytes"]) / float(r["copy_shared_s"])
            for r in rows if _copy_row(r)]


def split_kv_fit(measured: dict | None, hbm_bytes_per_s: float, l2_bytes: int = 0) -> dict:
    """The split-KV kernel's lines from the combine step's rows (the same K/V read every call, as the
    workloads read it every step), bytes as the model counts them (K and V, and the partials
    written), each fitted on relative error (weights 1/t^2) so that a short KV's fixed cost and a
    long one's rate both count; {} with fewer than 2 points.

    With the L2's size known (``l2_bytes``), rows up to ``RESIDENT_FRACTION`` of it give the
    L2-resident line (``split_kv_resident_bytes_per_s``, ``split_kv_resident_fixed_s``) and rows from
    ``STREAMED_FRACTION`` of it the HBM line (``triton_stream_efficiency``, ``split_kv_fixed_s``),
    each where it has 2 distinct sizes; otherwise one line through every row, as without the L2."""
    m = measured or {}
    try:
        hq, hkv, d = int(m["q_heads"]), int(m["kv_heads"]), int(m["head_dim"])
    except (KeyError, TypeError, ValueError):
        return {}
    points = []
    for r in _rows(m):
        if not _positive(r.get("batch"), r.get("kv_len"), r.get("splits"), r.get("split_s")):
            continue
        b, kv_len, s = int(r["batch"]), int(r["kv_len"]), int(r["splits"])
        points.append((_split_bytes(b, kv_len, s, hq, hkv, d), float(r["split_s"])))
    resident = [p for p in points if l2_bytes > 0 and p[0] <= RESIDENT_FRACTION * l2_bytes]
    streamed = [p for p in points if l2_bytes > 0 and p[0] >= STREAMED_FRACTION * l2_bytes]
    res_line, hbm_line = _line(resident), _line(streamed)
    if res_line is None or hbm_line is None:
        line = _line(points)
        if line is None:
            return {}
        return {"triton_stream_efficiency": round(line[0] / float(hbm_bytes_per_s), 4), "split_kv_fixed_s": line[1]}
    return {"triton_stream_efficiency": round(hbm_line[0] / float(hbm_bytes_per_s), 4), "split_kv_fixed_s": hbm_line[1],
            "split_kv_resident_bytes_per_s": res_line[0], "split_kv_resident_fixed_s": res_line[1]}


def _line(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """(bytes per second, fixed seconds) of t = fixed + bytes / rate through ``points`` (bytes, t),
    weighted by 1/t^2; None with fewer than 2 distinct sizes or a line that does not rise."""
    fit = _weighted_line(points)
    if fit is None:
        return None
    slope, fixed = fit
    return 1.0 / slope, max(float(fixed), 0.0)


def _weighted_line(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """(slope, intercept) of t = intercept + slope * x through ``points`` (x, t), weighted by 1/t^2
    (relative error: short and long points count alike); None with fewer than 2 distinct x or a
    line that does not rise."""
    if len(points) < 2 or len({x for x, _ in points}) < 2:
        return None
    w = [1.0 / t ** 2 for _, t in points]
    xs, ts = [x for x, _ in points], [t for _, t in points]
    sw, sx, st = sum(w), sum(wi * x for wi, x in zip(w, xs)), sum(wi * t for wi, t in zip(w, ts))
    sxx, sxt = sum(wi * x * x for wi, x in zip(w, xs)), sum(wi * x * t for wi, x, t in zip(w, xs, ts))
    det = sw * sxx - sx * sx
    if det <= 0:
        return None
    slope, fixed = (sw * sxt - sx * st) / det, (sxx * st - sx * sxt) / det
    if slope <= 0:
        return None
    return float(slope), float(fixed)


def fused_combine_fit(measured: dict | None, l2_bytes: int = 0) -> dict:
    """``fused_local_combine_step_s`` and ``fused_local_combine_fixed_s`` from the fused_combine
    step's rows (``runtime/calibrate_fused.py``): per shape, the fused flash decode kernel at world
    size 1 less the split-KV kernel alone on the same inputs and plan (``tail_s``: the pair's local
    combine, the push to its own rank, the merge of its own partial, the output rows) against the
    local combine's serial steps; the line tail = fixed + steps x step, weighted by 1/tail^2 (a short
    tail's fixed cost and a long one's step both count; the intercept clamped at 0). {} with fewer
    than 2 step counts, or a line that does not rise (e.g. the interpreter's rows, whose two kernels
    get the same host time).

    ``fused_fold_step_s``, with the L2's size known (``l2_bytes``) and the rows' head counts
    recorded: the slope of the same line through the rows whose split work (K, V and the partials)
    stays L2-resident (at most ``RESIDENT_FRACTION`` of it), where they span 2 step counts. There the
    standalone split kernel and the fused kernel's split phase read the same resident K/V, so the
    tail grows by the fold's steps alone; past them the one-rank tail grows faster (one H200: 0.7 us a
    step up to KV 8K, then 1.4 and 2 us a step to KV 32K and 128K) while the fused kernel's records
    on 2-8 H200s put the fold itself at 0.66-0.8 us a step at every KV. The model takes it for the fold
    on several ranks, where push, waits and merges replace the one-rank tail."""
    rows = [r for r in _rows(measured) if _positive(r.get("steps"), r.get("tail_s"))]
    fit = _weighted_line([(float(r["steps"]), float(r["tail_s"])) for r in rows])
    if fit is None:
        return {}
    step, fixed = fit
    out = {"fused_local_combine_step_s": step, "fused_local_combine_fixed_s": max(fixed, 0.0)}
    fold = _weighted_line(_resident_tails(measured, rows, l2_bytes))
    if fold is not None:
        out["fused_fold_step_s"] = fold[0]
    return out


def _resident_tails(measured: dict | None, rows: list[dict], l2_bytes: int) -> list[tuple[float, float]]:
    """(steps, tail seconds) of the fused_combine ``rows`` whose split work stays L2-resident; [] when
    the L2's size or the rows' head counts are unknown."""
    m = measured or {}
    try:
        hq, hkv, d = int(m["q_heads"]), int(m["kv_heads"]), int(m["head_dim"])
    except (KeyError, TypeError, ValueError):
        return []
    if l2_bytes <= 0:
        return []
    return [(float(r["steps"]), float(r["tail_s"])) for r in rows
            if _positive(r.get("batch"), r.get("kv_len"), r.get("splits"))
            and _split_bytes(int(r["batch"]), int(r["kv_len"]), int(r["splits"]), hq, hkv, d)
            <= RESIDENT_FRACTION * l2_bytes]


def _split_bytes(batch: int, kv_len: int, splits: int, hq: int, hkv: int, d: int) -> float:
    """Bytes the split-KV kernel moves as the model counts them: K and V (bf16) and the fp32 partials."""
    return 2.0 * batch * hkv * kv_len * d * 2 + batch * hq * splits * (d + 1) * 4


def ll_push_rate(measured: dict | None) -> float | None:
    """``ll_push_bytes_per_s`` from the ll step's pushes: every program's bytes into the peers per
    push (R rows x (D + 1) words of 8 bytes, to W - 1 peers) over the time one push adds (the
    difference of two launch lengths); None on one rank or without two lengths."""
    m = measured or {}
    try:
        reps, times = [int(x) for x in m["reps"]], [float(x) for x in m["push_s"]]
        world, programs, rows, d = int(m["world"]), int(m["programs"]), int(m["rows"]), int(m["head_dim"])
    except (KeyError, TypeError, ValueError):
        return None
    if world < 2 or len(reps) < 2 or len(times) != len(reps) or reps[-1] <= reps[0] or times[-1] <= times[0]:
        return None
    per_push = (times[-1] - times[0]) / (reps[-1] - reps[0])
    return programs * (world - 1) * rows * (d + 1) * 8 / per_push


def ll_merge_step(measured: dict | None) -> float | None:
    """``ll_merge_step_s`` from the ll step's merges: the time one more source adds to a merge."""
    m = measured or {}
    try:
        n, times = [int(x) for x in m["sources"]], [float(x) for x in m["merge_s"]]
    except (KeyError, TypeError, ValueError):
        return None
    if len(n) < 2 or len(times) != len(n) or n[-1] <= n[0] or times[-1] <= times[0]:
        return None
    return (times[-1] - times[0]) / (n[-1] - n[0])


def reduce_rate(measured: dict | None, flag_wait_s: float,
                kernel_overhead_s: float = ModelParams().kernel_overhead_s) -> float | None:
    """``reduce_program_bytes_per_s`` from the reduce step: per row, one program's bytes (W slots
    read and the tile written, (W + 1) x BLOCK_M x BLOCK_N elements) over the kernel's time less the
    fixed kernel cost and the W waits on set flags, as the model charges a program; the median."""
    rates = []
    for r in _rows(measured):
        if not _positive(r.get("world"), r.get("block_m"), r.get("block_n"), r.get("element_bytes"), r.get("reduce_s")):
            continue
        w = int(r["world"])
        busy = float(r["reduce_s"]) - kernel_overhead_s - w * float(flag_wait_s)
        if busy > 0:
            rates.append((w + 1) * int(r["block_m"]) * int(r["block_n"]) * int(r["element_bytes"]) / busy)
    return float(statistics.median(rates)) if rates else None


#: The measurement steps of a calibration, in the order they run, and the raw keys each writes.
STEP_KEYS: dict[str, tuple[str, ...]] = {
    "hbm": ("hbm",), "gemm": ("gemm",), "launch": ("launch",),
    "collectives": ("collectives", "collectives_graph", "collectives_graph_note"),
    "barrier": ("barrier",), "peer": ("peer",), "flag": ("flag",), "p2p": ("peer_copy",),
    "combine": ("combine",), "sync": ("sync",),
    "tile_gemm": ("tile_gemm",), "copy_share": ("copy_share",), "rs_gemm": ("rs_gemm",), "ll": ("ll_push", "ll_merge"),
    "fused_combine": ("fused_combine",), "reduce": ("reduce",),
}
#: Steps that need at least two ranks.
MULTI_RANK_STEPS = ("collectives", "barrier", "peer", "flag")


def parse_steps(text: str | None) -> tuple[str, ...]:
    """``--only`` ("collectives,barrier") as steps in run order; None or "all": every step."""
    if text is None or text.strip() in ("", "all"):
        return tuple(STEP_KEYS)
    asked = {t.strip() for t in text.split(",") if t.strip()}
    unknown = sorted(asked - set(STEP_KEYS))
    if unknown:
        raise InputError(f"--only {text}: unknown step(s) {', '.join(unknown)}; steps: {', '.join(STEP_KEYS)}")
    return tuple(s for s in STEP_KEYS if s in asked)


def check_update(existing: dict, steps: tuple[str, ...], world: int | None) -> int:
    """The world size an update of ``existing`` runs at; InputError when ``existing`` cannot be
    updated (no raw measurements) or was measured on another number of ranks than ``steps`` need.
    The collectives step may run on another number of ranks (``update_spec`` adds a curve for that
    world size); the other multi-rank steps need the file's own."""
    measured = existing.get("measured") or {}
    raw = measured.get("raw")
    if not isinstance(raw, dict) or not {"hbm", "gemm"} <= set(raw):
        raise InputError("--update: the file has no raw measurements (measured.raw with hbm and gemm); only a file "
                         "written by `taxmodel calibrate` can be updated -- calibrate fully instead")
    old_world = int(measured.get("world_size") or 1)
    world = old_world if world is None else int(world)
    fixed = [s for s in steps if s in MULTI_RANK_STEPS and s != "collectives"]
    if world != old_world and fixed:
        raise InputError(f"--update: the file was measured on {old_world} ranks and this run has {world}; only the "
                         f"collectives step may run on another number of ranks (it adds a curve for {world} ranks), "
                         f"{', '.join(fixed)} need the file's {old_world}: run them with --world-size {old_world} "
                         "or calibrate fully")
    if world != old_world and "collectives" in steps and world < 2:
        raise InputError(f"--update: the collectives step needs 2 or more ranks, this run has {world}")
    return world


def _keep_other_orders(old: dict | None, new: dict) -> dict:
    """The rs_gemm step's new rows plus the earlier rows of the tile orders the new run did not
    measure (a calibration of the spread kernel keeps the peers-first rows the bundles of older
    kernel revisions are predicted with)."""
    if not isinstance(new, dict) or not _rows(old):
        return new
    measured = {(r.get("order") or RS_PEERS_FIRST) for r in _rows(new)}
    kept = [r for r in _rows(old) if (r.get("order") or RS_PEERS_FIRST) not in measured]
    return {**new, "rows": [*kept, *_rows(new)]} if kept else new


def update_spec(existing: dict, new_meas: dict, steps: tuple[str, ...], *, device_name: str | None = None,
                num_sms: int | None = None, world: int | None = None, info: dict | None = None) -> dict:
    """``existing`` (a hardware file an earlier calibration wrote, with ``measured.raw``) with the raw
    measurements of ``steps`` taken from ``new_meas`` and every fitted number refit from the merged
    raw measurements, so a partial run (``--only collectives --update FILE``) changes only what its
    steps feed. The fit is always at the file's own world size. A collectives step on another
    number of ranks ``world`` stores its rows under ``raw["collectives_at"][str(world)]`` (replacing
    an earlier entry for ``world``), which the fit turns into ``collectives_by_world``; the file's
    own curve, its raw rows and the link numbers fitted to them stay. Pure: tests call it with
    made-up measurements."""
    measured = dict(existing.get("measured") or {})
    world = check_update(existing, steps, world)
    own_world = int(measured.get("world_size") or 1)
    at_other_world = world != own_world and "collectives" in steps
    own_steps = tuple(s for s in steps if not (at_other_world and s == "collectives"))
    raw = measured["raw"]
    failed = {k: v for k, v in (new_meas.get("errors") or {}).items() if k in steps}
    merged = {k: v for k, v in raw.items() if k != "errors"}
    errors = {k: v for k, v in (raw.get("errors") or {}).items() if k not in own_steps or k in failed}
    if at_other_world and "collectives" not in failed and any(key in new_meas for key in STEP_KEYS["collectives"]):
        rows = {key: new_meas[key] for key in STEP_KEYS["collectives"] if key in new_meas}
        merged["collectives_at"] = {**(merged.get("collectives_at") or {}), str(world): rows}
    for step in own_steps:
        if step in failed or not any(key in new_meas for key in STEP_KEYS[step]):
            continue  # a failed (or absent) step keeps the earlier numbers; the update entry names a failure
        for key in STEP_KEYS[step]:
            old = merged.pop(key, None)
            if key in new_meas:
                merged[key] = _keep_other_orders(old, new_meas[key]) if key == "rs_gemm" else new_meas[key]
    if errors:
        merged["errors"] = errors
    device = device_name or measured.get("device") or next(
        (u["device"] for u in reversed(measured.get("updates") or []) if isinstance(u, dict) and u.get("device")),
        existing["name"])
    spec = fit(merged, device, int(num_sms or existing["num_sms"]),
               own_world, vendor=existing.get("vendor"))
    entry = {**(info or {}), **({"world_size": world} if world != own_world else {}), "steps": list(steps),
             **({"failed": failed} if failed else {})}
    spec["measured"] = {**measured, "raw": merged, "updates": [*measured.get("updates", []), entry]}
    return spec


def refit_file(path: str, output: str) -> str:
    """Refit every number of the hardware file at ``path`` (written by ``taxmodel calibrate``) from
    the raw measurements it keeps, with this taxmodel's fits, and write it atomically to ``output``
    (which may be ``path``); its update log says so. InputError when it keeps no raw measurements."""
    try:
        existing = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"--refit {path}: not a readable hardware JSON file ({exc})") from exc
    if not isinstance(existing, dict):
        raise InputError(f"--refit {path}: not a hardware file (a JSON object)")
    spec = update_spec(existing, {}, (), info={"refit": True, "taxmodel": __version__,
                                              "note": "every number refit from the raw measurements; nothing measured"})
    out = atomic_write(output, json.dumps(spec, indent=2, default=float) + "\n", what="hardware file")
    load_hardware(out)
    return str(out)


def curve_table(meas: dict) -> str:
    """Eager, graph per-call and traced kernel time (us) per op and size: the compact summary a
    calibration prints (the model's curve is the kernel column where there is one)."""
    eager = {(r["op"], r["bytes_per_rank"]): r["ms"] for r in meas.get("collectives", [])}
    graph = {(r["op"], r["bytes_per_rank"]): r for r in meas.get("collectives_graph", [])}
    lines = ["op              bytes/rank    eager us    graph us   kernel us  (method)"]
    for (op, b), ms in sorted(eager.items()):
        g = graph.get((op, b))
        kernel = f"{g['kernel_ms'] * 1e3:11.1f}" if g and g.get("kernel_ms") else "          -"
        gtxt = f"{g['ms'] * 1e3:10.1f} {kernel}  ({g['method']})" if g else "         -           -"
        lines.append(f"{op:<15} {b:>10d} {ms * 1e3:11.1f} {gtxt}")
    return "\n".join(lines)
