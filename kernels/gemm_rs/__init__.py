"""GEMM + Reduce-Scatter workload (registered as ``gemm_rs``): bsp, fused and torch_fused variants.

See ``workload.py`` for presets and cost, ``state.py`` for shapes, inputs and buffers, ``tiles.py`` for the fine-grained kernels and their
flag protocol, and one module per variant.
"""
from .state import CPU_RS_CONFIG, GPU_RS_CONFIG, GemmRsState, RsConfig
from .workload import PRESETS, GemmRs

__all__ = ["GemmRs", "GemmRsState", "RsConfig", "CPU_RS_CONFIG", "GPU_RS_CONFIG", "PRESETS"]
