"""What a PyTorch operator has to do at the least: its FLOPs and its compulsory HBM bytes, from
the op's name and the input shapes and dtypes the profiler recorded (``record_shapes=True``).

Why here, in the trace layer: these are facts about the recorded work that need no hardware
(the model divides them by a GPU's peaks, ``ledger/kernel_costs.py``), and the importer attaches
them to every kernel the op launched (columns ``op``, ``dtype``, ``flops``, ``floor_bytes``,
``uncosted``; docs/ledger.md "Per-kernel floors").

Definitions, for every op family below (docs/ledger.md lists them with their formulas):

- **compulsory bytes** = every input tensor read once + every output written once, at the
  tensors' element sizes; an input expanded along a dimension (stride 0 in Kineto's ``Input
  Strides``) counts its distinct elements once. Kineto records input shapes only; outputs follow from the op
  (a GEMM's ``M x N``, an elementwise op's broadcast shape, an in-place op's first input).
  Where an output's size cannot be known from the inputs (a reduction's kept dims), only what
  is certain is counted, so the floor stays a lower bound.
- **flops**: multiply-adds count 2; attention 4·B·H·L·S·D forward (half with a causal mask),
  2.5x that backward; elementwise one per output element. Kineto's own ``flops`` (``with_flops``)
  is used for ops this table does not count itself.
- **dtype** names the peak the flops are divided by: bf16/fp16/fp8/tf32 for matrix ops on
  those inputs (fp32 GEMMs are floored at the TF32 peak, the higher one, so the floor stays a
  lower bound), fp32 for everything else (vector units; memory bytes dominate there).

An op that is not in the table, a dtype that is not known, or a tensor list whose element dtype
the profiler did not record, is *uncosted* with that reason; nothing is guessed.
"""
from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from taxmodel.trace import ints

# Kineto's "Input type" strings (C++ type names) -> (element bytes, dtype class)
_TYPES: dict[str, tuple[int, str]] = {
    "c10::bfloat16": (2, "bf16"), "c10::half": (2, "fp16"), "float": (4, "fp32"), "double": (8, "fp64"),
    "c10::float8_e4m3fn": (1, "fp8"), "c10::float8_e5m2": (1, "fp8"), "c10::float8_e4m3fnuz": (1, "fp8"),
    "c10::float8_e5m2fnuz": (1, "fp8"), "c10::float8_e8m0fnu": (1, "fp8"),
    "long int": (8, "int"), "long": (8, "int"), "int": (4, "int"), "short int": (2, "int"), "signed char": (1, "int"),
    "unsigned char": (1, "int"), "bool": (1, "int"), "unsigned short": (2, "int"), "unsigned int": (4, "int"),
    "c10::complex<float>": (8, "fp32"), "c10::complex<double>": (16, "fp64"), "c10::complex<c10::half>": (4, "fp16"),
}
_SCALAR_TYPES = frozenset(("Int", "Double", "Bool", "Float", "Long", "Scalar", "Complex", "SymInt"))
# c10::ScalarType codes (a dtype argument's concrete value) -> element bytes
_SCALAR_TYPE_BYTES = {0: 1, 1: 1, 2: 2, 3: 4, 4: 8, 5: 2, 6: 4, 7: 8, 8: 4, 9: 8, 10: 16, 11: 1, 15: 2,
                      23: 1, 24: 1, 25: 1, 26: 1}
#: dtype classes whose GEMMs run on tensor cores at their own peak
_MATRIX_CLASS = {"bf16": "bf16", "fp16": "fp16", "fp8": "fp8", "fp32": "tf32", "fp64": "fp64", "int": "int8"}


@dataclass(frozen=True)
class OpCall:
    """One recorded op: name (``aten::mm``), per-input dims (a list of ints, a list of such lists
    for a tensor list, ``[]`` for a scalar or None), per-input type strings, per-input concrete
    values (text), and Kineto's flops (None when not recorded)."""

    name: str
    dims: Sequence[Any]
    types: Sequence[str]
    concrete: Sequence[str] = ()
    kineto_flops: int | None = None
    #: element type of the op's tensor lists, read off the kernels it launched
    #: (``list_type_from_kernel``); "" when unknown
    list_type: str = ""
    #: per-input strides (Kineto's ``Input Strides``; ``()`` when not recorded): an input
    #: expanded along a dimension (stride 0) is read once, not once per view element
    strides: Sequence[Any] = ()


@dataclass(frozen=True)
class OpCost:
    """flops, compulsory bytes and the dtype class of the peak; ``uncosted`` says why not when
    the op could not be costed (then flops and bytes are -1)."""

    flops: int
    bytes: int
    dtype: str
    uncosted: str = ""


class _Uncosted(Exception):
    """Raised inside a cost function: the op cannot be costed, with the reason."""


def _uncosted(reason: str) -> OpCost:
    return OpCost(-1, -1, "", reason)


# --- argument helpers ----------------------------------------------------------------------------

