"""Tests for nanospa/signal/attn_bias.py: the E-SPA / U-SPA attention matrices in closed form
(against cholesky.transfer_matrix), their softmax realisation A = diag(D) softmax(B) (bias
B, rescale D, rescale, realise), the O(T) sources espa_bias / uspa_bias and bias_block against
the dense reference of method §7.2, spa_matrix, layer_bias of a plan, prefix consistency and
a finite-width check (docs/method.md §5-§8, §14, §15). All float64."""
from types import SimpleNamespace

import numpy as np
import pytest

from nanospa.config import GPTConfig
from nanospa.signal import (bias_and_rescale, bias_block, check_attention, espa_attention,
                            espa_attention_reference, espa_bias, espa_gammas, espa_kernel,
                            layer_bias, log_attention_from, make_plan, realise, rescale,
                            spa_matrix, transfer_matrix, uspa_attention, uspa_bias,
                            uspa_kernel, uspa_rhos)
from nanospa.signal.kernels import TINY
from nanospa.tensor import Tensor

EPS = np.finfo(np.float64).eps


SOURCE = {"espa": espa_bias, "uspa": uspa_bias}


def dense(parts, T=None):
    """(B, D) dense from a layer's parts (bias_block over the whole square; D None for a
    policy's own dense B, whose D comes with it)."""
    if parts["kind"] == "dense":
        T = len(parts["B"]) if T is None else T
        return bias_block(parts, 0, T, 0, T), None
    T = parts["lse"].size if T is None else T
    return bias_block(parts, 0, T, 0, T), np.exp(parts["lse"][:T])


def split(kind, T, value, prev, out=None):
    """(B, D) of one layer from its one source (espa_bias / uspa_bias)."""
    parts = SOURCE[kind](T, value, prev)
    return bias_block(parts, 0, T, 0, T, out=out), np.exp(parts["lse"])


def log_attention(kind, T, value, prev):
    """log A of one layer: the parts with a zero row normaliser (E-SPA), or log of A."""
    if kind == "uspa":
        return log_attention_from(uspa_attention(T, value, prev))
    return bias_block(dict(espa_bias(T, value, prev), lse=np.zeros(T)), 0, T, 0, T)


def layers(kind, T, L):
    """{"l", "B", "D", "logA"} of every layer of the default schedule."""
    sched = espa_gammas(L) if kind == "espa" else uspa_rhos(L)
    for l in range(1, L + 1):
        B, D = split(kind, T, sched[l], sched[l - 1])
        yield dict(l=l, B=B, D=D, logA=log_attention(kind, T, sched[l], sched[l - 1]))


def schedule(kind, L, T):
    """[(Sigma_{l-1}, Sigma_l, A_l)] for l = 1..L along the default schedule."""
    if kind == "espa":
        g = espa_gammas(L)
        return [(espa_kernel(T, g[l - 1]), espa_kernel(T, g[l]), espa_attention(T, g[l], g[l - 1]))
                for l in range(1, L + 1)]
    r = uspa_rhos(L)
    return [(uspa_kernel(T, r[l - 1]), uspa_kernel(T, r[l]), uspa_attention(T, r[l], r[l - 1]))
            for l in range(1, L + 1)]


def softmax_rows(B, D):
    """diag(D) softmax(B) over the causal entries j <= i, row by row (the reference realise
    is compared with)."""
    T = len(D)
    A = np.zeros((T, T))
    for i in range(T):
        z = np.exp(B[i, :i + 1] - np.max(B[i, :i + 1]))
        A[i, :i + 1] = D[i] * z / z.sum()
    return A


# ---------------------------------------------------------------- closed forms (§6, §7.2)


@pytest.mark.parametrize("kind", ["espa", "uspa"])
def test_closed_form_maps_kernel_and_is_causal_nonnegative(kind):
    for Sigma_prev, Sigma_next, A in schedule(kind, 36, 128):
        # A Sigma_prev A^T = Sigma_next to 1e-12: unit-scale entries, rounding only
        rep = check_attention(A, Sigma_prev, Sigma_next, kernel_atol=1e-12)
        assert rep["upper_max"] == 0.0 and rep["min_entry"] >= 0.0


