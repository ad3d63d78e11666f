"""Bundles whose events are the analytic model's own predicted timeline (shared by the model tests)."""
from __future__ import annotations

import importlib
from pathlib import Path

from taxmodel.model.analytic.collective_model import CollectiveModel
from taxmodel.model.analytic.params import ModelParams
from taxmodel.model.analytic.timeline import simulate, timeline_events
from taxmodel.model.analytic.topology import topology
from taxmodel.hardware.specs import find_preset
from taxmodel.trace.bundle import make_meta, write_bundle

H200 = find_preset("h200-calibrated")
AG = {"M": 4096, "N": 8192, "K": 8192, "tp": 0}


def model_bundle(path: Path, variant: str, shape: dict, world: int, workload: str = "ag_gemm",
                 params: ModelParams | None = None) -> Path:
    """A bundle whose events are the model's own predicted timeline (validation must give 0 error)."""
    model = importlib.import_module(f"taxmodel.model.analytic.{workload}")
    params = params or ModelParams.from_hardware(H200)
    coll = CollectiveModel.from_hardware(H200, topology(H200, world, params), params)
    plans, _, _ = model.plans(variant, shape, world, H200, params, coll)
    events = timeline_events(simulate(plans, params), iterations=3)
    meta = make_meta(source="capture", workload=workload, variant=variant, shape=shape, world_size=world,
                     ranks=list(range(world)), hardware={"name": "NVIDIA H200"},
                     clock_offsets_ns={str(r): 0 for r in range(world)}, capture={"clock_offsets_source": "measured"},
                     cost=model.cost(shape, world, variant))
    return write_bundle(path, events, meta)
