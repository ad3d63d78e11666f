"""Flash Decode as a taxmodel workload: sequence-parallel decode attention over W ranks.

One new token per sequence; the KV cache is split along the sequence across ranks (rank r holds
``kv_lengths(shape, W)[r]`` keys of every sequence), the query is replicated, and every rank ends
with the full attention output [B, Hq, D]. Grouped-query attention: Hq query heads share Hkv KV
heads (Hq / Hkv per KV head).

Shape keys: batch, q_heads, kv_heads, head_dim, kv_len (keys per rank), kv_len_step (rank r holds
kv_len + r * kv_len_step keys: ragged shards), empty_rank (a rank holding no keys, -1 for none),
fp16 (1: fp16 instead of bf16), seed (inputs; the same seed gives the same inputs everywhere),
optional kernel tuning (block_n, num_warps, num_stages, ctas_per_sm; 0 = default), and the fused
kernel's structure (fused_protocol: 1 LL words, 2 flags, 0 = default LL; fused_combiners: 0 =
each pair's last worker combines, N > 0 = N dedicated combiner CTAs; fused_slices: 0 = off, K = K
slice combiners per KV head, each combining and pushing 1/K of its query heads; see
``fused.FusedConfig``), and bsp_slices (combine programs per KV head in the BSP combines, each
taking q_heads / kv_heads / bsp_slices query heads; 1 = one per KV head).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

import torch

from taxmodel.errors import InputError
from taxmodel.vocabulary import ALLGATHER, COLLECTIVE_KERNELS
from taxmodel.workload import Cost, Intermediate, Variant, Workload, register
from taxmodel.kernels.flash_decode import bsp, fused
from taxmodel.kernels.flash_decode.combine import packed_size
from taxmodel.kernels.flash_decode.reference import make_kv_sequence, make_kv_shard, make_query, reference_output
from taxmodel.kernels.flash_decode.split_kv import (SplitConfig, SplitKVArgs, device_sm_count, plan_splits,
                                                    validate)

#: KV lengths per rank of the GPU sweep (1K .. 256K keys).
SWEEP_KV = {"1k": 1024, "4k": 4096, "16k": 16384, "64k": 65536, "256k": 262144}

#: Tiles for Triton's interpreter: small blocks, so that the tiny preset still has several
#: splits, a ragged last block and a multi-block loop.
CPU_CONFIG = SplitConfig(block_n=16, num_warps=4, num_stages=1, ctas_per_sm=2)

#: The H200 has 132 SMs; the cost of a run whose device is not at hand assumes one.
DEFAULT_GPU_SMS = 132


def _presets() -> dict[str, dict[str, int]]:
    llama = dict(q_heads=32, kv_heads=4, head_dim=128)  # 32 query heads, 8:1 GQA -> 4 KV heads
    presets: dict[str, dict[str, int]] = {
        "tiny": dict(batch=2, q_heads=8, kv_heads=2, head_dim=32, kv_len=40),
    }
    for b in (1, 16):
        for name, n in SWEEP_KV.items():
            presets[f"b{b}-kv{name}"] = dict(batch=b, kv_len=n, **llama)
    presets["h96-b4-kv64k"] = dict(batch=4, q_heads=96, kv_heads=12, head_dim=128, kv_len=65536)
    return presets


def kv_lengths(shape: Mapping[str, int], world_size: int) -> list[int]:
    """Keys held by each rank (ragged with kv_len_step; zero on empty_rank)."""
    base, step = int(shape["kv_len"]), int(shape.get("kv_len_step", 0))
    empty = int(shape.get("empty_rank", -1))
    lens = [max(0, base + r * step) for r in range(world_size)]
    if 0 <= empty < world_size:
        lens[empty] = 0
    return lens


def split_config(shape: Mapping[str, int], device: torch.device | str) -> SplitConfig:
    """Tile config for ``device``, with any tuning keys of the shape applied."""
    cfg = CPU_CONFIG if torch.device(device).type == "cpu" else SplitConfig()
    tuned = {k: int(shape[k]) for k in ("block_n", "num_warps", "num_stages", "ctas_per_sm") if int(shape.get(k, 0)) > 0}
    return replace(cfg, **tuned)


#: fused_protocol shape codes (0 = the default, LL).
FUSED_PROTOCOL_CODES = {0: "ll", 1: "ll", 2: "flags"}


def fused_config(shape: Mapping[str, int]) -> fused.FusedConfig:
    """The fused kernel's structure from the shape's fused_protocol / fused_combiners keys."""
    code = int(shape.get("fused_protocol", 0))
    if code not in FUSED_PROTOCOL_CODES:
        raise InputError(f"flash_decode: fused_protocol {code} unknown; use 1 (LL words) or 2 (flags)")
    combiners = int(shape.get("fused_combiners", 0))
    if combiners < 0:
        raise InputError(f"flash_decode: fused_combiners {combiners} must be 0 (last worker combines) or a "
                         "positive number of dedicated combiner CTAs")
    slices = int(shape.get("fused_slices", 0))
    if slices < 0:
        raise InputError(f"flash_decode: fused_slices {slices} must be 0 (off) or the number of row slices "
                         "per KV head (a divisor of q_heads / kv_heads)")
    return fused.FusedConfig(protocol=FUSED_PROTOCOL_CODES[code], combiners=combiners, slices=slices)


def _dtype(shape: Mapping[str, int]) -> torch.dtype:
    return torch.float16 if int(shape.get("fp16", 0)) else torch.bfloat16


def planner_sm_count(device: torch.device | str | None) -> int:
    """SMs the split planner assumes: the device's own, or an H200's when no GPU is at hand."""
    dev = torch.device(device) if device is not None else torch.device("cuda")
    if dev.type == "cuda" and not torch.cuda.is_available():
        return DEFAULT_GPU_SMS
    return device_sm_count(dev)


@dataclass
class FlashDecodeState:
    """One rank's inputs, output and variant buffers."""

    ctx: Any
    shape: dict[str, int]
    variant: str
    kv_lens: list[int]
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    out: torch.Tensor
    args: SplitKVArgs
    impl: Any  # bsp.BspState or fused.FusedState
    own_heap: Any = None  # a heap this state made itself (no heap in the context)

    def poison(self) -> None:
        """Fill the output with NaN, so a run that forgets to write a row cannot pass."""
        self.out.fill_(float("nan"))

    def reseed(self, seed: int) -> None:
        """Fresh inputs in place (same buffers, so captured graphs and kernel arguments stay valid)."""
        b, hq, hkv, d = self.q.shape[0], self.q.shape[1], self.k.shape[1], self.q.shape[2]
        self.shape["seed"] = int(seed)
        self.q.copy_(make_query(seed, b, hq, d, self.q.dtype, self.q.device))
        rank = self.ctx.rank
        for i in range(b):
            self.k[i], self.v[i] = make_kv_sequence(seed, rank, i, hkv, self.kv_lens[rank], d, self.k.dtype,
                                                    self.k.device)