@pytest.mark.parametrize("kind", ["espa", "uspa"])
def test_propagation_from_identity_ends_at_target(kind):
    T, L = 128, 36
    Sigma = np.eye(T)
    for _, _, A in schedule(kind, L, T):
        Sigma = A @ Sigma @ A.T
    target = espa_kernel(T, 0.005) if kind == "espa" else uspa_kernel(T, 0.8)
    # 36 products of unit-scale matrices, each exact to rounding: 1e-11 is ~500 ulps per layer
    np.testing.assert_allclose(Sigma, target, rtol=0, atol=1e-11)


def test_espa_closed_form_matches_cholesky_random():
    rng = np.random.default_rng(0)
    for _ in range(150):
        T = int(rng.integers(1, 201))
        g, g_prev = np.sort(np.exp(rng.uniform(np.log(1e-5), np.log(7.4), 2)))
        if rng.random() < 0.2:
            g_prev = np.inf                                      # layer 1
        Sp, Sn = espa_kernel(T, g_prev), espa_kernel(T, g)
        A, R = espa_attention(T, g, g_prev), transfer_matrix(Sp, Sn)
        # the closed form itself hits the target to rounding ...
        assert np.abs(A @ Sp @ A.T - Sn).max() < 1e-13
        # ... while the Cholesky route carries the forward error of two factors of kernels
        # with condition numbers up to ~1e7 (small gamma): bound eps sqrt(cond_p cond_n),
        # observed at most 0.03 of it
        tol = 1e-14 + EPS * np.sqrt(np.linalg.cond(Sp) * np.linalg.cond(Sn))
        assert np.abs(A - R).max() <= tol * np.abs(R).max()


def test_uspa_closed_form_matches_cholesky_random():
    rng = np.random.default_rng(1)
    for _ in range(150):
        T = int(rng.integers(1, 201))
        rho_prev, rho = np.sort(rng.uniform(0.0, 0.99, 2))
        A = uspa_attention(T, rho, rho_prev)
        R = transfer_matrix(uspa_kernel(T, rho_prev), uspa_kernel(T, rho))
        # cond <= (1 + 199 * 0.99) / 0.01 ~ 2e4: 1e-12 leaves a factor 20 over eps * cond
        np.testing.assert_allclose(A, R, rtol=0, atol=1e-12)
        assert A.min() >= 0.0


def test_closed_forms_refuse_the_wrong_way():
    """gamma increasing or rho decreasing gives a signed A (test_signal_cholesky.py); the
    closed forms refuse such a step instead of returning it."""
    T = 50
    with pytest.raises(ValueError, match="gamma <= gamma_prev"):
        espa_bias(T, 0.5, 0.2)
    with pytest.raises(ValueError, match="rho >= rho_prev"):
        uspa_attention(T, 0.3, 0.6)
    with pytest.raises(ValueError, match="gammas must be > 0"):
        espa_attention(T, 0.0, np.inf)
    with pytest.raises(ValueError, match="rhos must be in"):
        uspa_attention(T, 1.0, 0.5)


def test_equal_steps_give_identity():
    np.testing.assert_array_equal(espa_attention(20, 0.3, 0.3), np.eye(20))
    np.testing.assert_array_equal(espa_attention(20, np.inf, np.inf), np.eye(20))
    np.testing.assert_array_equal(uspa_attention(20, 0.4, 0.4), np.eye(20))


# ---------------------------------------------------------------- bias and rescale (§8)


@pytest.mark.parametrize("kind", ["espa", "uspa"])
def test_bias_rows_sum_to_one_and_D_at_least_one(kind):
    T = 256
    for layer in layers(kind, T, 36):
        B, D, logA = layer["B"], layer["D"], layer["logA"]
        np.testing.assert_allclose(np.exp(B).sum(axis=1), 1.0, rtol=1e-12)   # softmax(B) rows
        assert B.max() <= 0.0 and np.all(np.isneginf(B[np.triu_indices(T, 1)]))
        assert D[0] == 1.0 and np.all(D >= 1.0 - 1e-15)
        # A = diag(D) softmax(B) reproduces the closed form
        np.testing.assert_allclose(D[:, None] * np.exp(B), np.exp(logA), rtol=1e-12, atol=1e-300)
        B2, D2 = bias_and_rescale(logA)                           # generic log-sum-exp route
        np.testing.assert_allclose(D2, D, rtol=1e-13)
        low = np.tril_indices(T)
        np.testing.assert_allclose(B2[low], B[low], rtol=1e-12, atol=1e-12)


