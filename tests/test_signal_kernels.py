"""Tests for nanospa/signal/kernels.py: kernels, SPA targets (cholesky.py) and schedules (espa_/uspa_ and
walks.py's kind-generic spa_kernel / spa_schedule), the subnormal flush; and for the rank-collapse
measures and standard attention at init of nanospa/signal/collapse.py (docs/method.md §3, §4,
§6, §7.1, §7.3)."""
import numpy as np
import pytest

from nanospa.signal import (effective_rank, espa_gammas, espa_kernel, kernel_matrix,
                            kernel_stats, mean_offdiag, min_entry,
                            normalised_kernel, q_values, spa_kernel, spa_schedule,
                            uniform_causal_attention, uspa_kernel, uspa_rhos,
                            value_skipinit_attention)
from nanospa.signal.kernels import TINY, check_T, flush
from nanospa.signal.walks import SPA_KINDS

EPS = np.finfo(np.float64).eps


def test_kernel_matrix_batched_and_mean():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((3, 2, 5, 7))                       # (..., T, d)
    Sigma = kernel_matrix(X)
    assert Sigma.shape == (3, 2, 5, 5)
    np.testing.assert_allclose(Sigma[1, 0], X[1, 0] @ X[1, 0].T / 7, rtol=1e-14)
    np.testing.assert_allclose(kernel_matrix(X, mean=True), Sigma.mean(axis=(0, 1)), rtol=1e-14)
    np.testing.assert_array_equal(q_values(Sigma), np.diagonal(Sigma, axis1=-2, axis2=-1))
    with pytest.raises(ValueError):
        kernel_matrix(np.ones(4))


def test_normalised_kernel_unit_diagonal_and_cosines():
    rng = np.random.default_rng(1)
    X = rng.standard_normal((4, 6, 9)) * rng.uniform(0.5, 3.0, (4, 6, 1))   # varied q
    C = normalised_kernel(kernel_matrix(X))
    np.testing.assert_allclose(np.diagonal(C, axis1=-2, axis2=-1), 1.0, rtol=1e-14)
    x0, x1 = X[2, 0], X[2, 3]
    cos = x0 @ x1 / np.linalg.norm(x0) / np.linalg.norm(x1)
    assert C[2, 0, 3] == pytest.approx(cos, rel=1e-13)
    with pytest.raises(ValueError, match="positive diagonal"):
        normalised_kernel(np.zeros((3, 3)))


def test_effective_rank_extremes():
    T = 10
    assert effective_rank(np.eye(T)) == pytest.approx(T, rel=1e-12)
    assert effective_rank(np.ones((T, T))) == pytest.approx(1.0, rel=1e-12)
    # two equal non-zero eigenvalues: entropy log 2, effective rank 2
    assert effective_rank(np.diag([3.0, 3.0, 0.0, 0.0])) == pytest.approx(2.0, rel=1e-12)


def test_kernel_stats_on_espa_target():
    T, gamma = 50, 0.1
    st = kernel_stats(2.0 * espa_kernel(T, gamma))               # q = 2 scales out of C
    assert st["q_min"] == st["q_mean"] == st["q_max"] == 2.0
    assert st["first_to_last"] == pytest.approx(np.exp(-gamma * (T - 1)), rel=1e-13)
    assert st["min_entry"] == pytest.approx(np.exp(-gamma * (T - 1)), rel=1e-13)
    assert st["adjacent_mean"] == pytest.approx(np.exp(-gamma), rel=1e-13)
    C = espa_kernel(T, gamma)
    off = C[~np.eye(T, dtype=bool)]
    assert st["mean_offdiag"] == pytest.approx(off.mean(), rel=1e-13)
    assert 1.0 < st["effective_rank"] < T


def test_targets_are_positive_definite_with_unit_diagonal():
    T = 64
    for S in (espa_kernel(T, 0.005), espa_kernel(T, 3.0), uspa_kernel(T, 0.8), uspa_kernel(T, 0.0)):
        np.testing.assert_array_equal(np.diag(S), 1.0)
        assert np.linalg.eigvalsh(S).min() > 0
    np.testing.assert_array_equal(espa_kernel(T, np.inf), np.eye(T))
    # U-SPA eigenvalues are 1 + (T-1) rho (once) and 1 - rho: cond = (1 + (T-1) rho)/(1 - rho)
    rho = 0.8
    lam = np.linalg.eigvalsh(uspa_kernel(T, rho))
    assert lam.max() / lam.min() == pytest.approx((1 + (T - 1) * rho) / (1 - rho), rel=1e-10)
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match="gamma"):
            espa_kernel(T, bad)
    for bad in (1.0, -0.1):
        with pytest.raises(ValueError, match="rho"):
            uspa_kernel(T, bad)
    with pytest.raises(ValueError, match="T"):
        espa_kernel(0, 0.1)


def test_espa_gammas_schedule():
    L, gamma_L = 36, 0.005
    g = espa_gammas(L, gamma_L)
    assert g.shape == (L + 1,) and np.isinf(g[0]) and g[L] == gamma_L
    assert np.all(np.diff(g[1:]) < 0)                           # non-increasing: A_l >= 0
    a = np.sqrt(-np.expm1(-2.0 * g[1:]))                         # a_1 .. a_L
    # defining property a_l = a_L^(l/L), to rounding of log/exp (a few ulps)
    np.testing.assert_allclose(a, a[-1] ** (np.arange(1, L + 1) / L), rtol=1e-13)
    # regression against the table of method §7.3 (values quoted to 3 decimals)
    table = {1: 1.059, 2: 0.744, 6: 0.312, 12: 0.121, 18: 0.053, 24: 0.024, 30: 0.011, 36: 0.005}
    for l, value in table.items():
        assert g[l] == pytest.approx(value, abs=5e-4)
    assert a[-1] ** (1 / L) == pytest.approx(0.938, abs=5e-4)   # common diagonal of A_l
    assert espa_gammas(1, 0.3).tolist() == [np.inf, 0.3]
    for bad in (0.0, -1.0, np.inf):
        with pytest.raises(ValueError, match="gamma_final"):
            espa_gammas(L, bad)
    with pytest.raises(ValueError, match="n_layer"):
        espa_gammas(0)


