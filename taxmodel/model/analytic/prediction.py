"""A prediction: the simulated timeline split by the measured ledger's own code
(``taxmodel.ledger.compute_ledger``), so a predicted tax means what a measured one means,
with the assumptions stated."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import pandas as pd

from taxmodel.hardware.specs import HardwareSpec

from .params import ModelParams
from .timeline import KernelPlan, simulate, timeline_events
from .topology import Topology


@dataclass
class Prediction:
    """A predicted ledger: the ledger of the predicted timeline, with what it assumed.

    ``summary()`` has the columns of ``Ledger.summary()`` (category, subcategory, mean_ns, pct),
    so reports and ``validate`` put predicted and measured side by side. The timeline is simulated
    and split on first use: what needs only ``details`` (the fit of a parameter on a kernel's
    predicted time, a check that a case can be predicted) or ``window_ns`` does not pay for the
    split."""

    workload: str
    variant: str
    shape: dict[str, int]
    world_size: int
    hardware: HardwareSpec
    params: ModelParams
    plans: Sequence[Sequence[KernelPlan]]  # each rank's kernels of one iteration
    cost: Mapping[str, Any]  # the declared cost "useful" is measured against
    assumptions: list[str]
    details: dict[str, float]  # named component times (seconds), for the docs and debugging

    @functools.cached_property
    def timeline(self) -> Any:
        """The predicted timeline as a bundle (``predicted_bundle``)."""
        return predicted_bundle(self.plans, self.cost, self.hardware, self.params, workload=self.workload,
                                variant=self.variant, shape=self.shape)

    @functools.cached_property
    def ledger(self) -> Any:  # taxmodel.ledger.Ledger
        return split_predicted(self.timeline, self.hardware)

    @property
    def window_ns(self) -> float:
        if "ledger" in self.__dict__:
            return float(self.ledger.windows["window_ns"].mean())
        from taxmodel.ledger.compute import ledger_windows

        return float(ledger_windows(self.timeline, hardware=self.hardware)["window_ns"].mean())

    def summary(self) -> pd.DataFrame:
        return self.ledger.summary()

    def category_summary(self) -> pd.DataFrame:
        return self.ledger.category_summary()

    def taxes_ns(self) -> dict[str, float]:
        """Window, each category and each sub-category, mean ns per rank-iteration."""
        s = self.summary()
        out = {"window": self.window_ns}
        out.update({c: float(v) for c, v in s.groupby("category", sort=False)["mean_ns"].sum().items()})
        out.update({sc: float(v) for sc, v in zip(s["subcategory"], s["mean_ns"]) if sc not in out})
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "workload": self.workload, "variant": self.variant, "shape": dict(self.shape), "world_size": self.world_size,
            "hardware": {"name": self.hardware.name, "source": self.hardware.source},
            "predicted_window_ns": self.window_ns,
            "summary": self.summary().to_dict(orient="records"),
            "components_us": {k: v * 1e6 for k, v in self.details.items()},
            "params": self.params.to_dict(),
            "assumptions": list(self.assumptions),
        }


#: ``Ledger.locality`` of a prediction whose kernels carry predicted DRAM bytes: the ledger measured
#: the locality tax from them as it does from hardware counters (docs/ledger.md 5b)
LOCALITY_PREDICTED = "predicted"


def predicted_bundle(plans: Sequence[Sequence[KernelPlan]], cost: Mapping[str, Any], hw: HardwareSpec,
                     params: ModelParams, *, workload: str, variant: str, shape: Mapping[str, int]) -> Any:
    """Simulate ``plans`` into a bundle of the predicted timeline (one iteration, clocks aligned).
    Kernels with predicted DRAM bytes carry them as counters do."""
    from taxmodel.trace.bundle import Bundle, make_meta

    tl = simulate(plans, params)
    events = timeline_events(tl, instrumented=params.instrumented, counters=True)
    world = len(plans)
    meta = make_meta(source="model", workload=workload, variant=variant, shape=dict(shape), world_size=world,
                     ranks=list(range(world)), hardware={"name": hw.name, "vendor": hw.vendor},
                     clock_offsets_ns={str(r): 0 for r in range(world)},
                     capture={"tracer": "analytic model", "clock_offsets_source": "measured"}, cost=dict(cost))
    return Bundle(events=events, meta=meta)


def split_predicted(bundle: Any, hw: HardwareSpec) -> Any:
    """Split a predicted timeline (``predicted_bundle``) with the measured ledger's own code, so
    the locality tax is what the ledger would measure from the counters of that timeline: the
    time its DRAM bytes take at the HBM bandwidth beyond its useful floor, at most its time after
    useful (docs/ledger.md 5b)."""
    from taxmodel.ledger.compute import compute_ledger
    from taxmodel.ledger.per_kernel import LOCALITY_MEASURED

    ledger = compute_ledger(bundle, hardware=hw)
    if ledger.locality == LOCALITY_MEASURED:
        ledger.locality = LOCALITY_PREDICTED
    return ledger


def graph_gap_note(params: ModelParams) -> str:
    """For graph launches, the gap used between the kernels of one graph (the launch note's tail)."""
    if not params.graph_launch:
        return ""
    if not params.graph_kernel_gap_s > 0:
        return ", the same in a CUDA graph (graph_kernel_gap_s not measured)"
    return (f", {params.queued_gap_s * 1e6:.2f} us between the kernels of a CUDA graph "
            f"({params.sources.get('graph_kernel_gap_s', 'default')})")


def standard_assumptions(hw: HardwareSpec, topo: Topology, params: ModelParams) -> list[str]:
    scaled = (f"; datasheet peaks scaled by {params.vendor_fraction_of_datasheet:.2f} for vendor GEMMs"
              if hw.source == "datasheet" else "")
    named = f"({hw.source})" in hw.name  # a calibrated file's name says so already
    out = [
        f"hardware: {hw.name}" + ("" if named and not scaled else f" ({hw.source}{scaled})"),
        f"topology: {topo.description}",
        (f"ranks leave the per-iteration host barrier spread like exponential delays of mean {params.barrier_skew_s * 1e6:.1f} us "
         f"({params.sources.get('barrier_skew_s', 'default')})") if params.start_alignment == "host" else
        (f"a device gate releases the ranks (profile --align device): the last to arrive at once, the others one flag "
         f"latency later ({params.flag_roundtrip_s / 2 * 1e6:.1f} us, half the flag round trip); hosts enqueue "
         f"{params.gate_hold_s * 1e6:.0f} us before the release"),
        f"launch: {params.host_launch_triton_s * 1e6:.1f} us host per Triton launch, {params.host_launch_torch_s * 1e6:.1f} us per "
        f"torch/NCCL call, {params.launch_latency_s * 1e6:.1f} us launch latency, {params.kernel_gap_s * 1e6:.1f} us between queued kernels"
        + graph_gap_note(params),
    ]
    if not params.instrumented:
        out.append("fused kernels without in-kernel trace records: their flag waits count as compute time (as the ledger "
                   "measures them)")
    return out
