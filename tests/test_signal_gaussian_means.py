"""Q/C maps and quadrature (nanospa/signal/gaussian_means.py, local_maps.py; docs/activations.md §2, §5, §8):
leaky-ReLU closed forms against split quadrature, C-maps against finer rules and Monte
Carlo, the vectorised kernel map against a 2-D rule written here, bad input.

The maps are evaluated on solved phi_hat (act_transform.activation_transform), the
shapes they are used on; the solvers themselves are tested in test_signal_act_transform.py.
"""
import math

import numpy as np
import pytest
from numpy.polynomial.legendre import leggauss

from nanospa.signal.act_transform import activation_transform
from nanospa.signal.activations import ACTIVATIONS
from nanospa.signal.local_maps import LocalMaps, bivariate, c_map, lrelu_cmap, q_map
from nanospa.signal.gaussian_means import alpha_of_beta, lrelu_beta

SMOOTH = ["gelu", "gelu_exact", "tanh", "sigmoid", "softplus", "swish"]
C_POINTS = np.array([0.0, 0.25, 0.5, 0.75, 0.9, 0.99])


# ------------------------------------------------------------------------------- Q-map

@pytest.mark.parametrize("name", ["gelu", "elu", "leaky_relu"])
def test_q_map_slope_by_finite_differences(name):
    # Q'(1) = 1 on the public q_map: central difference with h = 1e-4 has truncation
    # h^2 |Q'''| / 6, below 1e-8 for these maps (|Q'''| < 1 near q = 1), rounding ~1e-12.
    t = activation_transform(name, "dks", 12)
    h = 1e-4
    slope = (q_map(t, 1 + h) - q_map(t, 1 - h)) / (2 * h)
    assert abs(slope - 1.0) < 1e-8
    assert abs(q_map(t, 1.0) - 1.0) < 1e-12


# ------------------------------------------------------------- closed forms vs quadrature

@pytest.mark.parametrize("case", [("leaky_relu", "tat", 36), ("leaky_relu", "dks", 12), "relu",
                                  "leaky_relu"])
@pytest.mark.parametrize("q", [1.0, 2.5])
def test_leaky_closed_form_vs_split_quadrature(case, q):
    t = activation_transform(*case) if isinstance(case, tuple) else case
    f = t if not isinstance(t, str) else ACTIVATIONS[t].fn
    c = np.array([-0.9, -0.3, 0.0, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0])
    closed = c_map(t, c, q=q)
    quad = c_map(lambda x: f(x), c, q=q, kink=0.0)         # a bare callable: split rule
    np.testing.assert_allclose(closed, quad, rtol=0, atol=1e-8)
    qs = np.array([0.3, 1.0, 2.5])
    np.testing.assert_allclose(q_map(t, qs), q_map(lambda x: f(x), qs, kink=0.0), rtol=1e-10)


def test_lrelu_cmap_forms():
    c = np.linspace(-1, 1, 41)
    for al in (0.0, 0.2, 0.35112, 0.9):
        beta = float(lrelu_beta(al))
        direct = ((1 - al) ** 2 * (np.sqrt(1 - c * c) + (np.pi - np.arccos(c)) * c) / np.pi
                  + 2 * al * c) / (1 + al * al)                             # §5 first form
        np.testing.assert_allclose(lrelu_cmap(c, al), direct, atol=1e-15)
        assert lrelu_cmap(0.0, al) == pytest.approx(beta, abs=1e-15)
        assert alpha_of_beta(beta) == pytest.approx(al, abs=1e-12)


@pytest.mark.parametrize("name", SMOOTH + ["elu"])
@pytest.mark.parametrize("method", ["dks", "tat"])
def test_cmap_against_finer_rule(name, method):
    # §8: 160 x 160 Gauss-Hermite is good to ~1e-14 for smooth phi_hat; the split rule
    # converges as fast. 1e-10 leaves room for summing 25,600 terms of size ~1.
    t = activation_transform(name, method, 36)
    fine = c_map(t, C_POINTS, n=240 if name != "elu" else 200)
    np.testing.assert_allclose(c_map(t, C_POINTS), fine, rtol=0, atol=1e-10)
    assert c_map(t, 1.0) == pytest.approx(1.0, abs=1e-12)
    assert np.all(np.diff(fine) > 0)                       # increasing on [0, 1]
    assert np.all(np.diff(np.diff(fine) / np.diff(C_POINTS)) > 0)   # convex: slopes increase
    # vectorised local map: Hermite series (smooth) or quadrature (elu)
    np.testing.assert_allclose(LocalMaps(t).C(C_POINTS), fine, rtol=0, atol=1e-11)


