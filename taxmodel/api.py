"""The notebook-facing API: profiles as objects with DataFrames and figures.

    import taxmodel
    p = taxmodel.load("profiles/h200x4/ag_gemm/bsp-M4096xN8192xK8192xtp0")   # one bundle -> Profile
    p.summary; p.ledger; p.collectives; p.kernels; p.plot_timeline()
    ps = taxmodel.load("profiles/h200x4")                                      # many -> ProfileSet
    ps.where(workload="ag_gemm", M=8192).compare(reference="bsp"); ps.plot_sweep()

Nothing here computes a number or draws a figure of its own: the ledger is
``taxmodel.ledger.compute_ledger``, the comparisons ``taxmodel.report.headline``, the figures
``taxmodel.report.figures``. This module only loads lazily, caches, and shapes results into tidy
DataFrames with the profile's identity (workload, variant, shape) attached, so that profiles
concatenate and group like any pandas data.
"""
from __future__ import annotations

import html
import os
import tarfile
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np
import pandas as pd

from taxmodel.errors import InputError
from taxmodel.ledger.categories import CATEGORY_ORDER, TAXES
from taxmodel.trace.bundle import Bundle, find_bundles, make_meta, write_bundle

PathLike = str | os.PathLike
NS_PER_US = 1000.0
IDENTITY_COLUMNS = ("label", "workload", "variant", "shape", "world_size")


def _shown(fig):
    """Return ``fig``, first teaching a running IPython to render matplotlib Figures as PNG.

    The report's figures live on their own Agg canvas (``figures._new_figure``) and
    ``taxmodel.report.figures`` selects the Agg backend, so Jupyter's inline backend never
    registers its display hook; registering the PNG formatter directly makes a returned figure
    show up as the cell's image, as a notebook reader expects."""
    try:
        from IPython import get_ipython
    except ImportError:
        return fig
    shell = get_ipython()
    if shell is not None and getattr(shell, "display_formatter", None) is not None:
        from IPython.core.pylabtools import select_figure_formats

        select_figure_formats(shell, {"png"})
    return fig


# --- one bundle ------------------------------------------------------------------------------------

