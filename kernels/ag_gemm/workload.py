"""All-Gather + GEMM: C = all_gather(A) @ B, with A row-sharded over the ranks.

Shapes (``M``, ``N``, ``K``, ``tp``): ``M`` is the global (gathered) row count, each rank holds
``M / world`` rows of A ([M/world, K]); B is [K, N] on every rank (``tp=0``, the layout of the
baseline measurements) or, in the tensor-parallel layout (``tp=1``), the weight is split by
columns and each rank holds [K, N/world]. Every rank computes all ``M`` rows of its C
([M, N] or [M, N/world]).

Inputs are drawn from seeded generators (seed in the shape's ``seed`` key, default 0) so that any
rank can rebuild every shard: the reference needs no communication. A ~ N(0, 1), B ~ N(0, 1/K),
so C ~ N(0, 1) and one tolerance fits every K.

Dtype: bf16 on GPUs; fp32 on CPU (Triton's interpreter has no fast bf16 dot and fp32 keeps the
reference check tight). A shape may force one with ``dtype`` 16 (bf16), 15 (fp16) or 32 (fp32).
"""
from __future__ import annotations

import os
from dataclasses import replace
from typing import Any, Mapping

import torch

from taxmodel.errors import InputError
from taxmodel.kernels.names import AG_GEMM_KERNEL, CE_GET, CE_PUT, COPY_BLOCKS_KERNEL
from taxmodel.vocabulary import ALLGATHER, COLLECTIVE_KERNELS, GEMM_KERNELS, MEMCPY, SYMM_MEM_KERNELS, any_name
from taxmodel.workload import Cost, Intermediate, Variant, Workload, register

from . import bsp, pull, push, torch_fused
from .gemm_tiles import GemmConfig, config_for_shape, default_config, first_wave_tiles, k_pieces, wave_programs
from .state import DTYPE_CODES, DTYPE_NAMES, AgGemmState, make_shard, make_weight, pick_dtype, shape_dims


#: Kernel names (regex) that write remote rows of A into a gathered buffer in the fine-grained
#: variants: copy-engine copies (traced as memcpy rows; ``ce_put``/``ce_get`` ranges on CPU) or the
#: Triton copy kernel.
COPY_PRODUCERS = any_name(MEMCPY, CE_PUT, CE_GET, COPY_BLOCKS_KERNEL)

#: Environment variable that picks the fine-grained variants' transport for `taxmodel profile`
#: when no GemmConfig is given: ``ce`` (default), ``sm`` or ``direct``. Only ``sm`` (and ``direct``
#: for pull) can be captured in a CUDA graph (``taxmodel profile --graph``).
TRANSPORT_ENV = "TAXMODEL_AG_GEMM_TRANSPORT"
TRANSPORTS = ("ce", "sm", "direct")

#: GPU presets: M x N x K with N = K = 8192 (the issue's sizes), a smaller N = K = 4096 family, and
#: the tensor-parallel layout (weight split by columns) of the 8192 family.
_GPU_PRESETS: dict[str, dict[str, int]] = {}
for _m in (1024, 4096, 8192, 16384):
    _GPU_PRESETS[f"m{_m}"] = {"M": _m, "N": 8192, "K": 8192, "tp": 0}
    _GPU_PRESETS[f"m{_m}_n4096"] = {"M": _m, "N": 4096, "K": 4096, "tp": 0}
    _GPU_PRESETS[f"m{_m}_tp"] = {"M": _m, "N": 8192, "K": 8192, "tp": 1}

#: Tiny CPU preset: with the CPU tile config (16x16x16) every dimension has a partial tile at
#: world sizes 1, 2, 3 and 4 (M_loc = 96, 48, 32, 24; N = 40; K = 40).
PRESETS: dict[str, dict[str, int]] = {"tiny": {"M": 96, "N": 40, "K": 40, "tp": 0},
                                      "tiny_tp": {"M": 96, "N": 48, "K": 40, "tp": 1}, **_GPU_PRESETS}