class _Args:
    """Typed access to an OpCall's inputs: tensor shapes, element sizes, concrete values."""

    def __init__(self, call: OpCall):
        self.call = call
        self.dims = list(call.dims)
        # older Kineto names a scalar argument's type "Int", "Double", "Bool": not an int/double/bool tensor
        self.types = ["scalar" if str(t).strip() in _SCALAR_TYPES else str(t).strip().lower() for t in call.types]
        self.concrete = list(call.concrete)

    def is_tensor(self, i: int) -> bool:
        return i < len(self.types) and self.types[i] in _TYPES and isinstance(self.dims[i], list) and \
            all(isinstance(v, int) for v in self.dims[i])

    def is_list(self, i: int) -> bool:
        return i < len(self.types) and self.types[i] == "tensorlist"

    def shape(self, i: int) -> list[int]:
        if not self.is_tensor(i):
            if i < len(self.types) and self.types[i] and self.types[i] not in ("scalar", "", "tensorlist", "scalarlist"):
                raise _Uncosted(f"unknown dtype {self.call.types[i]!r}")
            raise _Uncosted(f"input {i} is not a recorded tensor")
        return [int(v) for v in self.dims[i]]

    def numel(self, i: int) -> int:
        return math.prod(self.shape(i))

    def es(self, i: int) -> int:
        self.shape(i)
        return _TYPES[self.types[i]][0]

    def cls(self, i: int) -> str:
        self.shape(i)
        return _TYPES[self.types[i]][1]

    def stored(self, i: int) -> int:
        """Distinct elements behind input ``i``: its numel, less the repeats of dimensions it was
        expanded along (stride 0), when the profiler recorded its strides."""
        shape = self.shape(i)
        st = self.call.strides[i] if i < len(self.call.strides) else None
        if not isinstance(st, list) or len(st) != len(shape) or not all(isinstance(v, int) for v in st):
            return math.prod(shape)
        return math.prod(n for n, s in zip(shape, st) if s != 0) if all(shape) else 0

    def nbytes(self, i: int) -> int:
        """Bytes of input ``i`` read once: its distinct elements at its element size."""
        return self.stored(i) * self.es(i)

    def opt_bytes(self, i: int) -> int:
        """Bytes of an optional tensor input (0 when absent)."""
        return self.nbytes(i) if self.is_tensor(i) else 0

    def value(self, i: int) -> str:
        return str(self.concrete[i]).strip() if i < len(self.concrete) and self.concrete[i] is not None else ""

    def flag(self, i: int) -> bool | None:
        v = self.value(i).lower()
        return True if v in ("true", "1") else False if v in ("false", "0") else None

    def int_list(self, i: int, default: list[int] | None) -> list[int]:
        """Input ``i``'s recorded int list; ``default`` when absent or unreadable, or uncosted
        when there is no default (an argument the cost depends on)."""
        v = self.value(i)
        if not v:
            if default is None:
                raise _Uncosted(f"input {i} of {self.call.name} was not recorded (older profilers record no concrete values)")
            return default
        try:
            parsed = ast.literal_eval(v)
        except (ValueError, SyntaxError):
            parsed = None
        if isinstance(parsed, int):
            return [parsed]
        if isinstance(parsed, (list, tuple)) and all(isinstance(x, int) for x in parsed):
            return [int(x) for x in parsed]
        if default is None:
            raise _Uncosted(f"input {i} of {self.call.name} is not an int list ({v[:40]!r})")
        return default

    def list_es(self) -> int:
        """Element size of the op's tensor lists (from its kernels' names), or uncosted."""
        t = self.call.list_type.strip().lower()
        if t.startswith("opaque:"):
            return int(t[7:])
        if t in _TYPES:
            return _TYPES[t][0]
        raise _Uncosted("tensor-list dtypes not recorded")

    def list_numel(self, i: int, first: bool = False) -> list[int]:
        """Element counts of tensor list ``i``; ``first``: the op's main list, which cannot be empty
        (the profiler records long lists as empty)."""
        if not self.is_list(i) or not isinstance(self.dims[i], list):
            raise _Uncosted(f"input {i} is not a recorded tensor list")
        if first and not self.dims[i]:
            raise _Uncosted("tensor-list shapes not recorded (the profiler records long lists empty)")
        return [math.prod(int(v) for v in d) for d in self.dims[i] if isinstance(d, list)]

    def tensors(self) -> list[int]:
        return [i for i in range(len(self.types)) if self.is_tensor(i)]


def _broadcast(shapes: list[list[int]]) -> list[int]:
    n = max((len(s) for s in shapes), default=0)
    out = [1] * n
    for s in shapes:
        for k, v in enumerate(s):
            j = n - len(s) + k
            out[j] = v if out[j] == 1 else out[j]
    return out


def _cost(flops: float, nbytes: float, dtype: str) -> OpCost:
    return OpCost(int(round(flops)), int(round(nbytes)), dtype)


# --- op families ------------------------------------------------------------------------------

def _gemm(a: _Args, ia: int, ib: int, bias: int | None = None, out_es: int | None = None) -> OpCost:
    """C[..., M, N] = A[..., M, K] @ B[..., K, N] (batch dims broadcast), plus an optional bias."""
    sa, sb = a.shape(ia), a.shape(ib)
    if len(sa) == 1:
        sa = [1] + sa
    if len(sb) == 1:
        sb = sb + [1]
    m, k = sa[-2], sa[-1]
    n = sb[-1]
    batch = math.prod(_broadcast([sa[:-2], sb[:-2]]))
    es_out = out_es if out_es is not None else a.es(ia)
    out = batch * m * n
    nbytes = a.nbytes(ia) + a.nbytes(ib) + out * es_out + (a.opt_bytes(bias) if bias is not None else 0)
    return _cost(2.0 * batch * m * n * k, nbytes, _MATRIX_CLASS[a.cls(ia)])


def _mm(a: _Args) -> OpCost:
    return _gemm(a, 0, 1)


def _addmm(a: _Args) -> OpCost:  # addmm(bias, a, b), baddbmm(c, a, b), _addmm_activation(bias, a, b, ..., use_gelu)
    return _gemm(a, 1, 2, bias=0)


def _linear(a: _Args) -> OpCost:  # linear(x[..., K], w[N, K], bias)
    x, w = a.shape(0), a.shape(1)
    m = math.prod(x[:-1])
    n, k = (w[0], w[1]) if len(w) == 2 else (1, w[0])
    nbytes = a.nbytes(0) + a.nbytes(1) + a.opt_bytes(2) + m * n * a.es(0)
    return _cost(2.0 * m * n * k, nbytes, _MATRIX_CLASS[a.cls(0)])


