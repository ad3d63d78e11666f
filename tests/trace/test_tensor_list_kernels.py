"""Lower bounds on a PyTorch multi_tensor_apply launch from its name and grid (by hand, from the
chunking rules in ATen's MultiTensorApply.cuh: 65,536-element chunks, one per 512-thread CTA)."""
from __future__ import annotations

import pytest

from taxmodel.trace.tensor_list_kernels import CHUNK, tensor_list_launch_work

NS = "at::native::(anonymous namespace)::"


def _name(meta: str, functor: str, op: str = "std::multiplies<float>, float") -> str:
    return (f"void {NS}multi_tensor_apply_kernel<{NS}{meta}, {NS}{functor}, {op}>"
            f"({NS}{meta}, {NS}{functor}, {op})")


def test_in_place_scalar_op_a_full_launch():
    # depth 1: at most 110 tensors in a launch, so at most 110 partial chunks among 320
    w = tensor_list_launch_work(_name("TensorListMetadata<1>", "BinaryOpScalarFunctor<c10::BFloat16, 1, 1, 0>"),
                                "320,1,1", "512,1,1")
    assert w.elements == (320 - 110) * CHUNK + 110
    assert w.bytes == w.elements * 2 * 2  # bf16 read once, written once


def test_few_blocks_may_all_be_partial_chunks():
    # 58 CTAs could be 58 tensors of one element each: the bound is 58 elements
    w = tensor_list_launch_work(_name("TensorListMetadata<1>", "BinaryOpScalarFunctor<float, 1, 1, 0>"), "58,1,1", "512,1,1")
    assert w.elements == 58 and w.bytes == 58 * 4 * 2


def test_out_of_place_and_three_list_functors():
    sqrt = tensor_list_launch_work(_name("TensorListMetadata<2>", "UnaryOpFunctor<c10::BFloat16, 2, 1, 1>", "Sqrt<float> "),
                                   "320,1,1", "512,1,1")
    assert sqrt.elements == (320 - 64) * CHUNK + 64 and sqrt.bytes == sqrt.elements * 2 * 2  # read x, write out
    addcdiv = tensor_list_launch_work(
        _name("TensorListScalarListMetadata<float, 3>", "PointwiseOpScalarListFunctor<c10::BFloat16, 3, 3, 0>",
              "std::divides<float> "), "320,1,1", "512,1,1")
    assert addcdiv.elements == (320 - 48) * CHUNK + 48 and addcdiv.bytes == addcdiv.elements * 2 * 4  # 3 read, 1 written


def test_copy_reads_source_type_and_writes_destination_type():
    w = tensor_list_launch_work(_name("TensorListMetadata<2>", "CopyFunctor<int, long, 2, 1, 1>", "Copy<int, long> "),
                                "10,1,1", "512,1,1")
    assert w.bytes == w.elements * (4 + 8)


def test_norms_only_read_and_fused_adam_writes_all_but_grads():
    norm = tensor_list_launch_work(_name("TensorListMetadata<1>", "LpNormFunctor<float, (NormType)1, float, 1, 1, 0>", "float"),
                                   "200,1,1", "512,1,1")
    assert norm.bytes == norm.elements * 4
    adam = tensor_list_launch_work(_name("FusedOptimizerTensorListMetadata<4>", "FusedAdamMathFunctor<float, 4, (ADAM_MODE)1, false>",
                                         "double*, double, double"), "320,1,1", "512,1,1")
    assert adam.elements == (320 - 36) * CHUNK + 36 and adam.bytes == adam.elements * 4 * 7


def test_the_32kb_argument_build():
    named = tensor_list_launch_work(_name("TensorListMetadata<1, true>", "BinaryOpScalarFunctor<float, 1, 1, 0>"),
                                    "2240,1,1", "512,1,1")
    assert named.elements == (2240 - 770) * CHUNK + 770
    # a grid beyond the 4 KB build's 320 blocks can only be the 32 KB build
    unnamed = tensor_list_launch_work(_name("TensorListMetadata<1>", "BinaryOpScalarFunctor<float, 1, 1, 0>"), "400,1,1", "512,1,1")
    assert unnamed.elements == 400


@pytest.mark.parametrize("name, grid, block", [
    (_name("TensorListMetadata<1>", "BinaryOpScalarFunctor<float, 1, 1, 0>"), "320,1,1", "256,1,1"),  # not kBlockSize
    (_name("TensorListMetadata<1>", "BinaryOpScalarFunctor<float, 1, 1, 0>"), "3000,1,1", "512,1,1"),  # beyond any build
    (_name("TensorListMetadata<1, false>", "BinaryOpScalarFunctor<float, 1, 1, 0>"), "400,1,1", "512,1,1"),
    (_name("TensorListMetadata<1>", "SomeNewFunctor<float, 1, 1, 0>"), "10,1,1", "512,1,1"),  # traffic not known
    (_name("TensorListMetadata<1>", "BinaryOpScalarFunctor<c10::Float4, 1, 1, 0>"), "10,1,1", "512,1,1"),  # unknown type
    (_name("TensorListMetadata<2>", "BinaryOpScalarFunctor<float, 1, 1, 0>"), "10,1,1", "512,1,1"),  # depths disagree
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", "10,1,1", "512,1,1"),
    (_name("TensorListMetadata<1>", "BinaryOpScalarFunctor<float, 1, 1, 0>"), "", ""),  # no launch dims recorded
])
def test_anything_else_is_not_guessed(name, grid, block):
    assert tensor_list_launch_work(name, grid, block) is None