class Profile:
    """One profile bundle and its ledger, computed on first use and cached.

    DataFrames (times in integer ns on the ledger's aligned clock unless a column says ``_us``):
      ``events``       the bundle's events as stored (rank-local clocks)
      ``ledger``       tidy ledger parts: repetition, iteration, rank, category, subcategory, ns
      ``summary``      one row per sub-category: mean ns (and us) per iteration and rank, % of window
      ``iterations``   one row per (repetition, iteration): window and each category
      ``collectives``  one row per (collective, rank): op, start/end, wait for the last member, skew
      ``kernels``      GPU activities on the aligned clock with their duration
    """

    def __init__(self, bundle: Bundle, *, hardware: Any = None, lenient: bool = False) -> None:
        self.bundle = bundle
        self.hardware = hardware
        self.lenient = lenient

    # construction -------------------------------------------------------------------------------
    @classmethod
    def from_path(cls, path: PathLike, **kw: Any) -> "Profile":
        """The bundle at ``path`` (a directory or an archive); a trace given instead is refused with
        the import that makes it a bundle (``Profile.from_traces`` reads traces)."""
        from taxmodel.trace.importers import open_bundle

        return cls(open_bundle(path), **kw)

    @classmethod
    def from_traces(cls, paths: PathLike | Sequence[PathLike], *, fmt: str = "auto", iteration_pattern: str | None = None,
                    meta: Mapping[str, Any] | None = None, allow_missing_ranks: bool = False,
                    counters: PathLike | None = None, shapes_from: PathLike | Sequence[PathLike] = (),
                    **kw: Any) -> "Profile":
        """Import traces (one file per rank: torch.profiler/Kineto, nsys, rocprof) into an in-memory
        profile. ``meta`` adds what the traces cannot say (workload, variant, shape, cost...);
        ``counters``, an ncu export of the same run, adds measured DRAM bytes (docs/counters.md);
        ``shapes_from``, an eager capture of the same program, gives CUDA-graph replays their
        kernels' shapes (docs/ledger.md 5a)."""
        from taxmodel.trace.importers import import_traces

        paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
        shapes_from = [shapes_from] if isinstance(shapes_from, (str, os.PathLike)) else shapes_from
        events, found, _ = import_traces(paths, fmt, iteration_pattern, allow_missing_ranks=allow_missing_ranks,
                                         shapes_from=shapes_from)
        if counters is not None:
            from taxmodel.trace.counter_match import attach_counters_file

            events, found = attach_counters_file(events, found, counters)
        return cls(Bundle(events=events, meta=make_meta(**{**found, **dict(meta or {})})), **kw)

    def with_meta(self, **values: Any) -> "Profile":
        """A copy whose metadata is updated with ``values`` (e.g. declare ``cost`` or ``shape`` for
        imported traces, so that the useful floor and locality tax can be measured)."""
        meta = {**self.bundle.meta, **values}
        return Profile(Bundle(events=self.bundle.events, meta=meta, path=self.bundle.path),
                       hardware=self.hardware, lenient=self.lenient)

    def save(self, path: PathLike) -> Path:
        """Write the profile as a bundle directory (atomically)."""
        return write_bundle(path, self.bundle.events, self.bundle.meta)

    # identity -----------------------------------------------------------------------------------
    @property
    def meta(self) -> dict:
        return self.bundle.meta

    @property
    def path(self) -> Path | None:
        return self.bundle.path

    @property
    def label(self) -> str:
        return self.bundle.label

    @property
    def workload(self) -> str | None:
        return self.meta.get("workload")

    @property
    def variant(self) -> str | None:
        return self.meta.get("variant")

    @property
    def shape(self) -> dict:
        return dict(self.meta.get("shape") or {})

    @property
    def world_size(self) -> int:
        return self.bundle.world_size

    @property
    def injected(self) -> bool:
        """True when the capture injected a known tax (``taxmodel profile --inject``)."""
        return bool((self.meta.get("capture") or {}).get("inject"))

    @property
    def emulated(self) -> bool:
        """True for CPU captures (Triton's interpreter, gloo): their times say nothing about GPUs."""
        return bool((self.meta.get("capture") or {}).get("emulated_gpu") or (self.meta.get("hardware") or {}).get("emulated"))

    def identity(self) -> dict[str, Any]:
        """label, workload, variant, shape (text), world_size, and one column per shape key."""
        from taxmodel.report.compare import shape_label

        return {"label": self.label, "workload": self.workload, "variant": self.variant,
                "shape": shape_label(self.shape), "world_size": self.world_size, **self.shape}

    # the analysis -------------------------------------------------------------------------------
    @cached_property
    def analysis(self):
        """The ``taxmodel.ledger.Ledger`` of this bundle (computed once)."""
        from taxmodel.hardware.specs import HardwareSpec, resolve_hardware
        from taxmodel.ledger.compute import compute_ledger

        hw = self.hardware
        if hw is not None and not isinstance(hw, HardwareSpec):
            hw = resolve_hardware(self.meta, hw)
        return compute_ledger(self.bundle, hw, lenient=self.lenient)

    @property
    def events(self) -> pd.DataFrame:
        return self.bundle.events

    @property
    def ledger(self) -> pd.DataFrame:
        return self.analysis.parts

    @cached_property
    def summary(self) -> pd.DataFrame:
        s = self.analysis.summary()
        return s.assign(mean_us=s["mean_ns"] / NS_PER_US)

    @property
    def windows(self) -> pd.DataFrame:
        return self.analysis.windows

    @property
    def intervals(self) -> pd.DataFrame:
        return self.analysis.intervals

    @cached_property
    def iterations(self) -> pd.DataFrame:
        return self.analysis.per_iteration()

    @property
    def per_rank(self) -> pd.DataFrame:
        return self.analysis.per_rank()

    @property
    def caveats(self) -> list[str]:
        return list(self.analysis.caveats) + list(self.analysis.skipped)

    @property
    def window_ns(self) -> float:
        """Mean iteration latency (the global window) over repetitions and iterations."""
        from taxmodel.report.compare import mean_window_ns

        return mean_window_ns(self.analysis)

    def categories_ns(self) -> pd.Series:
        """Mean ns per iteration and rank of every ledger category."""
        from taxmodel.report.compare import category_means_ns

        return category_means_ns(self.analysis)

    def table(self) -> pd.DataFrame:
        """The mean ledger as the reports show it: category totals, their parts, us and % of window."""
        from taxmodel.report.headline import ledger_table

        return ledger_table(self.analysis)

    def headline(self) -> str:
        from taxmodel.report.headline import ledger_sentence

        return ledger_sentence(self.analysis)

    @cached_property
    def kernels(self) -> pd.DataFrame:
        from taxmodel.report.compare import aligned_events

        gpu = aligned_events(self.bundle.gpu_events(), self.analysis)
        cols = ["rank", "stream", "kind", "role", "name", "start_ns", "end_ns", "repetition", "iteration",
                "collective_id", "collective_op", "grid", "block", "bytes"]
        out = gpu[cols].assign(duration_ns=gpu["end_ns"] - gpu["start_ns"])
        return out.sort_values(["start_ns", "rank"], kind="stable").reset_index(drop=True)

    def advise(self, top: int | None = 10, *, kernel_costs: pd.DataFrame | None = None) -> pd.DataFrame:
        """Fusion candidates ranked by what fusing them would recover (``taxmodel.model.advise``;
        docs/advise.md): one row each with its kernels, the launch, locality and bulk-synchronous
        tax on its boundaries (us per iteration and rank), the bound (us, % of the step), the
        analytic model's predicted saving where a built-in workload matches, and the confidence.
        ``kernel_costs``: optional per-kernel roofline floors (``floor_ns``, ``bound``) and measured
        locality (``locality_ns``), indexed like ``events``."""
        from taxmodel.model.advise import Inputs, advise

        hw = self.hardware if isinstance(self.hardware, str) or self.hardware is None else None
        return advise(Inputs(self.bundle, self.analysis, kernel_costs), top=top, hardware=hw)

    def top_kernels(self, n: int = 10) -> pd.DataFrame:
        """The GPU activities that took the most time over all ranks (``taxmodel show``'s table)."""
        from taxmodel.trace.summary import top_kernels

        return top_kernels(self.bundle, n)

    @cached_property
    def collectives(self) -> pd.DataFrame:
        """Collectives matched across ranks by process group and sequence number: one row per
        (repetition, collective_id, rank) with ``start_ns`` (arrival) and ``end_ns`` on the aligned
        clock, ``wait_ns`` (how long this rank waited for the last member) and ``skew_ns`` (last
        minus first arrival; the same on every row of one collective)."""
        from taxmodel.ledger.collectives import match_collectives

        gpu = self.bundle.gpu_events()
        inst = match_collectives(gpu).complete()
        if inst.empty:
            return pd.DataFrame({c: pd.Series([], dtype=d) for c, d in (
                ("repetition", "int64"), ("iteration", "int64"), ("collective_id", object), ("op", object),
                ("rank", "int64"), ("start_ns", "int64"), ("end_ns", "int64"), ("bytes", "int64"),
                ("wait_ns", "int64"), ("skew_ns", "int64"))})
        rows = gpu[gpu["collective_id"].astype(str) != ""]
        info = rows.groupby(["repetition", "collective_id", "rank"], sort=False).agg(
            op=("collective_op", "first"), bytes=("bytes", "max")).reset_index()
        off = inst["rank"].map(self.analysis.clock.offsets_ns).fillna(0).astype("int64").to_numpy()
        out = pd.DataFrame({
            "repetition": inst["repetition"].to_numpy(np.int64), "iteration": inst["iteration"].to_numpy(np.int64),
            "collective_id": inst["collective_id"].to_numpy(object), "rank": inst["rank"].to_numpy(np.int64),
            "start_ns": inst["arrival_ns"].to_numpy(np.int64) + off, "end_ns": inst["done_ns"].to_numpy(np.int64) + off,
        })
        out = out.merge(info, on=["repetition", "collective_id", "rank"], how="left")
        grp = out.groupby(["repetition", "collective_id"])["start_ns"]
        out["wait_ns"] = grp.transform("max") - out["start_ns"]
        out["skew_ns"] = grp.transform("max") - grp.transform("min")
        cols = ["repetition", "iteration", "collective_id", "op", "rank", "start_ns", "end_ns", "bytes", "wait_ns", "skew_ns"]
        return out[cols].sort_values(["repetition", "start_ns", "rank"], kind="stable").reset_index(drop=True)

    # figures (all from taxmodel.report.figures) -----------------------------------------------------
    def plot_ledger(self, *, title: str | None = None):
        """Stacked bar of the mean ledger (``figures.ledger_bars``)."""
        from taxmodel.report import figures

        return _shown(figures.ledger_bars([self.analysis], title=title))

    def plot_timeline(self, iteration: int | None = None, *, repetition: int = 0):
        """Every rank's kernels and ledger intervals in one iteration (default: the median one)."""
        from taxmodel.report import figures

        return _shown(figures.iteration_timeline([(self.bundle, self.analysis)], iteration=iteration, repetition=repetition))

    @property
    def has_cta_records(self) -> bool:
        from taxmodel.report import figures

        return figures.has_cta_records(self.bundle)

    def plot_ctas(self, *, rank: int | None = None, iteration: int | None = None, repetition: int = 0):
        """Per-CTA flag waits and work inside a fused kernel (needs in-kernel records)."""
        from taxmodel.report import figures

        return _shown(figures.cta_timeline(self.bundle, rank=rank, iteration=iteration, repetition=repetition))

    # the analytic model ---------------------------------------------------------------------------
    def predict(self, fitted: Mapping[str, float] | None = None, **params: Any):
        """The analytic model's prediction for this profile's workload, variant, shape and world
        size, as it was captured (records, CUDA graphs, transport, start alignment), on the hardware
        the model would pick for it (a calibrated spec when one ships), with the parameters
        `taxmodel validate` fitted for that hardware (``fitted``: others; ``{}``: none), measuring
        "useful" against this bundle's declared cost. ``params`` override ModelParams fields. The
        same prediction as ``taxmodel predict`` and ``taxmodel validate`` give for this bundle."""
        from taxmodel.model import analytic
        from taxmodel.hardware.specs import HardwareSpec
        from taxmodel.trace.capture_meta import CaptureSettings

        if not (self.workload and self.variant and self.shape):
            raise InputError(f"{self.label}: the analytic model needs workload, variant and shape in the bundle's meta; "
                             "declare them with Profile.with_meta(workload=..., variant=..., shape=...)")
        if isinstance(self.hardware, HardwareSpec):
            hw = self.hardware
        else:
            hw, _ = analytic.resolve_model_hardware(self.hardware, self.meta)
        settings = CaptureSettings.from_meta(self.meta, instrumented=bool((self.events["kind"] == "record").any()))
        mp, _ = analytic.model_params(hw, settings, fitted, **params)
        shape = {k: int(v) for k, v in self.shape.items()}
        return analytic.predict(self.workload, self.variant, shape, self.world_size, hw, mp, cost=self.meta.get("cost"))

    def plot_vs_prediction(self, prediction=None, **params: Any):
        """Measured and predicted ledgers as side-by-side stacked bars (``figures.ledger_bars``)."""
        import dataclasses

        from taxmodel.report import figures

        pred = prediction if prediction is not None else self.predict(**params)
        shape = dict(sorted(self.shape.items()))
        measured = dataclasses.replace(self.analysis, meta={**self.meta, "shape": shape,
                                                            "variant": f"{self.variant} measured"})
        predicted = dataclasses.replace(pred.ledger, meta={**pred.ledger.meta, "workload": self.workload, "shape": shape,
                                                           "variant": f"{self.variant} predicted"})
        return _shown(figures.ledger_bars([measured, predicted], title="measured vs predicted"))

    # display --------------------------------------------------------------------------------------
    def __repr__(self) -> str:
        where = f" from {self.path}" if self.path else ""
        return f"<Profile {self.label}: {self.world_size} rank(s), {len(self.events):,} events{where}>"

    def _repr_html_(self) -> str:
        head = f"<b>{html.escape(self.label)}</b> &middot; {self.world_size} rank(s) &middot; {len(self.events):,} events"
        if self.emulated:
            head += " &middot; <i>CPU-emulated capture: times say nothing about GPUs</i>"
        try:
            n_windows = len(self.windows)
            table = self.table()
        except Exception as exc:  # noqa: BLE001 - a display must show the problem, not raise it
            return f"<p>{head}</p><p>ledger not available: {html.escape(str(exc))}</p>"
        head += f" &middot; {n_windows} iteration window(s), mean {self.window_ns / NS_PER_US:,.1f} us"
        return f"<p>{head}</p>" + table.to_html(index=False, float_format=lambda v: f"{v:,.1f}", na_rep="")