def test_bias_and_rescale_needs_a_finite_entry_per_row():
    logA = np.full((3, 3), -np.inf)
    logA[0, 0] = logA[2, 2] = 0.0
    with pytest.raises(ValueError, match="finite entry"):
        bias_and_rescale(logA)


def test_log_attention_from():
    A = espa_attention(30, 0.2, 0.6)
    logA = log_attention_from(A)
    np.testing.assert_allclose(logA, log_attention("espa", 30, 0.2, 0.6), rtol=1e-13)
    assert np.all(np.isneginf(logA[np.triu_indices(30, 1)]))
    with pytest.raises(ValueError, match="lower triangular"):
        log_attention_from(A.T)
    with pytest.raises(ValueError, match="negative entry"):
        log_attention_from(-np.eye(3))


def test_rescale_scales_row_i_by_D_i():
    """diag(D) X on (..., T, k) arrays with T <= len(D), and on an engine Tensor (the model's
    attention output)."""
    rng = np.random.default_rng(0)
    D = rng.uniform(1.0, 2.0, 9)
    X = rng.standard_normal((2, 3, 6, 5))                          # (B, H, T, k), T = 6 < 9
    expected = np.einsum("i,bhik->bhik", D[:6], X)
    np.testing.assert_array_equal(rescale(X, D), expected)
    np.testing.assert_array_equal(rescale(X[0, 0], D), np.diag(D[:6]) @ X[0, 0])
    out = rescale(Tensor(X), D)
    assert isinstance(out, Tensor)
    np.testing.assert_array_equal(out.data, expected)


@pytest.mark.parametrize("kind", ["espa", "uspa"])
def test_realise_is_diag_D_softmax_B_and_reproduces_the_closed_form(kind):
    T, L = 64, 6
    sched = espa_gammas(L) if kind == "espa" else uspa_rhos(L)
    closed = espa_attention if kind == "espa" else uspa_attention
    for l in (1, 3, L):
        B, D = split(kind, T, sched[l], sched[l - 1])
        A = realise(B, D)
        # against an independent row-by-row diag(D) softmax(B) over j <= i: same operations
        # in another order, a few ulps (relative)
        np.testing.assert_allclose(A, softmax_rows(B, D), rtol=1e-14, atol=0)
        # against the closed form: exp of a difference of logs, observed 3e-15 relative
        np.testing.assert_allclose(A, np.maximum(closed(T, sched[l], sched[l - 1]), 0.0),
                                   rtol=1e-13, atol=TINY)
        assert np.all(np.triu(A, 1) == 0.0) and A.min() >= 0.0
        # the first T' positions: the same matrix (prefix consistent); the longer rows add
        # exact zeros to the softmax sums but may regroup them: an ulp or two
        np.testing.assert_allclose(realise(B, D, 17), A[:17, :17], rtol=1e-14, atol=0)
        # whatever B holds above the diagonal is ignored (the model stores tril(B))
        np.testing.assert_array_equal(realise(np.tril(B), D), A)


def test_realise_flushes_below_tiny():
    """E-SPA layer 1 with a large gamma: e^{-gamma (i - j)} spans the subnormal range;
    realise returns exact zeros there, never subnormals."""
    T, g = 200, 5.0
    B, D = split("espa", T, g, np.inf)
    A = realise(B, D)
    nz = A[A != 0]
    assert nz.min() >= TINY and np.count_nonzero(A) < T * (T + 1) // 2
    # every entry e^{-5 (i-j)} above TINY is kept: distance <= floor(log(1/TINY) / 5) = 115
    assert A[115, 0] > 0 and A[150, 0] == 0.0


@pytest.mark.parametrize("kind", ["espa", "uspa"])
def test_spa_matrix_is_the_closed_form(kind):
    T, L = 48, 8
    sched = espa_gammas(L) if kind == "espa" else uspa_rhos(L)
    target = espa_kernel if kind == "espa" else uspa_kernel
    for l in range(1, L + 1):
        A = spa_matrix(kind, T, sched[l], sched[l - 1])
        assert A.min() >= 0.0 and np.all(np.triu(A, 1) == 0.0)
        assert np.all((A == 0) | (A >= TINY))                      # no subnormals
        np.testing.assert_allclose(A, realise(*split(kind, T, sched[l], sched[l - 1])), rtol=1e-13, atol=TINY)
        R = transfer_matrix(target(T, sched[l - 1]), target(T, sched[l]))
        # Cholesky reference: kernels with cond < 1e3 here, 1e-12 is eps * cond with margin
        np.testing.assert_allclose(A, R, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="kind"):
        spa_matrix("softmax", T, 0.1, 0.2)


