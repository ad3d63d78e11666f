"""Per-op flops and compulsory bytes (trace/op_costs.py), each against a hand computation."""
from __future__ import annotations

import pytest

from taxmodel.trace.op_costs import OpCall, collective_bus_bytes, op_cost

BF, HF, F32, I64 = "c10::BFloat16", "c10::Half", "float", "long int"


def cost(name, dims, types, concrete=(), flops=None, strides=()):
    return op_cost(OpCall(name, dims, types, list(concrete) or [""] * len(dims), flops, strides=strides))


@pytest.mark.parametrize("call, flops, nbytes, dtype", [
    # C[64,16] = A[64,32] B[32,16]: 2*64*16*32 flops; (64*32 + 32*16 + 64*16) * 2 bytes
    (("aten::mm", [[64, 32], [32, 16]], [BF, BF]), 65536, 7168, "bf16"),
    # fp32 GEMMs are floored at the TF32 peak; bias read once
    (("aten::addmm", [[16], [64, 32], [32, 16]], [F32, F32, F32]), 65536, (16 + 2048 + 512 + 1024) * 4, "tf32"),
    (("aten::bmm", [[4, 8, 16], [4, 16, 32]], [HF, HF]), 2 * 4 * 8 * 32 * 16, (512 + 2048 + 1024) * 2, "fp16"),
    # linear x[2,10,32] w[16,32] b[16]: M=20 N=16 K=32
    (("aten::linear", [[2, 10, 32], [16, 32], [16]], [BF, BF, BF]), 2 * 20 * 16 * 32, (640 + 512 + 16 + 320) * 2, "bf16"),
    # fp8 GEMM with two scalar scales and a bf16 output (ScalarType 15)
    (("aten::_scaled_mm", [[64, 32], [32, 16], [], [], [], [], [], []],
      ["c10::Float8_e4m3fn", "c10::Float8_e4m3fn", F32, F32, "", "", "Scalar", "Scalar"], ["", "", "", "", "", "", "15", "False"]),
     65536, 2048 + 512 + 1024 * 2 + 4 + 4, "fp8"),
    # causal flash attention, q=k=v [2,4,128,64]: (QK^T + PV) = 2 * 2*B*H*L*S*D, halved by the mask
    (("aten::_scaled_dot_product_flash_attention", [[2, 4, 128, 64]] * 3 + [[], [], [], []], [BF] * 3 + ["Scalar"] * 4,
      ["", "", "", "0.", "True", "False", ""]), 16777216, 3 * 65536 * 2 + 65536 * 2 + 2 * 4 * 128 * 4, "bf16"),
    # flash forward in (B, L, H, D) layout, S=256, not causal
    (("aten::_flash_attention_forward", [[2, 128, 4, 64], [2, 256, 4, 64], [2, 256, 4, 64]] + [[]] * 6,
      [BF] * 3 + [""] * 6, ["", "", "", "", "", "128", "256", "0.", "False"]),
     67108864, 131072 + 262144 + 262144 + 131072 + 1024 * 4, "bf16"),
    # backward: 2.5x the forward flops; reads grad_out, q, k, v, out, lse; writes dq, dk, dv
    (("aten::_scaled_dot_product_flash_attention_backward", [[1, 2, 64, 32]] * 5 + [[1, 2, 64]] + [[]] * 6,
      [HF] * 5 + [F32] + [""] * 6, [""] * 11 + ["False"]), 2621440, 2 * 4096 * 2 + 128 * 4 + 2 * 3 * 4096 * 2, "fp16"),
    # 3x3 conv, pad 1: output 8x8; MACs = N*O*H*W*C*kh*kw
    (("aten::convolution", [[1, 3, 8, 8], [4, 3, 3, 3], [4], [], [], [], [], [], []], [F32] * 3 + ["ScalarList"] * 3 + ["Scalar"] * 3,
      ["", "", "", "[1, 1]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1"]), 2 * 6912, (192 + 108 + 4 + 256) * 4, "tf32"),
    # cuDNN's own op orders (self, weight, padding, stride, dilation, groups, ...): 1x1 conv, pad 0, stride 2
    # on [2,8,16,16] -> [2,4,8,8]: MACs = 2*4*8*8*8
    (("aten::cudnn_convolution", [[2, 8, 16, 16], [4, 8, 1, 1]] + [[]] * 7, [BF] * 2 + ["ScalarList"] * 3 + ["Scalar"] * 4,
      ["", "", "[0, 0]", "[2, 2]", "[1, 1]", "1", "False", "False", "True"]), 2 * 4096,
     (4096 + 32 + 512) * 2, "bf16"),
    # MIOpen's (self, weight, bias, padding, stride, dilation, groups, ...): 3x3, pad 1, stride 1
    (("aten::miopen_convolution", [[1, 3, 8, 8], [4, 3, 3, 3], [4]] + [[]] * 6, [F32] * 3 + ["ScalarList"] * 3 + ["Scalar"] * 3,
      ["", "", "", "[1, 1]", "[1, 1]", "[1, 1]", "1", "False", "False"]), 2 * 6912, (192 + 108 + 4 + 256) * 4, "tf32"),
    # GEMM with a GELU epilogue: addmm's cost
    (("aten::_addmm_activation", [[16], [64, 32], [32, 16], [], [], []], [BF] * 3 + ["Scalar"] * 3, ["", "", "", "1", "1", "True"]),
     65536, (16 + 2048 + 512 + 1024) * 2, "bf16"),
    # an index expanded along its rows (strides [1, 0]) is read once: 8 longs, not 8x16
    (("aten::gather", [[32, 16], [], [8, 16], []], [BF, "Scalar", I64, "Scalar"], ["", "0", "", "False"], None,
      [[16, 1], [], [1, 0], []]), 0, 8 * 8 + 2 * 128 * 2, "fp32"),
    # cuDNN's backward ops of 2021 (torch 1.9): grad_input from grad_output [2,4,8,8] and weight [4,3,3,3]
    (("aten::cudnn_convolution_backward_input", [[], [2, 4, 8, 8], [4, 3, 3, 3]] + [[]] * 7, ["GenericList", F32, F32] + [""] * 7,
      ["[2, 3, 8, 8]"] + [""] * 9), 2 * 2 * 4 * 64 * 27, (512 + 108 + 384) * 4, "tf32"),
    (("aten::cudnn_convolution_backward_weight", [[], [2, 4, 8, 8], [2, 3, 8, 8]] + [[]] * 7, ["GenericList", F32, F32] + [""] * 7,
      ["[4, 3, 3, 3]"] + [""] * 9), 2 * 2 * 4 * 64 * 27, (512 + 384 + 108) * 4, "tf32"),
    (("aten::cudnn_batch_norm", [[2, 4, 8, 8], [4], [4], [4], [4], [], [], []], [F32] * 5 + [""] * 3), 8 * 512, (2 * 512 + 16) * 4, "fp32"),
    (("aten::native_batch_norm_backward", [[2, 4, 8, 8], [2, 4, 8, 8], [4], [4], [4], [4], [4], [], [], []], [BF] * 2 + [F32] * 5 + [""] * 3),
     12 * 512, 3 * 512 * 2 + 5 * 16, "fp32"),
    (("aten::max_pool2d_with_indices_backward", [[2, 4, 4, 4], [2, 4, 8, 8], [], [], [], [], [], [2, 4, 4, 4]],
      [F32, F32] + [""] * 5 + [I64]), 128, 128 * 4 + 128 * 8 + 512 * 4, "fp32"),
    # conv backward, grad_input and grad_weight (mask [True, True, False]): each one forward's MACs
    (("aten::convolution_backward", [[1, 4, 8, 8], [1, 3, 8, 8], [4, 3, 3, 3]] + [[]] * 8, [F32] * 3 + [""] * 8,
      [""] * 10 + ["[True, True, False]"]), 2 * 6912 * 2, (256 + 192 + 108) * 4 + (192 + 108) * 4, "tf32"),
    # broadcast add: out [4,8]
    (("aten::add", [[4, 8], [8], []], [BF, BF, "Scalar"]), 32, (32 + 8 + 32) * 2, "fp32"),
    (("aten::add_", [[4, 8], [4, 8], []], [F32, F32, "Scalar"]), 32, 3 * 32 * 4, "fp32"),
    # torch 1.9 records clamp_min's out= tensor as a third input: written once, not read
    (("aten::clamp_min", [[4, 8], [], [4, 8]], [F32, "Int", F32]), 32, 2 * 32 * 4, "fp32"),
    (("aten::sum", [[4, 8], []], [F32, ""]), 32, 128, "fp32"),
    (("aten::_softmax", [[4, 8], [], []], [BF, "Scalar", "Scalar"], ["", "-1", "False"]), 160, 128, "fp32"),
    (("aten::native_layer_norm", [[4, 8], [], [8], [8], []], [BF, "ScalarList", BF, BF, "Scalar"]), 256, 128 + 32 + 32, "fp32"),
    (("aten::embedding", [[100, 16], [2, 5]], [F32, I64]), 0, 80 + 2 * 160 * 4, "fp32"),
    (("aten::native_dropout", [[4, 8], [], []], [BF, "Scalar", "Scalar"]), 32, 2 * 64 + 32, "fp32"),
    (("aten::nll_loss_forward", [[4, 10], [4], [], [], []], [F32, I64, "", "Scalar", "Scalar"]), 4, 32 + 16 + 4, "fp32"),
    # backward: scalar grad_output and targets read, one gradient per row written (zero_ is its own op)
    (("aten::nll_loss_backward", [[], [4, 10], [4], [], [], [], []], [F32, F32, I64, "", "Scalar", "Scalar", F32]), 4, 4 + 32 + 16, "fp32"),
    # cuDNN attention (torch 2.11 names), causal flag at 10: q=k=v [1,2,64,32] bf16
    (("aten::_cudnn_attention_forward", [[1, 2, 64, 32]] * 3 + [[]] * 10, [BF] * 3 + [""] * 10,
      [""] * 6 + ["64", "64", "True", "0.", "True", "False", ""]), 524288, 3 * 4096 * 2 + 4096 * 2 + 128 * 4, "bf16"),
    (("aten::copy_", [[4, 8], [4, 8], []], [F32, BF, "Scalar"]), 0, 128 + 64, "fp32"),
    (("aten::fill_", [[], []], [F32, "Scalar"]), 0, 4, "fp32"),  # a 0-d tensor: dims [] is its shape
    (("aten::_to_copy", [[4, 8], [], [], [], [], [], []], [BF, "Scalar", "", "", "", "Scalar", ""], ["", "6", "", "", "", "False", ""]),
     0, 64 + 128, "fp32"),
])
def test_op_by_op(call, flops, nbytes, dtype):
    c = cost(*call)
    assert c.uncosted == ""
    assert (c.flops, c.bytes, c.dtype) == (flops, nbytes, dtype)


