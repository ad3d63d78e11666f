"""From bundle paths to a written report or trace: what ``taxmodel report`` and
``taxmodel export-trace`` do, kept here so the CLI only handles arguments.

The renderers (matplotlib's figures, the HTML/Markdown writers, the Perfetto export) are imported
where a report or trace is written: ``taxmodel show``, ``analyze`` and ``advise`` take only
``expand_bundle_paths`` and ``load_cases`` from here and start without them."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterable, Sequence

from taxmodel.errors import InputError, TaxmodelError
from taxmodel.fsutil import atomic_write, check_output_file
from taxmodel.report.compare import LedgerLike
from taxmodel.trace.bundle import Bundle, bundle_inputs, find_bundles

FORMATS = ("html", "md")


def expand_bundle_paths(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """Bundles named on the command line; a directory that is not a bundle stands for every bundle below it."""
    from taxmodel.trace.importers import import_hint

    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = find_bundles(p)
            if not found:
                hint = import_hint(p)
                raise InputError(f"{p}: no bundles found below this directory (a bundle has meta.json and events.parquet)"
                                 + (f"; {hint}" if hint else ""))
            out.extend(found)
        else:
            out.append(p)  # an archive, or a missing path that load_bundle reports clearly
    return list(dict.fromkeys(out))


def load_cases(paths: Iterable[str | os.PathLike], *, hardware: str | None = None, lenient: bool = False,
               on_skip: Callable[[str], None] | None = None, scheduler: str | None = None) -> list[tuple[Bundle, LedgerLike]]:
    """Load every bundle and compute its ledger.

    With ``lenient`` a bundle that cannot be loaded or analyzed (a damaged file among good ones)
    is skipped: ``on_skip`` gets one line saying which and why, and the others go on; without
    it the first such bundle stops everything. Nothing loadable at all is an error either way.
    With ``scheduler`` (``local[:N]`` or a Dask scheduler's address) the per-rank work runs on
    Dask (``ledger/on_dask.py``) and the returned bundles carry meta only."""
    from taxmodel.hardware.specs import resolve_hardware
    from taxmodel.ledger.compute import compute_ledger
    from taxmodel.trace.importers import open_bundle

    client = None
    if scheduler:
        from taxmodel.ledger.on_dask import close, compute_ledger_dask, connect
        client = connect(scheduler)
    cases, skipped = [], []
    try:
        for path in expand_bundle_paths(paths):
            try:
                if client is not None:
                    cases.append(compute_ledger_dask(path, client, hardware, lenient=lenient))
                    continue
                bundle = open_bundle(path)
                hw = resolve_hardware(bundle.meta, hardware) if hardware else None
                cases.append((bundle, compute_ledger(bundle, hw, lenient=lenient)))
            except TaxmodelError as exc:
                if not lenient:
                    raise
                skipped.append(str(exc))
                if on_skip:
                    on_skip(f"{exc} (--lenient: skipped)")
    finally:
        if client is not None:
            close(client)
    if not cases:
        if skipped:
            raise InputError(f"none of the {len(skipped)} bundle(s) could be used; the first: {skipped[0]}")
        raise InputError("no bundles given; name bundle directories, archives, or directories that contain them")
    return cases


def report_format(output: Path, fmt: str | None) -> str:
    """``--format`` wins; otherwise ``.md``/``.markdown`` outputs are Markdown and everything else HTML."""
    if fmt:
        if fmt not in FORMATS:
            raise InputError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
        return fmt
    return "md" if output.suffix.lower() in (".md", ".markdown") else "html"


def write_report(cases: Sequence[tuple[Bundle, LedgerLike]], output: str | os.PathLike, fmt: str | None = None) -> Path:
    """Write the report (HTML, or Markdown with its PNGs in a folder beside it) atomically; return its path."""
    return write_report_files(cases, output, fmt)[0]


def write_report_files(cases: Sequence[tuple[Bundle, LedgerLike]], output: str | os.PathLike,
                       fmt: str | None = None) -> list[Path]:
    """``write_report``, returning every file written: the report, then its figures (Markdown)."""
    from taxmodel.report.document import build_document
    from taxmodel.report.html import render_html
    from taxmodel.report.markdown import render_markdown

    # before the work: a device, link or directory is refused, and so is a path inside an input bundle
    output = check_output_file(output, "report", [b.path for b, _ in cases if b.path is not None])
    fmt = report_format(output, fmt)
    doc = build_document(cases)
    figures: list[Path] = []
    text = render_html(doc) if fmt == "html" else render_markdown(doc, output, written=figures)
    return [atomic_write(output, text, what="report"), *figures]


def export_trace(path: str | os.PathLike, output: str | os.PathLike, *, hardware: str | None = None,
                 lenient: bool = False) -> Path:
    """One bundle's events plus its ledger's tax tracks as a Chrome/Perfetto JSON trace."""
    from taxmodel.report.perfetto import write_chrome_trace

    check_output_file(output, "trace", bundle_inputs([path]))
    cases = load_cases([path], hardware=hardware, lenient=lenient)
    if len(cases) != 1:
        raise InputError(f"{path}: holds {len(cases)} bundles; export-trace takes exactly one (name it directly)")
    bundle, ledger = cases[0]
    return write_chrome_trace(bundle, ledger, output)


TRACE_SUFFIXES = (".json", ".json.gz")


def export_traces(paths: Sequence[str | os.PathLike], output: str | os.PathLike, *, hardware: str | None = None,
                  lenient: bool = False) -> list[Path]:
    """``export_trace`` for each bundle of ``paths`` (directories of bundles are searched): one
    bundle to the file ``output``; several, or any into a directory (an existing one, or ``output``
    ending in "/"), one trace per bundle named after its folder (``bsp-M96xN40xK40xtp0.json``).
    Every output path is checked before any trace is written."""
    bundles = expand_bundle_paths(paths)
    out = Path(output)
    if len(bundles) == 1 and not out.is_dir() and not str(output).endswith(("/", os.sep)):
        return [export_trace(bundles[0], out, hardware=hardware, lenient=lenient)]
    if out.name.endswith(TRACE_SUFFIXES) and not out.is_dir():
        shown = ", ".join(str(b) for b in bundles[:3]) + (", ..." if len(bundles) > 3 else "")
        raise InputError(f"-o {output} names one trace file, but {len(bundles)} bundles were given ({shown}): give -o a "
                         "directory (one trace per bundle, named after its folder), or name one bundle")
    targets = [out / f"{name}.json" for name in _unique_names(bundles)]
    for t in targets:
        check_output_file(t, "trace", bundle_inputs(bundles))
    return [export_trace(b, t, hardware=hardware, lenient=lenient) for b, t in zip(bundles, targets)]


def _unique_names(bundles: Sequence[Path]) -> list[str]:
    """Each bundle's folder name, with as many parent folders as it takes to tell them apart."""
    parts = [Path(b).resolve().parts for b in bundles]
    for depth in range(1, max(len(p) for p in parts) + 1):
        names = ["-".join(p[-depth:]).replace(" ", "_") for p in parts]
        if len(set(names)) == len(names):
            return names
    return [f"{i}-{Path(b).name}" for i, b in enumerate(bundles)]
