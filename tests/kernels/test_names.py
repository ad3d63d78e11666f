"""kernels/names.py is the one spelling of every built-in kernel's name: each name is the Triton
function's (or the host range's) that runs under it, the workloads' roles use them, and importing
the names imports no Triton."""
from __future__ import annotations

import subprocess
import sys

from taxmodel.kernels import names


def test_each_name_is_its_triton_function() -> None:
    from taxmodel.kernels.ag_gemm import gemm_tiles, transport
    from taxmodel.kernels.device import gate
    from taxmodel.kernels.flash_decode import combine, fused, split_kv
    from taxmodel.kernels.gemm_rs import tiles

    def fn_name(jitted) -> str:
        return getattr(jitted, "fn", jitted).__name__

    assert fn_name(gemm_tiles.ag_gemm_kernel) == names.AG_GEMM_KERNEL
    assert fn_name(transport.copy_blocks_kernel) == names.COPY_BLOCKS_KERNEL
    assert fn_name(tiles.gemm_rs_kernel) == names.GEMM_RS_KERNEL
    assert fn_name(tiles.rs_reduce_kernel) == names.RS_REDUCE_KERNEL
    assert fn_name(split_kv.flash_decode_split_kv) == names.FLASH_DECODE_SPLIT
    assert fn_name(combine.flash_decode_combine_local) == names.FLASH_DECODE_COMBINE_LOCAL
    assert fn_name(combine.flash_decode_combine_global) == names.FLASH_DECODE_COMBINE_GLOBAL
    assert fn_name(fused.flash_decode_fused) == names.FLASH_DECODE_FUSED
    assert fn_name(gate.taxmodel_gate_kernel) == names.GATE_KERNEL


def test_the_variants_roles_name_their_kernels() -> None:
    from taxmodel.workload import get_workload

    roles = {v: get_workload("ag_gemm").variants()[v].roles for v in ("pull", "push")}
    assert roles["push"][names.AG_GEMM_KERNEL] == "fused" and roles["push"][names.CE_PUT] == "comm"
    assert roles["pull"][names.COPY_BLOCKS_KERNEL] == "comm" and roles["pull"][names.CE_GET] == "comm"
    fused = get_workload("gemm_rs").variants()["fused"].roles
    assert {fused[k] for k in (names.GEMM_RS_KERNEL, names.RS_REDUCE_KERNEL) if k in fused} == {"fused"}


def test_names_import_no_triton() -> None:
    code = "import sys; import taxmodel.kernels.names; print('triton' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
