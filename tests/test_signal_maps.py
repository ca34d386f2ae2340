"""Tests for nanospa/signal/maps.py: the wide-limit kernel map of each sublayer at init
(attention, softmax mean field, MLP, norms, DyT) and one configuration's residual and norm
arrangement (docs/method.md §2.2, §3.2, §10). Each map is compared with a computation that
does not go through it: explicit sums, closed forms, or Gaussian quadrature written here."""
from types import SimpleNamespace

import numpy as np
import pytest

from nanospa.signal.beyond.policies import c_inverse
from nanospa.config import GPTConfig
from nanospa.signal import cholesky, kernels, make_plan
from nanospa.signal.beyond.norm_maps import DYT_ALPHA, dyt_map
from nanospa.signal.collapse import softmax_attention_map
from nanospa.signal.maps import MLPMap, attention_map, normalise
from nanospa.signal.walks import WalkMaps
from nanospa.signal.local_maps import lrelu_cmap


def gauss(n=80):
    """Probabilists' Gauss-Hermite nodes and weights for E over N(0, 1)."""
    z, w = np.polynomial.hermite_e.hermegauss(n)
    return z, w / np.sqrt(2 * np.pi)


def random_row_stochastic(rng, T):
    """A random lower-triangular, row-stochastic (T, T) matrix: nothing like I or its transpose."""
    A = np.tril(rng.uniform(0.1, 1.0, (T, T)))
    return A / A.sum(axis=1, keepdims=True)


def test_attention_map_is_A_Sigma_A_transposed():
    """Against an explicit double sum sum_kl A_ik Sigma_kl A_jl, on a kernel that row-stochastic
    matrices do change (unequal q-values and decaying correlations: not 1 1^T, which every
    row-stochastic A maps to itself). A^T Sigma A, A Sigma A or a missing transpose fail."""
    rng = np.random.default_rng(0)
    T = 7
    q = rng.uniform(0.5, 2.0, T)
    Sigma = cholesky.espa_kernel(T, 0.3) * np.sqrt(np.outer(q, q))
    A = random_row_stochastic(rng, T)
    expected = np.zeros((T, T))
    for i in range(T):
        for j in range(T):
            expected[i, j] = sum(A[i, k] * Sigma[k, l] * A[j, l] for k in range(T) for l in range(T))
    out = attention_map(Sigma, A)
    np.testing.assert_allclose(out, expected, rtol=1e-13, atol=0)
    assert np.abs(out - Sigma).max() > 0.1                     # the map does change this kernel
    # row 0 of a causal A is e_0, so position 0 keeps its q-value
    assert out[0, 0] == pytest.approx(Sigma[0, 0], rel=1e-15)


def test_attention_map_flushes_subnormals():
    A = np.diag([1.0, 1e-130])                                  # (1e-130)^2 = 1e-260 < TINY
    out = attention_map(np.eye(2), A)
    assert out[1, 1] == 0.0 and out[0, 0] == 1.0


def test_uniform_attention_map_in_closed_form():
    """n_samples = 0: the zero-query map P Sigma P^T with P[i, j] = 1/(i+1). From Sigma = I,
    (P P^T)[i, j] = sum_{k <= min(i,j)} 1/((i+1)(j+1)) = 1/(max(i, j) + 1)."""
    T = 9
    i = np.arange(T)
    expected = 1.0 / (np.maximum(i[:, None], i[None, :]) + 1.0)
    np.testing.assert_allclose(softmax_attention_map(np.eye(T), n_samples=0), expected,
                               rtol=1e-14, atol=0)
    # and on a correlated kernel: row i is the mean of Sigma's rows 0..i, then of its columns
    Sigma = cholesky.espa_kernel(T, 0.4)
    cums = np.cumsum(np.cumsum(Sigma, axis=0), axis=1)          # cums[i, j] = sum_{k<=i, l<=j}
    np.testing.assert_allclose(softmax_attention_map(Sigma, n_samples=0),
                               cums / np.outer(i + 1.0, i + 1.0), rtol=1e-14, atol=0)


