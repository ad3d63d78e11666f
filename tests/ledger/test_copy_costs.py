"""Copies are work with a floor (issue 36 item 2): every memcpy and memset is floored by its bytes
over the link it crosses, whichever importer named it, and pageable host copies are said."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from taxmodel.ledger.copy_costs import BOUND_HOST, BOUND_MEMORY, BOUND_PEER, copy_routes
from taxmodel.hardware.specs import find_preset, pcie_bytes_per_s
from taxmodel.ledger.kernel_costs import BASIS_SIZE, copy_bytes, kernel_floors
from taxmodel.ledger.compute import compute_ledger
from taxmodel.trace import importers

THIRD = Path(__file__).resolve().parents[1] / "data" / "thirdparty"
GB = 1 << 30


def _gpu(rows: list[tuple[str, str, int]]) -> pd.DataFrame:
    """GPU rows of (kind, name, bytes), as the importers write them."""
    return pd.DataFrame({"kind": [r[0] for r in rows], "name": [r[1] for r in rows], "bytes": [r[2] for r in rows],
                         "role": ["comm" if "PtoP" in r[1] else "copy" for r in rows],
                         "flops": -1, "floor_bytes": -1, "dtype": "", "uncosted": ""})


def test_each_copy_is_floored_on_the_link_it_crosses():
    t4 = find_preset("t4")
    host = pcie_bytes_per_s(3, 16)
    assert host == pytest.approx(8e9 * 128 / 130 / 8 * 16) and t4.host_bytes_per_s == host
    gpu = _gpu([("memcpy", "Memcpy HtoD (Pinned -> Device)", GB),       # Kineto / Nsight Systems
                ("memcpy", "Memcpy DtoH (Device -> Pageable)", GB),
                ("memcpy", "Memcpy HtoD", GB),                           # rocprof: no memory kinds
                ("memcpy", "Memcpy UVM HtoD (Managed -> Device)", GB),   # Nsight Systems unified-memory migration
                ("memcpy", "Memcpy DtoD (Device -> Device)", GB),
                ("memset", "Memset (Device)", GB),
                ("memcpy", "Memcpy PtoP (Device -> Device)", GB),
                ("memcpy", "Memcpy HtoH (Pinned -> Pageable)", GB),
                ("memcpy", "Memcpy Unknown (Unknown -> Unknown)", GB),
                ("memcpy", "Memcpy HtoD (Pinned -> Device)", -1)])
    fl = kernel_floors(gpu, t4)
    ns = fl["floor_ns"].to_numpy()
    on_host = GB / host * 1e9
    np.testing.assert_allclose(ns[:4], on_host)
    assert ns[4] == pytest.approx(2 * GB / t4.hbm_bytes_per_s * 1e9)   # read and write
    assert ns[5] == pytest.approx(GB / t4.hbm_bytes_per_s * 1e9)       # written once
    assert ns[6] == pytest.approx(GB / t4.link_bytes_per_s * 1e9)      # a T4 has no NVLink: PCIe
    assert fl["bound"].tolist()[:7] == [BOUND_HOST] * 4 + [BOUND_MEMORY] * 2 + [BOUND_PEER]
    assert (fl["basis"].iloc[:7] == BASIS_SIZE).all() and fl["costed"].iloc[:7].all()
    assert fl["reason"].tolist()[7:] == ["a host-to-host copy crosses no GPU link", "copy direction not recorded",
                                         "copy size not recorded"]
    assert not fl["costed"].iloc[7:].any()
    assert copy_routes(gpu)["host_memory"].tolist()[:3] == ["pinned", "pageable", ""]


def test_the_host_link_is_the_parts_own():
    """GH200 reaches host memory over NVLink-C2C (450 GB/s a direction), an H100 over PCIe Gen5 x16;
    a calibration, which does not measure it, borrows its part's; an HBM slower than the link bounds."""
    gpu = _gpu([("memcpy", "Memcpy HtoD (Pinned -> Device)", GB)])
    gh = find_preset("NVIDIA GH200 480GB")
    assert gh.key == "gh200" and gh.host_link_text == "NVLink-C2C"
    assert kernel_floors(gpu, gh)["floor_ns"].iloc[0] == pytest.approx(GB / 450e9 * 1e9)
    assert kernel_floors(gpu, find_preset("h100"))["floor_ns"].iloc[0] == pytest.approx(GB / pcie_bytes_per_s(5, 16) * 1e9)
    cal = find_preset("h200-calibrated")
    assert cal.host_bytes_per_s == 0 and kernel_floors(gpu, cal)["floor_ns"].iloc[0] == pytest.approx(
        GB / pcie_bytes_per_s(5, 16) * 1e9)


def test_copy_bytes_count_each_gpus_hbm_once_for_host_and_peer_copies():
    gpu = _gpu([("memcpy", "Memcpy DtoD (Device -> Device)", 100), ("memcpy", "Memcpy PtoP (Device -> Device)", 100),
                ("memcpy", "Memcpy HtoD (Pinned -> Device)", 100), ("memset", "Memset (Device)", 100)])
    assert copy_bytes(gpu, np.full(4, -1.0)).tolist() == [200, 100, 100, 100]


def test_a_real_nsys_export_floors_its_pageable_copies_on_pcie_and_says_they_are_pageable(tmp_path):
    """Perlmutter's saxpy (Nsight Systems 2022.2 export, no ENUM tables): its copies are
    pageable -> device (Nsight Systems' own memory-kind numbering, read right), floored on the
    A100's PCIe Gen4 x16, and the ledger says how much copy time was pageable."""
    path = THIRD / "pipit" / "perlmutter_saxpy_mpi_cuda_rank0.sqlite"
    bundle, _ = importers.import_bundle([path], tmp_path / "b", keep_raw=False)
    names = set(bundle.events.loc[bundle.events["kind"] == "memcpy", "name"])
    assert names == {"Memcpy HtoD (Pageable -> Device)", "Memcpy DtoH (Device -> Pageable)"}
    led = compute_ledger(bundle)
    copies = led.kernels[led.kernels["name"].str.startswith("Memcpy")]
    assert copies["costed"].all() and (copies["useful_ns"] > 0).all()
    assert (copies["floor_ns"] <= copies["time_ns"] * 1.0001).all()  # lower bounds, not above what ran
    said = [c for c in led.caveats if c.startswith("pageable host copies:")]
    assert len(said) == 1 and "pin the host buffers" in said[0]
