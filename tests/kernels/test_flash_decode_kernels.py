"""Flash decode kernels on one rank, in Triton's interpreter: split-KV partials, the LSE combine,
both variants end to end at world size 1, the split planner and the declared cost."""
from __future__ import annotations

import math
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported

import pytest
import torch
import triton
import triton.language as tl
from hypothesis import given, settings
from hypothesis import strategies as st

from taxmodel.kernels.flash_decode import combine as cb
from taxmodel.kernels.flash_decode import ll
from taxmodel.kernels.flash_decode import split_kv as sk
from taxmodel.kernels.flash_decode.reference import make_kv_shard, make_query, reference_output
from taxmodel.kernels.flash_decode.workload import FlashDecode, kv_lengths
from taxmodel.runtime.context import RankContext
from taxmodel.runtime.heap import ThreadHeap
from taxmodel.workload import get_workload

pytestmark = pytest.mark.skipif(not sk.interpreted(sk.flash_decode_split_kv),
                                reason="kernels were imported without TRITON_INTERPRET=1")

CFG = sk.SplitConfig(block_n=16, num_stages=1)


def _fresh_seed() -> int:
    return int(torch.randint(0, 2**31 - 1, ()).item())


def _partials_fp32(q, k, v, kv_len, plan):
    """Expected per-split (o, lse base 2) in fp32: [B*Hkv, S, G, D], [B*Hkv, S, G]."""
    b, hq, d = q.shape
    hkv = k.shape[1]
    g = hq // hkv
    qf = q.float().view(b, hkv, g, d)
    outs = torch.zeros(b * hkv, plan.num_splits, g, d)
    lses = torch.full((b * hkv, plan.num_splits, g), float("-inf"))
    for s in range(plan.num_splits):
        lo, hi = s * plan.chunk, min((s + 1) * plan.chunk, kv_len)
        if hi <= lo:
            continue
        scores = torch.einsum("bhgd,bhld->bhgl", qf, k[:, :, lo:hi].float()) / math.sqrt(d)
        lses[:, s] = (torch.logsumexp(scores, -1) / math.log(2)).reshape(b * hkv, g)
        outs[:, s] = torch.einsum("bhgl,bhld->bhgd", torch.softmax(scores, -1), v[:, :, lo:hi].float()).reshape(b * hkv, g, d)
    return outs, lses


@settings(max_examples=6, deadline=None)
@given(batch=st.sampled_from([1, 3]), kv_heads=st.sampled_from([1, 2]), group=st.sampled_from([1, 3, 4]),
       kv_len=st.integers(0, 70), dtype=st.sampled_from([torch.bfloat16, torch.float16]))
def test_split_kv_partials_match_fp32(batch, kv_heads, group, kv_len, dtype):
    seed = _fresh_seed()
    q = make_query(seed, batch, kv_heads * group, 32, dtype, "cpu")
    k, v = make_kv_shard(seed, 0, batch, kv_heads, kv_len, 32, dtype, "cpu")
    plan = sk.plan_splits(batch, kv_heads, kv_len, 4, CFG)
    args = sk.SplitKVArgs(q, k, v, kv_len, plan, CFG)
    part_out, part_lse = sk.partial_buffers(args)
    part_out.fill_(float("nan"))
    part_lse.fill_(float("nan"))
    sk.launch_split_kv(args, part_out, part_lse)
    want_out, want_lse = _partials_fp32(q, k, v, kv_len, plan)
    assert not torch.isnan(part_out).any() and not torch.isnan(part_lse).any()
    empty = torch.isinf(want_lse)
    assert torch.equal(torch.isinf(part_lse), empty)  # empty splits: lse = -inf exactly
    torch.testing.assert_close(part_lse[~empty], want_lse[~empty], rtol=1e-3, atol=2e-3)
    torch.testing.assert_close(part_out, want_out, rtol=1e-2, atol=1e-2)
    assert torch.all(part_out[empty] == 0)


@pytest.mark.parametrize("slices", [1, 2])  # one program per KV pair (2 rows), one per query row
def test_combine_rescales_partials_and_ignores_empty_ones(slices):
    """The global combine on hand-made partials: exact LSE algebra, -inf entries weigh nothing."""
    torch.manual_seed(_fresh_seed() % 1000)
    w, b, hq, hkv, d = 5, 2, 4, 2, 16
    rows = b * hq
    outs = torch.randn(w, rows, d)
    lses = torch.randn(w, rows) * 4
    lses[1] = float("-inf")  # an empty rank
    lses[3, :3] = float("-inf")
    packed = torch.cat([outs.reshape(w, -1), lses], dim=1).contiguous()
    q = torch.zeros(b, hq, d, dtype=torch.float16)
    k = torch.zeros(b, hkv, 0, d, dtype=torch.float16)
    args = sk.SplitKVArgs(q, k, k, 0, sk.SplitPlan(1, 16), CFG)
    out = torch.full((b, hq, d), float("nan"), dtype=torch.float32)
    cb.launch_combine_global(args, packed, out, w, slices=slices)
    weights = torch.softmax(lses * math.log(2), dim=0)  # 2^lse normalized over ranks
    want = (weights[:, :, None] * outs).sum(0).view(b, hq, d)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