def test_softmax_mean_field_two_tokens_against_quadrature():
    """T = 2: row 0 of P is e_0, row 1 is (s, 1 - s) with s = sigmoid(x), x = G_10 - G_11,
    and the model's logit covariance Cov(G_ij, G_i'j') = Sigma_ii' Sigma_jj' gives
    Var(x) = Sigma_11 (Sigma_00 + Sigma_11 - 2 Sigma_01). So, exactly,

        Sigma'_01 = E[s] Sigma_00 + (1 - E[s]) Sigma_01
        Sigma'_11 = E[s^2] Sigma_00 + 2 E[s (1 - s)] Sigma_01 + E[(1 - s)^2] Sigma_11

    with the 1-D Gaussian means by quadrature. Sigma is chosen so the answer is far from
    uniform attention (Sigma'_11 = 3.05 against 2.25 uniform)."""
    S = np.array([[4.0, 1.0], [1.0, 3.0]])
    v = S[1, 1] * (S[0, 0] + S[1, 1] - 2 * S[0, 1])
    z, w = gauss()
    s = 1.0 / (1.0 + np.exp(-np.sqrt(v) * z))
    Es, Es2 = w @ s, w @ s ** 2
    expected = np.array([[S[0, 0], Es * S[0, 0] + (1 - Es) * S[0, 1]], [0.0, 0.0]])
    expected[1, 0] = expected[0, 1]
    expected[1, 1] = Es2 * S[0, 0] + 2 * (Es - Es2) * S[0, 1] + (1 - 2 * Es + Es2) * S[1, 1]
    uniform = softmax_attention_map(S, n_samples=0)
    assert expected[1, 1] - uniform[1, 1] > 0.7
    n = 16000
    est = softmax_attention_map(S, n_samples=n, seed=3)
    # Monte Carlo: each sample's entry lies in [min, max] of its quadratic in s over [0, 1]
    # (a range <= 3 for these entries), so its standard deviation is <= 1.5 (Popoviciu) and
    # the mean of n samples is within 5 * 1.5 / sqrt(n) = 0.06 (5 standard errors)
    assert est[0, 0] == S[0, 0]
    np.testing.assert_allclose(est, expected, rtol=0, atol=5 * 1.5 / np.sqrt(n))
    # seeded: the same estimate again
    np.testing.assert_array_equal(softmax_attention_map(S, n_samples=50, seed=1),
                                  softmax_attention_map(S, n_samples=50, seed=1))


def test_mlp_map_of_tat_lrelu_is_the_closed_form():
    plan = make_plan(GPTConfig(n_layer=24, activation="tat_lrelu", kernel_budget="independent"))
    mlp = MLPMap(plan.activation)
    q = np.array([1.0, 2.0, 0.5])
    C = np.array([[1.0, 0.3, 0.7], [0.3, 1.0, 0.1], [0.7, 0.1, 1.0]])
    S = C * np.sqrt(np.outer(q, q))
    expected = np.sqrt(np.outer(q, q)) * lrelu_cmap(C, plan.params["negative_slope"])
    np.testing.assert_allclose(mlp(S), expected, atol=1e-13)     # homogeneous: q scales out
    assert mlp.Q1() == pytest.approx(1.0, abs=1e-12)             # TAT: Q(1) = 1
    c = np.linspace(-0.4, 1.0, 8)                            # C(-1) = -1 + pi beta > -0.45 here
    np.testing.assert_allclose(mlp.C(c_inverse(mlp, c)), c, atol=1e-12)
    with pytest.raises(ValueError, match="C\\^-1 needs c"):
        c_inverse(mlp, np.array([-0.99]))


def test_mlp_map_of_relu_against_the_arc_cosine_kernel():
    """Plain ReLU: E[relu(u) relu(v)] = sqrt(q q') (sin t + (pi - t) cos t) / (2 pi), t = arccos c
    (Cho & Saul's arc-cosine kernel of degree 1)."""
    mlp = MLPMap(dict(activation="relu", method=None))
    q = np.array([1.0, 3.0])
    c = 0.4
    S = np.array([[q[0], c * np.sqrt(q[0] * q[1])], [c * np.sqrt(q[0] * q[1]), q[1]]])
    t = np.arccos(c)
    off = np.sqrt(q[0] * q[1]) * (np.sin(t) + (np.pi - t) * np.cos(t)) / (2 * np.pi)
    np.testing.assert_allclose(mlp(S), [[q[0] / 2, off], [off, q[1] / 2]], rtol=1e-12)
    assert mlp.Q1() == pytest.approx(0.5, rel=1e-12) and not mlp.is_identity


def test_identity_mlp_map():
    mlp = MLPMap(dict(activation="linear", method=None))
    S = cholesky.espa_kernel(5, 0.2) * 3.0
    out = mlp(S)
    assert mlp.is_identity and mlp.Q1() == 1.0 and out is not S
    np.testing.assert_array_equal(out, S)
    np.testing.assert_array_equal(c_inverse(mlp, np.array([0.2, -0.5])), [0.2, -0.5])


