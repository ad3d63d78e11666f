"""Per-kernel floors on a spec (ledger/kernel_costs.py), against hand computations."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from taxmodel.hardware.specs import HardwareSpec
from taxmodel.ledger.kernel_costs import kernel_floors

NV = HardwareSpec(name="Test NV", vendor="nvidia", source="datasheet", peak_flops={"bf16": 1e15, "fp32": 5e13},
                  hbm_bytes_per_s=4e12, link_bytes_per_s=4e11)
AMD = HardwareSpec(name="Test AMD", vendor="amd", source="datasheet", peak_flops={"bf16": 1e15, "fp32": 1e14},
                   hbm_bytes_per_s=4e12, link_bytes_per_s=4e11)


def rows(*r):
    cols = ["kind", "role", "name", "flops", "floor_bytes", "dtype", "bytes", "uncosted"]
    return pd.DataFrame([dict(zip(cols, x)) for x in r])


def test_floors_by_hand():
    f = kernel_floors(rows(
        ("kernel", "compute", "gemm", 10**12, 10**9, "bf16", -1, ""),      # 1e12/1e15 = 1 ms > 1e9/4e12 = 0.25 ms
        ("kernel", "compute", "add", 10**6, 4 * 10**9, "fp32", -1, ""),    # bytes: 1 ms
        ("kernel", "comm", "ncclAllReduce", -1, 4 * 10**8, "", 10**9, ""),  # link: 4e8 / 4e11 = 1 ms
        ("memcpy", "copy", "Memcpy DtoD (Device -> Device)", -1, -1, "", 2 * 10**9, ""),  # 2 x 2e9 / 4e12 = 1 ms
        ("memset", "copy", "Memset (Device)", -1, -1, "", -1, ""),
        ("kernel", "compute", "x", -1, -1, "", -1, "op not in the cost table"),
    ), NV)
    assert f["floor_ns"].iloc[:4].tolist() == pytest.approx([1e6, 1e6, 1e6, 1e6])
    assert f["bound"].iloc[:4].tolist() == ["compute", "memory", "link", "memory"]
    assert not f["costed"].iloc[4] and f["reason"].iloc[4] == "copy size not recorded"
    assert np.isnan(f["floor_ns"].iloc[5]) and f["reason"].iloc[5] == "op not in the cost table"


def test_tf32_without_a_tf32_peak():
    r = rows(("kernel", "compute", "sgemm", 10**12, 4 * 10**6, "tf32", -1, ""))
    assert kernel_floors(r, AMD)["floor_ns"].iloc[0] == pytest.approx(1e12 / 1e14 * 1e9)  # AMD: fp32 matrix rate
    # NVIDIA without a TF32 peak: never the (slower) CUDA-core fp32 rate, only the bytes
    assert kernel_floors(r, NV)["floor_ns"].iloc[0] == pytest.approx(4e6 / 4e12 * 1e9)
