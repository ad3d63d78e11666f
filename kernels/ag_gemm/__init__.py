"""All-Gather + GEMM workload (registered as ``ag_gemm``): bsp, pull, push and torch_fused variants.

See ``workload.py`` for shapes and inputs, ``gemm_tiles.py`` for the shared persistent Triton GEMM,
and one module per variant.
"""
from .gemm_tiles import CPU_CONFIG, GPU_CONFIG, GemmConfig
from .workload import PRESETS, AgGemm, AgGemmState

__all__ = ["AgGemm", "AgGemmState", "GemmConfig", "CPU_CONFIG", "GPU_CONFIG", "PRESETS"]