def test_normalise_and_dyt_against_quadrature():
    S = np.array([[2.0, 0.6], [0.6, 0.5]])
    np.testing.assert_allclose(normalise(S), [[1.0, 0.6 / 1.0], [0.6, 1.0]], rtol=1e-14)
    # DyT(x) = tanh(alpha x): a 2-D Gauss-Hermite mean over u = L z, L = chol(S)
    L = np.linalg.cholesky(S)
    z, w = gauss()
    u0 = L[0, 0] * z[:, None] + 0 * z[None, :]
    u1 = L[1, 0] * z[:, None] + L[1, 1] * z[None, :]
    W = np.outer(w, w)
    f0, f1 = np.tanh(DYT_ALPHA * u0), np.tanh(DYT_ALPHA * u1)
    expected = np.array([[np.sum(W * f0 * f0), np.sum(W * f0 * f1)],
                         [np.sum(W * f0 * f1), np.sum(W * f1 * f1)]])
    assert DYT_ALPHA == 0.5
    # both are converged quadratures of a smooth integrand: agreement to ~1e-14
    np.testing.assert_allclose(dyt_map(S), expected, rtol=1e-12, atol=0)


def block_cfg(**kw):
    base = dict(residual="none", residual_beta=0.6, norm="none", norm_position="pre", uses_final_norm=False)
    base.update(kw)
    return SimpleNamespace(**base)


LINEAR = dict(activation="linear", method=None)
RELU = dict(activation="relu", method=None)


def test_block_maps_residual_and_norm_arrangements():
    """X' = f(N(X)) / X + f(N(X)) / a X + b f(N(X)) with a^2 + b^2 = 1, norms pre or post;
    sublayer returns (branch kernel, combined kernel)."""
    S = np.array([[2.0, 0.5, 0.1], [0.5, 1.0, 0.3], [0.1, 0.3, 0.5]])
    C = kernels.normalised_kernel(S)
    f = lambda X: 2.0 * X                                     # a branch that doubles the kernel
    h, out = WalkMaps(block_cfg(), LINEAR).sublayer(S, f)
    np.testing.assert_array_equal(h, 2 * S)
    np.testing.assert_array_equal(out, 2 * S)
    h, out = WalkMaps(block_cfg(residual="standard"), LINEAR).sublayer(S, f)
    np.testing.assert_allclose(out, 3 * S, rtol=1e-14)
    maps = WalkMaps(block_cfg(residual="normalised"), LINEAR)
    assert maps.a ** 2 == pytest.approx(0.64) and maps.b ** 2 == pytest.approx(0.36)
    np.testing.assert_allclose(maps.sublayer(S, f)[1], 0.64 * S + 0.36 * 2 * S, rtol=1e-14)
    # pre-norm: the branch sees C, the skip the un-normalised kernel
    h, out = WalkMaps(block_cfg(residual="standard", norm="layernorm"), LINEAR).sublayer(S, f)
    np.testing.assert_allclose(h, 2 * C, rtol=1e-14)
    np.testing.assert_allclose(out, S + 2 * C, rtol=1e-14)
    # post-norm: the branch sees S, the sum is normalised
    h, out = WalkMaps(block_cfg(residual="standard", norm="rmsnorm", norm_position="post"),
                       LINEAR).sublayer(S, f)
    np.testing.assert_allclose(h, 2 * S, rtol=1e-14)
    np.testing.assert_allclose(out, C, rtol=1e-14)            # normalise(3 S) = C
    # DyT as the norm; no norm means none anywhere
    maps = WalkMaps(block_cfg(norm="dyt"), LINEAR)
    np.testing.assert_allclose(maps.branch_input(S), dyt_map(S), rtol=1e-14)
    np.testing.assert_array_equal(WalkMaps(block_cfg(), LINEAR).norm(S), S)


def test_block_maps_final_norm_and_mlp():
    S = np.array([[2.0, 0.5], [0.5, 1.0]])
    np.testing.assert_array_equal(WalkMaps(block_cfg(norm="layernorm"), LINEAR).final(S), S)
    np.testing.assert_allclose(WalkMaps(block_cfg(norm="layernorm", uses_final_norm=True), LINEAR).final(S),
                               kernels.normalised_kernel(S), rtol=1e-15)
    maps = WalkMaps(block_cfg(), RELU)
    np.testing.assert_allclose(maps.sublayer(S, maps.mlp_map)[1], MLPMap(RELU)(S), rtol=1e-15)
