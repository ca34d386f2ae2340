"""Tests for nanospa/signal/inputs.py and maps.input_kernel: the input kernel Sigma_0 of a token
sequence, the positional encodings and variances it depends on (docs/method.md §11)."""
import math

import numpy as np
import pytest

from nanospa.nn import Embedding
from nanospa.signal import kernels
from nanospa.signal.inputs import ADDITIVE_POSITIONS, POS_VARIANCE, sinusoidal_encoding, token_variance
from nanospa.signal.maps import input_kernel


def test_variances_give_q_one():
    assert ADDITIVE_POSITIONS == ("learned", "sinusoidal")
    assert POS_VARIANCE == 0.5
    for pos in ("none", "alibi", "rope", "spa_prior"):               # nothing added to the embedding
        assert token_variance(pos) == 1.0
    for pos in ("learned", "sinusoidal"):
        assert token_variance(pos) + POS_VARIANCE == 1.0          # q = 1 at the embedding output


def test_sinusoidal_encoding_layout_and_mean_square():
    T, d = 10, 16
    pe = sinusoidal_encoding(T, d)
    assert pe.shape == (T, d)
    # coordinates 2k, 2k+1 are sin, cos of position / 10000^(2k/d), scaled by sqrt(2 var)
    t, k = 7, 3
    w = 10000.0 ** (-2 * k / d)
    scale = math.sqrt(2 * POS_VARIANCE)
    assert pe[t, 2 * k] == pytest.approx(scale * math.sin(t * w), rel=1e-14)
    assert pe[t, 2 * k + 1] == pytest.approx(scale * math.cos(t * w), rel=1e-14)
    # sin^2 + cos^2 = 1 per pair: every position has mean square pos_variance exactly
    np.testing.assert_allclose((pe ** 2).mean(axis=1), POS_VARIANCE, rtol=1e-14)
    np.testing.assert_allclose((sinusoidal_encoding(T, d, 0.2) ** 2).mean(axis=1), 0.2, rtol=1e-14)
    # odd width: the last sin coordinate has no cos partner
    assert sinusoidal_encoding(4, 7).shape == (4, 7)
    with pytest.raises(ValueError, match="T must be"):
        sinusoidal_encoding(0, 8)


def test_input_kernel_counts_repeated_tokens_and_positions():
    t = np.array([3, 5, 3, 7, 5, 3])
    same = (t[:, None] == t[None, :]).astype(float)
    np.testing.assert_array_equal(input_kernel(t), same)
    np.testing.assert_array_equal(input_kernel(T=5), np.eye(5))
    np.testing.assert_allclose(input_kernel(t, pos="learned"), 0.5 * same + 0.5 * np.eye(6))
    S = input_kernel(t, pos="sinusoidal", n_embd=32)
    P = sinusoidal_encoding(6, 32)                           # the model's own encoding
    np.testing.assert_allclose(S, 0.5 * same + P @ P.T / 32, atol=1e-14)
    np.testing.assert_allclose(np.diag(S), 1.0, rtol=1e-14)  # q = 1 at every position
    np.testing.assert_allclose(input_kernel(t, pos="learned", pos_variance=0.2),
                               0.8 * same + 0.2 * np.eye(6), rtol=1e-15)
    with pytest.raises(ValueError, match="n_embd"):
        input_kernel(t, pos="sinusoidal")
    for pos in ("alibi", "rotary"):                          # positions in the logits pass pos='none'
        with pytest.raises(ValueError, match=f"pos='{pos}'"):
            input_kernel(t, pos=pos)


def test_input_kernel_argument_errors():
    with pytest.raises(ValueError, match="needs tokens or T"):
        input_kernel()
    with pytest.raises(ValueError, match="does not match"):
        input_kernel(np.arange(4), T=5)
    with pytest.raises(ValueError, match="non-empty 1-D"):
        input_kernel(np.zeros((2, 3), dtype=int))
    with pytest.raises(ValueError, match="pos_variance"):
        input_kernel(T=3, pos="learned", pos_variance=1.0)


@pytest.mark.parametrize("pos", ["none", "learned", "sinusoidal"])
def test_input_kernel_matches_a_wide_embedding(pos):
    """The embedding output of the model's init (model.GPT: tokens N(0, token_variance),
    learned positions N(0, POS_VARIANCE), sinusoidal positions of mean square POS_VARIANCE)."""
    d, T = 4096, 12
    t = np.array([1, 2, 1, 3, 1, 2, 4, 5, 6, 1, 7, 0])
    rng = np.random.default_rng(0)
    X = Embedding(8, d, std=np.sqrt(token_variance(pos)), rng=rng, dtype="float64")(t).data
    if pos == "learned":
        X = X + Embedding(T, d, std=np.sqrt(POS_VARIANCE), rng=rng, dtype="float64")(np.arange(T)).data
    elif pos == "sinusoidal":
        X = X + sinusoidal_encoding(T, d)
    # one draw of width 4096: entries fluctuate by about 4096^-1/2 = 0.016; 5 sigma
    np.testing.assert_allclose(kernels.kernel_matrix(X), input_kernel(t, pos=pos, n_embd=d), atol=5 / np.sqrt(d))
