"""Flash decode on four CPU ranks (processes, Triton's interpreter): both variants against the fp32
reference over the gathered KV, with fresh inputs and a NaN-poisoned output at every step."""
from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from test_flash_decode_harness import _assert_matches, _seeds, _spawn

@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fd4")
    ragged = dict(batch=1, kv_len=37, kv_len_step=-9, empty_rank=2)  # 37, 28, 0, 10 keys
    plan = [
        ("uniform-bsp", "bsp", {}, 1, _seeds(1)),
        ("uniform-fused", "fused", {}, 2, _seeds(2)),
        ("ragged-bsp", "bsp", dict(ragged, bsp_slices=2), 1, _seeds(1)),
        ("ragged-fused", "fused", ragged, 1, _seeds(1)),
        # the other structures: flags protocol with dedicated combiners (the old kernel), LL with
        # one dedicated combiner for both pairs, flags with the last worker combining
        ("uniform-flags-c2", "fused", dict(fused_protocol=2, fused_combiners=2), 2, _seeds(2)),
        ("ragged-ll-c1", "fused", dict(ragged, batch=2, fused_combiners=1), 1, _seeds(1)),
        ("ragged-flags-last", "fused", dict(ragged, fused_protocol=2), 1, _seeds(1)),
        # spread: one-row slices (4 per pair, 8 slice combiners capped at 2 CTAs looping over
        # them), and the flag protocol with 2-row slices
        ("uniform-ll-s4", "fused", dict(fused_slices=4), 2, _seeds(2)),
        ("ragged-flags-s2", "fused", dict(ragged, batch=2, fused_protocol=2, fused_slices=2), 1, _seeds(1)),
    ]
    return _spawn(4, plan, tmp)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["uniform-bsp", "uniform-fused", "ragged-bsp", "ragged-fused", "uniform-flags-c2",
                                  "ragged-ll-c1", "ragged-flags-last", "uniform-ll-s4", "ragged-flags-s2"])
def test_four_ranks_match_reference(four_ranks, name):
    _assert_matches(four_ranks, name)


@pytest.mark.slow
@pytest.mark.parametrize("name,config", [("uniform-fused", "ll-last"), ("uniform-flags-c2", "flags-c2"),
                                         ("uniform-ll-s4", "ll-s4")])
def test_fused_pushes_hold_the_epoch_and_counters_reset(four_ranks, name, config):
    for res in four_ranks:
        (item,) = [i for i in res if i["name"] == name]
        assert item["config"] == config
        assert item["epoch"] == 2
        assert torch.all(item["arrived"] == 2)  # every pair's partial from every rank arrived at step 2
        assert torch.all(item["counters"] == 0)
        assert item["splits"] > 1  # the tiny preset really exercises the split combine


@pytest.mark.slow
def test_ragged_shards_include_an_empty_rank(four_ranks):
    (item,) = [i for i in four_ranks[0] if i["name"] == "ragged-fused"]
    assert item["kv_lens"] == [37, 28, 0, 10]