def heap_bytes(shape: Mapping[str, int], world: int, variant: str, dtype: torch.dtype, cfg: GemmConfig) -> int:
    """Symmetric-heap bytes a variant allocates on each rank (plus alignment slack)."""
    m, m_loc, _, k = shape_dims(shape, world)
    elt = torch.empty((), dtype=dtype).element_size()
    slack = 4096
    flag_bytes = world * -(-m_loc // cfg.block_m) * k_pieces(cfg, k) * 4
    if variant == "pull":
        return m * k * elt + flag_bytes + 2 * slack
    if variant == "push":
        return 2 * m * k * elt + 2 * flag_bytes + 2 * slack
    if variant == "bsp":
        return m_loc * k * elt + slack  # CPU thread ranks emulate the collective through the heap
    return 0


@register
class AgGemm(Workload):
    """All-Gather + GEMM (tensor-parallel input projection): bsp, pull, push, torch_fused."""

    name = "ag_gemm"
    description = "C = all_gather(A) @ B with A row-sharded over ranks (M global rows; B [K,N] or [K,N/world])"
    presets = PRESETS
    default_preset = "m8192"
    cpu_preset = "tiny"

    def __init__(self, config: GemmConfig | None = None) -> None:
        self.config = config

    def _config(self, device: Any = None) -> GemmConfig:
        """The given config, else the device's default with the transport ``TRANSPORT_ENV`` names."""
        if self.config is not None:
            return self.config
        cfg = default_config(device) if device is not None else GemmConfig()
        chosen = os.environ.get(TRANSPORT_ENV, "").strip().lower()
        if not chosen:
            return cfg
        if chosen not in TRANSPORTS:
            raise InputError(f"{TRANSPORT_ENV}={chosen!r}: use one of {', '.join(TRANSPORTS)}")
        return replace(cfg, transport=chosen)

    def _transport(self) -> str:
        return self._config().transport

    def config_summary(self, device: Any = None, shape: Mapping[str, int] | None = None, world: int | None = None,
                       variant: str | None = None) -> dict[str, Any]:
        """What the bundle's meta records of the kernels' configuration (tiles, transport): with the
        shape, world size and variant, the config that variant ran (``shape_config``), else the default."""
        if shape is not None and world and variant:
            return {"label": self.shape_config(shape, world, variant, device).label(),
                    "transport": self._config(device).transport}
        cfg = self._config(device)
        summary = {"label": cfg.label(), "transport": cfg.transport}
        if self.config is None and device is not None and torch.device(device).type == "cuda":
            summary["tiles"] = "per-shape table (kernels/ag_gemm/gemm_table.py); label is the default's"
        return summary

    def variants(self) -> dict[str, Variant]:
        """The variants, with ``graph_safe`` set for this workload's transport (the runtime may
        capture those in a CUDA graph): bsp always; pull with the ``sm`` or ``direct`` transport;
        push with ``sm``; never the copy engines (host-chosen flag values) nor torch_fused."""
        transport = self._transport()
        return {
            "bsp": bsp.VARIANT,
            "pull": replace(pull.VARIANT, graph_safe=pull.graph_safe(transport)),
            "push": replace(push.VARIANT, graph_safe=push.graph_safe(transport)),
            "torch_fused": torch_fused.VARIANT,
        }

    def shape_config(self, shape: Mapping[str, int], world: int, variant: str, device: Any) -> GemmConfig:
        """The config ``setup`` runs ``variant`` with: the given one, else the device's default with
        the committed per-shape tile table (gemm_table.py) on a GPU and, for pull, narrower tiles at
        small own slabs (``first_wave_tiles``, kernel revision 5)."""
        cfg = self._config(device)
        if self.config is not None:
            return cfg
        m, m_loc, n_loc, k = shape_dims(shape, world)
        cfg = config_for_shape(m, n_loc, k, device, base=cfg)
        if variant == "pull":
            cfg = first_wave_tiles(cfg, m_loc, n_loc, world, wave_programs(cfg, torch.device(device)))
        return cfg

    def setup(self, ctx: Any, shape: Mapping[str, int], variant: Variant) -> AgGemmState:
        from taxmodel.kernels.device.sync import new_error_buffer, spin_budget, sync_mode

        shape = dict(shape)
        world, rank, device = ctx.world_size, ctx.rank, torch.device(ctx.device)
        m, m_loc, n_loc, k = shape_dims(shape, world)
        dtype = pick_dtype(shape, device)
        cfg = self.shape_config(shape, world, variant.name, device)
        seed = int(shape.get("seed", 0))
        tp = bool(shape.get("tp", 0))
        shard = make_shard(seed, rank, m_loc, k, dtype, device)
        b = make_weight(seed, rank, k, int(shape["N"]), n_loc, tp, dtype, device)
        c = torch.full((m, n_loc), float("nan"), dtype=dtype, device=device)
        sync = sync_mode(device)
        st = AgGemmState(ctx=ctx, shape=shape, variant=variant.name, dtype=dtype, m=m, m_loc=m_loc, n_loc=n_loc,
                         k=k, a_local=shard, b=b, c=c, cfg=cfg, err=new_error_buffer(device), sync=sync,
                         budget=spin_budget(ctx.spin_timeout_s, sync))
        prepare = getattr(variant, "prepare", None)
        if prepare is not None:
            prepare(st, heap_bytes(shape, world, variant.name, dtype, cfg))
        ctx.barrier()  # every rank's inputs are in place before any rank's first run reads them
        return st

    def reference(self, ctx: Any, shape: Mapping[str, int], state: AgGemmState) -> torch.Tensor:
        """fp32 C of the inputs of ``shape``'s seed (after ``reseed``, pass the state's shape)."""
        device = torch.device(ctx.device)
        seed = int(shape.get("seed", 0))
        shards = [make_shard(seed, r, state.m_loc, state.k, state.dtype, device).float() for r in range(ctx.world_size)]
        b = make_weight(seed, ctx.rank, state.k, int(shape["N"]), state.n_loc, bool(shape.get("tp", 0)), state.dtype,
                        device)
        return torch.cat(shards) @ b.float()

    def output(self, state: AgGemmState) -> torch.Tensor:
        return state.c

    def tolerance(self, shape: Mapping[str, int], world_size: int = 1) -> tuple[float, float]:
        return (2e-2, 2e-2)  # no sum over ranks in 16-bit arithmetic: one tolerance at every world size

    def cost(self, shape: Mapping[str, int], world_size: int, variant: str) -> Cost:
        """Per rank and iteration. HBM floor: own A shard read, B read, C written (remote rows of A
        can go from the link straight on chip); link: the (world-1) remote shards received.
        Intermediates: the gathered A written to HBM by the all-gather (or the pushes, or the
        pull's staging copies) and read back by the GEMM; only the "direct" pull transport reads
        remote rows straight into the GEMM."""
        m, m_loc, n_loc, k = shape_dims(shape, world_size)
        dtype_code = shape.get("dtype")
        dtype = DTYPE_CODES.get(int(dtype_code), torch.bfloat16) if dtype_code is not None else torch.bfloat16
        elt = torch.empty((), dtype=dtype).element_size()
        remote = (world_size - 1) * m_loc * k * elt
        inter: tuple[Intermediate, ...] = ()
        if variant in ("bsp", "torch_fused"):
            producer = COLLECTIVE_KERNELS[ALLGATHER] if variant == "bsp" else SYMM_MEM_KERNELS
            inter = (Intermediate("gathered_A", m * k * elt, producer, GEMM_KERNELS),)
        elif variant == "push" and world_size > 1:
            inter = (Intermediate("pushed_A", remote, COPY_PRODUCERS, AG_GEMM_KERNEL),)
        elif variant == "pull" and world_size > 1 and self._transport() != "direct":
            inter = (Intermediate("staged_A", remote, COPY_PRODUCERS, AG_GEMM_KERNEL),)
        return Cost(
            flops=2 * m * n_loc * k,
            hbm_bytes=(m_loc * k + k * n_loc + m * n_loc) * elt,
            link_bytes=remote,
            intermediates=inter,
            dtype=DTYPE_NAMES[dtype],
        )