# --- many bundles ------------------------------------------------------------------------------------

class ProfileSet(Sequence[Profile]):
    """Profiles of several variants and sizes, e.g. every bundle under ``profiles/h200x4``.

    Tables concatenate the members' tables with their identity columns (label, workload,
    variant, shape, world_size and one column per shape key) in front."""

    def __init__(self, profiles: Iterable[Profile], *, root: Path | None = None, note: str | None = None) -> None:
        self.profiles = list(profiles)
        self.root = root
        self.note = note

    @classmethod
    def from_dir(cls, root: PathLike, **kw: Any) -> "ProfileSet":
        root = Path(root)
        paths = find_bundles(root)
        if not paths:
            raise InputError(f"{root}: no profile bundles below this directory (a bundle has meta.json and "
                             "events.parquet); write some with `taxmodel profile -o DIR` or `taxmodel import`")
        return cls([Profile.from_path(p, **kw) for p in paths], root=root)

    def __len__(self) -> int:
        return len(self.profiles)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return ProfileSet(self.profiles[i], root=self.root)
        if isinstance(i, str):
            hits = [p for p in self.profiles if p.label == i or (p.path is not None and p.path.name == i)]
            if len(hits) != 1:
                raise KeyError(f"{i!r} names {len(hits)} profiles; labels: {', '.join(self.labels)}")
            return hits[0]
        return self.profiles[i]

    def __iter__(self) -> Iterator[Profile]:
        return iter(self.profiles)

    @property
    def labels(self) -> list[str]:
        return [p.label for p in self.profiles]

    # selection --------------------------------------------------------------------------------------
    def where(self, **criteria: Any) -> "ProfileSet":
        """Members matching every criterion. Keys: workload, variant, world_size, injected, emulated,
        label, or a shape key (``M=8192``). Values: a value, a list/tuple/set of accepted values, or
        a predicate ``lambda v: ...``."""
        def ok(p: Profile) -> bool:
            for key, want in criteria.items():
                if key in ("workload", "variant", "world_size", "injected", "emulated", "label"):
                    have = getattr(p, key)
                else:
                    have = p.shape.get(key)
                if callable(want):
                    if not want(have):
                        return False
                elif isinstance(want, (list, tuple, set, frozenset)):
                    if have not in want:
                        return False
                elif have != want:
                    return False
            return True

        return ProfileSet([p for p in self.profiles if ok(p)], root=self.root, note=self.note)

    @property
    def shapes(self) -> pd.DataFrame:
        """One row per member: its identity (no analysis needed)."""
        return pd.DataFrame([p.identity() for p in self.profiles])

    def families(self, vary: str) -> list["ProfileSet"]:
        """Members grouped so that inside a group only ``vary`` (and the variant) changes: the
        groups a size sweep is drawn from, the one with the most distinct ``vary`` values first."""
        groups: dict[tuple, list[Profile]] = {}
        for p in self.profiles:
            if vary not in p.shape:
                continue
            fixed = tuple(sorted((k, str(v)) for k, v in p.shape.items() if k != vary))
            groups.setdefault((p.workload, p.world_size, fixed), []).append(p)
        ordered = sorted(groups.values(), key=lambda g: (-len({p.shape[vary] for p in g}), -len(g), g[0].label))
        return [ProfileSet(g, root=self.root, note=self.note) for g in ordered]

    # tables -----------------------------------------------------------------------------------------
    def _concat(self, frames: Callable[[Profile], pd.DataFrame]) -> pd.DataFrame:
        out = []
        for p in self.profiles:
            f = frames(p)
            ident = p.identity()
            out.append(f.assign(**{k: [v] * len(f) for k, v in ident.items()}) if len(f) else f.assign(**{k: [] for k in ident}))
        if not out:
            return pd.DataFrame(columns=list(IDENTITY_COLUMNS))
        df = pd.concat(out, ignore_index=True)
        front = [c for c in df.columns if c in self.profiles[0].identity() or any(c in p.shape for p in self.profiles)]
        front = list(dict.fromkeys(list(IDENTITY_COLUMNS) + front))
        return df[front + [c for c in df.columns if c not in front]]

    @property
    def ledger(self) -> pd.DataFrame:
        return self._concat(lambda p: p.ledger)

    @property
    def breakdown(self) -> pd.DataFrame:
        """Every member's ``summary`` (one row per sub-category), stacked."""
        return self._concat(lambda p: p.summary)

    @property
    def summary(self) -> pd.DataFrame:
        """One row per member: identity, mean window (us) and each category (us per iteration and rank)."""
        rows = []
        for p in self.profiles:
            cats = p.categories_ns() / NS_PER_US
            rows.append({**p.identity(), "window_us": p.window_ns / NS_PER_US,
                         **{f"{c}_us": float(cats[c]) for c in CATEGORY_ORDER}})
        return pd.DataFrame(rows)

    @property
    def collectives(self) -> pd.DataFrame:
        return self._concat(lambda p: p.collectives)

    @property
    def kernels(self) -> pd.DataFrame:
        return self._concat(lambda p: p.kernels)

    @property
    def iterations(self) -> pd.DataFrame:
        return self._concat(lambda p: p.iterations)

    @property
    def caveats(self) -> dict[str, list[str]]:
        return {p.label: p.caveats for p in self.profiles}

    @property
    def analyses(self) -> list:
        return [p.analysis for p in self.profiles]

    def compare(self, reference: str = "bsp") -> pd.DataFrame:
        """Every other variant against ``reference`` at the same (workload, shape): one row each with
        both latencies, the time saved (positive: the candidate is faster), and where the saving
        came from, per ledger category (``<category>_saved_us``; they add up to ``saved_us``)."""
        from taxmodel.report import compare as cmp
        from taxmodel.report.headline import compare_ledgers, comparison_sentence

        rows = []
        for group in cmp.group_by_shape(self.analyses).values():
            refs = [led for led in group if cmp.identity(led).variant == reference]
            if not refs:
                continue
            ref = refs[0]
            for led in group:
                if led is ref or cmp.identity(led).variant == reference:
                    continue
                c = compare_ledgers(ref, led)
                row = {"workload": c.workload, "shape": c.shape, "reference": c.reference, "candidate": c.candidate,
                       "reference_label": ref.label, "candidate_label": led.label,
                       **dict(cmp.identity(led).shape),
                       "reference_us": c.reference_ns / NS_PER_US, "candidate_us": c.candidate_ns / NS_PER_US,
                       "saved_us": c.saved_ns / NS_PER_US, "saved_pct": c.saved_pct, "speedup": c.speedup}
                row.update({f"{cat}_saved_us": c.category_saved_ns[cat] / NS_PER_US for cat in CATEGORY_ORDER})
                row["headline"] = comparison_sentence(c)
                rows.append(row)
        return pd.DataFrame(rows)

    def comparison_table(self) -> pd.DataFrame:
        """Variants side by side per ledger part (``headline.comparison_table``); the set must hold
        one (workload, shape): select it first with ``where``."""
        from taxmodel.report import compare as cmp
        from taxmodel.report.headline import comparison_table

        groups = list(cmp.group_by_shape(self.analyses).values())
        if len(groups) != 1:
            raise InputError(f"comparison_table needs profiles of one workload and shape, this set has {len(groups)}; "
                             "narrow it first, e.g. ps.where(M=8192)")
        return comparison_table(groups[0])

    def headlines(self) -> list[str]:
        from taxmodel.report.headline import headlines

        return headlines(self.analyses)

    # figures (all from taxmodel.report.figures) -----------------------------------------------------
    def plot_ledger(self, *, title: str | None = None):
        """Stacked ledger bars per variant, one panel per (workload, shape)."""
        from taxmodel.report import figures

        return _shown(figures.ledger_bars(self.analyses, title=title))

    def plot_sweep(self, workload: str | None = None):
        """Latency, speedup over bsp and each tax against problem size, one line per variant."""
        from taxmodel.report import figures

        return _shown(figures.sweep(self.analyses, workload=workload))

    def plot_timeline(self, iteration: int | None = None, *, repetition: int = 0):
        """One iteration of every member, stacked on a shared time axis (select a few first)."""
        from taxmodel.report import figures

        return _shown(figures.iteration_timeline([(p.bundle, p.analysis) for p in self.profiles], iteration=iteration,
                                                 repetition=repetition))

    # display --------------------------------------------------------------------------------------
    def __repr__(self) -> str:
        where = f" under {self.root}" if self.root else ""
        return f"<ProfileSet of {len(self)} profile(s){where}: {', '.join(self.labels[:4])}{', ...' if len(self) > 4 else ''}>"

    def _repr_html_(self) -> str:
        head = f"<b>{len(self)} profile(s)</b>" + (f" under {html.escape(str(self.root))}" if self.root else "")
        if self.note:
            head += f"<br><i>{html.escape(self.note)}</i>"
        try:
            table = self.summary
        except Exception as exc:  # noqa: BLE001
            return f"<p>{head}</p><p>ledgers not available: {html.escape(str(exc))}</p>" + self.shapes.to_html(index=False)
        keep = ["label", "world_size", "window_us"] + [f"{c}_us" for c in ("useful", "compute_inefficiency") + TAXES + ("unattributed",)]
        return f"<p>{head}</p>" + table[keep].to_html(index=False, float_format=lambda v: f"{v:,.1f}")


