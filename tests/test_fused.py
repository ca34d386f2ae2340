"""nanospa/fused.py: softmax (scale, bias, causal mask), log-softmax, cross-entropy,
layernorm, rmsnorm.

Every op against float64 central differences (full Jacobian, random upstream gradient),
float32 in -> float32 out, the values against their definitions, and softmax with SPA's
cached bias + mask against softmax with the bias and causal=True.
"""
import numpy as np
import pytest

from conftest import assert_full_jacobian, assert_keeps_float32, tiny_config
from nanospa import GPT, Tensor
from nanospa import fused
from nanospa.gradcheck import check_jacobian

R = np.random.default_rng(0)


def normal(*shape):
    return R.standard_normal(shape)


TARGETS = np.array([0, 4, 2, 2, 1, 3])

# name -> (function of Tensors, input arrays)
OPS = {
    "softmax": (lambda a: fused.softmax(a, axis=-1), [normal(2, 3, 5)]),
    "softmax_axis0": (lambda a: fused.softmax(a, axis=0), [normal(4, 3)]),
    "softmax_bias_causal_scale": (lambda a, b: fused.softmax(a, b, scale=0.6, causal=True),
                                  [normal(2, 2, 5, 5), normal(5, 5)]),
    "cross_entropy": (lambda a: fused.cross_entropy(a, TARGETS), [normal(6, 5) * 2]),
    "cross_entropy_3d": (lambda a: fused.cross_entropy(a, TARGETS.reshape(2, 3)), [normal(2, 3, 5)]),
    "layernorm": (lambda x, w, b: fused.layer_norm(x, w, b), [normal(2, 3, 6), normal(6), normal(6)]),
    "rmsnorm": (lambda x, w: fused.rms_norm(x, w), [normal(2, 3, 6), normal(6)]),
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_op_full_jacobian(name):
    assert_full_jacobian(*OPS[name])


@pytest.mark.parametrize("name", sorted(OPS))
def test_op_float32_in_float32_out(name):
    assert_keeps_float32(name, *OPS[name])


def test_softmax_causal_rows_and_zeros():
    x = Tensor(normal(2, 4, 4))
    y = fused.softmax(x, causal=True).data
    np.testing.assert_allclose(y.sum(-1), 1.0)
    assert np.all(y[:, np.triu_indices(4, 1)[0], np.triu_indices(4, 1)[1]] == 0)


def test_softmax_is_stable_for_large_logits():
    y = fused.softmax(Tensor(np.array([[1000.0, 0.0, -1000.0]], dtype=np.float32))).data
    assert np.all(np.isfinite(y)) and y[0, 0] == 1.0


def test_cross_entropy_value():
    logits = normal(6, 5)
    got = fused.cross_entropy(Tensor(logits), TARGETS).item()
    lse = np.log(np.exp(logits).sum(1))
    np.testing.assert_allclose(got, np.mean(lse - logits[np.arange(6), TARGETS]), rtol=1e-12)


def test_softmax_with_bias_and_causal_mask_is_the_masked_softmax():
    """causal=True adds -inf above the diagonal to whatever bias it is given (a stored tril(B_l)
    holds finite numbers there): the same as the bias with the mask written in."""
    x, B = normal(2, 2, 6, 6), np.tril(normal(6, 6))
    y = fused.softmax(Tensor(x), Tensor(B), scale=0.3, causal=True).data
    masked = np.where(np.tri(6, dtype=bool), B, -np.inf)
    reference = fused.softmax(Tensor(x), Tensor(masked), scale=0.3, causal=False).data
    np.testing.assert_allclose(y, reference, rtol=1e-13, atol=1e-300)
    assert np.all(y[..., np.triu_indices(6, 1)[0], np.triu_indices(6, 1)[1]] == 0.0)


def test_softmax_gradient_with_trainable_bias_and_scale():
    x, b = Tensor(normal(2, 1, 5, 5), requires_grad=True), Tensor(normal(5, 5), requires_grad=True)
    assert check_jacobian(lambda u, v: fused.softmax(u, v, scale=0.7, causal=False), [x, b], rtol=1e-6) < 1e-6