def _scaled_mm(a: _Args) -> OpCost:
    """_scaled_mm(a, b, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum)."""
    code = a.value(6)
    out_es = _SCALAR_TYPE_BYTES.get(ints.whole(code))
    if out_es is None:
        out_es = a.es(0)  # out_dtype None: the output keeps the input dtype
    c = _gemm(a, 0, 1, bias=4, out_es=out_es)
    return OpCost(c.flops, c.bytes + a.opt_bytes(2) + a.opt_bytes(3), c.dtype)


# attention: (query index of "is_causal" / "custom_mask_type", layout) per op
_ATTN_FWD = {
    "aten::scaled_dot_product_attention": (5, "bhld"),
    "aten::_scaled_dot_product_flash_attention": (4, "bhld"),
    "aten::_scaled_dot_product_flash_attention_for_cpu": (4, "bhld"),
    "aten::_scaled_dot_product_efficient_attention": (6, "bhld"),
    "aten::_scaled_dot_product_cudnn_attention": (6, "bhld"),
    "aten::_flash_attention_forward": (8, "blhd"),
    "aten::_efficient_attention_forward": (9, "blhd"),
    "aten::_cudnn_attention_forward": (10, "bhld"),
}
# backward: (index of query, index of is_causal / custom_mask_type, layout)
_ATTN_BWD = {
    "aten::_scaled_dot_product_flash_attention_backward": (1, 11, "bhld"),
    "aten::_scaled_dot_product_efficient_attention_backward": (1, 11, "bhld"),
    "aten::_scaled_dot_product_cudnn_attention_backward": (1, 14, "bhld"),
    "aten::_cudnn_attention_backward": (1, 14, "bhld"),
    "aten::_flash_attention_backward": (1, 11, "blhd"),
    "aten::_efficient_attention_backward": (1, 14, "blhd"),
}


