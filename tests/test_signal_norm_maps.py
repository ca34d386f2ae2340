"""nanospa/signal/beyond/norm_maps.py (with batch_input_kernel) and predict_kernels(batch=B): the
BatchNorm map's integral against closed forms and Monte Carlo, the causal map's Monte Carlo
against the exact one where their windows agree, the running-statistics, PRepBN and
GroupNorm maps, and the predictions against wide random models (BatchNorm with batch
statistics on the kernel of the whole batch; GroupNorm, PRepBN at init and BatchNorm in
evaluation mode per sequence). Tolerances: tests/test_predict.py's tol and q_tol."""
import math

import numpy as np
import pytest

from nanospa import GPT, GPTConfig
from nanospa.beyond.norms import measured_batch_kernels
from nanospa.measure import measured_kernels
from nanospa.predict import predict_kernels
from nanospa.signal import kernels
from nanospa.signal.maps import input_kernel
from nanospa.signal.beyond.norm_maps import (BATCH_NORM_EPS, batch_attention, batch_input_kernel, batchnorm_map,
                                             causal_batchnorm_map, init_norm_map, running_batchnorm_map)
from test_predict import distinct_batch, max_errors, q_tol, tol, wide

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:norm=.* with norm_causal=False")]
WIDTH = 1024
B = 4


def gaussian_columns(K, n, seed):
    w, V = np.linalg.eigh(K)
    return np.random.default_rng(seed).standard_normal((n, K.shape[0])) @ (V * np.sqrt(np.clip(w, 0, None))).T


def low_rank_kernel(N=12, rank=3, seed=0):
    A = np.random.default_rng(seed).standard_normal((N, rank))
    return A @ A.T / rank + 0.05 * np.eye(N)


# ------------------------------------------------------------------ the maps

def test_batchnorm_map_of_an_isotropic_kernel_is_the_scaled_projector():
    """K = I: P x is isotropic in the N - 1 centred directions with |y|^2 = N exactly (eps 0),
    so E[y y^T] = N / (N - 1) P; with eps the integral against one-dimensional quadrature."""
    N = 10
    P = np.eye(N) - 1.0 / N
    np.testing.assert_allclose(batchnorm_map(np.eye(N), eps=0.0), N / (N - 1) * P, atol=1e-13)
    # eps > 0: E[y y^T] = E[N s / (s + N eps)] P / (N - 1), s = |z|^2 ~ chi^2 with k = N - 1
    # degrees of freedom; the mean by the trapezoidal rule in log s (s pdf(s) = (s/2)^(k/2)
    # exp(-s/2) / Gamma(k/2)), independent of the map's integral over u
    k, eps, h = N - 1, 0.3, 1e-3
    s = np.exp(np.arange(-60.0, 8.0, h))
    density = np.exp(k / 2 * np.log(s / 2) - s / 2 - math.lgamma(k / 2))
    mean = h * np.sum(density * N * s / (s + N * eps))
    np.testing.assert_allclose(batchnorm_map(np.eye(N), eps=eps), mean / k * P, rtol=1e-10)


def test_batchnorm_map_against_monte_carlo_and_the_concentrated_approximation():
    """A low-rank kernel, where a column's variance does not concentrate: the exact map agrees
    with 200000 sampled columns within 5 standard errors of each entry, the concentrated
    P K P / (tr / N + eps) misses by far more."""
    K = low_rank_kernel()
    X = gaussian_columns(K, 200_000, seed=1)
    Xc = X - X.mean(axis=1, keepdims=True)
    Y = Xc / np.sqrt((Xc * Xc).mean(axis=1, keepdims=True) + BATCH_NORM_EPS)
    prods = Y[:, :, None] * Y[:, None, :]
    mc, se = prods.mean(axis=0), prods.std(axis=0) / np.sqrt(len(Y))
    exact = batchnorm_map(K)
    assert np.all(np.abs(exact - mc) < 5 * se + 1e-12)
    assert np.abs(batchnorm_map(K, concentrated=True) - exact).max() > 20 * se.max()


