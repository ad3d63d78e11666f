"""GEMM + Reduce-Scatter workload (registered as ``gemm_rs``): bsp, fused and torch_fused variants.

See ``workload.py`` for shapes, inputs and cost, ``tiles.py`` for the fine-grained kernels and their
flag protocol, and one module per variant.
"""
from .workload import CPU_RS_CONFIG, GPU_RS_CONFIG, PRESETS, GemmRs, GemmRsState, RsConfig

__all__ = ["GemmRs", "GemmRsState", "RsConfig", "CPU_RS_CONFIG", "GPU_RS_CONFIG", "PRESETS"]