@pytest.mark.parametrize("call, reason", [
    (("aten::_foreach_add_", [[[10], [5, 5]], [[10], [5, 5]], []], ["TensorList", "TensorList", "Scalar"]), "tensor-list"),
    (("aten::_fused_adamw_", [[[10]], [[10]], [[10]], [[10]], [], [[1]]], ["TensorList"] * 4 + ["", "TensorList"]), "tensor-list"),
    (("mylib::custom", [[4, 4]], [BF]), "not in the cost table"),
    (("aten::mm", [[4, 4], [4, 4]], ["c10::Weird", "c10::Weird"]), "unknown dtype"),
    (("aten::mm", [[], []], ["", ""]), "record_shapes"),
    (("aten::_foreach_mul_", [[], []], ["TensorList", "Scalar"]), "tensor-list shapes not recorded"),  # a long list
    # 2021 traces record no concrete values: a convolution's stride and padding would be guessed
    (("aten::cudnn_convolution", [[32, 3, 224, 224], [64, 3, 7, 7]] + [[]] * 7, [F32] * 2 + [""] * 7), "was not recorded"),
    (("aten::cudnn_convolution_backward_weight", [[], [2, 4, 8, 8], [2, 3, 8, 8]] + [[]] * 7, ["GenericList", F32, F32] + [""] * 7),
     "was not recorded"),
])
def test_uncosted_is_counted_not_guessed(call, reason):
    c = cost(*call)
    assert reason in c.uncosted and c.flops == -1 and c.bytes == -1


