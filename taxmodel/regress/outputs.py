"""The outputs of a comparison: a terminal table, Markdown (a PR comment or CI job summary),
JUnit XML (one testcase per row and metric, a failure per regression) and JSON (everything).

Relative changes print as percentages of what they are relative to: the metric itself for
latency, the baseline latency ("of window") for categories by default (see config.py).
"""
from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pandas as pd

from taxmodel import safetext
from taxmodel.errors import InputError
from taxmodel.fsutil import atomic_write, check_output_file, overlap
from taxmodel.regress.compare import CompareResult
from taxmodel.regress.stats import IMPROVED, REGRESSED, UNCHANGED

JSON_FORMAT = "taxmodel-compare"
JSON_VERSION = 1
_MARK = {REGRESSED: "❌ regressed", IMPROVED: "🟢 improved", UNCHANGED: "✅ unchanged", "incomplete": "⚠️ incomplete"}


def pct(x: float) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if abs(x) >= 1e5:
        return ">+1e7%" if x > 0 else "<-1e7%"
    return f"{x * 100:+.1f}%"


def us(x: float) -> str:
    return f"{x:,.1f} us"


def ci_text(line: Any, prefix: str = "ci") -> str:
    return f"[{pct(line[f'{prefix}_low'])}, {pct(line[f'{prefix}_high'])}]"


def change_text(m: Any) -> str:
    """'+12.3 us (+1.8% of window) [+1.1%, +2.5%]'."""
    of = " of window" if m["relative_to"] == "window" and m["metric"] != "latency" else ""
    return f"{m['change_us']:+,.1f} us ({pct(m['rel_change'])}{of}) {ci_text(m)}"


def threshold_text(m: Any) -> str:
    of = " of window" if m["relative_to"] == "window" and m["metric"] != "latency" else ""
    return f"{m['threshold_rel'] * 100:g}%{of} and {m['threshold_abs_us']:g} us"


def method_text(result: CompareResult) -> str:
    s = result.config.statistics
    return (f"{s.statistic} per iteration, {s.confidence * 100:g}% percentile bootstrap CI ({s.resamples} resamples, "
            f"seed {s.seed}, repetitions resampled when there are several); a metric regresses when its whole CI is "
            f"above the relative threshold and the change exceeds the absolute one. Thresholds: {result.config.source}.")


# --- terminal -------------------------------------------------------------------------------

def terminal_text(result: CompareResult, verbose: bool = False) -> str:
    """A plain-text table (no colour codes, so it survives CI logs)."""
    lines = [f"taxmodel compare: {result.baseline} -> {result.candidate}",
             f"  {method_text(result)}", ""]
    header = ("row", "latency baseline", "candidate", "change [CI]", "verdict", "regressed / improved metrics")
    table = [header]
    for _, r in result.rows.iterrows():
        flagged = ", ".join(r["regressed"]) or ", ".join(r["improved"])
        table.append((r["row"], us(r["latency_baseline_us"]), us(r["latency_candidate_us"]),
                      f"{pct(r['latency_rel_change'])} {ci_text(r, 'latency_ci')}", r["verdict"].upper(), flagged))
    widths = [max(len(str(row[i])) for row in table) for i in range(len(header))]
    for row in table:
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())
    shown = result.metrics if verbose else result.metrics[result.metrics["verdict"] != UNCHANGED]
    if len(shown):
        lines += ["", "metrics" + ("" if verbose else " that changed") + ":"]
        for _, m in shown.iterrows():
            lines.append(f"  {m['row']}  {m['metric']}: {us(m['baseline_us'])} -> {us(m['candidate_us'])}, "
                         f"{change_text(m)}; threshold {threshold_text(m)}: {m['verdict']}"
                         + (f" ({m['note']})" if m["note"] else ""))
    for miss in result.missing:
        lines.append(f"missing: {miss['row']} is only in the {miss['only_in']} ({', '.join(miss['paths'])})")
    for caveat in result.caveats:
        lines.append(f"note: {caveat}")
    lines += ["", f"verdict: {result.verdict.upper()} ({_counts(result)})"]
    return "\n".join(lines)


def _counts(result: CompareResult) -> str:
    v = result.rows["verdict"]
    parts = [f"{int((v == k).sum())} {k}" for k in (REGRESSED, IMPROVED, UNCHANGED)]
    if result.missing:
        parts.append(f"{len(result.missing)} missing on one side")
    return ", ".join(parts)


# --- Markdown -------------------------------------------------------------------------------

_md = safetext.markdown  # text from bundles and paths, literal in a PR comment
_code = safetext.markdown_code
_x = safetext.xml  # every string that goes into the JUnit file


