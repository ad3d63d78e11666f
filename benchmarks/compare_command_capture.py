"""Does `taxmodel profile -- COMMAND` measure what a hand-written torch.profiler capture of the
same steps measures? The two bundles' ledgers, part by part, within noise (issue 40 item 4).

The two captures are two runs of one program, so their kernels must be the same (checked
exactly: kernels per step and rank, by name) and their floors too (``useful`` depends on the
kernels' shapes, not on timing: within 0.5%). Timed parts differ by run-to-run noise only; a part
agrees when the difference of its means is within ``max(3 x the combined standard error of the
two means over steps, --floor-pct of the hand-written step, the difference between two
hand-written runs)``. The last term (``--noise``: a second hand-written capture of the same steps,
a separate run) is what one process's host time varies by from run to run, which the steps of one
run do not show: a host-bound job's launch tax moved by 30% between two hand-written runs on one
H200.

    python benchmarks/compare_command_capture.py HOOK_BUNDLE HAND_BUNDLE [--noise HAND_BUNDLE_2] \
        --hardware h200 --markdown compare.md --json compare.json        # exit 1 when a check fails
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import pandas as pd

import taxmodel

USEFUL_TOLERANCE = 0.005


def per_step(profile) -> pd.DataFrame:
    """ns per (repetition, iteration) of every ledger part and of the window, mean over ranks."""
    parts = profile.ledger.groupby(["repetition", "iteration", "rank", "subcategory"])["ns"].sum().unstack("subcategory")
    parts["window"] = parts.sum(axis=1)
    return parts.groupby(["repetition", "iteration"]).mean()


def kernel_counts(profile) -> dict[str, int]:
    """Kernels per traced step and rank, by name (the multiset must be the same in both captures)."""
    k = profile.events[(profile.events["kind"] == "kernel") & (profile.events["iteration"] >= 0)]
    steps = max(k.groupby(["rank"])["iteration"].nunique().min(), 1)
    return {name: round(n / steps / profile.world_size, 3) for name, n in k["name"].value_counts().items()}


def compare(hook: Path, hand: Path, hardware: str | None, floor_pct: float, noise: Path | None = None) -> dict:
    a, b = taxmodel.load(hook, hardware=hardware), taxmodel.load(hand, hardware=hardware)
    sa, sb = per_step(a), per_step(b)
    sn = per_step(taxmodel.load(noise, hardware=hardware)) if noise is not None else None
    window = float(sb["window"].mean())
    rows, ok = [], True
    for part in [c for c in sb.columns if c in sa.columns]:
        ma, mb = float(sa[part].mean()), float(sb[part].mean())
        se = math.sqrt((sa[part].var(ddof=1) if len(sa) > 1 else 0.0) / len(sa)
                       + (sb[part].var(ddof=1) if len(sb) > 1 else 0.0) / len(sb))
        between = abs(mb - float(sn[part].mean())) if sn is not None and part in sn.columns else 0.0
        allowed = max(3 * se, floor_pct / 100 * window, between)
        if part == "useful":
            allowed = USEFUL_TOLERANCE * max(abs(mb), 1.0)
        good = abs(ma - mb) <= allowed
        ok &= good
        rows.append({"part": part, "hook_us": ma / 1e3, "hand_us": mb / 1e3, "diff_us": (ma - mb) / 1e3,
                     "hand_runs_diff_us": between / 1e3, "allowed_us": allowed / 1e3,
                     "pct_of_step": 100 * (ma - mb) / window if window else 0.0, "within": bool(good)})
    ka, kb = kernel_counts(a), kernel_counts(b)
    same_kernels = ka == kb
    opts = {name: {k: (p.meta.get("capture") or {}).get("profiler", {}).get(k) for k in ("record_shapes", "with_stack")}
            for name, p in (("hook", a), ("hand", b))}
    same_options = opts["hook"] == opts["hand"] == {"record_shapes": True, "with_stack": False}
    differing = sorted(set(ka) ^ set(kb) | {n for n in set(ka) & set(kb) if ka[n] != kb[n]})
    return {"hook": str(hook), "hand": str(hand), "noise": str(noise) if noise else None, "world_size": [a.world_size, b.world_size],
            "steps": [len(sa), len(sb)], "hardware": hardware, "floor_pct": floor_pct, "parts": rows,
            "same_kernels": same_kernels, "kernels_differing": differing[:20],
            "kernels_per_step": [sum(ka.values()), sum(kb.values())], "profiler_options": opts,
            "passed": bool(ok and same_kernels and same_options and a.world_size == b.world_size)}


def markdown(result: dict) -> str:
    lines = ["# `taxmodel profile -- COMMAND` vs a hand-written capture of the same steps",
             "",
             f"- hook: `{result['hook']}`; hand-written: `{result['hand']}`; world size {result['world_size']}; "
             f"steps {result['steps']}; hardware {result['hardware'] or 'from the bundles'}",
             f"- kernels per step and rank: {result['kernels_per_step'][0]:g} vs {result['kernels_per_step'][1]:g}, "
             f"same by name: {result['same_kernels']}" + (f" (differing: {', '.join(result['kernels_differing'])})"
                                                         if result["kernels_differing"] else ""),
             f"- profiler options: {result['profiler_options']}",
             f"- a part agrees within max(3 x combined standard error, {result['floor_pct']:g}% of the step"
             + (f", the difference between two hand-written runs (the second: `{result['noise']}`)" if result["noise"]
                else "") + f"); useful within {USEFUL_TOLERANCE:.1%}",
             "",
             "| part | hook (us) | hand (us) | diff (us) | hand runs' diff (us) | allowed (us) | diff, % of step | within |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in result["parts"]:
        lines.append(f"| {r['part']} | {r['hook_us']:,.1f} | {r['hand_us']:,.1f} | {r['diff_us']:+,.1f} | "
                     f"{r['hand_runs_diff_us']:,.1f} | {r['allowed_us']:,.1f} | {r['pct_of_step']:+.2f} | "
                     f"{'yes' if r['within'] else '**no**'} |")
    lines += ["", f"**{'PASS' if result['passed'] else 'FAIL'}**", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("hook", type=Path)
    ap.add_argument("hand", type=Path)
    ap.add_argument("--hardware", default=None)
    ap.add_argument("--floor-pct", type=float, default=3.0)
    ap.add_argument("--noise", type=Path, default=None,
                    help="a second hand-written capture of the same steps (another run): run-to-run noise")
    ap.add_argument("--markdown", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    result = compare(args.hook, args.hand, args.hardware, args.floor_pct, args.noise)
    text = markdown(result)
    print(text)
    if args.markdown:
        args.markdown.write_text(text)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    sys.exit(0 if result["passed"] else 1)


if __name__ == "__main__":
    main()