@pytest.mark.parametrize("case", [("gelu", "tat", 12), ("tanh", "dks", 12), ("sigmoid", "tat", 36),
                                  ("elu", "tat", 12), ("leaky_relu", "dks", 12),
                                  ("leaky_relu", "tat", 36)])
def test_cmap_against_monte_carlo_wide_layer(case):
    # A random layer W (n_in, M), entries N(0, 1/n_in), applied to two inputs with
    # |x|^2 = n_in and x1.x2 = c n_in: each of the M output units is an exact draw of
    # (u, v) with correlation c, so mean(phi_hat(u) phi_hat(v)) -> C(c) at rate 1/sqrt(M).
    # Tolerance: 5 standard errors of that mean (seeded, so deterministic).
    t = activation_transform(*case)
    rng = np.random.default_rng(7)
    n_in, M = 16, 200_000
    for c in C_POINTS:
        e = np.linalg.qr(rng.standard_normal((n_in, 2)))[0].T * math.sqrt(n_in)   # orthogonal rows
        X = np.stack([e[0], c * e[0] + math.sqrt(1 - c * c) * e[1]])               # (2, n_in)
        H = X @ (rng.standard_normal((n_in, M)) / math.sqrt(n_in))                 # (2, M)
        prod = t(H[0]) * t(H[1])
        se = prod.std() / math.sqrt(M)
        assert abs(prod.mean() - c_map(t, c)) < 5 * se, (c, prod.mean(), c_map(t, c), se)


# ------------------------------------------------------------------ local maps, kernels

@pytest.mark.parametrize("case", [("gelu", "tat", 12), ("tanh", "dks", 36), ("elu", "dks", 12),
                                  ("leaky_relu", "dks", 12), ("leaky_relu", "tat", 36)])
def test_kernel_map(case):
    # Sigma' = E[phi_hat(u) phi_hat(u)^T] for u ~ N(0, Sigma) with unequal q-values,
    # against an entry-by-entry 2-D rule written here: x1 = sqrt(q1) z1,
    # x2 = sqrt(q2) (rho z1 + sqrt(1 - rho^2) z2), 400 x 400 Gauss-Legendre on [-12, 12]^2
    # for smooth phi_hat (1e-10), or against the split quadrature for kinked phi_hat.
    t = activation_transform(*case)
    rng = np.random.default_rng(3)
    T = 5
    X = rng.standard_normal((T, 12))
    S = X @ X.T / 12
    K = LocalMaps(t).kernel(S)
    assert K.shape == (T, T) and np.allclose(K, K.T, atol=1e-14)
    np.testing.assert_allclose(np.diag(K), q_map(t, np.diag(S)), rtol=1e-10)
    x, w = leggauss(400)
    x, w = 12 * x, 12 * w * np.exp(-72 * x * x) / math.sqrt(2 * math.pi)
    smooth = not ACTIVATIONS[t.activation].kinked
    for i, j in [(0, 1), (2, 4), (3, 0)]:
        q1, q2 = S[i, i], S[j, j]
        rho = S[i, j] / math.sqrt(q1 * q2)
        if smooth:
            z1, z2 = x[:, None], x[None, :]
            ref = w @ (t(math.sqrt(q1) * z1) * t(math.sqrt(q2) * (rho * z1 + math.sqrt(1 - rho ** 2) * z2))) @ w
        else:
            ref = bivariate(t.phi_hat, q1, q2, rho, n=200)
        assert abs(K[i, j] - ref) < 1e-10 * max(1.0, abs(ref))
    # with unit diagonal the kernel map is the C-map
    C = S / np.sqrt(np.outer(np.diag(S), np.diag(S)))
    np.testing.assert_allclose(LocalMaps(t).kernel(C), LocalMaps(t).C(C), atol=1e-11)


def test_kernel_map_large_q_falls_back_to_quadrature():
    # for q = 400 the Hermite series of TAT-tanh is too slow: those entries use quadrature
    t = activation_transform("tanh", "tat", 36)
    S = np.array([[400.0, 200.0], [200.0, 1.0 * 400]])
    K = LocalMaps(t).kernel(S)
    assert K[0, 0] == pytest.approx(float(q_map(t, 400.0)), rel=1e-10)
    assert K[0, 1] == pytest.approx(float(c_map(t, 0.5, q=400.0)) * float(q_map(t, 400.0)), rel=1e-10)


def test_bad_map_input_raises():
    with pytest.raises(ValueError, match="c"):
        c_map("tanh", 1.5)
    with pytest.raises(ValueError, match="q"):
        q_map("tanh", -1.0)
