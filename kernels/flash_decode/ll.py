"""Low-latency ("LL") words: a value and the epoch it belongs to in one 8-byte store.

Why: the flag protocol (data stores, then a system-scope release of a flag per peer; the receiver
acquires each peer's flag, then reads the data) puts a system-scope fence, a remote atomic round
trip per peer and an acquire per peer on the critical path of every decode step. At short KV those
sum to more than the attention itself. With LL words the data carries its own flag: the sender
stores ``(epoch << 32) | bits(value)`` with plain stores (no fence, no atomic, nothing waited for)
and the receiver polls the words themselves until every one holds the current epoch. An aligned
8-byte access is single-copy atomic (the value and its epoch arrive together, NVLink included;
NCCL's LL protocol relies on the same), so a word that shows the epoch shows its value.

Epochs only grow, so words are never reset; a receive buffer double-buffered by epoch parity holds
either the current epoch's word or one two epochs old. The price: 8 bytes on the wire per fp32
value (the partials are tiny: B*Hq*(D+1) values per rank).

Device functions:
    pack(x, epoch) -> int64 words                   fp32 values tagged with the epoch
    unpack(words) -> fp32 values
    push(base, offs, words, mask, rank, world_size, heap_bases)   the same words into every rank
    wait_rows(out_ptrs, out_mask, lse_ptrs, lse_mask, epoch, ...) -> (out, lse, ok)
                                                    bounded poll of one peer's rows, then decode
"""
from __future__ import annotations

import iris
import triton
import triton.language as tl

from taxmodel.kernels.device import sync


@triton.jit
def pack(x, epoch):
    """fp32 tensor -> int64 words: the epoch in the high 32 bits, the value's bits in the low 32."""
    lo = x.to(tl.uint32, bitcast=True).to(tl.int64)  # zero-extended
    return lo | (tl.cast(epoch, tl.int64) << 32)


@triton.jit
def unpack(words):
    """int64 words -> their fp32 values (the low 32 bits)."""
    return words.to(tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def push(base, offs, words, mask, rank, world_size, heap_bases):
    """Store ``words`` at ``base + offs`` (this rank's heap address) on every rank, peers first
    (rotated by rank, so the ranks do not all write to rank 0 first), this rank last."""
    for i in range(world_size):
        dst = (rank + 1 + i) % world_size
        iris.store(base + offs, words, rank, dst, heap_bases, mask=mask)


@triton.jit
def _missing(words, mask, epoch64):
    """How many of the masked words do not hold ``epoch64`` yet."""
    return tl.sum(tl.where(mask & ((words >> 32) != epoch64), 1, 0))


@triton.jit
def _oldest(words, mask, epoch64):
    """The lowest epoch among the masked words (for the give-up record)."""
    return tl.min(tl.where(mask, words >> 32, epoch64))


@triton.jit
def _pause(MODE: tl.constexpr):
    """A short back-off between polls on NVIDIA (fewer issue slots taken from co-resident CTAs)."""
    if MODE == 1:
        tl.inline_asm_elementwise("nanosleep.u32 32;\n mov.u32 $0, 0;", "=r", [], dtype=tl.int32,
                                  is_pure=False, pack=1)


@triton.jit
def _give_up(err_ptr, rank, peer, flag_index, kernel_id, target, seen, waited):
    """Record a give-up in the error buffer (layout ``sync.ERR_FIELDS``; first failure wins), so
    ``sync.check_errors`` reports an LL wait exactly as it reports a flag wait."""
    old = tl.atomic_cas(err_ptr, tl.full((), 0, tl.int64), tl.full((), 1, tl.int64), sem="acq_rel", scope="gpu")
    if old == 0:
        tl.store(err_ptr + 1, tl.cast(rank, tl.int64))
        tl.store(err_ptr + 2, tl.cast(peer, tl.int64))
        tl.store(err_ptr + 3, tl.cast(flag_index, tl.int64))
        tl.store(err_ptr + 4, tl.cast(kernel_id, tl.int64))
        tl.store(err_ptr + 5, tl.cast(target, tl.int64))
        tl.store(err_ptr + 6, tl.cast(seen, tl.int64))
        tl.store(err_ptr + 7, tl.cast(waited, tl.int64))


@triton.jit
def _poll(ptrs, mask, e, waited, failed, start, budget, err_ptr, MODE: tl.constexpr):
    """Read the masked words at ``ptrs`` until none misses epoch ``e``, the budget is spent
    (``waited`` counts on from the caller's ``start``) or a give-up shows in ``err_ptr``; return
    (words, how many miss, waited, failed)."""
    words = tl.load(ptrs, mask=mask, other=0, volatile=True)
    miss = _missing(words, mask, e)
    while (miss > 0) & (waited < budget) & (failed == 0):
        _pause(MODE)
        words = tl.load(ptrs, mask=mask, other=0, volatile=True)
        miss = _missing(words, mask, e)
        waited = sync.now(MODE) - start
        failed = tl.load(err_ptr, volatile=True)
    return words, miss, waited, failed


@triton.jit
def wait_rows(out_ptrs, out_mask, lse_ptrs, lse_mask, epoch, budget, err_ptr, rank, peer, flag_index, kernel_id,
              MODE: tl.constexpr):
    """Poll one peer's LL words (an [R, D] output tile and its [R] log-sum-exps) until all hold
    ``epoch``; return (out fp32, lse fp32, ok). Bounded by ``budget`` (``sync.spin_budget`` units);
    a give-up is recorded in ``err_ptr`` and every later wait of the launch returns at once.

    The lse words are polled first: a few bytes per poll while the peer is still working; the
    tile is read once they arrived (usually complete by then) and re-polled only if not.
    """
    e = tl.cast(epoch, tl.int64)
    failed = tl.load(err_ptr, volatile=True)
    start = sync.now(MODE)
    waited = tl.full((), 0, tl.int64)
    wl, miss_l, waited, failed = _poll(lse_ptrs, lse_mask, e, waited, failed, start, budget, err_ptr, MODE)
    wo, miss_o, waited, failed = _poll(out_ptrs, out_mask, e, waited, failed, start, budget, err_ptr, MODE)
    ok = (miss_l + miss_o) == 0
    if ((miss_l + miss_o) > 0) & (failed == 0):
        seen = tl.minimum(_oldest(wl, lse_mask, e), _oldest(wo, out_mask, e))
        _give_up(err_ptr, rank, peer, flag_index, kernel_id, e, seen, waited)
    return unpack(wo), unpack(wl), ok