def test_causal_map_agrees_with_the_exact_one_at_the_last_position():
    """At t = T - 1 the causal window is the whole batch, so there the causal and plain
    BatchNorm outputs coincide: their kernels between last positions agree within the Monte
    Carlo error; earlier positions differ (the windows do)."""
    T = 4
    K = low_rank_kernel(N=B * T, rank=5, seed=2)
    n = 100_000
    causal = causal_batchnorm_map(K, B, n_samples=n, seed=3)
    exact = batchnorm_map(K)
    last = np.arange(B) * T + T - 1
    err = np.abs(causal[np.ix_(last, last)] - exact[np.ix_(last, last)]).max()
    assert err < 5 * np.sqrt(np.abs(exact[np.ix_(last, last)]).max() ** 2 * 3 / n) + 1e-3
    first = np.arange(B) * T
    assert np.abs(causal[np.ix_(first, first)] - exact[np.ix_(first, first)]).max() > 0.1
    np.testing.assert_array_equal(causal, causal_batchnorm_map(K, B, n_samples=n, seed=3))   # seeded


def test_running_prepbn_and_groupnorm_maps():
    S = low_rank_kernel(N=6) + np.eye(6)
    np.testing.assert_allclose(running_batchnorm_map(S), S / (1 + BATCH_NORM_EPS), rtol=1e-15)
    with pytest.raises(ValueError, match="zero running mean"):
        running_batchnorm_map(S, mean=0.5)
    C = kernels.normalised_kernel(S)
    cfg = lambda **kw: GPTConfig(**kw)
    np.testing.assert_array_equal(init_norm_map(S, cfg(norm="groupnorm", norm_groups=8)), C)
    np.testing.assert_array_equal(init_norm_map(S, cfg(norm="prepbn", prepbn_steps=10), batch=2), C)
    np.testing.assert_allclose(init_norm_map(S, cfg(norm="prepbn", prepbn_steps=0)),
                               S * (1 + 1 / np.sqrt(1 + BATCH_NORM_EPS)) ** 2, rtol=1e-15)
    np.testing.assert_allclose(init_norm_map(S, cfg(norm="prepbn", prepbn_steps=0, prepbn_eta=0.5)),
                               S * (0.5 + 1 / np.sqrt(1 + BATCH_NORM_EPS)) ** 2, rtol=1e-15)
    with pytest.raises(NotImplementedError, match="prepbn_steps=0"):
        init_norm_map(S, cfg(norm="prepbn", prepbn_steps=0), batch=2)
    np.testing.assert_array_equal(init_norm_map(S, cfg(norm="batchnorm")), running_batchnorm_map(S))
    np.testing.assert_array_equal(init_norm_map(S, cfg(norm="batchnorm"), batch=2), batchnorm_map(S))


def test_batch_input_kernel_and_batch_attention():
    tokens = np.array([[0, 1, 2], [2, 1, 5]])
    K = batch_input_kernel(tokens, pos="learned")
    assert K.shape == (6, 6)
    for b in range(2):
        np.testing.assert_array_equal(K[3 * b: 3 * b + 3, 3 * b: 3 * b + 3], input_kernel(tokens[b], pos="learned"))
    # between sequences: the same position (0.5), the same id (0.5), both (1), neither (0)
    assert (K[0, 3 + 0], K[2, 3 + 0], K[1, 3 + 1], K[0, 3 + 1]) == (0.5, 0.5, 1.0, 0.0)
    A = np.tril(np.ones((3, 3))) / np.arange(1, 4)[:, None]
    np.testing.assert_array_equal(batch_attention(A, 2)[3:, 3:], A)
    assert not batch_attention(A, 2)[:3, 3:].any()


def test_a_batch_walk_without_batch_norms_is_the_per_sequence_walk_on_the_blocks():
    cfg = GPTConfig(block_size=8, n_layer=3, residual="standard", norm="layernorm", activation="tat_lrelu",
                    kernel_budget="independent", eta=0.5, gamma_final=0.05)
    tokens = np.random.default_rng(0).integers(0, 5, size=(3, 8))
    pred = predict_kernels(cfg, sigma_0=batch_input_kernel(tokens), batch=3)
    for b in range(3):
        alone = predict_kernels(cfg, sigma_0=input_kernel(tokens[b]))
        np.testing.assert_allclose(pred.kernel(3)[8 * b: 8 * b + 8, 8 * b: 8 * b + 8], alone.kernel(3), rtol=1e-12, atol=1e-14)
    with pytest.raises(ValueError, match="fixed attention matrix"):
        predict_kernels(GPTConfig(block_size=8, n_layer=1, attention="softmax"), sigma_0=np.eye(16), batch=2)
    with pytest.raises(ValueError, match="times batch=3"):
        predict_kernels(cfg, sigma_0=np.eye(16), batch=3)


