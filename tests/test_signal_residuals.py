"""The wide-limit kernel maps of DeepNorm, RealFormer and nGPT at initialisation
(nanospa/signal/maps.py, predict.py; docs/residuals.md §4): the maps against their formulas,
then the predictions against the kernels of wide random models (nanospa/measure.py), as
tests/test_predict.py does for the paper's variants; each comparison is paired with a
wrong map (the scheme's own factor left out) that the same measurement rejects."""
from dataclasses import replace

import numpy as np
import pytest

from nanospa import GPT, GPTConfig
from nanospa.measure import measured_kernels
from nanospa.signal import cholesky, kernels
from nanospa.beyond.ngpt import NGPTMaps
from nanospa.predict import predict_kernels
from nanospa.signal import make_plan
from nanospa.signal.collapse import softmax_attention_map
from nanospa.signal.maps import MLPMap
from nanospa.signal.walks import WalkMaps

pytestmark = pytest.mark.slow       # the full suite only: python -m pytest -m 'not slow' skips it

DEEPNORM = dict(residual="deepnorm", norm="layernorm", norm_position="post")
NGPT = dict(residual="ngpt", attention="softmax", activation="swish")
GELU = dict(activation="gelu", method=None)
SWISH = dict(activation="swish", method=None)


def wide(width, **kw):
    base = dict(vocab_size=64, block_size=16, n_layer=4, n_head=4, n_embd=width, dtype="float64",
                mlp_ratio=1)
    base.update(kw)
    return GPTConfig(**base)


def tol(width):
    """4 d^-1/2, tests/test_predict.py's bound on one entry's finite-width error."""
    return 4.0 / np.sqrt(width)


def layer_errors(model, pred, B=4, seed=0):
    """Per block l: (C error of the attention branch, of the block output, q error of the block
    output): the largest |C_pred - C_meas| of the normalised kernels, |q_meas / q_pred - 1|."""
    cfg = model.config
    rng = np.random.default_rng(seed)
    idx = np.stack([rng.permutation(cfg.vocab_size)[:cfg.block_size] for _ in range(B)])
    meas = measured_kernels(model, idx)
    C = kernels.normalised_kernel
    out = []
    for l in range(1, cfg.n_layer + 1):
        P, M = pred.kernel(l), meas["hidden"][l]
        out.append((np.abs(C(pred.kernel(l, "attn_branch")) - C(meas["attn_branch"][l - 1])).max(),
                    np.abs(C(P) - C(M)).max(), np.abs(np.diag(M) / np.diag(P) - 1.0).max()))
    return np.array(out)


# ------------------------------------------------------------------ the maps

def test_deepnorm_block_maps():
    """Post-LN with alpha^2 on the stream's kernel, beta^4 on the attention branch (W^V, W^O),
    beta^2 F(beta^2 Sigma) for the MLP (W_1, W_2)."""
    N = 3
    cfg = wide(32, n_layer=N, attention="softmax", zero_query=True, activation="gelu", **DEEPNORM)
    maps = WalkMaps(cfg, GELU)
    rng = np.random.default_rng(0)
    X = rng.standard_normal((5, 9))
    S = X @ X.T / 9
    h = kernels.normalised_kernel(S) * 0.7
    alpha2, beta2 = np.sqrt(2 * N), 1 / np.sqrt(8 * N)
    np.testing.assert_allclose(maps.combine(S, h), kernels.normalised_kernel(alpha2 * S + h), rtol=1e-14)
    A = np.tril(rng.random((5, 5)))
    np.testing.assert_allclose(maps.scale_attention(A @ S @ A.T), beta2 ** 2 * A @ S @ A.T, rtol=1e-14)
    np.testing.assert_allclose(maps.mlp(S), beta2 * MLPMap(GELU)(beta2 * S), rtol=1e-14)
    assert maps.branch_input(S) is S                               # Post-LN: the branch sees X


