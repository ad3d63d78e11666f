"""How ``world`` GPUs are connected, as the model assumes it (stated in every prediction)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from taxmodel.errors import InputError
from taxmodel.hardware.specs import HardwareSpec

from .params import ModelParams


@dataclass(frozen=True)
class Topology:
    """How ``world`` GPUs are connected, as the model assumes it (stated in every prediction)."""

    world: int
    domain_size: int
    link_bytes_per_s: float  # per GPU, receive, for collectives
    latency_s: float
    description: str

    @property
    def single_domain(self) -> bool:
        return self.world <= self.domain_size


def topology(hw: HardwareSpec, world: int, params: ModelParams) -> Topology:
    if world < 1:
        raise InputError(f"world size must be at least 1, got {world}")
    dom = params.domain_size
    fabric = "xGMI, fully connected" if hw.vendor == "amd" else "NVLink through an all-to-all switch (NVL72-style)"
    if world <= dom:
        desc = f"{world} GPU(s) in one {fabric} domain (up to {dom}); every pair at {hw.link_bytes_per_s / 1e9:.0f} GB/s per direction"
        return Topology(world, dom, hw.link_bytes_per_s, max(hw.link_latency_s, 0.0), desc)
    desc = (f"{world} GPUs = {math.ceil(world / dom)} domains of {dom} ({fabric}); collectives bottlenecked by the "
            f"scale-out network at {params.internode_bytes_per_s / 1e9:.0f} GB/s per GPU, "
            f"{params.internode_latency_s * 1e6:.0f} us latency (an assumption, not a measurement)")
    return Topology(world, dom, min(hw.link_bytes_per_s, params.internode_bytes_per_s),
                    max(hw.link_latency_s, params.internode_latency_s), desc)