# --- entry points ----------------------------------------------------------------------------------

def _is_trace_file(p: Path) -> bool:
    return p.is_file() and not tarfile.is_tarfile(p)


def load(path: PathLike | Sequence[PathLike], *, hardware: Any = None, lenient: bool = False) -> Profile | ProfileSet:
    """Open profiles for analysis.

    - a bundle directory or archive -> ``Profile``
    - a directory holding several bundles (at any depth) -> ``ProfileSet``
    - trace files (a path or a list: one file per rank of one run) -> ``Profile``, imported in memory
    - a list of bundles/directories -> ``ProfileSet``
    ``hardware``: preset name, JSON file or HardwareSpec for the useful floor (default: from each
    bundle). ``lenient``: skip (and list in ``caveats``) iterations that cannot be analyzed.
    """
    kw = {"hardware": hardware, "lenient": lenient}
    if not isinstance(path, (str, os.PathLike)):
        paths = [Path(p) for p in path]
        if paths and all(_is_trace_file(p) for p in paths):
            return Profile.from_traces(paths, **kw)
        members: list[Profile] = []
        for p in paths:
            got = load(p, **kw)
            members.extend(got.profiles if isinstance(got, ProfileSet) else [got])
        return ProfileSet(members)
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: no such file or directory (give a bundle directory, a directory of bundles, or trace files)")
    if p.is_file():
        return Profile.from_traces([p], **kw) if _is_trace_file(p) else Profile.from_path(p, **kw)
    found = find_bundles(p)
    if found == [p]:
        return Profile.from_path(p, **kw)
    return ProfileSet.from_dir(p, **kw)


