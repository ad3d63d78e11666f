"""Flash Decode: the kernels of each variant, per rank (shards may be ragged).

Rank r holds L_r keys of every sequence (B sequences, Hkv KV heads, head dim D, 2-byte K/V).
Decode attention is memory-bound: the split-KV kernel streams 2*B*Hkv*L_r*D*2 bytes of K and V
and writes its partials (B*Hq*S*(D+1) fp32, S splits from the workload's own planner), at the
Triton streaming efficiency of the HBM bandwidth, plus its fixed cost (``costs.split_kv_time``:
calibrated, or the fixed kernel overhead).

Combines are latency-bound where programs are few: a combine program for R query rows folds its S
partials NB at a time (``combine.combine_block(R)``), ceil(S / NB) serial steps of
``combine_step_s`` each (calibrated: ``taxmodel/runtime/calibrate_combine.py``); the kernel takes
the longer of that and streaming its bytes. At batch 1 (4 programs, up to ~100 splits) the steps
dominate: 20-30 us on one H200, where bandwidth alone says 1 us.

- bsp: split-KV -> local combine (partials in, one packed partial of B*Hq*(D+1) fp32 out) ->
  NCCL all_gather of the packed partial (collective model; small messages are latency-bound) ->
  global combine (W packed partials in, the output out). Four launches: at small sizes the
  host's launch cost per kernel exceeds the kernels, and the launch tax dominates.
- fused: one kernel; workers do the split and the local combine (the pair's last worker folds the
  S partials: with the hardware file's fused_combine calibration steps x ``fused_local_combine_step_s``,
  measured in the fused kernel itself at one rank; the line's fixed part ``fused_local_combine_fixed_s``
  is the one-rank epilogue (push into its own slot, merge of its own partial, store), which replaces
  push and merge at one rank and which on W ranks the push, waits and merges below stand for; on W
  ranks the step is the fold's own, ``fused_fold_step_s`` (the line's slope through its L2-resident
  rows) where calibrated; without the calibration steps x ``combine_step_s``, the separate kernel's
  step), the last worker per head group stores the combined partial into every peer (LL words: value and epoch in one store, no fence;
  8 bytes per 4-byte value) from one CTA, so at one SM's peer-store rate unless the pushing CTAs
  together exceed the GPU's peer-store bandwidth (``costs.push_wave_time``), and then waits for
  every rank's partial of its group (the slowest rank's work + a one-way latency, modelled as
  half a flag round trip), then combines them: with LL words one serial step per peer (it polls
  each peer's words and merges them in rank order; ``ll_merge_step_s`` each, fitted on the
  records' wait and merge), with flags one step of ``combine_step_s`` (a synced fused kernel in
  the timeline). On 4 H200s at batch 1 the records show the push at 2.4 us (model 2.2) and the
  wait plus merge at 4.8 us (model 1.3 + 3 x 1.4 = 5.5); on 2, 1.6 and 2.6 us (model 1.3 and 2.7).
"""
from __future__ import annotations

from typing import Any, Mapping

from taxmodel.errors import InputError
from taxmodel.kernels.names import (FLASH_DECODE_COMBINE_GLOBAL, FLASH_DECODE_COMBINE_LOCAL, FLASH_DECODE_FUSED,
                                    FLASH_DECODE_SPLIT)
from taxmodel.hardware.specs import HardwareSpec
from taxmodel.vocabulary import ALLGATHER, LIBRARY_KERNEL_NAMES

from .collective_model import CollectiveModel
from .costs import l2_bytes, l2_kept_fraction, push_wave_time, serial_steps_time, sm_count, split_kv_time, stream_time
from .params import ModelParams
from .timeline import KernelPlan
from .topology import topology

VARIANTS = ("bsp", "fused")
SPLIT, COMBINE_LOCAL, COMBINE_GLOBAL = FLASH_DECODE_SPLIT, FLASH_DECODE_COMBINE_LOCAL, FLASH_DECODE_COMBINE_GLOBAL
NCCL_AG = LIBRARY_KERNEL_NAMES[ALLGATHER]
FUSED = FLASH_DECODE_FUSED


