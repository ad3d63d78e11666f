"""All-Gather + GEMM workload (registered as ``ag_gemm``): bsp, pull, push and torch_fused variants.

See ``workload.py`` for presets and cost, ``state.py`` for shapes, inputs and buffers, ``gemm_tiles.py``
for the shared persistent Triton GEMM, ``transport.py`` for how blocks of A move between ranks, and
one module per variant.
"""
from .gemm_tiles import CPU_CONFIG, GPU_CONFIG, GemmConfig
from .state import AgGemmState
from .workload import PRESETS, AgGemm

__all__ = ["AgGemm", "AgGemmState", "GemmConfig", "CPU_CONFIG", "GPU_CONFIG", "PRESETS"]
