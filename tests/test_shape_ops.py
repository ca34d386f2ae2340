"""nanospa/shape_ops.py: reductions, matmul, reshape, transpose, indexing, embedding.

Every op against float64 central differences (full Jacobian, random upstream gradient),
float32 in -> float32 out, the gathers' backward summing repeated indices, and a vector
operand of @ refused.
"""
import numpy as np
import pytest

from conftest import assert_full_jacobian, assert_keeps_float32
from nanospa import shape_ops as S
from nanospa.gradcheck import tensor64

R = np.random.default_rng(0)


def normal(*shape):
    return R.standard_normal(shape)


IDX = np.array([[1, 3, 1], [0, 3, 3]])  # repeated rows on purpose
MIX = R.standard_normal((4, 6))

# name -> (function of Tensors, input arrays)
OPS = {
    "matmul_2d": (lambda a, b: a @ b, [normal(3, 4), normal(4, 5)]),
    "matmul_weight": (lambda a, b: a @ b, [normal(2, 3, 4), normal(4, 5)]),
    "matmul_batched_broadcast": (lambda a, b: a @ b, [normal(2, 1, 3, 4), normal(3, 4, 2)]),
    "sum_all": (lambda a: a.sum(), [normal(3, 4)]),
    "sum_axis": (lambda a: a.sum(axis=1), [normal(2, 3, 4)]),
    "sum_axes_keepdims": (lambda a: a.sum(axis=(0, 2), keepdims=True), [normal(2, 3, 4)]),
    "mean_axis": (lambda a: a.mean(axis=-1), [normal(2, 3, 4)]),
    "mean_all_keepdims": (lambda a: a.mean(keepdims=True), [normal(2, 3)]),
    "reshape": (lambda a: a.reshape(4, 6) * MIX, [normal(2, 3, 4)]),
    "transpose": (lambda a: a.transpose(2, 0, 1), [normal(2, 3, 4)]),
    "T": (lambda a: a.T, [normal(3, 4)]),
    "getitem_slice": (lambda a: a[1:, ::2, None], [normal(3, 4)]),
    "getitem_fancy_repeated": (lambda a: a[np.array([0, 2, 0, 0])], [normal(3, 4)]),
    "getitem_int_and_slice": (lambda a: a[..., 1, :2], [normal(2, 3, 4)]),
    "embedding_repeated": (lambda w: S.embedding(w, IDX), [normal(5, 3)]),
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_op_full_jacobian(name):
    assert_full_jacobian(*OPS[name])


@pytest.mark.parametrize("name", sorted(OPS))
def test_op_float32_in_float32_out(name):
    assert_keeps_float32(name, *OPS[name])


def test_embedding_repeated_indices_sum():
    W = tensor64(normal(4, 2))
    idx = np.array([2, 2, 2, 0])
    S.embedding(W, idx).sum().backward()
    np.testing.assert_allclose(W.grad, [[1, 1], [0, 0], [3, 3], [0, 0]])


def test_matmul_refuses_a_vector():
    with pytest.raises(ValueError, match=r"MatMul: a vector operand.*\(3, 4\), \(4,\)"):
        tensor64(normal(3, 4)) @ tensor64(normal(4))
