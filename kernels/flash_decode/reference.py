"""Inputs and the fp32 reference for flash decode.

Inputs are a pure function of (seed, rank, batch index), so any rank can rebuild any other rank's
KV shard one sequence at a time: the reference attends over the whole gathered KV without a
collective and without ever holding every shard of every sequence at once.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch

#: Query scale: scores then have a standard deviation of ~3, so the softmax concentrates on
#: a few dozen keys even over a million and the output stays O(0.1-1): an error in any shard,
#: split or combine weight is visible against the tolerance (with unit queries, attention over
#: long KV averages to ~0 and a check against it proves little).
QUERY_SCALE = 3.0


def _generator(device: torch.device, seed: int, *stream: int) -> torch.Generator:
    g = torch.Generator(device=device)
    mixed = seed
    for s in stream:
        mixed = (mixed * 1_000_003 + s + 1) % (2**63 - 1)
    g.manual_seed(mixed)
    return g


def make_query(seed: int, batch: int, q_heads: int, head_dim: int, dtype: torch.dtype,
               device: torch.device) -> torch.Tensor:
    """The replicated query [B, Hq, D] (the same on every rank)."""
    g = _generator(torch.device(device), seed, 7)
    q = torch.randn(batch, q_heads, head_dim, generator=g, device=device, dtype=torch.float32)
    return (q * QUERY_SCALE).to(dtype)


def make_kv_sequence(seed: int, rank: int, b: int, kv_heads: int, kv_len: int, head_dim: int,
                     dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s K and V shard of sequence ``b``: each [Hkv, L, D]."""
    g = _generator(torch.device(device), seed, 11, rank, b)
    k = torch.randn(kv_heads, kv_len, head_dim, generator=g, device=device, dtype=dtype)
    v = torch.randn(kv_heads, kv_len, head_dim, generator=g, device=device, dtype=dtype)
    return k, v


def make_kv_shard(seed: int, rank: int, batch: int, kv_heads: int, kv_len: int, head_dim: int,
                  dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's KV cache [B, Hkv, L, D] (K and V)."""
    k = torch.empty(batch, kv_heads, kv_len, head_dim, dtype=dtype, device=device)
    v = torch.empty_like(k)
    for b in range(batch):
        k[b], v[b] = make_kv_sequence(seed, rank, b, kv_heads, kv_len, head_dim, dtype, device)
    return k, v


def attention_fp32(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Decode attention of one sequence in fp32: q [Hq, D], k/v [Hkv, L, D] -> [Hq, D]."""
    hq, d = q.shape
    hkv = k.shape[0]
    qf = q.float().view(hkv, hq // hkv, d)
    scores = torch.matmul(qf, k.float().transpose(1, 2)) / math.sqrt(d)  # [Hkv, G, L]
    probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs, v.float()).reshape(hq, d)


def reference_output(seed: int, q: torch.Tensor, kv_lens: Sequence[int], kv_heads: int) -> torch.Tensor:
    """Attention of every sequence over the KV of all ranks, gathered, in fp32: [B, Hq, D]."""
    batch, hq, d = q.shape
    out = torch.empty(batch, hq, d, dtype=torch.float32, device=q.device)
    for b in range(batch):
        shards = [make_kv_sequence(seed, r, b, kv_heads, n, d, q.dtype, q.device) for r, n in enumerate(kv_lens)]
        k = torch.cat([s[0] for s in shards], dim=1)
        v = torch.cat([s[1] for s in shards], dim=1)
        del shards
        out[b] = attention_fp32(q[b], k, v)
    return out