# ------------------------------------------------------------------ against wide networks

def batch_errors(cfg, seed=0):
    """Training mode, kernels of the whole batch: the largest |C_pred - C_meas| of the
    sequences' mean kernel (diagonal blocks), |q_meas / q_pred - 1| of it, and the largest
    error of the mean kernel between different sequences (off-diagonal blocks, unnormalised),
    over every block's attention branch and output."""
    model = GPT(cfg, seed=seed)
    idx = distinct_batch(cfg, B, seed)
    pred = predict_kernels(cfg, sigma_0=batch_input_kernel(idx, pos=cfg.pos, n_embd=cfg.n_embd), plan=model.plan,
                           batch=B)
    meas = measured_batch_kernels(model, idx)
    T = cfg.block_size
    blocks = lambda K: K.reshape(B, T, B, T).transpose(0, 2, 1, 3)             # [b, b'] -> (T, T)
    diag = lambda K: np.mean([blocks(K)[b, b] for b in range(B)], axis=0)
    cross = lambda K: np.mean([blocks(K)[b, c] for b in range(B) for c in range(B) if b != c], axis=0)
    c_err = q_err = x_err = 0.0
    for l in range(1, cfg.n_layer + 1):
        for P, M in ((pred.kernel(l, "attn_branch"), meas["attn_branch"][l - 1]), (pred.kernel(l), meas["hidden"][l])):
            c_err = max(c_err, np.abs(kernels.normalised_kernel(diag(P)) - kernels.normalised_kernel(diag(M))).max())
            q_err = max(q_err, np.abs(np.diag(diag(M)) / np.diag(diag(P)) - 1.0).max())
            x_err = max(x_err, np.abs(cross(P) - cross(M)).max() / np.diag(diag(P)).mean())
    return c_err, q_err, x_err


@pytest.mark.parametrize("extra", [dict(residual="standard", norm="batchnorm"),
                                   dict(residual="none", norm="batchnorm"),
                                   dict(residual="standard", norm="batchnorm", norm_position="post"),
                                   dict(residual="standard", norm="batchnorm", norm_causal=True)])
def test_batchnorm_with_batch_statistics_matches_a_wide_network(extra):
    """Width 1024, B = 4 sequences of T = 16: the batch statistics couple the sequences, so
    the kernels between them are checked too (post-norm: an approximation, see norm_maps)."""
    cfg = wide(**extra)
    c_err, q_err, x_err = batch_errors(cfg)
    assert c_err < tol(WIDTH) and q_err < q_tol(cfg) and x_err < tol(WIDTH)


@pytest.mark.parametrize("extra", [dict(residual="standard", norm="groupnorm", norm_groups=4),
                                   dict(residual="standard", norm="groupnorm", norm_groups=8, norm_position="post"),
                                   dict(residual="standard", norm="prepbn", norm_causal=True)])
def test_groupnorm_and_prepbn_at_init_match_a_wide_network(extra):
    """Width 512 (128 or 64 channels a group): GroupNorm's and PRepBN's (lambda = 1) map is
    LayerNorm's."""
    width = 512
    cfg = wide(n_embd=width, **extra)
    c_err, q_err = max_errors(cfg)
    assert c_err < tol(width) and q_err < q_tol(cfg)


def test_batchnorm_in_evaluation_mode_at_init_matches_a_wide_network():
    """Running statistics 0 and 1: x / sqrt(1 + eps) per sequence, what train.py measures."""
    width = 512
    cfg = wide(n_embd=width, residual="standard", norm="batchnorm")
    model = GPT(cfg).eval()
    pred = predict_kernels(cfg, plan=model.plan)
    meas = measured_kernels(model, distinct_batch(cfg, B))
    for l in range(1, cfg.n_layer + 1):
        P, M = pred.kernel(l), meas["hidden"][l]
        assert np.abs(kernels.normalised_kernel(P) - kernels.normalised_kernel(M)).max() < tol(width)
        assert np.abs(np.diag(M) / np.diag(P) - 1.0).max() < q_tol(cfg)
