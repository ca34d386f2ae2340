"""The engine: every op against float64 central differences (full Jacobian, random upstream
gradient), dtype preservation, graph mechanics, error messages."""
import sys

import numpy as np
import pytest

from nanospa import Tensor, backend, no_grad
from nanospa import functions as F
from nanospa.gradcheck import check_directions, check_jacobian, tensor64
from nanospa.tensor import Function

R = np.random.default_rng(0)


def normal(*shape):
    return R.standard_normal(shape)


def away_from_zero(*shape):
    """Values with |x| in [0.2, 2]: central differences never straddle a kink at 0."""
    return np.sign(R.standard_normal(shape)) * R.uniform(0.2, 2.0, shape)


def positive(*shape):
    return R.uniform(0.5, 2.0, shape)


IDX = np.array([[1, 3, 1], [0, 3, 3]])  # repeated rows on purpose
COND = R.standard_normal((3, 4)) > 0
MIX = R.standard_normal((4, 6))
TARGETS = np.array([0, 4, 2, 2, 1, 3])

# name -> (function of Tensors, input arrays)
OPS = {
    "add_broadcast": (lambda a, b: a + b, [normal(2, 3, 4), normal(3, 1)]),
    "sub_broadcast": (lambda a, b: a - b, [normal(4), normal(2, 3, 4)]),
    "mul_broadcast": (lambda a, b: a * b, [normal(2, 3, 4), normal(1, 3, 1)]),
    "div": (lambda a, b: a / b, [normal(3, 4), positive(3, 4)]),
    "neg": (lambda a: -a, [normal(3, 4)]),
    "pow": (lambda a: a ** 2.5, [positive(3, 4)]),
    "rsub_scalar": (lambda a: 2.0 - a * 3.0, [normal(3, 4)]),
    "rdiv_scalar": (lambda a: 1.5 / a, [positive(3, 4)]),
    "matmul_2d": (lambda a, b: a @ b, [normal(3, 4), normal(4, 5)]),
    "matmul_weight": (lambda a, b: a @ b, [normal(2, 3, 4), normal(4, 5)]),
    "matmul_batched_broadcast": (lambda a, b: a @ b, [normal(2, 1, 3, 4), normal(3, 4, 2)]),
    "matmul_vector": (lambda a, b: a @ b, [normal(3, 4), normal(4)]),
    "matmul_vector_left": (lambda a, b: a @ b, [normal(4), normal(2, 4, 3)]),
    "sum_all": (lambda a: a.sum(), [normal(3, 4)]),
    "sum_axis": (lambda a: a.sum(axis=1), [normal(2, 3, 4)]),
    "sum_axes_keepdims": (lambda a: a.sum(axis=(0, 2), keepdims=True), [normal(2, 3, 4)]),
    "mean_axis": (lambda a: a.mean(axis=-1), [normal(2, 3, 4)]),
    "mean_all_keepdims": (lambda a: a.mean(keepdims=True), [normal(2, 3)]),
    "max_axis": (lambda a: a.max(axis=1), [normal(2, 5, 3)]),
    "max_all": (lambda a: a.max(), [normal(4, 3)]),
    "exp": (lambda a: a.exp(), [normal(3, 4)]),
    "log": (lambda a: a.log(), [positive(3, 4)]),
    "sqrt": (lambda a: a.sqrt(), [positive(3, 4)]),
    "tanh": (lambda a: a.tanh(), [normal(3, 4)]),
    "sigmoid": (lambda a: a.sigmoid(), [normal(3, 4) * 3]),
    "relu": (lambda a: a.relu(), [away_from_zero(3, 4)]),
    "leaky_relu": (lambda a: a.leaky_relu(0.2), [away_from_zero(3, 4)]),
    "gelu_tanh": (lambda a: a.gelu("tanh"), [normal(3, 4) * 2]),
    "gelu_exact": (lambda a: a.gelu("none"), [normal(3, 4) * 2]),
    "softplus": (lambda a: a.softplus(), [normal(3, 4) * 3]),
    "elu": (lambda a: a.elu(0.7), [away_from_zero(3, 4)]),
    "swish": (lambda a: a.swish(), [normal(3, 4) * 2]),
    "reshape": (lambda a: a.reshape(4, 6) * MIX, [normal(2, 3, 4)]),
    "transpose": (lambda a: a.transpose(2, 0, 1), [normal(2, 3, 4)]),
    "T": (lambda a: a.T, [normal(3, 4)]),
    "getitem_slice": (lambda a: a[1:, ::2, None], [normal(3, 4)]),
    "getitem_fancy_repeated": (lambda a: a[np.array([0, 2, 0, 0])], [normal(3, 4)]),
    "getitem_int_and_slice": (lambda a: a[..., 1, :2], [normal(2, 3, 4)]),
    "concatenate": (lambda a, b: F.concatenate([a, b, a], axis=1), [normal(2, 3), normal(2, 2)]),
    "split": (lambda a: F.split(a, [1, 3], axis=1)[1] * 2.0 + F.split(a, 2, axis=0)[0].sum(), [normal(2, 4)]),
    "embedding_repeated": (lambda w: F.embedding(w, IDX), [normal(5, 3)]),
    "where": (lambda a, b: F.where(COND, a, b), [normal(3, 4), normal(4)]),
    "masked_fill": (lambda a: F.masked_fill(a, COND, -7.0), [normal(3, 4)]),
    "softmax": (lambda a: F.softmax(a, axis=-1), [normal(2, 3, 5)]),
    "softmax_axis0": (lambda a: F.softmax(a, axis=0), [normal(4, 3)]),
    "softmax_bias_causal_scale": (lambda a, b: F.softmax(a, b, scale=0.6, causal=True),
                                  [normal(2, 2, 5, 5), normal(5, 5)]),
    "log_softmax": (lambda a: F.log_softmax(a), [normal(3, 5)]),
    "cross_entropy": (lambda a: F.cross_entropy(a, TARGETS), [normal(6, 5) * 2]),
    "cross_entropy_ignore": (lambda a: F.cross_entropy(a, TARGETS, ignore_index=2), [normal(6, 5)]),
    "cross_entropy_3d": (lambda a: F.cross_entropy(a, TARGETS.reshape(2, 3)), [normal(2, 3, 5)]),
    "shaped_lrelu": (lambda a: F.Shaped.apply(a, base="leaky_relu", s=1.3, slope=0.35), [away_from_zero(3, 4)]),
    "shaped_gelu": (lambda a: F.Shaped.apply(a, base="gelu", a=0.8, b=0.3, s=1.7, o=-0.2), [normal(3, 4)]),
    "shaped_gelu_exact": (lambda a: F.Shaped.apply(a, base="gelu_exact", a=1.1, s=0.9), [normal(3, 4)]),
    "shaped_tanh": (lambda a: F.Shaped.apply(a, base="tanh", a=0.5, b=-0.1, s=2.0, o=0.1), [normal(3, 4)]),
    "shaped_sigmoid": (lambda a: F.Shaped.apply(a, base="sigmoid", a=1.5, s=3.0, o=-0.5), [normal(3, 4)]),
    "shaped_relu": (lambda a: F.Shaped.apply(a, base="relu", s=1.4), [away_from_zero(3, 4)]),
    "shaped_softplus_elu_swish": (lambda a: F.Shaped.apply(a, base="softplus", a=0.7)
                                  + F.Shaped.apply(a, base="elu", s=1.2, b=0.05)
                                  + F.Shaped.apply(a, base="swish", a=1.3, o=0.2), [away_from_zero(3, 4)]),
    "layernorm": (lambda x, w, b: F.layer_norm(x, w, b), [normal(2, 3, 6), normal(6), normal(6)]),
    "rmsnorm": (lambda x, w: F.rms_norm(x, w), [normal(2, 3, 6), normal(6)]),
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_op_full_jacobian(name):
    fn, arrays = OPS[name]
    inputs = [tensor64(a.copy()) for a in arrays]
    err = check_jacobian(fn, inputs, rtol=1e-6)
    assert err < 1e-6


@pytest.mark.parametrize("name", sorted(OPS))
def test_op_float32_in_float32_out(name):
    fn, arrays = OPS[name]
    inputs = [Tensor(a.astype(np.float32), requires_grad=True) for a in arrays]
    out = fn(*inputs)
    assert out.dtype == np.float32, f"{name} promoted to {out.dtype}"
    out.backward(np.ones(out.shape, dtype=np.float32))
    for t in inputs:
        assert t.grad is not None and t.grad.dtype == np.float32, name


def test_checker_catches_a_planted_wrong_backward():
    class BadSquare(Function):
        def forward(ctx, x):
            ctx.save(x)
            return x * x

        def backward(ctx, g):
            return g * ctx.saved[0]  # wrong: the derivative is 2x

    x = tensor64(normal(3, 4))
    with pytest.raises(AssertionError, match="gradient check failed"):
        check_jacobian(lambda a: BadSquare.apply(a), [x])
    with pytest.raises(AssertionError, match="directional gradient check failed"):
        check_directions(lambda: BadSquare.apply(x), [x])


def test_checker_catches_a_transposed_backward_that_a_plain_sum_would_miss():
    class BadTranspose(Function):  # forward x.T, backward returns g unchanged (square input)
        def forward(ctx, x):
            return x.T.copy()

        def backward(ctx, g):
            return g

    x = tensor64(normal(4, 4))
    with pytest.raises(AssertionError):
        check_jacobian(lambda a: BadTranspose.apply(a), [x])


def test_long_chain_has_no_recursion_limit():
    x = Tensor(np.ones(3), requires_grad=True)
    y = x
    n = max(10_000, 2 * sys.getrecursionlimit())
    for _ in range(n):
        y = y * 1.0001
    y.sum().backward()
    np.testing.assert_allclose(x.grad, np.full(3, 1.0001 ** n), rtol=1e-9)


def test_fan_out_accumulates():
    x = tensor64([1.5, -2.0])
    (x * x + x).sum().backward()
    np.testing.assert_allclose(x.grad, 2 * np.array([1.5, -2.0]) + 1)


def test_gradients_accumulate_across_backward_calls():
    x = tensor64([1.0, 2.0])
    (x * 3.0).sum().backward()
    (x * 2.0).sum().backward()
    np.testing.assert_allclose(x.grad, [5.0, 5.0])


def test_embedding_repeated_indices_sum():
    W = tensor64(normal(4, 2))
    idx = np.array([2, 2, 2, 0])
    F.embedding(W, idx).sum().backward()
    np.testing.assert_allclose(W.grad, [[1, 1], [0, 0], [3, 3], [0, 0]])


def test_scatter_add_repeated_indices():
    a = np.zeros(3)
    backend.scatter_add(a, np.array([1, 1, 2, 1]), np.array([1.0, 2.0, 3.0, 4.0]))
    np.testing.assert_allclose(a, [0, 7, 3])


def test_graph_is_freed_after_backward():
    x = Tensor(np.ones(3), requires_grad=True)
    y = (x * 2.0).exp()
    z = y.sum()
    z.backward()
    assert z._ctx is None and y._ctx is None


def test_no_grad_records_nothing():
    x = Tensor(np.ones(3), requires_grad=True)
    with no_grad():
        y = x * 2.0
    assert not y.requires_grad and y._ctx is None


def test_error_backward_non_scalar():
    x = Tensor(np.ones(3), requires_grad=True)
    with pytest.raises(RuntimeError, match=r"non-scalar output of shape \(3,\)"):
        (x * 2.0).backward()


def test_error_backward_without_grad():
    with pytest.raises(RuntimeError, match="does not require grad"):
        Tensor(np.ones(3)).sum().backward()


def test_error_shape_mismatch_names_op_and_shapes():
    a, b = Tensor(np.ones((2, 3))), Tensor(np.ones((4, 5)))
    with pytest.raises(ValueError, match=r"MatMul.*\(2, 3\), \(4, 5\)"):
        a @ b
    with pytest.raises(ValueError, match=r"Add.*\(2, 3\), \(4, 5\)"):
        a + b


def test_softmax_causal_rows_and_zeros():
    x = Tensor(normal(2, 4, 4))
    y = F.softmax(x, causal=True).data
    np.testing.assert_allclose(y.sum(-1), 1.0)
    assert np.all(y[:, np.triu_indices(4, 1)[0], np.triu_indices(4, 1)[1]] == 0)


def test_softmax_is_stable_for_large_logits():
    y = F.softmax(Tensor(np.array([[1000.0, 0.0, -1000.0]], dtype=np.float32))).data
    assert np.all(np.isfinite(y)) and y[0, 0] == 1.0


def test_cross_entropy_value():
    logits = normal(6, 5)
    got = F.cross_entropy(Tensor(logits), TARGETS).item()
    lse = np.log(np.exp(logits).sum(1))
    np.testing.assert_allclose(got, np.mean(lse - logits[np.arange(6), TARGETS]), rtol=1e-12)


def test_directional_check_on_a_small_network():
    W1, W2 = tensor64(normal(4, 8)), tensor64(normal(8, 3))
    x = Tensor(normal(5, 4))
    err = check_directions(lambda: ((x @ W1).gelu() @ W2).tanh(), [W1, W2], n_directions=4)
    assert err < 1e-6
