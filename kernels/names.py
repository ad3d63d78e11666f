"""The names the built-in kernels have in traces, defined once.

Each is the name of the Triton function (or of the ``RankContext.kernel`` range a host-side step
runs under on CPU), so that the workloads' roles, the analytic model's predicted timelines, the
fit rules that read one kernel's duration, and the capture's roles all say the same kernel. This
module imports nothing, so the model can name kernels without importing Triton. Other libraries'
kernels (collectives, vendor GEMMs, copies) are named in ``taxmodel.vocabulary``.
"""

#: All-Gather + GEMM: the persistent GEMM that waits on per-block flags, the SM copy kernel that
#: moves blocks of A, and the copy-engine transfers (ranges named after the direction).
AG_GEMM_KERNEL = "ag_gemm_kernel"
COPY_BLOCKS_KERNEL = "copy_blocks_kernel"
CE_PUT = "ce_put"
CE_GET = "ce_get"

#: GEMM + Reduce-Scatter: the persistent GEMM that pushes partial tiles, and the reduction.
GEMM_RS_KERNEL = "gemm_rs_kernel"
RS_REDUCE_KERNEL = "rs_reduce_kernel"

#: Flash Decode: split-KV attention, the local and global combines (bsp), and the fused kernel.
FLASH_DECODE_SPLIT = "flash_decode_split_kv"
FLASH_DECODE_COMBINE_LOCAL = "flash_decode_combine_local"
FLASH_DECODE_COMBINE_GLOBAL = "flash_decode_combine_global"
FLASH_DECODE_FUSED = "flash_decode_fused"

#: The vendor GEMM that the bsp variants call (``torch.matmul``: cuBLAS's nvjet kernels on H100 and
#: H200), as the analytic model names it in predicted timelines.
VENDOR_GEMM = "nvjet_gemm"

#: The device gate that starts every rank's traced step together (``device/gate.py``).
GATE_KERNEL = "taxmodel_gate_kernel"