def test_uspa_rhos_schedule():
    L, rho_L = 24, 0.8
    r = uspa_rhos(L, rho_L)
    assert r.shape == (L + 1,) and r[0] == 0.0 and r[L] == rho_L
    assert np.all(np.diff(r) > 0)                               # non-decreasing: A_l >= 0
    np.testing.assert_allclose(1 - r, (1 - rho_L) ** (np.arange(L + 1) / L), rtol=1e-13)
    with pytest.raises(ValueError, match="rho_final"):
        uspa_rhos(L, 1.0)


def test_uniform_attention_collapses_rank():
    """Iterating Sigma <- P Sigma P^T from I under zero-query causal softmax (method §3.4)."""
    T = 64
    P = uniform_causal_attention(T)
    np.testing.assert_allclose(P.sum(axis=1), 1.0, rtol=1e-14)
    assert np.all(np.triu(P, 1) == 0) and P[T - 1, 0] == 1.0 / T
    # table of method §3.4: (min C entry, mean off-diagonal), quoted to 2-3 decimals
    table = {1: (0.125, 0.67, 5e-3), 2: (0.43, 0.90, 5e-3), 4: (0.84, 0.98, 5e-3),
             8: (0.995, 0.999, 5e-4), 36: (1.000, 1.000, 5e-4)}
    Sigma, ranks = np.eye(T), []
    for l in range(1, 37):
        Sigma = P @ Sigma @ P.T
        C = normalised_kernel(Sigma)
        ranks.append(effective_rank(Sigma))
        if l in table:
            lo, mean, tol = table[l]
            assert min_entry(C) == pytest.approx(lo, abs=tol)
            assert mean_offdiag(C) == pytest.approx(mean, abs=tol)
    # depth 1 in closed form: C[i, j] = sqrt((min(i,j)+1)/(max(i,j)+1)), min sqrt(1/T)
    assert min_entry(normalised_kernel(P @ P.T)) == pytest.approx(1 / np.sqrt(T), rel=1e-13)
    # effective rank falls towards 1 (past depth ~16 it sits at 1 + O(1e-13) rounding noise)
    assert np.all(np.diff(ranks[:12]) < 0) and ranks[-1] < 1.0 + 1e-9


def test_value_skipinit_is_identity_at_init():
    T = 16
    np.testing.assert_array_equal(value_skipinit_attention(T), np.eye(T))
    Sigma = espa_kernel(T, 0.2)
    A = value_skipinit_attention(T)
    np.testing.assert_array_equal(A @ Sigma @ A.T, Sigma)          # kernel passes unchanged
    M = value_skipinit_attention(T, alpha=0.6, beta=0.8)
    np.testing.assert_allclose(M, 0.6 * np.eye(T) + 0.8 * uniform_causal_attention(T), rtol=1e-15)
    with pytest.raises(ValueError, match="P must have shape"):
        value_skipinit_attention(T, P=np.eye(T + 1))


def test_spa_kernel_and_schedule_dispatch_on_kind():
    assert SPA_KINDS == ("espa", "uspa")
    np.testing.assert_array_equal(spa_kernel("espa", 12, 0.3), espa_kernel(12, 0.3))
    np.testing.assert_array_equal(spa_kernel("uspa", 12, 0.3), uspa_kernel(12, 0.3))
    np.testing.assert_array_equal(spa_schedule("espa", 7, 0.02), espa_gammas(7, 0.02))
    np.testing.assert_array_equal(spa_schedule("uspa", 7, 0.6), uspa_rhos(7, 0.6))
    for bad in ("softmax", "value_skipinit", None):
        with pytest.raises(ValueError, match="kind must be one of"):
            spa_kernel(bad, 4, 0.1)
        with pytest.raises(ValueError, match="kind must be one of"):
            spa_schedule(bad, 4, 0.1)
    with pytest.raises(ValueError, match="rho"):
        spa_kernel("uspa", 4, 1.0)                                 # each kind's own checks apply


def test_flush_zeroes_only_entries_below_tiny():
    assert TINY == 1e-250
    M = np.array([[1.0, 1e-249, -1e-249], [1e-251, -1e-251, 5e-324], [0.0, -3.0, np.inf]])
    out = flush(M)
    expected = np.array([[1.0, 1e-249, -1e-249], [0.0, 0.0, 0.0], [0.0, -3.0, np.inf]])
    np.testing.assert_array_equal(out, expected)
    assert M[1, 0] == 1e-251                                     # input untouched


def test_check_T():
    assert check_T(5) == 5 and check_T(np.int64(3)) == 3 and type(check_T(np.int64(3))) is int
    for bad in (0, -2):
        with pytest.raises(ValueError, match="T must be >= 1"):
            check_T(bad)
    for bad in (2.0, "4", None):
        with pytest.raises(ValueError, match="T must be an integer"):
            check_T(bad)