def test_prefix_consistency():
    """Built once at T_max and sliced, A, B and D equal the objects built at t (method §5)."""
    T_max, (g, gp), (r, rp) = 96, espa_gammas(12)[[5, 4]], uspa_rhos(12)[[5, 4]]
    big = {"espa": (log_attention("espa", T_max, g, gp), *split("espa", T_max, g, gp)),
           "uspa": (log_attention("uspa", T_max, r, rp), *split("uspa", T_max, r, rp))}
    for t in (1, 2, 17, 95):
        small = {"espa": (log_attention("espa", t, g, gp), *split("espa", t, g, gp)),
                 "uspa": (log_attention("uspa", t, r, rp), *split("uspa", t, r, rp))}
        # E-SPA entries are elementwise formulas of (i, j): bit-identical
        for x, y in zip(big["espa"], small["espa"]):
            np.testing.assert_array_equal(x[:t, :t] if x.ndim == 2 else x[:t], y)
        # U-SPA D is a row sum; a longer row adds exact zeros but may regroup the pairwise
        # summation, so allow a few ulps
        for x, y in zip(big["uspa"], small["uspa"]):
            np.testing.assert_allclose(x[:t, :t] if x.ndim == 2 else x[:t], y, rtol=1e-14)


def test_method_15_check_T2048():
    """Method §15: at T = 2048, layer 1 (L = 36, gamma_L = 0.005) has finite B and D in
    [1, 1.436]."""
    T, g = 2048, espa_gammas(36, 0.005)
    B, D = split("espa", T, g[1], g[0])
    assert np.array_equal(np.isfinite(B), np.tri(T, dtype=bool))
    assert D.min() == 1.0
    assert D.max() == pytest.approx(1.436, abs=5e-4)             # quoted to 3 decimals


@pytest.mark.slow
def test_finite_at_T16384():
    """No underflow in log space at T = 16384 for layer 1 and the last layer of a 36-layer
    schedule (built with exp, layer 1 underflows at distances above ~670). Every entry of
    the (T, T) B, made by bias_block in bands of 1024 rows into one 128 MB buffer (each row
    is the same arithmetic as in the whole square): the whole square's 2 GB cost 20 to 30 s
    of first-touch page faults on the 2-core machine."""
    T, g, rows = 16384, espa_gammas(36), 1024
    band = np.empty((rows, T))
    for l in (1, 36):
        parts = SOURCE["espa"](T, g[l], g[l - 1])
        for i0 in range(0, T, rows):
            B = bias_block(parts, i0, i0 + rows, 0, T, out=band)
            lower = np.arange(T)[None, :] <= np.arange(i0, i0 + rows)[:, None]
            assert np.array_equal(np.isfinite(B), lower)         # finite exactly on j <= i
            assert B.max() <= 0.0
        D = np.exp(parts["lse"])
        assert np.all(np.isfinite(D)) and D.min() == 1.0


# ---------------------------------------------------------------- per-layer build


@pytest.mark.parametrize("kind", ["espa", "uspa"])
def test_layer_bias_follows_the_schedule(kind):
    """A plan without overrides (read by duck typing): block l gets the closed form along
    plan.schedule, for the first T positions (default block_size)."""
    L, T = 5, 24
    sched = tuple(espa_gammas(L, 0.05) if kind == "espa" else uspa_rhos(L, 0.6))
    plan = SimpleNamespace(kind=kind, schedule=sched, overrides=None, block_size=T)
    for l in range(1, L + 1):
        B, D = dense(*layer_bias(plan, l)[:1])[0], layer_bias(plan, l)[1]
        ref = split(kind, T, sched[l], sched[l - 1])
        np.testing.assert_array_equal(B, ref[0])
        np.testing.assert_array_equal(D, ref[1])
        B8, D8 = dense(layer_bias(plan, l, 8)[0])[0], layer_bias(plan, l, 8)[1]
        assert B8.shape == (8, 8) and D8.shape == (8,)
        np.testing.assert_array_equal(B8, B[:8, :8])
        np.testing.assert_array_equal(D8, D[:8])