def test_ngpt_maps():
    """Embedding C_0 / d; the normalised interpolation; the gated MLP m Sigma o F(d Sigma)
    against a Monte Carlo of u phi(nu) with u, nu ~ N(0, Sigma), N(0, d Sigma) independent."""
    d = 64
    cfg = wide(d, mlp_ratio=2, **NGPT)
    maps = NGPTMaps(cfg, make_plan(cfg))
    assert maps.alpha == 0.05 and maps.mlp_map.activation == SWISH
    c = 0.3
    C = np.array([[1.0, c], [c, 1.0]])
    np.testing.assert_allclose(maps.embedding(2.0 * C), C / d, rtol=1e-15)
    H = np.array([[1.0, 0.8], [0.8, 1.0]]) * 5.0
    K = 0.95 ** 2 * C + 0.05 ** 2 * np.array([[1.0, 0.8], [0.8, 1.0]])
    np.testing.assert_allclose(maps.combine(C / d, H), kernels.normalised_kernel(K) / d, rtol=1e-14)
    rng = np.random.default_rng(0)
    n = 2_000_000
    u = rng.standard_normal((n, 2)) @ np.linalg.cholesky(C / d).T
    nu = rng.standard_normal((n, 2)) @ np.linalg.cholesky(C).T
    g = u * nu / (1.0 + np.exp(-nu))                               # u swish(nu)
    mc = 2 * (g.T @ g) / n                                          # m = 2 hidden units per dimension
    np.testing.assert_allclose(maps.mlp(C / d), mc, rtol=0.02)


def test_carried_logits_add_as_independent_gaussians():
    """logit_kernels=[K, K]: G = G_1 + G_2 has covariance 2 K o K, the logits of the single
    kernel sqrt(2) K; the two Monte Carlo estimates agree within their sampling error. The
    default is the one kernel Sigma, bit for bit."""
    T = 6
    S = cholesky.espa_kernel(T, 0.3)
    np.testing.assert_array_equal(softmax_attention_map(S, 40, seed=2),
                                  softmax_attention_map(S, 40, seed=2, logit_kernels=[S]))
    two = softmax_attention_map(S, 4000, seed=0, logit_kernels=[S, S])
    one = softmax_attention_map(S, 4000, seed=1, logit_kernels=[np.sqrt(2.0) * S])
    plain = softmax_attention_map(S, 4000, seed=1)
    assert np.abs(two - one).max() < 0.01 < np.abs(two - plain).max()


# ------------------------------------------------------------------ DeepNorm against wide models

@pytest.mark.parametrize("extra", [dict(attention="softmax", zero_query=True, activation="gelu", n_layer=2),
                                   dict(attention="espa", activation="tat_lrelu", kernel_budget="independent",
                                        gamma_final=0.2, eta=0.6),
                                   dict(attention="uspa", activation="gelu", norm="rmsnorm")])
def test_deepnorm_prediction_matches_a_wide_network(extra):
    """Width 512 (tolerance 0.18). Measured: errors 0.03-0.07 here; the Post-LN map without
    alpha and beta is off by 0.2-0.7 on the same measurement (q of the attention branch by
    a factor 1 / beta^4)."""
    width = 512
    cfg = wide(width, **{**DEEPNORM, **extra})
    model = GPT(cfg, seed=0)
    errors = layer_errors(model, predict_kernels(cfg, plan=model.plan))
    assert errors[:, :2].max() < tol(width) and errors[:, 2].max() < 0.25
    wrong = layer_errors(model, predict_kernels(replace(cfg, residual="standard"), plan=model.plan))
    assert wrong[:, :2].max() > tol(width)


# ------------------------------------------------------------------ RealFormer

@pytest.mark.parametrize("extra", [dict(attention="espa", residual="standard", norm="layernorm"),
                                   dict(attention="uspa", residual="none"),
                                   dict(attention="softmax", zero_query=True, residual="standard", norm="rmsnorm"),
                                   dict(attention="value_skipinit", residual="standard", norm="layernorm")])
