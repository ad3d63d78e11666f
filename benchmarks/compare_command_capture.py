"""Does `taxmodel profile -- COMMAND` measure what a hand-written torch.profiler capture of the
same steps measures? The two captures' ledgers, part by part, within noise (issue 40 item 4).

The captures are runs of one program, so their kernels must be the same (checked exactly: kernels
per step and rank, by name) and their floors too (``useful`` depends on the kernels' shapes, not
on timing: within 0.5%). Timed parts differ by noise only. A host-bound job's host time moves
from one run to the next by far more than its steps vary within a run (the same one-GPU capture's
host-starved time: 5.3 ms per step in one run, 13.2 in another, on 2x H200 machines), so the unit
is the run: give several runs of each,
alternated (``--hook H1 H2 H3 --hand P1 P2 P3``). A part agrees when the difference of the two
groups' means (each run's mean over its steps) is within ``max(3 x its standard error over runs,
--floor-pct of the hand-written step)``; with one run of each, the standard error is over steps.

    python benchmarks/compare_command_capture.py --hook H1 H2 H3 --hand P1 P2 P3 --hardware h200 \
        --markdown compare.md --json compare.json        # exit 1 when a check fails
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


def _mean_and_variance(steps: list[pd.DataFrame], part: str) -> tuple[float, float]:
    """The mean of ``part`` over runs (each run's mean over its steps) and the variance of that mean:
    between runs where there are several, else over the one run's steps."""
    means = [float(s[part].mean()) for s in steps if part in s.columns]
    if len(means) > 1:
        return sum(means) / len(means), float(pd.Series(means).var(ddof=1)) / len(means)
    one = steps[0][part]
    return means[0], (float(one.var(ddof=1)) / len(one) if len(one) > 1 else 0.0)


def compare(hooks: list[Path], hands: list[Path], hardware: str | None, floor_pct: float) -> dict:
    runs = {name: [taxmodel.load(p, hardware=hardware) for p in paths] for name, paths in (("hook", hooks), ("hand", hands))}
    a, b = runs["hook"][0], runs["hand"][0]
    sa, sb = [per_step(p) for p in runs["hook"]], [per_step(p) for p in runs["hand"]]
    window = sum(float(s["window"].mean()) for s in sb) / len(sb)
    rows, ok = [], True
    for part in [c for c in sb[0].columns if all(c in s.columns for s in sa + sb)]:
        (ma, va), (mb, vb) = _mean_and_variance(sa, part), _mean_and_variance(sb, part)
        se = math.sqrt(va + vb)
        allowed = max(3 * se, floor_pct / 100 * window)
        if part == "useful":
            allowed = USEFUL_TOLERANCE * max(abs(mb), 1.0)
        good = abs(ma - mb) <= allowed
        ok &= good
        spread = {name: [round(float(s[part].mean()) / 1e3, 1) for s in group] for name, group in (("hook", sa), ("hand", sb))}
        rows.append({"part": part, "hook_us": ma / 1e3, "hand_us": mb / 1e3, "diff_us": (ma - mb) / 1e3,
                     "se_us": se / 1e3, "allowed_us": allowed / 1e3, "runs_us": spread,
                     "pct_of_step": 100 * (ma - mb) / window if window else 0.0, "within": bool(good)})
    kernels = {name: [kernel_counts(p) for p in group] for name, group in runs.items()}
    ka = kernels["hook"][0]
    same_kernels = all(k == ka for group in kernels.values() for k in group)
    differing = sorted({n for group in kernels.values() for k in group for n in set(k) ^ set(ka) | {
        n for n in set(k) & set(ka) if k[n] != ka[n]}})
    opts = {name: {k: (p.meta.get("capture") or {}).get("profiler", {}).get(k) for k in ("record_shapes", "with_stack")}
            for name, p in (("hook", a), ("hand", b))}
    same_options = opts["hook"] == opts["hand"] == {"record_shapes": True, "with_stack": False}
    worlds = {p.world_size for group in runs.values() for p in group}
    return {"hook": [str(p) for p in hooks], "hand": [str(p) for p in hands], "world_size": sorted(worlds),
            "runs": [len(hooks), len(hands)], "steps": [len(sa[0]), len(sb[0])], "hardware": hardware,
            "floor_pct": floor_pct, "parts": rows, "same_kernels": same_kernels, "kernels_differing": [n[:80] for n in differing[:20]],
            "kernels_per_step": [sum(ka.values()), sum(kernels["hand"][0].values())], "profiler_options": opts,
            "passed": bool(ok and same_kernels and same_options and len(worlds) == 1)}


def markdown(result: dict) -> str:
    lines = ["# `taxmodel profile -- COMMAND` vs a hand-written capture of the same steps",
             "",
             f"- runs: {result['runs'][0]} hook, {result['runs'][1]} hand-written (alternated); world size "
             f"{result['world_size']}; steps per run {result['steps']}; hardware {result['hardware'] or 'from the bundles'}",
             f"- kernels per step and rank: {result['kernels_per_step'][0]:g} vs {result['kernels_per_step'][1]:g}, "
             f"same by name: {result['same_kernels']}" + (f" (differing: {', '.join(result['kernels_differing'])})"
                                                         if result["kernels_differing"] else ""),
             f"- profiler options: {result['profiler_options']}",
             f"- a part agrees within max(3 x the standard error of the difference (over runs where there are "
             f"several), {result['floor_pct']:g}% of the step); useful within {USEFUL_TOLERANCE:.1%}",
             "",
             "| part | hook (us) | hand (us) | diff (us) | SE (us) | allowed (us) | diff, % of step | hook runs (us) | "
             "hand runs (us) | within |",
             "|---|---:|---:|---:|---:|---:|---:|---|---|---|"]
    for r in result["parts"]:
        lines.append(f"| {r['part']} | {r['hook_us']:,.1f} | {r['hand_us']:,.1f} | {r['diff_us']:+,.1f} | "
                     f"{r['se_us']:,.1f} | {r['allowed_us']:,.1f} | {r['pct_of_step']:+.2f} | "
                     f"{', '.join(map(str, r['runs_us']['hook']))} | {', '.join(map(str, r['runs_us']['hand']))} | "
                     f"{'yes' if r['within'] else '**no**'} |")
    lines += ["", f"**{'PASS' if result['passed'] else 'FAIL'}**", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hook", type=Path, nargs="+", required=True, help="bundles of `taxmodel profile -- COMMAND` runs")
    ap.add_argument("--hand", type=Path, nargs="+", required=True, help="bundles of hand-written captures (other runs)")
    ap.add_argument("--hardware", default=None)
    ap.add_argument("--floor-pct", type=float, default=3.0)
    ap.add_argument("--markdown", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    result = compare(args.hook, args.hand, args.hardware, args.floor_pct)
    text = markdown(result)
    print(text)
    if args.markdown:
        args.markdown.write_text(text)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    sys.exit(0 if result["passed"] else 1)


if __name__ == "__main__":
    main()