def test_layer_bias_takes_the_plans_overrides():
    """Where a policy moved A_l off the closed form (here qpreserve's D_l, and a hand-made
    mix of None and (B, D) entries), layer_bias returns the plan's own (B_l, D_l), sliced."""
    cfg = GPTConfig(block_size=16, n_layer=4, n_head=2, n_embd=16, kernel_budget="qpreserve",
                    gamma_final=0.05, eta=0.6)
    plan = make_plan(cfg)
    ind = make_plan(GPTConfig(**{**cfg.to_dict(), "kernel_budget": "independent"}))
    assert ind.overrides is None and plan.overrides is not None and len(plan.overrides) == 4
    for l in range(1, 5):
        parts, D = layer_bias(plan, l)
        B = dense(parts)[0]
        assert plan.overrides[l - 1][0] is None                   # qpreserve moves D only: B_l
        np.testing.assert_array_equal(D, plan.overrides[l - 1][1])  # stays O(T) closed form
        parts_ind, D_ind = layer_bias(ind, l)
        np.testing.assert_array_equal(B, dense(parts_ind)[0])              # qpreserve keeps B, moves D
        # ... except at layer 1, where the incoming kernel is I and A_1 A_1^T = Sigma_1
        # already has unit diagonal: the same D (to rounding)
        if l == 1:
            np.testing.assert_allclose(D, D_ind, rtol=1e-14)
        else:
            assert np.abs(D - D_ind).max() > 0.1
        parts5, D5 = layer_bias(plan, l, 5)
        np.testing.assert_array_equal(dense(parts5)[0], B[:5, :5])
        np.testing.assert_array_equal(D5, D[:5])
    # per-layer mix: layer 1 closed form, layer 2 the override
    sched = plan.schedule[:3]
    B_own = np.where(np.tri(16, dtype=bool), -np.log(np.arange(1, 17))[:, None], -np.inf)
    D_own = np.full(16, 2.0)                                  # 2 x uniform causal attention
    mixed = SimpleNamespace(kind="espa", schedule=sched, block_size=16, overrides=(None, (B_own, D_own)))
    np.testing.assert_array_equal(dense(layer_bias(mixed, 1)[0])[0], split("espa", 16, sched[1], sched[0])[0])
    parts2, D2 = layer_bias(mixed, 2)
    B2 = dense(parts2, 16)[0]
    assert parts2["kind"] == "dense" and np.array_equal(B2, B_own) and np.array_equal(D2, D_own)
    np.testing.assert_allclose(realise(B2, D2), 2.0 * np.tri(16) / np.arange(1, 17)[:, None], rtol=1e-14)


# ---------------------------------------------------------------- finite width


def spa_mha(X, Wq, Wk, Wv, Wo, B, D, H):
    """One SPA attention sublayer (method §2.1). X (T, d); B (T, T), -inf above the diagonal."""
    T, d = X.shape
    dk = d // H
    split = lambda Y: Y.reshape(T, H, dk).transpose(1, 0, 2)          # (T, d) -> (H, T, dk)
    q, k, v = split(X @ Wq), split(X @ Wk), split(X @ Wv)
    logits = q @ k.transpose(0, 2, 1) / np.sqrt(dk) + B              # (H, T, T)
    P = np.exp(logits - logits.max(axis=-1, keepdims=True))
    P /= P.sum(axis=-1, keepdims=True)
    Y = D[:, None] * (P @ v)                                         # (H, T, dk)
    return Y.transpose(1, 0, 2).reshape(T, d) @ Wo                   # (T, d)


@pytest.mark.parametrize("kind", ["espa", "uspa"])
def test_finite_width_network_reproduces_targets(kind):
    """W^Q = 0, orthogonal W^V, W^O, X X^T / d = I: the recursion is exact at finite width
    (method §3.2), so 12 layers hit every Sigma_l to rounding."""
    rng = np.random.default_rng(0)
    T, d, H, L = 32, 256, 4, 12
    orth = lambda: np.linalg.qr(rng.standard_normal((d, d)))[0]
    X = np.sqrt(d) * orth()[:T]                                    # rows orthogonal, norm^2 d
    Sigma = X @ X.T / d
    np.testing.assert_allclose(Sigma, np.eye(T), atol=1e-13)
    targets = ([espa_kernel(T, g) for g in espa_gammas(L)] if kind == "espa"
               else [uspa_kernel(T, r) for r in uspa_rhos(L)])
    for layer in layers(kind, T, L):
        Wk = rng.standard_normal((d, d)) / np.sqrt(d)
        X = spa_mha(X, np.zeros((d, d)), Wk, orth(), orth(), layer["B"], layer["D"], H)
        # 12 layers of unit-scale matmuls over d = 256: rounding ~1e-14, 1e-12 is the brief
        np.testing.assert_allclose(X @ X.T / d, targets[layer["l"]], rtol=0, atol=1e-12)


