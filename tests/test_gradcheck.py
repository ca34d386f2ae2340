"""nanospa/gradcheck.py: the checks catch planted wrong backwards (including one that a
plain out.sum() would miss), and pass on a small network and on a whole model through
every fast path.
"""
import numpy as np
import pytest

from nanospa import GPT, GPTConfig, Tensor
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
    err = check_directions(lambda: ((x @ W1).gelu() @ W2).tanh(), [W1, W2], n_directions=4)
    assert err < 1e-6


def tiny(**kw):
    base = dict(vocab_size=13, block_size=8, n_layer=2, n_head=2, n_embd=8, dtype="float64")
    base.update(kw)
    return GPTConfig(**base)


def _perturbed(cfg):
    model = GPT(cfg, seed=0)
    rng = np.random.default_rng(3)
    for p in model.parameters():  # move off init (W^Q = 0 there) so every path matters
        p.data = p.data + 0.3 * rng.standard_normal(p.shape)
    return model


def test_espa_model_gradients_through_all_fast_paths():
    """The reference architecture (E-SPA, TAT leaky ReLU: cached bias + mask, fused leaky
    ReLU, flattened matmuls) in float64, by random directions."""
    model = _perturbed(tiny(attention="espa", activation="tat_lrelu"))
    idx = np.random.default_rng(5).integers(0, 13, (2, 8))
    assert check_directions(lambda: model(idx, np.roll(idx, 1))[1], model.parameters(), n_directions=3) < 1e-6
