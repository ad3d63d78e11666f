"""Flash decode on three CPU ranks (processes, Triton's interpreter): an odd GQA group in fp16 at
batch 1, and a rank that never launches its step (a bounded wait, then a RunError naming it)."""
from __future__ import annotations

import os
import re

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

from test_flash_decode_harness import _assert_matches, _seeds, _spawn


@pytest.fixture(scope="module")
def three_ranks(tmp_path_factory):
    odd = dict(batch=1, q_heads=6, kv_heads=2, kv_len=33, fp16=1)  # G = 3 query heads per KV head
    plan = [("odd-bsp", "bsp", odd, 1, _seeds(1)), ("odd-fused", "fused", odd, 2, _seeds(2)), ("timeout",)]
    return _spawn(3, plan, tmp_path_factory.mktemp("fd3"))


@pytest.mark.slow
def test_three_ranks_odd_group_fp16(three_ranks):
    _assert_matches(three_ranks, "odd-bsp")
    _assert_matches(three_ranks, "odd-fused")


@pytest.mark.slow
@pytest.mark.parametrize("rank", [0, 2])
def test_a_missing_peer_becomes_a_run_error_not_a_hang(three_ranks, rank):
    (item,) = [i for i in three_ranks[rank] if i["name"] == "timeout"]
    assert f"rank {rank}: kernel flash_decode_fused gave up waiting on flag" in item["message"]
    assert "from rank 1" in item["message"]
    # The wait is bounded by wall-clock time, however fast this machine polls: it gave up after
    # its 0.5 s spin timeout had passed, and the time it reports waiting was spent in this step.
    waited = float(re.search(r"after ([0-9.e+-]+) s \(spin timeout 0.5 s\)", item["message"]).group(1))
    assert 0.5 <= waited <= item["elapsed"]


@pytest.mark.slow
def test_the_missing_rank_itself_reports_nothing(three_ranks):
    (item,) = [i for i in three_ranks[1] if i["name"] == "timeout"]
    assert item["message"] == ""