def open_profiles(root: PathLike, *, workload: str | None = None, fallback: PathLike | None = None,
                  hardware: Any = None, lenient: bool = True, quiet: bool = False) -> ProfileSet:
    """The bundles (of ``workload``) under ``root``; when there are none, those under ``fallback``,
    saying so. What the notebooks start from: they name the real GPU profiles and run on stand-in
    CPU bundles until those exist, and switch without edits once they do."""
    def collect(d: Path) -> ProfileSet | None:
        if not d.is_dir() or not find_bundles(d):
            return None
        ps = ProfileSet.from_dir(d, hardware=hardware, lenient=lenient)
        if workload is not None:
            ps = ps.where(workload=workload)
        return ps if len(ps) else None

    root = Path(root)
    ps = collect(root)
    if ps is not None:
        return ps
    what = f"{workload} bundles" if workload else "bundles"
    if fallback is None:
        raise InputError(f"{root}: no {what} there; capture some with `taxmodel profile` or pass another directory")
    ps = collect(Path(fallback))
    if ps is None:
        raise InputError(f"no {what} under {root} nor under the fallback {fallback}")
    kinds = "CPU-emulated " if all(p.emulated for p in ps) else ""
    ps.note = (f"NOTE: no {what} under {root} yet; using the {len(ps)} {kinds}stand-in bundle(s) under {fallback}. "
               + ("Their times come from Triton's interpreter and gloo on a CPU and say nothing about GPUs: read the "
                  "figures for their structure, not their numbers." if kinds else ""))
    if not quiet:
        print(ps.note)
    return ps