# ---------------------------------------------------------------- O(T) parts and blocks of B


def _random_blocks(rng, T, n):
    """n random (i0, i1, j0, j1) with 0 <= i0 < i1 <= T, 0 <= j0 < j1 <= T, plus the whole
    square, a diagonal block, the first column and the last row."""
    out = [(0, T, 0, T), (3, T - 2, 3, T - 2), (0, T, 0, 1), (T - 1, T, 0, T)]
    for _ in range(n):
        i0, i1 = np.sort(rng.choice(T + 1, 2, replace=False))
        j0, j1 = np.sort(rng.choice(T + 1, 2, replace=False))
        out.append((int(i0), int(i1), int(j0), int(j1)))
    return out


@pytest.mark.parametrize("kind", ["espa", "uspa"])
def test_bias_block_is_the_slice_of_the_dense_closed_form(kind):
    """Any block of B generated from the O(T) parts equals the slice of the dense B bit for
    bit (the same float64 operations per entry), and rounds once to float32 like it; D_l is
    exp(lse). Layers 1, 2 and L of a schedule, and the identity step."""
    rng = np.random.default_rng(5)
    T, L = 37, 6
    sched = espa_gammas(L, 0.05) if kind == "espa" else uspa_rhos(L, 0.7)
    steps = [(sched[1], sched[0]), (sched[2], sched[1]), (sched[L], sched[L - 1]), (sched[3], sched[3])]
    for value, prev in steps:
        parts = SOURCE[kind](T, value, prev)
        assert all(np.ndim(a) == 1 and np.size(a) < 2 * T for a in parts.values() if isinstance(a, np.ndarray))
        B, D = split(kind, T, value, prev)
        np.testing.assert_array_equal(np.exp(parts["lse"]), D)
        for i0, i1, j0, j1 in _random_blocks(rng, T, 30):
            block = bias_block(parts, i0, i1, j0, j1)
            assert block.shape == (i1 - i0, j1 - j0) and block.dtype == np.float64
            np.testing.assert_array_equal(block, B[i0:i1, j0:j1])
            np.testing.assert_array_equal(bias_block(parts, i0, i1, j0, j1, np.float32),
                                          B[i0:i1, j0:j1].astype(np.float32))


def test_bias_block_against_the_definitions():
    """Independently of the dense builders: E-SPA's block from v[i - j], c and lse by the
    definition in espa_bias' docstring; U-SPA's from phi_j - psi_i and diag_i; -inf above
    the diagonal; a dense part is sliced."""
    T, g, gp = 20, 0.3, 0.9
    parts = espa_bias(T, g, gp)
    v, c, logD = parts["u"][T - 1::-1], parts["c"], parts["lse"]     # u is v reversed, padded
    block = bias_block(parts, 2, 19, 0, 11)
    for a, i in enumerate(range(2, 19)):
        for b, j in enumerate(range(0, 11)):
            want = -np.inf if j > i else (c[i] if j == 0 else v[i - j]) - logD[i]
            assert block[a, b] == want
    u = uspa_bias(T, 0.5, 0.2)
    block = bias_block(u, 4, 12, 3, 15)
    for a, i in enumerate(range(4, 12)):
        for b, j in enumerate(range(3, 15)):
            A = u["diag"][i] if i == j else (u["phi"][j] - u["psi"][i] if j < i else 0.0)
            if A > 0:
                assert block[a, b] == pytest.approx(np.log(A) - u["lse"][i], rel=1e-15, abs=1e-15)
            else:
                assert block[a, b] == -np.inf
    B = np.arange(36.0).reshape(6, 6)
    np.testing.assert_array_equal(bias_block({"kind": "dense", "B": B}, 1, 4, 2, 6), B[1:4, 2:6])
    with pytest.raises(ValueError, match="kind"):
        bias_block({"kind": "softmax"}, 0, 1, 0, 1)