def test_kineto_flops_give_a_floor_for_an_op_outside_the_table():
    c = cost("mylib::gemm", [[4, 8], [8, 4]], [BF, BF], flops=256)
    assert (c.flops, c.bytes, c.dtype, c.uncosted) == (256, -1, "bf16", "")


@pytest.mark.parametrize("op, n, want", [("allreduce", 4, 1500), ("allgather", 4, 750), ("reduce_scatter", 8, 875),
                                         ("sendrecv", 2, 1000), ("allreduce", 1, 0), ("mystery", 4, -1)])
def test_collective_bus_bytes(op, n, want):
    assert collective_bus_bytes(op, 1000, n) == want


def test_tensor_lists_take_their_dtype_from_the_kernel_name():
    from taxmodel.trace.op_costs import list_type_from_kernel

    name = ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
            "TensorListMetadata<2>, at::native::(anonymous namespace)::BinaryOpListAlphaFunctor<float, 2, 2, 0>, "
            "std::plus<float>, float>(x)")
    assert list_type_from_kernel(name) == "float"
    assert list_type_from_kernel("CatArrayBatchedCopy_contig<at::native::(anonymous namespace)::OpaqueType<2u>, unsigned int>") == "opaque:2"
    assert list_type_from_kernel("ampere_bf16_gemm") == ""
    # _foreach_add_(list[10, 25], list[10, 25], alpha): reads 2 x 35 floats, writes 35
    c = op_cost(OpCall("aten::_foreach_add_", [[[10], [5, 5]], [[10], [5, 5]], []], ["TensorList", "TensorList", "Scalar"],
                       ["", "", "1"], None, "float"))
    assert (c.bytes, c.flops, c.uncosted) == (3 * 35 * 4, 35, "")
    # fused AdamW on 35 fp32 params: reads params, grads, exp_avg, exp_avg_sq, steps (fp32 per tensor), writes 3 lists
    c = op_cost(OpCall("aten::_fused_adamw_", [[[10], [5, 5]]] * 4 + [[], [[], []]] + [[]] * 3,
                       ["TensorList"] * 4 + ["TensorList", "TensorList"] + ["Scalar"] * 3, [""] * 9, None, "float"))
    assert c.bytes == 4 * 35 * 4 + 0 + 2 * 4 + 3 * 35 * 4
    # cat of [2,3] and [4,3] bf16 (OpaqueType<2>): 18 elements read and written
    c = op_cost(OpCall("aten::cat", [[[2, 3], [4, 3]], []], ["TensorList", "Scalar"], ["", "0"], None, "opaque:2"))
    assert c.bytes == 2 * 18 * 2


def test_an_inductor_kernel_reads_and_writes_each_buffer_once():
    # triton_poi_fused_add_cos_sin_0(in_ptr0, in_ptr1, out_ptr0, xnumel): three float [10, 10] buffers
    c = cost("triton_poi_fused_add_cos_sin_0", [[10, 10], [10, 10], [10, 10], []], [F32, F32, F32, "Scalar"], ["", "", "", "100"])
    assert (c.flops, c.bytes, c.dtype, c.uncosted) == (100, 1200, "fp32", "")
    c = cost("triton_tem_fused_mm_0", [[64, 32], [32, 16], [64, 16]], [BF, BF, BF])
    assert (c.flops, c.bytes) == (-1, (2048 + 512 + 1024) * 2)