def _attention_core(a: _Args, q: int, causal_idx: int, layout: str) -> tuple[float, int, int, int]:
    """(forward flops, bytes of q, k, v, numel of the output) of one attention call. A causal
    mask halves the flops; when the profiler did not record the flag, the causal (smaller)
    count is used so that the floor stays a lower bound."""
    sq, sk, sv = a.shape(q), a.shape(q + 1), a.shape(q + 2)
    if len(sq) != 4 or len(sk) != 4 or len(sv) != 4:
        raise _Uncosted("attention inputs are not 4-d")
    s_len = sk[2] if layout == "bhld" else sk[1]
    dv = sv[-1]
    causal = a.flag(causal_idx)
    mask_type = ints.nonneg(a.value(causal_idx), None)  # custom_mask_type: 0 none, 1/2 causal
    if causal is None and mask_type is not None:
        causal = mask_type > 0
    qk = 2.0 * math.prod(sq) * s_len  # Q K^T: B H L S D
    pv = 2.0 * (math.prod(sq) // sq[-1]) * s_len * dv
    flops = (qk + pv) * (0.5 if causal is not False else 1.0)
    out_numel = math.prod(sq) // sq[-1] * dv
    return flops, a.nbytes(q) + a.nbytes(q + 1) + a.nbytes(q + 2), out_numel, math.prod(sq) // sq[-1]


def _attention_fwd(a: _Args) -> OpCost:
    causal_idx, layout = _ATTN_FWD[a.call.name]
    flops, qkv, out_numel, rows = _attention_core(a, 0, causal_idx, layout)
    lse = rows * 4 if a.call.name != "aten::scaled_dot_product_attention" else 0
    return _cost(flops, qkv + out_numel * a.es(0) + lse, _MATRIX_CLASS[a.cls(0)])


def _attention_bwd(a: _Args) -> OpCost:
    q, causal_idx, layout = _ATTN_BWD[a.call.name]
    flops, qkv, out_numel, rows = _attention_core(a, q, causal_idx, layout)
    es = a.es(q)
    # read grad_out, q, k, v, out, logsumexp; write dq, dk, dv
    nbytes = 2 * out_numel * es + rows * 4 + 2 * qkv
    return _cost(2.5 * flops, nbytes, _MATRIX_CLASS[a.cls(q)])


#: positions of (stride, padding, dilation) among a convolution op's inputs: aten::convolution,
#: _convolution and convN d take (input, weight, bias, stride, padding, dilation, ...); the
#: backend ops order them otherwise
_CONV_ARGS = {"aten::cudnn_convolution": (3, 2, 4), "aten::miopen_convolution": (4, 3, 5)}


def _conv_out(a: _Args, spatial_in: list[int], kernel: list[int], transposed: bool = False) -> list[int]:
    nd = len(spatial_in)
    i_stride, i_pad, i_dil = _CONV_ARGS.get(a.call.name, (3, 4, 5))
    # no defaults: an unrecorded stride or padding would be guessed, and the guess (1, 0) can put the
    # floor above the convolution's true work
    stride = a.int_list(i_stride, None)
    pad = a.int_list(i_pad, None)
    dil = a.int_list(i_dil, None)
    stride, pad, dil = ([v[0]] * nd if len(v) == 1 else v for v in (stride, pad, dil))
    if transposed:
        return [(i - 1) * s - 2 * p + d * (k - 1) + 1 for i, k, s, p, d in zip(spatial_in, kernel, stride, pad, dil)]
    return [(i + 2 * p - d * (k - 1) - 1) // s + 1 for i, k, s, p, d in zip(spatial_in, kernel, stride, pad, dil)]


def _conv_fwd(a: _Args) -> OpCost:
    """convolution(input[N, C, *S], weight[O, C/g, *K], bias, stride, padding, dilation, ...)."""
    x, w = a.shape(0), a.shape(1)
    transposed = bool(a.flag(6)) if a.call.name in ("aten::convolution", "aten::_convolution") else False
    out_sp = _conv_out(a, x[2:], w[2:], transposed)
    if transposed:  # weight[C_in, O/g, *K]; the MACs are those of the matching forward conv
        out_c = w[1] * max(1, x[1] // w[0]) if w[0] else w[1]
        macs = x[0] * math.prod(x[2:]) * w[0] * w[1] * math.prod(w[2:])
    else:
        out_c = w[0]
        macs = x[0] * out_c * math.prod(out_sp) * w[1] * math.prod(w[2:])
    out = x[0] * out_c * math.prod(out_sp)
    nbytes = a.nbytes(0) + a.nbytes(1) + a.opt_bytes(2) + out * a.es(0)
    return _cost(2.0 * macs, nbytes, _MATRIX_CLASS[a.cls(0)])


def _conv_bwd(a: _Args) -> OpCost:
    """convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
    transposed, output_padding, groups, output_mask): dgrad and wgrad are each one forward's MACs."""
    go, w = a.shape(0), a.shape(2)
    mask = [m.strip().lower() == "true" for m in a.value(10).strip("[]").split(",")] if a.value(10) else [True, True, True]
    macs = go[0] * go[1] * math.prod(go[2:]) * w[1] * math.prod(w[2:])
    n_grads = int(mask[0]) + (int(mask[1]) if len(mask) > 1 else 1)
    nbytes = a.nbytes(0) + a.nbytes(1) + a.nbytes(2)
    nbytes += (a.nbytes(1) if mask[0] else 0) + (a.nbytes(2) if len(mask) < 2 or mask[1] else 0)
    return _cost(2.0 * macs * n_grads, nbytes, _MATRIX_CLASS[a.cls(0)])


def _cudnn_conv_bwd_input(a: _Args) -> OpCost:
    """cudnn_convolution_backward_input(self_size, grad_output, weight, padding, stride, ...):
    one forward's MACs from grad_output [N, O, *S'] and weight [O, C/g, *K]; grad_input is
    written when its size was recorded."""
    go, w = a.shape(1), a.shape(2)
    macs = go[0] * go[1] * math.prod(go[2:]) * w[1] * math.prod(w[2:])
    size = a.int_list(0, [])
    grad_input = math.prod(size) * a.es(1) if size else 0
    return _cost(2.0 * macs, a.nbytes(1) + a.nbytes(2) + grad_input, _MATRIX_CLASS[a.cls(1)])


def _cudnn_conv_bwd_weight(a: _Args) -> OpCost:
    """cudnn_convolution_backward_weight(weight_size, grad_output, self, padding, stride, ...):
    one forward's MACs, which need the weight's size (its kernel and group shape); uncosted when
    it was not recorded, since a bytes-only floor would hide the op's dominant work."""
    go = a.shape(1)
    size = a.int_list(0, None)
    if len(size) != len(go):
        raise _Uncosted("weight_size does not match grad_output's rank")
    macs = go[0] * go[1] * math.prod(go[2:]) * size[1] * math.prod(size[2:])
    return _cost(2.0 * macs, a.nbytes(1) + a.nbytes(2) + math.prod(size) * a.es(1), _MATRIX_CLASS[a.cls(1)])


def _batch_norm(a: _Args) -> OpCost:
    """(cudnn_|native_)batch_norm(input, weight, bias, running_mean, running_var, training, ...):
    input read once, output written once, the per-channel tensors read."""
    params = sum(a.opt_bytes(i) for i in range(1, 5))
    return _cost(8.0 * a.numel(0), 2 * a.nbytes(0) + params, "fp32")


def _batch_norm_bwd(a: _Args, x: int, go: int) -> OpCost:
    params = sum(a.opt_bytes(i) for i in range(2, 7))
    return _cost(12.0 * a.numel(x), a.nbytes(x) + a.nbytes(go) + a.numel(x) * a.es(x) + params, "fp32")


def _cudnn_batch_norm_bwd(a: _Args) -> OpCost:  # (input, grad_output, weight, running_mean, running_var, save_mean, save_var, ...)
    return _batch_norm_bwd(a, 0, 1)


def _native_batch_norm_bwd(a: _Args) -> OpCost:  # (grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, ...)
    return _batch_norm_bwd(a, 1, 0)


def _max_pool_bwd(a: _Args) -> OpCost:
    """max_pool2d_with_indices_backward(grad_output, self, kernel, stride, padding, dilation,
    ceil_mode, indices): grad_output and indices read, grad_input (self's size) written."""
    return _cost(float(a.numel(0)), a.nbytes(0) + a.opt_bytes(7) + a.numel(1) * a.es(1), "fp32")


def _elementwise(a: _Args) -> OpCost:
    """Every tensor input read once; the broadcast output written once (in place: the first
    input). A tensor recorded beyond the op's positional arguments is its ``out=`` tensor (older
    profilers record ``clamp_min(self, min, out)``): written, not read."""
    arity = _ELEMENTWISE_ARITY.get(a.call.name.removeprefix("aten::").rstrip("_"))
    ts = [i for i in a.tensors() if arity is None or i < arity]
    outs = [i for i in a.tensors() if arity is not None and i >= arity]
    if not ts:
        raise _Uncosted("no tensor inputs recorded")
    out = math.prod(_broadcast([a.shape(i) for i in ts]))
    inplace = a.call.name.endswith("_") and not a.call.name.endswith("__")
    written = sum(a.numel(i) * a.es(i) for i in outs) if outs else (a.numel(ts[0]) if inplace else out) * a.es(ts[0])
    return _cost(float(out), sum(a.nbytes(i) for i in ts) + written, "fp32")


def _read_input(a: _Args) -> OpCost:
    """Reductions: the input is read once (the kept output is at most that large and not counted)."""
    ts = a.tensors()
    if not ts:
        raise _Uncosted("no tensor inputs recorded")
    return _cost(float(a.numel(ts[0])), a.nbytes(ts[0]), "fp32")


def _softmax(a: _Args) -> OpCost:  # _softmax(self, dim, half_to_float)
    out_es = 4 if a.flag(2) else a.es(0)
    return _cost(5.0 * a.numel(0), a.nbytes(0) + a.numel(0) * out_es, "fp32")


def _softmax_bwd(a: _Args) -> OpCost:  # (grad_output, output, dim, input_dtype)
    return _cost(3.0 * a.numel(0), a.nbytes(0) + a.nbytes(1) + a.numel(0) * a.es(1), "fp32")


def _norm_rows(a: _Args, shape_idx: int) -> int:
    """Rows of a layer/rms norm: numel / prod(normalized_shape), from the weight's shape."""
    x = a.shape(0)
    w = a.shape(shape_idx) if a.is_tensor(shape_idx) else [x[-1]]
    return max(1, a.numel(0) // max(1, math.prod(w)))


def _layer_norm(a: _Args) -> OpCost:  # native_layer_norm(input, normalized_shape, weight, bias, eps)
    rows = _norm_rows(a, 2)
    nbytes = 2 * a.nbytes(0) + a.opt_bytes(2) + a.opt_bytes(3) + 2 * rows * 4
    return _cost(8.0 * a.numel(0), nbytes, "fp32")


def _layer_norm_bwd(a: _Args) -> OpCost:
    """native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias, mask)."""
    nbytes = a.nbytes(0) + a.nbytes(1) + a.opt_bytes(3) + a.opt_bytes(4) + 2 * a.opt_bytes(5) + a.opt_bytes(6)
    nbytes += a.numel(0) * a.es(0)
    return _cost(12.0 * a.numel(0), nbytes, "fp32")


def _rms_norm(a: _Args) -> OpCost:  # _fused_rms_norm(input, normalized_shape, weight, eps)
    rows = _norm_rows(a, 2)
    return _cost(4.0 * a.numel(0), 2 * a.nbytes(0) + a.opt_bytes(2) + rows * 4, "fp32")


def _rms_norm_bwd(a: _Args) -> OpCost:  # _fused_rms_norm_backward(grad_out, input, normalized_shape, rstd, weight, mask)
    nbytes = a.nbytes(0) + a.nbytes(1) + a.opt_bytes(3) + 2 * a.opt_bytes(4) + a.numel(0) * a.es(0)
    return _cost(8.0 * a.numel(0), nbytes, "fp32")


def _embedding(a: _Args) -> OpCost:  # embedding(weight[V, D], indices)
    w = a.shape(0)
    out = a.numel(1) * w[-1]
    return _cost(0.0, a.nbytes(1) + 2 * out * a.es(0), "fp32")


def _embedding_bwd(a: _Args) -> OpCost:
    """embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale): the
    dense gradient [num_weights, D] is written, grad_output and indices read."""
    v = ints.nonneg(a.value(2), None)
    if v is None:
        raise _Uncosted("num_weights not recorded")
    dim = a.shape(0)[-1]
    return _cost(float(a.numel(0)), a.nbytes(0) + a.nbytes(1) + v * dim * a.es(0), "fp32")


def _dropout(a: _Args) -> OpCost:  # native_dropout(input, p, train): output + bool mask
    return _cost(float(a.numel(0)), 2 * a.nbytes(0) + a.numel(0), "fp32")


def _dropout_bwd(a: _Args) -> OpCost:  # native_dropout_backward(grad, mask, scale)
    return _cost(float(a.numel(0)), 2 * a.nbytes(0) + a.nbytes(1), "fp32")


def _nll_loss(a: _Args) -> OpCost:
    """nll_loss_forward(self[N, C], target, ...): one logit per row is read, plus the targets."""
    n = a.numel(1)
    return _cost(float(n), a.nbytes(1) + n * a.es(0) + a.es(0), "fp32")


def _nll_loss_bwd(a: _Args) -> OpCost:
    """nll_loss_backward(grad_output, self, target, ...): one gradient per row is written at its
    target; zeroing the rest of grad_input is a nested ``zero_`` op with its own kernel and floor."""
    n = a.numel(2)
    return _cost(float(n), a.opt_bytes(0) + a.nbytes(2) + n * a.es(1), "fp32")


def _index_select(a: _Args) -> OpCost:  # index_select(self, dim, index): rows of self picked by index
    x = a.shape(0)
    d = ints.whole(a.value(1))
    if d is None or not x:
        raise _Uncosted("dim not recorded")
    out = a.numel(0) // max(1, x[d]) * a.numel(2)
    return _cost(0.0, a.nbytes(2) + 2 * out * a.es(0), "fp32")


def _gather(a: _Args) -> OpCost:  # gather(self, dim, index): output has index's shape
    out = a.numel(2)
    return _cost(0.0, a.nbytes(2) + 2 * out * a.es(0), "fp32")


def _copy(a: _Args) -> OpCost:  # copy_(self, src): src read, self written
    return _cost(0.0, a.nbytes(1) + a.nbytes(0), "fp32")


def _to_copy(a: _Args) -> OpCost:  # _to_copy(self, dtype, ...)
    code = ints.whole(a.value(1))
    out_es = a.es(0) if code is None else _SCALAR_TYPE_BYTES.get(code)
    return _cost(0.0, a.nbytes(0) + a.numel(0) * out_es, "fp32")


def _fill(a: _Args) -> OpCost:  # fill_/zero_: the tensor written once
    return _cost(0.0, a.nbytes(0), "fp32")


def _lists(a: _Args) -> list[int]:
    return [i for i in range(len(a.types)) if a.is_list(i)]


def _foreach(a: _Args) -> OpCost:
    """``_foreach_*`` ops: every tensor list (and tensor) read once; the first list written
    (in place) or an output list of its sizes (out of place); ``_foreach_norm``/``max`` write one
    value per tensor, not counted. Kineto records a list's shapes, not its dtype: the element
    type comes from the kernels the op launched (``list_type``), else the op is uncosted."""
    lists = _lists(a)
    if not lists:
        raise _Uncosted("no tensor lists recorded")
    first = sum(a.list_numel(lists[0], first=True))
    es = a.list_es()
    read = sum(sum(a.list_numel(i)) for i in lists) * es + sum(a.nbytes(i) for i in a.tensors())
    reduction = any(t in a.call.name for t in ("_foreach_norm", "_foreach_max"))
    return _cost(float(first), read + (0 if reduction else first * es), "fp32")


def _fused_optimizer(a: _Args) -> OpCost:
    """``_fused_adam(w)_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, ...)``:
    every list read, params and both moments (and max_exp_avg_sqs when given) written;
    ``_fused_sgd_(params, grads, momentum_buffers, ...)``: params and momenta written."""
    lists = _lists(a)
    written = (0, 2) if "sgd" in a.call.name else (0, 2, 3, 4)
    if not lists:
        raise _Uncosted("no tensor lists recorded")
    sizes = [sum(a.list_numel(i, first=(k == 0))) for k, i in enumerate(lists)]
    es = a.list_es()
    # state_steps are one fp32 value per parameter, whatever the parameters' dtype
    steps = 5 if "adam" in a.call.name and len(lists) > 5 else None
    nbytes = sum(n * (4 if k == steps else es) for k, n in enumerate(sizes))
    nbytes += sum(sizes[k] * es for k in written if k < len(sizes))
    return _cost(10.0 * sizes[0], nbytes, "fp32")


def _cat(a: _Args) -> OpCost:  # cat(tensors, dim): every input read, the concatenation written
    n = sum(sum(a.list_numel(i, first=(k == 0))) for k, i in enumerate(_lists(a)))
    es = a.list_es()
    return _cost(0.0, 2 * n * es, "fp32")


def _inductor_kernel(a: _Args) -> OpCost:
    """A Triton kernel torch.compile (Inductor) launched, recorded as an op of its own name with
    its buffer arguments: they are exactly the kernel's inputs and outputs, so each is read or
    written once (an in-out buffer once: a lower bound). Pointwise/reduction kernels
    (``triton_poi/red/per``) do one flop per element of their largest buffer; other kernels
    (templates: GEMMs) get a bytes-only floor, still a lower bound."""
    ts = a.tensors()
    if not ts:
        raise _Uncosted("no tensor arguments recorded")
    nbytes = sum(a.nbytes(i) for i in ts)
    pointwise = re.match(r"^triton_(?:poi|red|per)_", a.call.name) is not None
    return OpCost(max(a.numel(i) for i in ts) if pointwise else -1, nbytes, "fp32" if pointwise else "")


COST_TABLE: dict[str, Callable[[_Args], OpCost]] = {
    "aten::mm": _mm, "aten::bmm": _mm, "aten::matmul": _mm, "aten::addmm": _addmm, "aten::baddbmm": _addmm,
    "aten::addbmm": _addmm, "aten::linear": _linear, "aten::_scaled_mm": _scaled_mm,
    "aten::_addmm_activation": _addmm,
    "aten::convolution": _conv_fwd, "aten::_convolution": _conv_fwd, "aten::cudnn_convolution": _conv_fwd,
    "aten::miopen_convolution": _conv_fwd,
    "aten::conv2d": _conv_fwd, "aten::conv1d": _conv_fwd, "aten::conv3d": _conv_fwd,
    "aten::convolution_backward": _conv_bwd,
    "aten::cudnn_convolution_backward_input": _cudnn_conv_bwd_input,
    "aten::cudnn_convolution_backward_weight": _cudnn_conv_bwd_weight,
    "aten::cudnn_batch_norm": _batch_norm, "aten::native_batch_norm": _batch_norm,
    "aten::_native_batch_norm_legit": _batch_norm, "aten::_native_batch_norm_legit_no_training": _batch_norm,
    "aten::cudnn_batch_norm_backward": _cudnn_batch_norm_bwd, "aten::native_batch_norm_backward": _native_batch_norm_bwd,
    "aten::miopen_batch_norm": _batch_norm, "aten::miopen_batch_norm_backward": _cudnn_batch_norm_bwd,
    # pooling forward: its output's size needs the stride, so only the input read once is certain
    "aten::max_pool2d_with_indices": _read_input, "aten::max_pool3d_with_indices": _read_input,
    "aten::adaptive_avg_pool2d": _read_input, "aten::_adaptive_avg_pool2d": _read_input, "aten::avg_pool2d": _read_input,
    "aten::max_pool2d_with_indices_backward": _max_pool_bwd,
    "aten::_softmax": _softmax, "aten::softmax": _softmax, "aten::_log_softmax": _softmax, "aten::log_softmax": _softmax,
    "aten::_softmax_backward_data": _softmax_bwd, "aten::_log_softmax_backward_data": _softmax_bwd,
    "aten::native_layer_norm": _layer_norm, "aten::layer_norm": _layer_norm,
    "aten::native_layer_norm_backward": _layer_norm_bwd,
    "aten::_fused_rms_norm": _rms_norm, "aten::_fused_rms_norm_backward": _rms_norm_bwd,
    "aten::embedding": _embedding, "aten::embedding_dense_backward": _embedding_bwd,
    "aten::native_dropout": _dropout, "aten::native_dropout_backward": _dropout_bwd,
    "aten::nll_loss_forward": _nll_loss, "aten::nll_loss_backward": _nll_loss_bwd,
    "aten::index_select": _index_select, "aten::gather": _gather, "aten::copy_": _copy, "aten::_to_copy": _to_copy, "aten::fill_": _fill, "aten::zero_": _fill,
    "aten::cat": _cat, "aten::stack": _cat, "aten::_fused_adam_": _fused_optimizer,
    "aten::_fused_adamw_": _fused_optimizer, "aten::_fused_sgd_": _fused_optimizer,
    **{n: _attention_fwd for n in _ATTN_FWD}, **{n: _attention_bwd for n in _ATTN_BWD},
}
_ELEMENTWISE = (
    "add mul sub div neg abs exp log sqrt rsqrt pow relu gelu silu sigmoid tanh where clamp clamp_min clamp_max "
    "masked_fill threshold_backward gelu_backward silu_backward sigmoid_backward tanh_backward lerp addcmul addcdiv "
    "reciprocal sin cos maximum minimum eq ne lt le gt ge logical_not bitwise_and mse_loss hardtanh leaky_relu "
    "erf exp2 log1p expm1 sign square"
).split()
#: positional arguments of the elementwise ops (ATen schemas, before ``out=``): a recorded tensor at
#: or beyond this index is the op's output
_ELEMENTWISE_ARITY = {
    **{n: 1 for n in "neg abs exp log sqrt rsqrt relu sigmoid tanh reciprocal sin cos logical_not erf exp2 log1p expm1 "
                     "sign square silu".split()},
    **{n: 2 for n in "mul pow maximum minimum eq ne lt le gt ge bitwise_and clamp_min clamp_max leaky_relu gelu "
                     "silu_backward sigmoid_backward tanh_backward".split()},
    **{n: 3 for n in "add sub where clamp masked_fill threshold_backward gelu_backward lerp mse_loss hardtanh".split()},
    **{n: 4 for n in "addcmul addcdiv".split()},
}
for _n in _ELEMENTWISE:
    COST_TABLE[f"aten::{_n}"] = _elementwise
    COST_TABLE[f"aten::{_n}_"] = _elementwise
for _n in "sum mean amax amin max min norm linalg_vector_norm var std argmax argmin prod any all var_mean".split():
    COST_TABLE[f"aten::{_n}"] = _read_input
_FOREACH = re.compile(r"^aten::_(?:foreach|fused)_\w+$")
_INDUCTOR = re.compile(r"^triton_\w+$")
# the element type a tensor-list kernel was instantiated for: the first template argument of its
# functor (multi_tensor_apply_kernel<..., BinaryOpListAlphaFunctor<float, 2, 2, 0>, ...>) or of the
# cat kernel (CatArrayBatchedCopy<c10::BFloat16, ...>, or OpaqueType<2u>: two-byte elements)
_KERNEL_ELEM = re.compile(r"(?:Functor|CatArrayBatchedCopy\w*)<\s*((?:at::native::)?OpaqueType<\s*(\d+)u?\s*>|[\w:]+(?: int)?)")


def list_type_from_kernel(kernel_name: str) -> str:
    """The element type a tensor-list op's kernel works on, as a Kineto type string ("float",
    "c10::bfloat16") or "opaque:N" (N-byte elements); "" when the name does not say."""
    m = _KERNEL_ELEM.search(kernel_name.replace("(anonymous namespace)::", ""))
    if not m:
        return ""
    if m.group(2):
        return f"opaque:{int(m.group(2))}"
    t = m.group(1).strip().lower()
    return t if t in _TYPES else ""


def has_shapes(dims: Any, types: Any) -> bool:
    """Whether an op's record carries input shapes: a non-empty dims entry, or a tensor input
    (a 0-d tensor's dims are ``[]``) or tensor list typed as such."""
    if not isinstance(dims, list) or not dims:
        return False
    if any(isinstance(d, list) and d for d in dims):
        return True
    return isinstance(types, list) and any(str(t).strip().lower() in _TYPES or str(t).strip().lower() == "tensorlist"
                                           for t in types)


def op_cost(call: OpCall) -> OpCost:
    """The cost of one recorded op (see the module docstring), or an uncosted result with the reason."""
    fn = COST_TABLE.get(call.name)
    if fn is None and _FOREACH.match(call.name):
        fn = _foreach
    if fn is None and _INDUCTOR.match(call.name):
        fn = _inductor_kernel
    args = _Args(call)
    if fn is None:
        ts = args.tensors()
        if call.kineto_flops is not None and call.kineto_flops > 0 and ts:
            # Kineto counted the flops (with_flops): a floor from them alone is still a lower bound
            return OpCost(int(call.kineto_flops), -1, _MATRIX_CLASS[args.cls(ts[0])])
        return _uncosted("op not in the cost table")
    if not has_shapes(call.dims, call.types):
        return _uncosted("no input shapes recorded (capture with record_shapes=True)")
    try:
        return fn(args)
    except _Uncosted as exc:
        return _uncosted(str(exc))
    except (IndexError, ValueError, ZeroDivisionError, TypeError, KeyError) as exc:
        return _uncosted(f"inputs not as expected for {call.name} ({type(exc).__name__})")


# --- collectives ------------------------------------------------------------------------------

#: bus bytes per message byte for a group of n (NCCL's "bus bandwidth" convention); the message
#: is the larger of input and output.
_BUS_FACTOR: dict[str, Callable[[int], float]] = {
    "allreduce": lambda n: 2.0 * (n - 1) / n,
    "allgather": lambda n: (n - 1) / n, "reduce_scatter": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0, "send": lambda n: 1.0, "recv": lambda n: 1.0,
    "sendrecv": lambda n: 1.0, "gather": lambda n: (n - 1) / n, "scatter": lambda n: (n - 1) / n,
}


#: Bytes per element for the dtype names PyTorch writes into collective metadata (c10 ScalarType
#: names: ``"dtype": "BFloat16"`` beside ``In msg nelems``).
COMM_DTYPE_BYTES = {
    "float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "float16": 2, "bfloat16": 2,
    "int": 4, "int32": 4, "long": 8, "int64": 8, "short": 2, "int16": 2, "char": 1, "int8": 1,
    "byte": 1, "uint8": 1, "bool": 1, "complexfloat": 8, "complexdouble": 16, "complexhalf": 4,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
    "uint16": 2, "uint32": 4, "uint64": 8,
}
#: collectives whose per-rank payload is 1/n of their larger side (input of an all-gather, output
#: of a reduce-scatter, one peer's share of an all-to-all)
_PER_RANK_SIDE = frozenset(("allgather", "reduce_scatter", "alltoall", "gather", "scatter"))


def collective_call(args: Mapping[str, Any]) -> tuple[int, int]:
    """(message bytes: the larger of the collective's input and output, group size) that the op
    launching a collective recorded: PyTorch's ``In``/``Out msg nelems`` and ``dtype``
    (``record_param_comms``, every c10d collective since PyTorch 1.13), else its tensors' recorded
    shapes and types (``Input Dims``, ``Input type`` of ``c10d::allreduce_``, ``nccl:all_reduce``);
    the group from ``Group size`` or ``Process Group Ranks``. -1 where not recorded."""
    nelems = max(ints.nonneg(args.get("In msg nelems")), ints.nonneg(args.get("Out msg nelems")))
    width = COMM_DTYPE_BYTES.get(str(args.get("dtype", "")).lower(), 0)
    msg = nelems * width if nelems > 0 and width else -1
    if msg < 0:
        sizes = [_tensor_bytes(d, t) for d, t in zip(_seq(args.get("Input Dims")), _seq(args.get("Input type")))]
        msg = max(sizes, default=-1)
        msg = msg if msg > 0 else -1
    return msg, recorded_group_size(args)


#: The args of an op that ``collective_call`` reads (an importer that keeps only some of each op's
#: args keeps these).
COLLECTIVE_CALL_ARGS = ("In msg nelems", "Out msg nelems", "dtype", "Input Dims", "Input type", "Group size",
                        "Process Group Ranks")


def recorded_group_size(args: Mapping[str, Any]) -> int:
    """A collective's process group size as its args (a kernel's or the op's that launched it)
    record it: ``Group size``, else the length of ``Process Group Ranks``; -1 where neither does."""
    group = ints.nonneg(args.get("Group size"))
    ranks = args.get("Process Group Ranks")
    if group <= 0 and isinstance(ranks, str):
        group = len([x for x in ranks.strip("[]").split(",") if x.strip()])
    return group if group > 0 else -1


def payload_message_bytes(op: str, payload_bytes: int, group_size: int) -> int:
    """A collective library's per-call payload (NCCL's NVTX "Message size [bytes]": an all-gather's
    send buffer, a reduce-scatter's receive buffer, an all-reduce's buffer) as the message
    ``collective_bus_bytes`` takes (the larger side); with the group unknown, as if 2 ranks."""
    if payload_bytes is None or payload_bytes < 0:
        return -1
    return payload_bytes * max(group_size, 2) if op in _PER_RANK_SIDE else payload_bytes


def _seq(v: Any) -> list:
    return v if isinstance(v, list) else []


def _tensor_bytes(dims: Any, type_name: Any) -> int:
    """Bytes of one recorded input: a tensor's dims (a list of ints) or a tensor list's (a list of
    such lists), of element type ``type_name``; -1 for a scalar, an unknown type or no dims."""
    es = _TYPES.get(str(type_name).lower(), (0, ""))[0] or COMM_DTYPE_BYTES.get(
        str(type_name).lower().replace("c10::", ""), 0)
    if not isinstance(dims, list) or not dims or not es:
        return -1
    shapes = dims if all(isinstance(d, list) for d in dims) else [dims]
    if not all(isinstance(x, int) for sh in shapes for x in sh):
        return -1
    return sum(math.prod(sh) for sh in shapes) * es


def collective_bus_bytes_at_least(op: str, message_bytes: int) -> int:
    """``collective_bus_bytes`` with the group unknown: the fewest bytes any group of 2 or more
    ranks carries (every factor is smallest at 2), a lower bound; -1 when the op or size is unknown."""
    return collective_bus_bytes(op, message_bytes, 2)


def collective_bus_bytes(op: str, message_bytes: int, group_size: int) -> int:
    """Bytes one rank's link must carry for a collective (message = the larger of input and
    output): all-reduce 2(n-1)/n, all-gather / reduce-scatter / all-to-all (n-1)/n, point to
    point and broadcast 1. -1 when the op, the size or the group is unknown."""
    f = _BUS_FACTOR.get(op)
    if f is None or message_bytes is None or message_bytes < 0 or not group_size or group_size < 1:
        return -1
    if group_size == 1:
        return 0
    return int(round(message_bytes * f(group_size)))