def predict(workload: str, variant: str, shape: Mapping[str, int], world_size: int = 4, hardware: Any = "h200-calibrated",
            fitted: Mapping[str, float] | None = None, graph_launch: bool | None = None, transport: str | None = None,
            align: str = "back-to-back", **params: Any):
    """The analytic model's predicted ledger (``taxmodel.model.analytic.predict``), with the same
    parameters and defaults as ``taxmodel predict``: the hardware's calibration, the parameters
    `taxmodel validate` fitted for it (``fitted``: others; ``{}``: none), how the iterations are
    launched (``graph_launch``, ``transport``, ``align``: back to back behind one device gate, as
    ``taxmodel profile`` captures on GPUs, unless given), and keyword ``params`` over
    ``ModelParams`` fields (e.g. ``triton_gemm_efficiency=0.9``)."""
    from taxmodel.model import analytic
    from taxmodel.trace.capture_meta import CaptureSettings

    hw = hardware
    if isinstance(hw, str):
        hw, _ = analytic.resolve_model_hardware(hw)
    settings = CaptureSettings(graph_launch=graph_launch, transport=transport, align=align)
    mp, _ = analytic.model_params(hw, settings, fitted, **params)
    return analytic.predict(workload, variant, shape, world_size, hw, mp)


def sum_check(profile: Profile) -> bool:
    """True when every (repetition, iteration, rank) of the ledger sums exactly to its window."""
    parts = profile.ledger.groupby(["repetition", "iteration", "rank"])["ns"].sum().rename("sum").reset_index()
    merged = parts.merge(profile.windows[["repetition", "iteration", "window_ns"]], on=["repetition", "iteration"])
    return bool((merged["sum"] == merged["window_ns"]).all())


__all__ = ["Profile", "ProfileSet", "load", "open_profiles", "predict", "sum_check"]