@register
class FlashDecode(Workload):
    name = "flash_decode"
    description = ("Sequence-parallel decode attention (GQA): split-KV partials per rank, combined across "
                   "ranks by log-sum-exp rescaling")
    presets = _presets()
    default_preset = "b16-kv16k"
    cpu_preset = "tiny"
    option_keys = ("kv_len_step", "empty_rank", "fp16", "seed", "block_n", "num_warps", "num_stages", "ctas_per_sm",
                   "fused_protocol", "fused_combiners", "fused_slices", "bsp_slices")

    def variants(self) -> dict[str, Variant]:
        return {
            "bsp": Variant(
                name="bsp", run=lambda st: bsp.run_bsp(st.impl, st.ctx),
                roles={bsp.SPLIT_NAME: "compute", r"flash_decode_combine": "compute",
                       COLLECTIVE_KERNELS[ALLGATHER]: "comm"},
                description="split-KV kernel, local combine, NCCL all_gather of the partials, global combine",
                available=_bsp_available, graph_safe=True,
            ),
            "fused": Variant(
                name="fused", run=lambda st: _run_fused(st),
                roles={fused.KERNEL_NAME: "fused"}, needs_heap=True, fine_grained=True,
                description="one kernel: split-KV workers; the last worker per head group combines its "
                            "splits, pushes the partial to every rank as LL words (value + epoch in one "
                            "8-byte store) and combines the ranks' partials of its group",
                available=_threads_unavailable, graph_safe=True,
            ),
        }

    # -- inputs -------------------------------------------------------------------------------
    def setup(self, ctx: Any, shape: Mapping[str, int], variant: Variant) -> FlashDecodeState:
        shape = dict(shape)
        dev = torch.device(ctx.device)
        b, hq, hkv, d = (int(shape[k]) for k in ("batch", "q_heads", "kv_heads", "head_dim"))
        lens = kv_lengths(shape, ctx.world_size)
        seed = int(shape.get("seed", 0))
        dtype = _dtype(shape)
        q = make_query(seed, b, hq, d, dtype, dev)
        k, v = make_kv_shard(seed, ctx.rank, b, hkv, lens[ctx.rank], d, dtype, dev)
        validate(q, k, v, lens[ctx.rank])
        cfg = split_config(shape, dev)
        plan = plan_splits(b, hkv, lens[ctx.rank], planner_sm_count(dev), cfg)
        args = SplitKVArgs(q, k, v, lens[ctx.rank], plan, cfg)
        out = torch.full((b, hq, d), float("nan"), dtype=dtype, device=dev)
        own_heap = None
        if variant.name == "bsp":
            impl = bsp.make_bsp_state(ctx, args, out, int(shape.get("bsp_slices", 1)))
        elif variant.name == "fused":
            if ctx.heap is None:
                own_heap = ctx.new_heap(self.heap_bytes(shape, ctx.world_size))
                ctx = replace(ctx, heap=own_heap)
            impl = fused.make_fused_state(ctx, args, out, planner_sm_count(dev), fused_config(shape))
            fused.warmup_fused(impl)
            # Every rank has zeroed its flags and compiled its kernel before any rank pushes.
            ctx.barrier()
        else:
            raise InputError(f"flash_decode has no variant '{variant.name}'; choose bsp or fused")
        return FlashDecodeState(ctx, shape, variant.name, lens, q, k, v, out, args, impl, own_heap)

    def heap_bytes(self, shape: Mapping[str, int], world_size: int) -> int:
        """Symmetric-heap bytes the fused variant needs (receive buffers and flags)."""
        return fused.heap_bytes(int(shape["batch"]), int(shape["q_heads"]), int(shape["kv_heads"]),
                                int(shape["head_dim"]), world_size)

    # -- correctness --------------------------------------------------------------------------
    def reference(self, ctx: Any, shape: Mapping[str, int], state: FlashDecodeState) -> torch.Tensor:
        return reference_output(int(state.shape.get("seed", 0)), state.q, state.kv_lens, int(shape["kv_heads"]))

    def output(self, state: FlashDecodeState) -> torch.Tensor:
        if state.variant == "fused":
            fused.check_fused(state.impl, state.ctx)
        return state.out

    def tolerance(self, shape: Mapping[str, int], world_size: int = 1) -> tuple[float, float]:
        return (2e-2, 2e-2)  # no sum over ranks in 16-bit arithmetic: one tolerance at every world size

    # -- cost ---------------------------------------------------------------------------------
    def cost(self, shape: Mapping[str, int], world_size: int, variant: str, device: Any = None) -> Cost:
        """Per-rank floor of one step (mean over ranks where shards are ragged).

        FLOPs: QK and PV, 2*D each per (query head, key). HBM: this rank's K and V once, plus q and
        the output. Link: the (W-1) peers' packed partials (fp32 out + lse per query row).
        """
        b, hq, hkv, d = (int(shape[k]) for k in ("batch", "q_heads", "kv_heads", "head_dim"))
        lens = kv_lengths(shape, world_size)
        mean_len = sum(lens) // max(1, world_size)
        elt = 2
        packed = packed_size(b * hq, d) * 4
        if device is None:  # a process without a GPU runs the CPU (interpreter) configuration
            device = "cuda" if torch.cuda.is_available() else "cpu"
        dev = device
        cfg = split_config(shape, dev)
        splits = plan_splits(b, hkv, mean_len, planner_sm_count(dev), cfg).num_splits
        partials = b * hq * splits * (d + 1) * 4
        if variant == "bsp":
            inter = [Intermediate("split_partials", partials, bsp.SPLIT_NAME, bsp.COMBINE_LOCAL_NAME)]
            if world_size > 1:
                inter += [Intermediate("rank_partial", packed, bsp.COMBINE_LOCAL_NAME, COLLECTIVE_KERNELS[ALLGATHER]),
                          Intermediate("gathered_partials", world_size * packed, COLLECTIVE_KERNELS[ALLGATHER],
                                       bsp.COMBINE_GLOBAL_NAME)]
            else:
                inter += [Intermediate("rank_partial", packed, bsp.COMBINE_LOCAL_NAME, bsp.COMBINE_GLOBAL_NAME)]
        elif variant == "fused":
            # Written by the workers, read back by each head group's last worker in the same kernel.
            inter = [Intermediate("split_partials", partials, fused.KERNEL_NAME, fused.KERNEL_NAME)]
        else:
            raise InputError(f"flash_decode has no variant '{variant}'; choose bsp or fused")
        return Cost(
            flops=4 * b * hq * mean_len * d,
            hbm_bytes=2 * b * hkv * mean_len * d * elt + 2 * b * hq * d * elt,
            link_bytes=(world_size - 1) * packed,
            intermediates=tuple(inter),
            dtype="fp16" if int(shape.get("fp16", 0)) else "bf16",
        )


def _run_fused(state: FlashDecodeState) -> None:
    with state.ctx.kernel(fused.KERNEL_NAME):
        fused.launch_fused(state.impl)


def _threads_unavailable(ctx: Any) -> str | None:
    if getattr(ctx, "backend", "") == "threads" and ctx.world_size > 1:
        return ("Triton's interpreter is not thread-safe (one global program index, tl patched per launch): "
                "run CPU ranks as processes (gloo + SharedMemoryHeap), not threads")
    return None


def _bsp_available(ctx: Any) -> str | None:
    why = _threads_unavailable(ctx)
    if why:
        return why
    if ctx.world_size > 1 and ctx.group is None:
        import torch.distributed as dist

        if not dist.is_initialized():
            return "bsp needs a torch.distributed process group (NCCL on GPU, gloo on CPU)"
    return None


__all__ = ["FlashDecode", "FlashDecodeState", "fused_config", "kv_lengths", "split_config"]