def markdown_text(result: CompareResult) -> str:
    """A summary for a pull-request comment or ``$GITHUB_STEP_SUMMARY``."""
    setup = result.setup.get("candidate", {})
    device = f" on {_md(setup['device'])}" if setup.get("device") else ""
    ranks = f", {setup['world_size']} ranks" if setup.get("world_size") else ""
    out = [f"## taxmodel compare: {_MARK.get(result.verdict, result.verdict)}", "",
           f"Baseline {_code(result.baseline)} vs candidate {_code(result.candidate)}{device}{ranks}: {_counts(result)}.", "",
           "| Row | Verdict | Latency baseline → candidate | Change [CI] | Regressed metrics | Improved metrics |",
           "|---|---|---|---|---|---|"]
    for _, r in result.rows.iterrows():
        out.append(f"| {_code(r['row'])} | {_MARK[r['verdict']]} | {us(r['latency_baseline_us'])} → "
                   f"{us(r['latency_candidate_us'])} | {pct(r['latency_rel_change'])} {ci_text(r, 'latency_ci')} | "
                   f"{', '.join(r['regressed']) or '-'} | {', '.join(r['improved']) or '-'} |")
    changed = result.metrics[result.metrics["verdict"] != UNCHANGED]
    if len(changed):
        out += ["", "### Metrics beyond their thresholds", "",
                "| Row | Metric | Baseline | Candidate | Change [CI] | Threshold | Verdict |", "|---|---|---|---|---|---|---|"]
        for _, m in changed.iterrows():
            out.append(f"| {_code(m['row'])} | {m['metric']} | {us(m['baseline_us'])} | {us(m['candidate_us'])} | "
                       f"{_md(change_text(m))} | {threshold_text(m)} | {_MARK[m['verdict']]} |")
    out += ["", "<details><summary>All metrics</summary>", "",
            "| Row | Metric | Baseline | Candidate | Change [CI] | Verdict |", "|---|---|---|---|---|---|"]
    for _, m in result.metrics.iterrows():
        out.append(f"| {_code(m['row'])} | {m['metric']} | {us(m['baseline_us'])} | {us(m['candidate_us'])} | "
                   f"{_md(change_text(m))} | {m['verdict']}{' (' + _md(m['note']) + ')' if m['note'] else ''} |")
    out += ["", "</details>"]
    if result.missing:
        out += ["", "### Rows on one side only", ""]
        out += [f"- {_code(m['row'])}: only in the {m['only_in']}" for m in result.missing]
        if not result.allow_missing:
            out.append("\nThis makes the comparison incomplete (exit 2); pass `--allow-missing` to accept it, "
                       "or record the new rows with `taxmodel baseline update`.")
    if result.caveats:
        out += ["", "### Notes", ""] + [f"- {_md(c)}" for c in result.caveats]
    out += ["", f"<sub>{_md(method_text(result))}</sub>", ""]
    return "\n".join(out)


# --- JUnit ----------------------------------------------------------------------------------

def junit_tree(result: CompareResult) -> ET.ElementTree:
    """<testsuites> with one <testsuite> per row and one <testcase> per metric; regressions are
    <failure>s, ungated metrics <skipped>, rows on one side only an <error> (a <skipped> with
    --allow-missing)."""
    root = ET.Element("testsuites", name="taxmodel compare")
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for row, group in result.metrics.groupby("row", sort=False):
        suite = ET.SubElement(root, "testsuite", name=_x(f"taxmodel.compare {row}"))
        counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        for _, m in group.iterrows():
            case = ET.SubElement(suite, "testcase", classname=_x(_classname(m)), name=m["metric"], time="0")
            counts["tests"] += 1
            detail = _x(f"{m['metric']} of {row}: {us(m['baseline_us'])} -> {us(m['candidate_us'])}, "
                        f"{change_text(m)}; threshold {threshold_text(m)}")
            if m["verdict"] == REGRESSED:
                counts["failures"] += 1
                ET.SubElement(case, "failure", type="regression", message=detail).text = detail
            elif not m["gated"]:
                counts["skipped"] += 1
                ET.SubElement(case, "skipped", message=f"not gated: {detail}")
            else:
                ET.SubElement(case, "system-out").text = f"{m['verdict']}: {detail}"
        _set_counts(suite, counts, totals)
    for miss in result.missing:
        suite = ET.SubElement(root, "testsuite", name=_x(f"taxmodel.compare {miss['row']}"))
        case = ET.SubElement(suite, "testcase", classname=_x(miss["row"].replace("/", ".")), name="present on both sides",
                             time="0")
        message = _x(f"{miss['row']} is only in the {miss['only_in']}")
        counts = {"tests": 1, "failures": 0, "errors": 0, "skipped": 0}
        if result.allow_missing:
            counts["skipped"] = 1
            ET.SubElement(case, "skipped", message=message)
        else:
            counts["errors"] = 1
            ET.SubElement(case, "error", type="missing", message=message).text = message
        _set_counts(suite, counts, totals)
    for k, v in totals.items():
        root.set(k, str(v))
    ET.indent(root)
    return ET.ElementTree(root)


