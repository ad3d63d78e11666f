"""Summary tables of a bundle: exact sums, the top list, the import paragraph."""
from __future__ import annotations

import pandas as pd
import pytest

from kineto_fixtures import build_trace, write_ranks
from taxmodel.trace import importers, summary


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("summary")
    paths, _ = write_ranks(tmp, world_size=2)
    b, _ = importers.import_bundle(paths, tmp / "b")
    return b


def test_role_table_is_exact(bundle):
    table = summary.role_table(bundle).set_index(["rank", "role"])
    # per step: gemm 100_001 + s ns, nccl 50_000 + 7 * rank ns, memcpy 3_003 ns; plus a 1_234 ns warm-up kernel
    for rank in (0, 1):
        assert table.loc[(rank, "compute"), "count"] == 4
        assert table.loc[(rank, "compute"), "total_ns"] == 100_001 + 100_002 + 100_003 + 1_234
        assert table.loc[(rank, "comm"), "total_ns"] == 3 * (50_000 + 7 * rank)
        assert table.loc[(rank, "comm"), "mean_ns"] == 50_000 + 7 * rank
        assert table.loc[(rank, "copy"), "total_ns"] == 3 * 3_003


def test_top_kernels_and_overview(bundle):
    top = summary.top_kernels(bundle, 2)
    assert list(top["name"]) == ["gemm_kernel", "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"]
    assert top.loc[0, "count"] == 6 and top.loc[0, "total_ns"] == 2 * (100_001 + 100_002 + 100_003)
    all_top = summary.top_kernels(bundle, 100)
    assert all_top["pct"].sum() == pytest.approx(100.0)
    o = summary.overview(bundle)
    assert o["ranks"] == [0, 1] and o["iterations"] == [1, 2, 3] and o["kernels"] == 14 and o["memcpy"] == 6
    assert o["collectives"] == 3 and o["launches"] == 18 and o["repetitions"] == 1


def test_meta_table_and_describe(bundle):
    meta = summary.meta_table(bundle).set_index("field")["value"]
    assert meta["device"] == "NVIDIA H200, 132 SMs, 140 GiB, sm 9.0"
    assert meta["nccl"] == "2.21.5" and meta["workload"] == "-"
    text = summary.describe(bundle, "kineto")
    assert text.startswith("Imported 2 ranks from kineto traces: 14 kernels, 6 memcpy, 0 memset")
    assert "3 iterations (1..3)" in text
    doc = summary.to_json(bundle)
    assert set(doc) == {"overview", "meta", "roles", "top_kernels"}
    assert isinstance(pd.DataFrame(doc["roles"]), pd.DataFrame)


def test_build_trace_is_importable_for_one_rank(tmp_path):
    # sanity of the fixture builder used throughout these tests
    doc, exp = build_trace(0, 1, steps=1)
    assert len(exp.kernels) == 3 and exp.launches == 3