def test_combine_of_only_empty_partials_is_zero_not_nan():
    w, b, hq, d = 3, 1, 2, 16
    packed = torch.cat([torch.zeros(w, b * hq * d), torch.full((w, b * hq), float("-inf"))], dim=1)
    q = torch.zeros(b, hq, d, dtype=torch.float16)
    k = torch.zeros(b, 1, 0, d, dtype=torch.float16)
    args = sk.SplitKVArgs(q, k, k, 0, sk.SplitPlan(1, 16), CFG)
    out = torch.full((b, hq, d), float("nan"))
    cb.launch_combine_global(args, packed, out, w)
    assert torch.equal(out, torch.zeros_like(out))


@pytest.mark.parametrize("slices", [1, 2, 4])  # one program per KV pair, per 2 rows, per row
def test_local_combine_gives_the_attention_of_the_whole_shard(slices):
    seed = _fresh_seed()
    b, hq, hkv, d, n = 2, 8, 2, 32, 75
    q = make_query(seed, b, hq, d, torch.bfloat16, "cpu")
    k, v = make_kv_shard(seed, 0, b, hkv, n, d, torch.bfloat16, "cpu")
    plan = sk.plan_splits(b, hkv, n, 4, CFG)
    assert plan.num_splits > 1
    args = sk.SplitKVArgs(q, k, v, n, plan, CFG)
    part_out, part_lse = sk.partial_buffers(args)
    sk.launch_split_kv(args, part_out, part_lse)
    send = torch.full((cb.packed_size(b * hq, d),), float("nan"))
    cb.launch_combine_local(args, part_out, part_lse, send, slices=slices)
    qf = q.float().view(b, hkv, hq // hkv, d)
    scores = torch.einsum("bhgd,bhld->bhgl", qf, k.float()) / math.sqrt(d)
    want_lse = (torch.logsumexp(scores, -1) / math.log(2)).reshape(-1)
    torch.testing.assert_close(send[b * hq * d:], want_lse, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(send[:b * hq * d].view(b, hq, d), reference_output(seed, q, [n], hkv),
                               rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("batch,kv_heads,kv_len,sms,want", [
    (1, 4, 262144, 132, (66, 4032)),   # 4 pairs x 66 splits of 63 blocks = one wave of 264
    (16, 4, 262144, 132, (4, 65536)),  # 64 pairs x 4 splits = 256 programs
    (64, 8, 1024, 132, (1, 1024)),     # the pairs alone fill the GPU
    (1, 4, 100, 132, (2, 64)),         # never more than one split per block of keys
    (2, 2, 0, 132, (1, 64)),           # an empty shard still makes one (empty) split
])
def test_plan_splits_fills_one_wave(batch, kv_heads, kv_len, sms, want):
    cfg = sk.SplitConfig(block_n=64, ctas_per_sm=2)
    plan = sk.plan_splits(batch, kv_heads, kv_len, sms, cfg)
    assert (plan.num_splits, plan.chunk) == want
    assert plan.chunk % 64 == 0 and plan.num_splits * plan.chunk >= kv_len
    assert (plan.num_splits - 1) * plan.chunk < max(kv_len, 1)  # no split is empty unless the shard is


def _single_rank_ctx() -> RankContext:
    (heap,) = ThreadHeap.group(1, 1 << 20)
    return RankContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend="threads",
                       heap=heap, interpret=True, spin_timeout_s=20.0)


@pytest.mark.parametrize("variant,structure", [
    ("bsp", {}),
    ("bsp", dict(bsp_slices=4)),  # one combine program per query row
    ("fused", {}),  # default: LL words, the last worker of a pair combines
    ("fused", dict(fused_protocol=1, fused_combiners=1)),  # LL, 1 dedicated combiner for the 4 pairs
    ("fused", dict(fused_protocol=2)),  # flags, last worker combines
    ("fused", dict(fused_protocol=2, fused_combiners=9)),  # flags, dedicated (capped at half the SMs)
    ("fused", dict(fused_slices=4)),  # LL, spread: 4 one-row slices per pair, one combiner CTA each (capped)
    ("fused", dict(fused_protocol=2, fused_slices=2, fused_combiners=1)),  # flags, 2 slices, 1 combiner CTA
])
def test_world_size_one_matches_reference_over_steps(variant, structure):
    wl = get_workload("flash_decode")
    ctx = _single_rank_ctx()
    shape = wl.shape("tiny", seed=_fresh_seed(), **structure)
    v = wl.variants()[variant]
    assert v.available(ctx) is None
    state = wl.setup(ctx, shape, v)
    for step in range(3):
        state.reseed(_fresh_seed())
        state.poison()
        v.run(state)
        got = wl.output(state)
        torch.testing.assert_close(got.float(), wl.reference(ctx, shape, state), rtol=2e-2, atol=2e-2)
    if variant == "fused":
        impl = state.impl
        pairs = shape["batch"] * shape["kv_heads"]
        assert impl.config.protocol == ("flags" if structure.get("fused_protocol") == 2 else "ll")
        # dedicated combiners: at most one per unit (pair, or row slice) and half the SMs (the CPU
        # stand-in has 4); slice combiners default to one per slice
        slices = structure.get("fused_slices", 0)
        units = pairs * slices if slices else pairs
        wanted = structure.get("fused_combiners", 0) or (units if slices else 0)
        assert impl.num_combiners == min(wanted, units, sk.device_sm_count("cpu") // 2)
        assert impl.config.slices == slices
        assert impl.grid == (pairs * state.args.plan.num_splits + impl.num_combiners,)
        assert int(impl.epoch.item()) == 3  # one epoch per step
        assert torch.all(impl.arrived_epochs() == 3) and torch.all(impl.counters == 0)
        assert int(impl.done.item()) == 0


def test_fused_config_from_shape_rejects_unknown_codes():
    from taxmodel.errors import InputError
    from taxmodel.kernels.flash_decode.workload import fused_config

    assert fused_config({}).label() == "ll-last"
    assert fused_config({"fused_protocol": 2, "fused_combiners": 4}).label() == "flags-c4"
    with pytest.raises(InputError, match="fused_protocol"):
        fused_config({"fused_protocol": 3})
    with pytest.raises(InputError, match="fused_combiners"):
        fused_config({"fused_combiners": -1})
    assert fused_config({"fused_slices": 8}).label() == "ll-s8"
    with pytest.raises(InputError, match="fused_slices"):
        fused_config({"fused_slices": -2})


def test_fused_slices_must_divide_the_group():
    from taxmodel.errors import InputError

    wl = get_workload("flash_decode")
    ctx = _single_rank_ctx()
    shape = wl.shape("tiny", seed=1, fused_slices=3)  # 4 query heads per KV head
    with pytest.raises(InputError, match="divide the 4 query heads"):
        wl.setup(ctx, shape, wl.variants()["fused"])


@triton.jit
def _ll_round_trip(x_ptr, words_ptr, back_ptr, epoch, N: tl.constexpr):
    i = tl.arange(0, N)
    w = ll.pack(tl.load(x_ptr + i), epoch)
    tl.store(words_ptr + i, w)
    tl.store(back_ptr + i, ll.unpack(w))


def test_ll_words_round_trip_values_and_epochs():
    """pack/unpack keep every fp32 bit pattern (negative, -inf, subnormal) and tag the epoch."""
    x = torch.randn(64) * 1e3
    x[:4] = torch.tensor([float("-inf"), -0.0, 1e-40, -3.5])
    words = torch.zeros(64, dtype=torch.int64)
    back = torch.zeros(64)
    _ll_round_trip[(1,)](x, words, back, 123457, N=64)
    assert torch.equal(back.view(torch.int32), x.view(torch.int32))
    assert torch.all((words >> 32) == 123457)
    assert torch.equal((words & 0xFFFFFFFF).to(torch.int64), x.view(torch.int32).to(torch.int64) & 0xFFFFFFFF)


def test_cost_is_the_kv_floor_and_declares_the_intermediates():
    wl = FlashDecode()
    shape = wl.shape("b1-kv16k")
    c = wl.cost(shape, 4, "bsp", device="cuda")
    b, hq, hkv, d, n = 1, 32, 4, 128, 16384
    assert c.flops == 4 * b * hq * n * d
    assert c.hbm_bytes == 2 * b * hkv * n * d * 2 + 2 * b * hq * d * 2
    assert c.link_bytes == 3 * b * hq * (d + 1) * 4
    names = [i.name for i in c.intermediates]
    assert names == ["split_partials", "rank_partial", "gathered_partials"]
    assert c.intermediates[2].bytes == 4 * b * hq * (d + 1) * 4
    f = wl.cost(shape, 4, "fused", device="cuda")
    assert (f.flops, f.hbm_bytes, f.link_bytes) == (c.flops, c.hbm_bytes, c.link_bytes)
    assert [i.name for i in f.intermediates] == ["split_partials"]
    assert f.intermediates[0].bytes == c.intermediates[0].bytes


def test_kv_lengths_ragged_and_empty():
    assert kv_lengths({"kv_len": 40}, 3) == [40, 40, 40]
    assert kv_lengths({"kv_len": 37, "kv_len_step": -9, "empty_rank": 2}, 4) == [37, 28, 0, 10]
    assert kv_lengths({"kv_len": 5, "kv_len_step": -4}, 3) == [5, 1, 0]


def test_presets_cover_the_sweep():
    wl = FlashDecode()
    for b in (1, 16):
        for n in ("1k", "4k", "16k", "64k", "256k"):
            s = wl.shape(f"b{b}-kv{n}")
            assert (s["batch"], s["q_heads"], s["kv_heads"], s["head_dim"]) == (b, 32, 4, 128)
    assert wl.shape("h96-b4-kv64k")["q_heads"] == 96 and wl.shape("h96-b4-kv64k")["kv_heads"] == 12