def _dims(shape: Mapping[str, int]) -> tuple[int, int, int, int]:
    try:
        dims = tuple(int(shape[k]) for k in ("batch", "q_heads", "kv_heads", "head_dim", "kv_len"))
    except KeyError as exc:
        raise InputError(f"flash_decode shape needs batch, q_heads, kv_heads, head_dim and kv_len; missing {exc}") from exc
    bad = [f"{k}={v}" for k, v in zip(("batch", "q_heads", "kv_heads", "head_dim", "kv_len"), dims) if v < 1]
    if bad:
        raise InputError(f"flash_decode: {', '.join(bad)}: every dimension must be at least 1")
    return dims[:4]  # type: ignore[return-value]


def plans(variant: str, shape: Mapping[str, int], world: int, hw: HardwareSpec, params: ModelParams,
          coll: CollectiveModel) -> tuple[list[list[KernelPlan]], dict[str, float], list[str]]:
    from taxmodel.kernels.flash_decode.split_kv import SplitConfig, plan_splits
    from taxmodel.kernels.flash_decode.workload import kv_lengths, split_config

    b, hq, hkv, d = _dims(shape)
    from taxmodel.kernels.flash_decode.combine import combine_block

    group = max(hq // max(hkv, 1), 1)

    def steps(partials: int, rows: int) -> int:  # serial steps of one combine program of ``rows`` rows
        nb = combine_block(max(rows, 1))
        return -(-int(partials) // nb)

    lens = kv_lengths(shape, world)
    cfg = split_config(shape, "cuda") if isinstance(shape, Mapping) else SplitConfig()
    num_sms = sm_count(hw)
    packed = b * hq * (d + 1) * 4
    out_bytes = b * hq * d * 2
    q_bytes = b * hq * d * 2
    l2 = l2_bytes(hw)
    ht, hv = params.host_launch_triton_s, params.host_launch_torch_s
    det: dict[str, float] = {}
    per_rank = []
    for L in lens:
        splits = plan_splits(b, hkv, L, num_sms, cfg).num_splits
        partials = b * hq * splits * (d + 1) * 4
        kv = 2 * b * hkv * L * d * 2
        per_rank.append((kv, partials, splits))
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    notes = [f"K/V streamed at {params.triton_stream_efficiency:.2f} of the HBM bandwidth; splits from the workload's "
             f"planner on {num_sms} SMs"]
    if variant == "bsp":
        ag = coll.time(ALLGATHER, packed, world) if world > 1 else 0.0
        rows = max(group // max(int(shape.get("bsp_slices", 1)), 1), 1)
        glob = max(stream_time(world * packed + out_bytes, hw, params),  # W partials: one step (NB = next_pow2(W))
                   params.kernel_overhead_s + serial_steps_time(1, params))
        out = []
        for kv, partials, splits in per_rank:
            split = split_kv_time(kv + partials, hw, params)
            local = max(stream_time(partials + packed, hw, params),
                        params.kernel_overhead_s + serial_steps_time(steps(splits, rows), params))
            # DRAM bytes: K/V and q read; the partials and the packed partial(s) reach DRAM only as far
            # as the L2 does not keep them between their producer and their consumer
            miss_p = partials * (1.0 - l2_kept_fraction(partials, kv + q_bytes + partials, partials + packed, l2))
            gathered = world * packed
            miss_g = gathered * (1.0 - l2_kept_fraction(gathered, partials + packed if world == 1 else 2 * gathered,
                                                        gathered + out_bytes, l2))
            ks = [KernelPlan(SPLIT, "compute", split, ht, dram_read_bytes=kv + q_bytes, dram_write_bytes=miss_p),
                  KernelPlan(COMBINE_LOCAL, "compute", local, ht, dram_read_bytes=miss_p,
                             dram_write_bytes=packed * miss_g / gathered)]
            if world > 1:
                ks.append(KernelPlan(NCCL_AG, "comm", ag, hv, collective=ALLGATHER))
            ks.append(KernelPlan(COMBINE_GLOBAL, "compute", glob, ht, dram_read_bytes=miss_g, dram_write_bytes=out_bytes))
            out.append(ks)
        det.update({"split_kv": mean([p[0].duration_s for p in out]), "combine_local": mean([p[1].duration_s for p in out]),
                    "all_gather": ag, "combine_global": glob})
        return out, det, notes
    if variant == "fused":
        if world > 1 and not topology(hw, world, params).single_domain:
            raise InputError(f"flash_decode/fused at {world} GPUs spans several NVLink/xGMI domains: out of the model's scope")
        from taxmodel.kernels.flash_decode.fused import combiner_count
        from taxmodel.kernels.flash_decode.workload import fused_config

        fcfg = fused_config(shape)
        ll = fcfg.protocol == "ll"
        slices = fcfg.slices
        rows = max(group // slices, 1) if slices > 0 else group  # rows per combining CTA
        units = b * hkv * (slices if slices > 0 else 1)  # pushes: one per head group or row slice
        # CTAs that push at once: each pair's last worker, or the slice combiners (at most half the SMs)
        pushers = min(units, combiner_count(fcfg, b * hkv, num_sms) if slices > 0 else num_sms)
        store_bw = params.peer_store_bytes_per_s or hw.link_bytes_per_s
        per_sm = params.peer_store_bytes_per_s_per_sm or store_bw / num_sms
        if ll and params.ll_push_bytes_per_s:
            store_bw = params.ll_push_bytes_per_s
        # Each unit's CTA stores its rows (D values and an lse each; LL words carry 4 value bytes in 8) into
        # every peer, all units at about the same time.
        unit_bytes = (world - 1) * rows * (d + 1) * (8 if ll else 4)
        push = push_wave_time(unit_bytes, pushers, per_sm, store_bw, params.peer_load_latency_s) \
            if world > 1 else 0.0
        if not ll and world > 1:
            # flags: after its stores the CTA signals every rank's flag with a system-scope
            # release-exchange, one after another (each release waits for the one before): W round
            # trips of an atomic over the link, each taken as half the calibrated flag round trip.
            push += world * params.flag_roundtrip_s / 2
        flag = params.flag_roundtrip_s / 2 if world > 1 else 0.0
        # The combine of the ranks' partials: LL waits for each peer's words and merges them in rank
        # order, one serial step per source rank (the pair's own partial is in registers unless a
        # dedicated combiner reads it back); the flags protocol waits for all flags, then one step.
        own_in_registers = fcfg.combiners == 0
        post_steps = (world - 1 if own_in_registers else world) if ll else 1
        # flags: the combiner waits on every rank's flag, one wait after another (each costs a
        # program the calibrated wait on a set flag even when the flag landed long ago)
        flag_waits = 0.0 if ll else world * params.flag_wait_s
        post = max((world * packed + out_bytes) / (hw.hbm_bytes_per_s * params.triton_stream_efficiency),
                   flag_waits + serial_steps_time(max(post_steps, 1), params, params.ll_merge_step_s if ll else None))
        # The pair's last worker's local combine: calibrated in the fused kernel itself where the hardware
        # file has the fused_combine step (a line over the steps, measured at one rank: its fixed part holds
        # what the kernel does after the fold at one rank, so there no merge step follows); else the
        # separate combine kernel's step (combine_step_s) per step. Slice combiners fold fewer rows
        # per step (another NB), which the step did not measure: they keep combine_step_s.
        # The line's fixed part is the one-rank epilogue (the push into its own slot, the merge of its own
        # partial, the output's store: in-kernel records on one H100, b1-kv16k, put the fold at 15.2 us for
        # 22 steps and that epilogue at ~4 us after it). On W ranks the push, the waits and the merges
        # modelled above are that epilogue, so there the fold is the steps alone.
        in_kernel = params.fused_local_combine_step_s is not None and slices <= 0
        one_rank_epilogue = in_kernel and world == 1 and ll and own_in_registers
        if one_rank_epilogue:
            post = 0.0
        fixed = (params.fused_local_combine_fixed_s or 0.0) if one_rank_epilogue else 0.0
        # slice combiners first wait for their pair's workers (the pair's ready word, GPU scope)
        ready_wait = params.flag_wait_gpu_s if slices > 0 else 0.0
        out, local_steps = [], []
        # The step: at one rank the calibrated tail's line as measured (it is that kernel); on several
        # ranks the fold's own step where calibrated (the line's slope through its L2-resident rows)
        own_fold = not one_rank_epilogue and params.fused_fold_step_s is not None
        fold_step = params.fused_fold_step_s if own_fold else params.fused_local_combine_step_s
        for kv, partials, splits in per_rank:
            if in_kernel:  # after the last split of the group
                local = fixed + serial_steps_time(steps(splits, rows), params, fold_step)
            else:
                local = serial_steps_time(steps(splits, rows), params)
            local_steps.append(local)
            work = split_kv_time(kv + partials, hw, params) + ready_wait + local + push
            # DRAM bytes: K/V and q read, the output written; the split partials that the kernel
            # writes and reads back, and the peers' partials, only as far as the L2 does not keep them
            miss_p = partials * (1.0 - l2_kept_fraction(partials, kv + q_bytes + partials, partials + packed, l2))
            miss_g = world * packed * (1.0 - l2_kept_fraction(world * packed, world * packed,
                                                              world * packed + out_bytes, l2))
            out.append([KernelPlan(FUSED, "fused", work, ht, sync=world > 1, post_s=post, flag_latency_s=flag,
                                   dram_read_bytes=kv + q_bytes + miss_p + miss_g,
                                   dram_write_bytes=miss_p + out_bytes)])
        det.update({"fused_work": mean([p[0].duration_s for p in out]), "local_combine": mean(local_steps), "push": push,
                    "flag": flag, "combine": post, "wait_merge": flag + post})
        notes.append("fused: each head group's combine waits for the slowest rank's partial plus a one-way "
                     "latency (half a flag round trip)")
        if in_kernel:
            notes.append(f"fused: the pair's local combine in the kernel: "
                         f"{fold_step * 1e6:.2f} us a step"
                         + (f" + {fixed * 1e6:.2f} us of one-rank epilogue" if one_rank_epilogue else
                            " (the one-rank epilogue of the line left out: on W ranks push, waits and merges are modelled)")
                         + (" (the fold's step: the calibrated fused_combine line through its L2-resident rows, "
                            f"{params.sources.get('fused_fold_step_s', 'given')})" if own_fold else
                            f" (calibrated fused_combine step, {params.sources.get('fused_local_combine_step_s', 'given')})"))
        else:
            notes.append(f"fused: the pair's local combine takes combine_step_s ({params.combine_step_s * 1e6:.2f} us) "
                         "a step, the separate combine kernel's step"
                         + (" (slice combiners)" if slices > 0 else
                            ": no fused_combine calibration in this hardware file"))
        notes.append(f"fused: {pushers} CTA(s) push {unit_bytes / 1024:.1f} KiB each to the peers at once (one SM's "
                     "peer-store rate, or the GPU's peer-store bandwidth shared), then the combine of the ranks' "
                     f"partials takes {max(post_steps, 1)} serial step(s) of "
                     + (f"{params.ll_merge_step_s * 1e6:.2f} us (LL: one per source rank)" if ll else
                        f"{params.combine_step_s * 1e6:.2f} us"))
        return out, det, notes
    raise InputError(f"flash_decode has no variant '{variant}'; choose one of {', '.join(VARIANTS)}")


def cost(shape: Mapping[str, int], world: int, variant: str) -> dict[str, Any]:
    from taxmodel.workload import get_workload

    return get_workload("flash_decode").cost(dict(shape), world, variant).to_dict()