def test_uspa_row_sums_in_O_T_match_the_dense_row_sums():
    """D_i = diag_i + sum_{j<i} phi_j - i psi_i (summed in extended precision) against the
    row sums of the dense A at T = 2048, where a float64 cumulative sum of the nearly
    cancelling terms was off by 4e-12 relative (observed with np.longdouble: 4e-16)."""
    from nanospa.signal.attn_bias import _uspa_block
    rho = uspa_rhos(36, 0.8)
    for l in (1, 2, 36):
        p = uspa_bias(2048, rho[l], rho[l - 1])
        D = _uspa_block(p, 0, 2048, 0, 2048).sum(axis=1)
        np.testing.assert_allclose(np.exp(p["lse"]), D, rtol=1e-14 if np.finfo(np.longdouble).eps < EPS else 5e-12)


def test_layer_bias_is_O_T_at_T16384():
    """A 36-layer plan at T = 16384 keeps O(T) numbers per layer: parts and D_l of block l
    from layer_bias, whose blocks are those of a plan of block_size 40 (prefix consistent)."""
    L = 36
    sched = tuple(espa_gammas(L))
    plan = SimpleNamespace(kind="espa", schedule=sched, overrides=None, block_size=16384)
    nbytes = 0
    for l in range(1, L + 1):
        parts, D = layer_bias(plan, l)
        nbytes += D.nbytes + sum(a.nbytes for a in parts.values() if isinstance(a, np.ndarray))
    assert nbytes < L * 5 * 16384 * 8                              # (2T - 1) + T + T + T float64s
    small = SimpleNamespace(kind="espa", schedule=sched, overrides=None, block_size=40)
    parts, D = layer_bias(plan, 7)
    B, D40 = dense(layer_bias(small, 7)[0])
    np.testing.assert_array_equal(bias_block(parts, 0, 40, 0, 40), B)   # prefix consistent
    np.testing.assert_array_equal(D[:40], D40)


# ---------------------------------------------------------------- the dense reference of §7.2

@pytest.mark.parametrize("T, gamma, gamma_prev", [(1, 0.3, np.inf), (40, 0.3, np.inf), (40, 0.05, 0.3),
                                                  (40, 0.2, 0.2), (64, 1.06, np.inf), (64, 0.005, 0.011)])
def test_espa_bias_is_the_dense_reference_of_method_7_2(T, gamma, gamma_prev):
    """The O(T) source of E-SPA's B_l and D_l against A_l written entry by entry from
    docs/method.md §7.2 (espa_attention_reference): B = log A - log(row sums of A) on j <= i,
    -inf above, and D = the row sums. Tolerance: the reference sums T exponentials per row
    with exp in float64 and the source works with logs; both are a few ulps of entries of
    size 1 (observed up to 6.4e-15 absolute in log space, 4.4e-16 relative in D), whatever BLAS or SIMD path (no BLAS call,
    no reduction longer than a row). 1e-12: two orders of margin, far below any change of
    gamma that matters (a relative change of 1e-9 in gamma moves B by ~1e-9 at T = 64)."""
    A = espa_attention_reference(T, gamma, gamma_prev)
    B, D = split("espa", T, gamma, gamma_prev)
    low = np.tril(np.ones((T, T), dtype=bool)) & (A > 0)
    np.testing.assert_allclose(D, A.sum(axis=1), rtol=1e-12, atol=0)
    with np.errstate(divide="ignore"):
        ref = np.log(A) - np.log(A.sum(axis=1, keepdims=True))
    np.testing.assert_allclose(B[low], ref[low], rtol=0, atol=1e-12)
    assert np.all(np.isneginf(B[np.triu_indices(T, 1)]))
    assert np.all(np.isneginf(B[np.tril(np.ones((T, T), dtype=bool)) & (A == 0)]))   # A = I: zero entries


def test_the_reference_check_catches_a_planted_change(monkeypatch):
    """A constant of the source moved by 1e-9 relative (gamma inside espa_bias) is seen."""
    from nanospa.signal import attn_bias
    real = attn_bias.espa_bias
    monkeypatch.setattr(attn_bias, "espa_bias", lambda T, g, gp: real(T, g * (1 + 1e-9), gp))
    T, g, gp = 64, 0.05, 0.3
    A = espa_attention_reference(T, g, gp)
    B = bias_block(attn_bias.espa_bias(T, g, gp), 0, T, 0, T)
    low = np.tri(T, dtype=bool)
    assert np.abs(B[low] - (np.log(A) - np.log(A.sum(axis=1, keepdims=True)))[low]).max() > 1e-11
