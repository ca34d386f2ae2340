"""Tests for nanospa/signal/cholesky.py: the checked Cholesky factor, the general transfer
matrix A = chol(Sigma_next) chol(Sigma_prev)^-1, symmetric square roots, the non-causal
variant and the construction checks (docs/method.md §5, §9, §14). All float64. The closed
forms of E-SPA / U-SPA, which use transfer_matrix as their reference, are tested in
tests/test_signal_attn_bias.py."""
import numpy as np
import pytest

from nanospa.signal import (check_attention, checked_cholesky, espa_kernel, noncausal_attention,
                            sym_sqrt, transfer_matrix, uspa_kernel)

EPS = np.finfo(np.float64).eps


def random_kernel(rng, T, width=None):
    """A random symmetric positive definite (T, T) kernel X X^T / d with d = 2T."""
    d = width or 2 * T
    X = rng.standard_normal((T, d))
    return X @ X.T / d


def test_checked_cholesky_refuses_indefinite_without_jitter():
    S = np.array([[1.0, 0.9, 0.0], [0.9, 1.0, 0.9], [0.0, 0.9, 1.0]])   # min eigenvalue < 0
    lam = np.linalg.eigvalsh(S).min()
    with pytest.raises(ValueError, match=f"min eigenvalue {lam:.6g}"):
        checked_cholesky(S)
    with pytest.raises(ValueError, match="not symmetric"):
        checked_cholesky(np.array([[1.0, 0.5], [0.0, 1.0]]))
    L = checked_cholesky(espa_kernel(30, 0.1))
    np.testing.assert_allclose(L @ L.T, espa_kernel(30, 0.1), rtol=0, atol=1e-14)


def test_checked_cholesky_refuses_bad_shapes_and_values():
    with pytest.raises(ValueError, match="square"):
        checked_cholesky(np.ones((2, 3)))
    with pytest.raises(ValueError, match="non-finite"):
        checked_cholesky(np.array([[1.0, np.nan], [np.nan, 1.0]]))
    # rounding-level asymmetry (a propagated kernel A S A^T) is accepted: SYM_RTOL = 1e-10
    S = espa_kernel(8, 0.3)
    S[0, 1] += 1e-13
    checked_cholesky(S)


def test_transfer_matrix_maps_a_general_kernel():
    """Random positive definite kernels (not SPA targets): A is lower triangular with exact
    zeros above the diagonal and A Sigma_prev A^T = Sigma_next to rounding."""
    rng = np.random.default_rng(0)
    for T in (1, 2, 7, 40):
        Sp, Sn = random_kernel(rng, T), random_kernel(rng, T)
        A = transfer_matrix(Sp, Sn)
        assert A.shape == (T, T) and np.all(np.triu(A, 1) == 0.0)
        # backward-stable triangular solves: error ~ eps * cond(Sigma_prev) * |Sigma_next|,
        # cond < 30 here (observed <= 7e-16); 100 eps ~ 2e-14 leaves room
        np.testing.assert_allclose(A @ Sp @ A.T, Sn, rtol=0, atol=100 * EPS * np.abs(Sn).max())
        rep = check_attention(A, Sp, Sn, raise_error=False)
        assert rep["kernel_err"] < 100 * EPS * np.abs(Sn).max() and rep["upper_max"] == 0.0
    with pytest.raises(ValueError, match="kernel shapes differ"):
        transfer_matrix(np.eye(3), np.eye(4))
    with pytest.raises(ValueError, match="Sigma_prev is not positive definite"):
        transfer_matrix(np.zeros((3, 3)), np.eye(3))


