"""Split-KV decode attention on one rank: partial outputs and log-sum-exps, one per KV split.

Math (one new token per sequence, grouped-query attention with G = Hq / Hkv query heads per KV
head; query head h reads KV head h // G). For query row q (head dim D) and this rank's keys
K[0:L), values V[0:L):

    s_j = (q . k_j) / sqrt(D)                  scores (kept in base 2: s_j * log2(e))
    lse = log2(sum_j 2^{s_j})                  log-sum-exp of the split (base 2)
    o   = sum_j 2^{s_j - lse} v_j              the split's normalized partial output

Each program handles one (batch, KV head) pair over one contiguous chunk of keys, for all G query
heads of that KV head at once, so every K/V tile is loaded from HBM once and used by the G heads
(a [G, D] x [D, BLOCK_N] product). The chunking makes many programs even at batch 1, so every SM
streams KV: ``plan_splits`` picks the number of splits so that one wave fills the GPU.

Partials of split s are written to ``part_out[b*Hkv + kvh, s, g, :]`` (fp32) and
``part_lse[b*Hkv + kvh, s, g]``; an empty split (no keys: a short or empty shard) writes
``o = 0`` and ``lse = -inf`` so that every combine can treat it as weight zero.

``attend_split`` is a device function shared with the fused kernel (``fused.py``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class SplitConfig:
    """Tile sizes of the split-KV programs and how many programs a plan aims for.

    ``ctas_per_sm``: programs assumed resident per SM; one wave is ``num_sms * ctas_per_sm``
    programs (the planner fills one wave, so no half-empty tail wave wastes bandwidth). The
    default tile compiled for sm_90 (Triton 3.9) uses 70 KB of shared memory for its 3-stage
    cp.async pipeline and 82 registers, so 3 programs fit per SM.
    """

    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 3
    ctas_per_sm: int = 3

    def label(self) -> str:
        return f"n{self.block_n}w{self.num_warps}s{self.num_stages}c{self.ctas_per_sm}"


@dataclass(frozen=True)
class SplitPlan:
    """How one rank's KV is cut: ``num_splits`` chunks of ``chunk`` keys (a multiple of block_n)."""

    num_splits: int
    chunk: int


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def plan_splits(batch: int, kv_heads: int, kv_len: int, num_sms: int, cfg: SplitConfig) -> SplitPlan:
    """Number of splits so that ``batch * kv_heads * splits`` programs fill one wave of the GPU.

    At least one split (an empty shard still produces an empty partial), at most one split per
    ``block_n`` keys. When the (batch, head) pairs alone fill a wave, there is one split each.
    """
    groups = max(1, batch * kv_heads)
    blocks = cdiv(max(kv_len, 0), cfg.block_n)
    if blocks == 0:
        return SplitPlan(1, cfg.block_n)
    slots = max(1, num_sms * cfg.ctas_per_sm)
    splits = max(1, min(slots // groups, blocks))
    chunk = cdiv(blocks, splits) * cfg.block_n
    return SplitPlan(cdiv(kv_len, chunk), chunk)


def device_sm_count(device: torch.device | str) -> int:
    """SMs (CUs) of ``device``; on CPU a small number keeps interpreted grids short."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_properties(dev).multi_processor_count
    return 4


def interpreted(fn) -> bool:
    """True when ``fn`` was decorated while ``TRITON_INTERPRET=1`` (runs on CPU tensors)."""
    return type(fn).__name__ == "InterpretedFunction"


def check_runnable(fn, device: torch.device) -> None:
    """CPU tensors need interpreted kernels: say what to do instead of crashing inside Triton."""
    from taxmodel.errors import UnavailableError

    if torch.device(device).type == "cpu" and not interpreted(fn):
        raise UnavailableError(
            "flash_decode kernels were compiled for a GPU but the tensors are on the CPU; set "
            "TRITON_INTERPRET=1 before importing taxmodel.kernels to run them in Triton's interpreter"
        )


@triton.jit
def attend_split(q_ptr, k_ptr, v_ptr, part_out_ptr, part_lse_ptr, bk, split,
                 kv_len, chunk, num_splits, kv_heads, qk_scale,
                 stride_qb, stride_qh, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
                 G: tl.constexpr, G_DOT: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
                 NUM_STAGES: tl.constexpr, DOT_F32: tl.constexpr):
    """Attend the G query heads of KV pair ``bk`` (= b*Hkv + kvh) to keys [split*chunk, +chunk).

    ``G_DOT`` >= 16 pads the query rows for tl.dot (padding rows are zero and never stored).
    ``DOT_F32`` multiplies in fp32 (Triton's interpreter mis-computes bf16 tl.dot).
    """
    b = (bk // kv_heads).to(tl.int64)
    kvh = bk % kv_heads
    rows = tl.arange(0, G_DOT)
    row_ok = rows < G
    d = tl.arange(0, D)
    q = tl.load(q_ptr + b * stride_qb + (kvh * G + rows)[:, None] * stride_qh + d[None, :],
                mask=row_ok[:, None], other=0.0)
    if DOT_F32:
        q = q.to(tl.float32)
    lo = split * chunk
    hi = tl.minimum(lo + chunk, kv_len)
    k_base = k_ptr + b * stride_kb + kvh * stride_kh
    v_base = v_ptr + b * stride_vb + kvh * stride_vh
    m = tl.full([G_DOT], float("-inf"), tl.float32)
    denom = tl.zeros([G_DOT], tl.float32)
    acc = tl.zeros([G_DOT, D], tl.float32)
    for start in tl.range(lo, hi, BLOCK_N, num_stages=NUM_STAGES):
        n = start + tl.arange(0, BLOCK_N)
        n_ok = n < hi
        k = tl.load(k_base + n[:, None] * stride_kn + d[None, :], mask=n_ok[:, None], other=0.0,
                    eviction_policy="evict_first")
        if DOT_F32:
            s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = tl.where(n_ok[None, :], s * qk_scale, float("-inf"))
        # Every block holds at least one key, so m_new is finite and alpha never sees inf - inf.
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        denom = denom * alpha + tl.sum(p, 1)
        v = tl.load(v_base + n[:, None] * stride_vn + d[None, :], mask=n_ok[:, None], other=0.0,
                    eviction_policy="evict_first")
        acc = acc * alpha[:, None]
        if DOT_F32:
            acc = tl.dot(p, v.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(p.to(v.dtype), v, acc)
        m = m_new
    has = denom > 0.0
    o = acc / tl.where(has, denom, 1.0)[:, None]
    lse = tl.where(has, m + tl.log2(tl.where(has, denom, 1.0)), float("-inf"))
    part_row = (bk * num_splits + split) * G + rows
    tl.store(part_out_ptr + part_row[:, None] * D + d[None, :], o, mask=row_ok[:, None])
    tl.store(part_lse_ptr + part_row, lse, mask=row_ok)


@triton.jit
def flash_decode_split_kv(q_ptr, k_ptr, v_ptr, part_out_ptr, part_lse_ptr,
                          kv_len, chunk, num_splits, kv_heads, qk_scale,
                          stride_qb, stride_qh, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
                          G: tl.constexpr, G_DOT: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
                          NUM_STAGES: tl.constexpr, DOT_F32: tl.constexpr):
    """One program per (KV pair, split); program id = bk * num_splits + split."""
    pid = tl.program_id(0)
    attend_split(q_ptr, k_ptr, v_ptr, part_out_ptr, part_lse_ptr, pid // num_splits, pid % num_splits,
                 kv_len, chunk, num_splits, kv_heads, qk_scale,
                 stride_qb, stride_qh, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
                 G, G_DOT, D, BLOCK_N, NUM_STAGES, DOT_F32)


@dataclass
class SplitKVArgs:
    """Everything one launch of the split-KV kernel (or the fused kernel's workers) needs."""

    q: torch.Tensor  # [B, Hq, D]
    k: torch.Tensor  # [B, Hkv, >=L, D]
    v: torch.Tensor
    kv_len: int
    plan: SplitPlan
    cfg: SplitConfig

    @property
    def batch(self) -> int:
        return self.q.shape[0]

    @property
    def q_heads(self) -> int:
        return self.q.shape[1]

    @property
    def kv_heads(self) -> int:
        return self.k.shape[1]

    @property
    def head_dim(self) -> int:
        return self.q.shape[2]

    @property
    def group(self) -> int:
        return self.q_heads // self.kv_heads

    def scalars(self) -> tuple:
        """(kv_len, chunk, num_splits, kv_heads, qk_scale, strides...) in kernel order."""
        q, k, v = self.q, self.k, self.v
        qk_scale = LOG2E / math.sqrt(self.head_dim)
        return (self.kv_len, self.plan.chunk, self.plan.num_splits, self.kv_heads, qk_scale,
                q.stride(0), q.stride(1), k.stride(0), k.stride(1), k.stride(2),
                v.stride(0), v.stride(1), v.stride(2))

    def constexprs(self) -> dict:
        return dict(G=self.group, G_DOT=max(16, next_pow2(self.group)), D=self.head_dim,
                    BLOCK_N=self.cfg.block_n, NUM_STAGES=self.cfg.num_stages,
                    DOT_F32=self.q.device.type == "cpu")


def validate(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_len: int) -> None:
    """Shapes the kernels support; raise InputError naming what to change."""
    from taxmodel.errors import InputError

    if q.dim() != 3 or k.dim() != 4 or v.shape != k.shape:
        raise InputError(f"flash_decode: expected q [B, Hq, D] and k, v [B, Hkv, L, D]; got {list(q.shape)}, "
                         f"{list(k.shape)}, {list(v.shape)}")
    b, hq, d = q.shape
    if k.shape[0] != b or k.shape[3] != d or hq % k.shape[1] != 0:
        raise InputError(f"flash_decode: q {list(q.shape)} does not match k {list(k.shape)} "
                         "(same batch and head dim; query heads a multiple of KV heads)")
    if d < 16 or d & (d - 1):
        raise InputError(f"flash_decode: head dim {d} must be a power of two >= 16")
    if not 0 <= kv_len <= k.shape[2]:
        raise InputError(f"flash_decode: kv_len {kv_len} outside the cache length {k.shape[2]}")
    if q.stride(2) != 1 or k.stride(3) != 1 or v.stride(3) != 1:
        raise InputError("flash_decode: the head dim must be contiguous in q, k and v")


def partial_buffers(args: SplitKVArgs) -> tuple[torch.Tensor, torch.Tensor]:
    """Scratch for the partials: out [B*Hkv, S, G, D] fp32, lse [B*Hkv, S, G] fp32."""
    pairs = args.batch * args.kv_heads
    s, g, d = args.plan.num_splits, args.group, args.head_dim
    dev = args.q.device
    return (torch.empty(pairs, s, g, d, dtype=torch.float32, device=dev),
            torch.empty(pairs, s, g, dtype=torch.float32, device=dev))


def launch_split_kv(args: SplitKVArgs, part_out: torch.Tensor, part_lse: torch.Tensor) -> None:
    """Enqueue the split-KV kernel: ``B * Hkv * num_splits`` programs."""
    check_runnable(flash_decode_split_kv, args.q.device)
    grid = (args.batch * args.kv_heads * args.plan.num_splits,)
    flash_decode_split_kv[grid](args.q, args.k, args.v, part_out, part_lse, *args.scalars(),
                                num_warps=args.cfg.num_warps, **args.constexprs())