def _classname(m: Any) -> str:
    return f"{m['workload']}.{m['variant']}" + (f"[{m['shape']}]" if m["shape"] else "")


def _set_counts(suite: ET.Element, counts: dict[str, int], totals: dict[str, int]) -> None:
    for k, v in counts.items():
        suite.set(k, str(v))
        totals[k] += v


def junit_text(result: CompareResult) -> str:
    return ET.tostring(junit_tree(result).getroot(), encoding="unicode", xml_declaration=True) + "\n"


# --- JSON -----------------------------------------------------------------------------------

def json_data(result: CompareResult) -> dict[str, Any]:
    return {
        "format": JSON_FORMAT, "version": JSON_VERSION,
        "verdict": result.verdict, "exit_code": result.exit_code,
        "baseline": result.baseline, "candidate": result.candidate,
        "allow_missing": result.allow_missing, "config": result.config.to_dict(), "setup": result.setup,
        "rows": _records(result.rows), "metrics": _records(result.metrics),
        "missing": result.missing, "caveats": result.caveats,
    }


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    out = []
    for rec in df.to_dict(orient="records"):
        out.append({k: (None if isinstance(v, float) and not math.isfinite(v) else
                        v.item() if hasattr(v, "item") else v) for k, v in rec.items()})
    return out


def json_text(result: CompareResult) -> str:
    return json.dumps(json_data(result), indent=2) + "\n"


# --- when nothing could be compared ----------------------------------------------------------

def error_outputs(message: str, baseline: str, candidate: str) -> dict[str, str]:
    """Markdown, JUnit and JSON texts saying why the comparison could not run (exit 2), so that a
    CI job summary and test report show the reason instead of nothing."""
    md = (f"## taxmodel compare: ⚠️ cannot compare\n\nBaseline {_code(baseline)} vs candidate {_code(candidate)}:\n\n"
          f"> {_md(message)}\n")
    root = ET.Element("testsuites", name="taxmodel compare", tests="1", failures="0", errors="1", skipped="0")
    suite = ET.SubElement(root, "testsuite", name="taxmodel.compare", tests="1", failures="0", errors="1", skipped="0")
    case = ET.SubElement(suite, "testcase", classname="taxmodel.compare", name="inputs can be compared", time="0")
    ET.SubElement(case, "error", type="cannot-compare", message=_x(message)).text = _x(message)
    ET.indent(root)
    junit = ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
    data = {"format": JSON_FORMAT, "version": JSON_VERSION, "verdict": "cannot compare", "exit_code": 2,
            "baseline": baseline, "candidate": candidate, "error": message}
    return {"markdown": md, "junit": junit, "json": json.dumps(data, indent=2) + "\n"}


# --- files ----------------------------------------------------------------------------------

def check_outputs(outputs: dict[str, str | Path | None], inputs: list[str | Path]) -> None:
    """Refuse, before any work, outputs that would replace an input (a bundle's meta.json, the
    config) or another output, or that stand where only a regular file may (``fsutil``)."""
    given = [(kind, Path(p)) for kind, p in outputs.items() if p]
    for i, (_, path) in enumerate(given):
        check_output_file(path, "comparison output", inputs)
        other = next((k for k, p in given[:i] if overlap(path, [p])), None)
        if other:
            raise InputError(f"{path}: is also the {other.removesuffix('_path')} output; give each output a file of its own")


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (``fsutil.atomic_write``: a unique temporary sibling
    and a rename; a device, link or directory at ``path`` is refused)."""
    return atomic_write(path, text, what="comparison output")


def write_outputs(result: CompareResult | dict[str, str], markdown: str | Path | None = None,
                  junit: str | Path | None = None, json_path: str | Path | None = None) -> list[Path]:
    """Write the requested files from a result (or from ``error_outputs``'s texts)."""
    if isinstance(result, CompareResult):
        texts = {"markdown": lambda: markdown_text(result), "junit": lambda: junit_text(result),
                 "json": lambda: json_text(result)}
    else:
        texts = {k: (lambda v=v: v) for k, v in result.items()}
    written = []
    for kind, path in (("markdown", markdown), ("junit", junit), ("json", json_path)):
        if path:
            written.append(write_text_atomic(path, texts[kind]()))
    return written