def test_wrong_way_schedule_goes_negative():
    """Documented property (method §6, §7.2): gamma increasing or rho decreasing gives a
    signed A, which softmax cannot realise; check_attention and the non-causal variant
    refuse it. (The closed forms' refusal: test_signal_attn_bias.py.)"""
    T = 50
    A = transfer_matrix(espa_kernel(T, 0.2), espa_kernel(T, 0.5))     # gamma 0.2 -> 0.5
    assert A.min() == pytest.approx(-0.527, abs=1e-3)                 # method §7.2: -0.53
    A = transfer_matrix(uspa_kernel(T, 0.6), uspa_kernel(T, 0.3))     # rho 0.6 -> 0.3
    assert A.min() == pytest.approx(-0.415, abs=1e-3)                 # method §6: ~ -0.42
    with pytest.raises(ValueError, match="negative entry"):
        check_attention(A, uspa_kernel(T, 0.6), uspa_kernel(T, 0.3))
    # the non-causal variant goes negative too, and is refused at construction
    with pytest.raises(ValueError, match="negative entry"):
        noncausal_attention(uspa_kernel(T, 0.6), uspa_kernel(T, 0.3))


def test_check_attention_reports_and_raises_each_failure():
    T = 6
    Sp, Sn = np.eye(T), espa_kernel(T, 0.4)
    A = transfer_matrix(Sp, Sn)
    rep = check_attention(A, Sp, Sn)
    assert set(rep) == {"kernel_err", "upper_max", "min_entry"}
    assert rep["kernel_err"] < 1e-15 and rep["upper_max"] == 0.0 and rep["min_entry"] >= 0.0
    # a kernel miss above kernel_atol
    with pytest.raises(ValueError, match="misses Sigma_next"):
        check_attention(1.01 * A, Sp, Sn)
    assert check_attention(1.01 * A, Sp, Sn, kernel_atol=0.1)["kernel_err"] > 1e-2
    # a non-zero entry above the diagonal, however small, for a causal A
    B = A.copy()
    B[0, 1] = 1e-300
    with pytest.raises(ValueError, match="not lower triangular"):
        check_attention(B, Sp, B @ Sp @ B.T)
    assert check_attention(B, Sp, B @ Sp @ B.T, causal=False)["upper_max"] == 0.0
    # a negative entry beyond rounding; a tiny one within neg_rtol passes
    C = A.copy()
    C[3, 1] = -1e-3
    with pytest.raises(ValueError, match="negative entry"):
        check_attention(C, Sp, C @ Sp @ C.T)
    C[3, 1] = -1e-14
    check_attention(C, Sp, C @ Sp @ C.T)
    rep = check_attention(-np.eye(T), Sp, Sp, raise_error=False)
    assert rep["min_entry"] == -1.0
    with pytest.raises(ValueError, match="shapes differ"):
        check_attention(np.eye(3), np.eye(3), np.eye(4))


def test_sym_sqrt_powers():
    S = espa_kernel(40, 0.2)
    R = sym_sqrt(S)
    np.testing.assert_allclose(R, R.T, rtol=0, atol=1e-14)       # V diag V^T: symmetric to rounding
    np.testing.assert_allclose(R @ R, S, rtol=0, atol=1e-13)
    # S^1/2 S^-1/2 = I: eigh-based, error ~ eps * sqrt(cond(S)) (cond ~ 120 here)
    np.testing.assert_allclose(sym_sqrt(S, 0.5) @ sym_sqrt(S, -0.5), np.eye(40), rtol=0, atol=1e-13)
    with pytest.raises(ValueError, match="positive definite"):
        sym_sqrt(np.diag([1.0, 0.0]))


def test_noncausal_variant_maps_kernel():
    T = 40
    for Sp, Sn in [(np.eye(T), espa_kernel(T, 0.8)), (espa_kernel(T, 0.3), espa_kernel(T, 0.05)),
                   (uspa_kernel(T, 0.2), uspa_kernel(T, 0.7))]:
        A = noncausal_attention(Sp, Sn)
        # eigh-based square roots: error ~ eps * max cond(Sigma) = 2.2e-16 * 919 = 2e-13 here
        # (observed 1.6e-14); 1e-12 (was 1e-11) is 5x that bound
        np.testing.assert_allclose(A @ Sp @ A.T, Sn, rtol=0, atol=1e-12)
        assert A.min() >= -1e-12 * np.abs(A).max()
    S = espa_kernel(T, 0.2)
    np.testing.assert_allclose(sym_sqrt(S) @ sym_sqrt(S), S, rtol=0, atol=1e-13)