def test_realformer_with_zero_queries_predicts_the_plain_model(extra):
    """W^Q = 0: every carried score is 0 at init, so the prediction is the plain model's, exactly
    (and the wide RealFormer model is the plain one: tests/test_schemes.py)."""
    cfg = wide(32, activation="gelu", **extra)
    real = predict_kernels(replace(cfg, residual_attention=True))
    plain = predict_kernels(cfg)
    for l in range(1, cfg.n_layer + 1):
        for sub in ("attn_branch", "mlp"):
            np.testing.assert_array_equal(real.kernel(l, sub), plain.kernel(l, sub))


def test_realformer_softmax_prediction_matches_a_wide_network():
    """Softmax attention with random W^Q, W^K (Pre-LN, 16 heads of width 64): the layers'
    independent Gaussian logits add in the carried scores. A head's attention matrix is
    random at any width, so the measured kernel averages B H = 128 of them and the mean field
    is estimated from 256 samples: measured errors 0.04-0.08 (layer 1 is the plain layer),
    below tol(1024) = 0.125; the map that does not carry the scores is off by 0.20-0.24 in
    the attention branches of layers 2-4."""
    cfg = wide(1024, n_head=16, attention="softmax", activation="gelu", residual="standard", norm="layernorm",
               residual_attention=True)
    model = GPT(cfg, seed=0)
    errors = layer_errors(model, predict_kernels(cfg, plan=model.plan, softmax_samples=256), B=8)
    assert errors[:, :2].max() < tol(1024) and errors[:, 2].max() < 0.25
    plain = predict_kernels(replace(cfg, residual_attention=False), plan=model.plan, softmax_samples=256)
    assert layer_errors(model, plain, B=8)[1:, 0].min() > tol(1024)


# ------------------------------------------------------------------ nGPT

@pytest.mark.parametrize("alpha", [0.05, 0.5])
def test_ngpt_prediction_matches_a_wide_network(alpha):
    """Width 1024, 16 heads (random W^Q, W^K; a head's P is random, measured over B H = 128).
    alpha = 0.05 is the published init; at 0.5 (the model's alpha_A, alpha_M set to it) the
    branches move the stream enough to test the MLP's gated map. Every block output has q =
    1 / d exactly. Measured errors 0.03-0.08; the prediction with the other alpha is off by
    0.2-0.7."""
    cfg = wide(1024, n_head=16, **NGPT)
    model = GPT(cfg, seed=0)
    for block in model.blocks:
        for a in (block.alpha_attn, block.alpha_mlp):
            a.weight.data[:] = alpha / a.factor
    maps = lambda value: NGPTMaps(cfg, model.plan, softmax_samples=256, alpha=value)
    pred = predict_kernels(cfg, plan=model.plan, softmax_samples=256, maps=maps(alpha))
    errors = layer_errors(model, pred, B=8)
    assert errors[:, :2].max() < tol(1024) and errors[:, 2].max() < 1e-12
    np.testing.assert_allclose(np.diagonal(pred.kernel(cfg.n_layer)), 1.0 / cfg.n_embd, rtol=1e-14)
    other = predict_kernels(cfg, plan=model.plan, softmax_samples=256, maps=maps(0.55 - alpha))
    assert layer_errors(model, other, B=8)[1:, 1].min() > tol(1024)


def test_ngpt_default_prediction_uses_the_published_alpha():
    cfg = wide(64, n_layer=2, **NGPT)
    a = predict_kernels(cfg, softmax_samples=8)
    b = predict_kernels(cfg, softmax_samples=8, maps=NGPTMaps(cfg, make_plan(cfg), softmax_samples=8, alpha=0.05))
    np.testing.assert_array_equal(a.kernel(2), b.kernel(2))
    np.testing.assert_allclose(np.diagonal(a.sigma_0), 1 / 64, rtol=1e-15)
