"""nanospa/gradcheck.py: the checks catch planted wrong backwards (including one that a
plain out.sum() would miss), and pass on a small network and on a whole model through
every fast path.
"""
import numpy as np
import pytest

from conftest import perturbed_model, tiny_config
from nanospa import Tensor
from nanospa.more_ops import activation
from nanospa.gradcheck import check_directions, check_jacobian, tensor64
from nanospa.tensor import Function

R = np.random.default_rng(0)


def normal(*shape):
    return R.standard_normal(shape)


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


def test_directional_check_on_a_small_network():
    W1, W2 = tensor64(normal(4, 8)), tensor64(normal(8, 3))
    x = Tensor(normal(5, 4))
    err = check_directions(lambda: activation(activation(x @ W1, "gelu") @ W2, "tanh"), [W1, W2], n_directions=4)
    assert err < 1e-6


def test_espa_model_gradients_through_all_fast_paths():
    """The reference architecture (E-SPA, TAT leaky ReLU: cached bias + mask, fused leaky
    ReLU, flattened matmuls) in float64, by random directions."""
    model = perturbed_model(tiny_config(attention="espa", activation="tat_lrelu"))
    idx = np.random.default_rng(5).integers(0, 13, (2, 8))
    assert check_directions(lambda: model(idx, np.roll(idx, 1))[1], model.parameters(), n_directions=3) < 1e-6
