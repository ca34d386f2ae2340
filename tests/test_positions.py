"""Tests for the positions that act in attention (docs/positions.md): nanospa/beyond/positions.py
(the RoPE op, ALiBi and fixed-bias blocks), nanospa/signal/beyond/positions.py (slopes, angles,
the SPA prior's model) and their use in model.py and beyond/positions.py: float64 gradient checks
of the op and of models with every attention, residual and norm variant, the dense and
blockwise paths against each other, the SPA prior's B_l against E-SPA's own, and the
attention matrices and kernels at init against nanospa.signal's predictions."""
import itertools

import numpy as np
import pytest

from nanospa import GPT, GPTConfig, beyond, config, signal
from nanospa.gradcheck import check_directions, check_jacobian, tensor64
from nanospa.beyond.positions import AlibiHook, Rope, rope
from nanospa.signal import collapse
from nanospa.signal.attn_bias import bias_block, espa_bias
from nanospa.signal.cholesky import dense_layer_bias, realise
from nanospa.signal.inputs import token_variance
from nanospa.signal.maps import input_kernel
from nanospa.signal.collapse import softmax_attention_map
from nanospa.signal.maps import attention_map
from nanospa.model import variant
from nanospa.predict import attention_at_init, predict_kernels
from nanospa.signal.beyond.positions import (alibi_bias, alibi_slopes, rope_angles, rope_correlation,
                                      rope_frequencies, spa_prior_config)
from nanospa.tensor import Tensor

from conftest import perturbed_model, tiny_config
from test_predict import max_errors, q_tol, tol, wide

LOGIT_POSITIONS = ("alibi", "rope", "spa_prior")
IDX = np.random.default_rng(7).integers(0, 13, (2, 8))
TARGETS = np.roll(IDX, -1, axis=1)


# ---------------------------------------------------------------- ALiBi's slopes and bias

def test_alibi_slopes_are_the_published_ones():
    """Powers of two: 2^(-8h/H). Otherwise the slopes of the largest power of two n below H,
    then every other slope of 2n (Press et al.'s interpolation)."""
    np.testing.assert_array_equal(alibi_slopes(8), [2.0 ** -k for k in range(1, 9)])
    np.testing.assert_array_equal(alibi_slopes(1), [2.0 ** -8])
    np.testing.assert_array_equal(alibi_slopes(6), [2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8, 2.0 ** -1, 2.0 ** -3])
    np.testing.assert_allclose(alibi_slopes(12), [2.0 ** -k for k in range(1, 9)]
                               + [2.0 ** -0.5, 2.0 ** -1.5, 2.0 ** -2.5, 2.0 ** -3.5], rtol=1e-15)
    with pytest.raises(ValueError, match="heads"):
        alibi_slopes(0)


def test_alibi_bias_blocks_and_the_hook():
    """-m_h (i - j) for any block; ALiBi's hook adds it to another fixed bias's blocks (SPA's
    B_l by blocks) in float64, rounded once, and alone it is the bias itself."""
    m = alibi_slopes(4)
    full = alibi_bias(m, 0, 9, 0, 9)
    i, j = np.arange(9)[:, None], np.arange(9)[None, :]
    np.testing.assert_array_equal(full, -m[:, None, None] * (i - j))
    np.testing.assert_array_equal(alibi_bias(m, 3, 7, 2, 5), full[:, 3:7, 2:5])
    parts = espa_bias(9, 0.1, 0.3)
    spa = lambda i0, i1, j0, j1, dtype: bias_block(parts, i0, i1, j0, j1, dtype)  # noqa: E731
    both = AlibiHook(m).bias((None, spa))[1](2, 9, 0, 4, np.float32)
    assert both.shape == (4, 7, 4) and both.dtype == np.float32
    np.testing.assert_array_equal(both, (bias_block(parts, 2, 9, 0, 4) + full[:, 2:9, 0:4]).astype(np.float32))
    np.testing.assert_array_equal(AlibiHook(m).bias((None, None))[1](1, 3, 0, 3, np.float64), full[:, 1:3, :3])


# ---------------------------------------------------------------- the RoPE op

def test_rope_full_jacobian_against_a_random_upstream_gradient():
    """Every entry of x (B, H, T, D), T = 5 below the tables' T_max = 7, float64."""
    rng = np.random.default_rng(0)
    ang = rope_angles(7, 6)
    cos, sin = np.cos(ang), np.sin(ang)
    x = tensor64(rng.standard_normal((2, 3, 5, 6)))
    assert check_jacobian(lambda a: rope(a, cos, sin), [x]) < 1e-6


def test_rope_pairs_angles_and_relative_logits():
    """The convention: pair (x[2k], x[2k+1]) at position t turned by t theta_k,
    theta_k = 10000^(-2k/D); norms are kept, the backward is the inverse rotation, and
    rotated q_i . k_j depends on the positions through j - i only."""
    D, T = 8, 6
    theta = rope_frequencies(D)
    np.testing.assert_array_equal(theta, 10000.0 ** (-np.arange(0, D, 2) / D))
    ang = rope_angles(T, D)
    cos, sin = np.cos(ang), np.sin(ang)
    e0 = np.zeros((1, T, D))
    e0[..., 2] = 1.0                                               # the first coordinate of pair k = 1
    y = Rope.apply(Tensor(e0), cos=cos, sin=sin).data[0]
    np.testing.assert_allclose(y[:, 2], np.cos(np.arange(T) * theta[1]), atol=1e-15)
    np.testing.assert_allclose(y[:, 3], np.sin(np.arange(T) * theta[1]), atol=1e-15)
    assert np.all(y[:, [0, 1, 4, 5, 6, 7]] == 0)
    rng = np.random.default_rng(1)
    q, k = rng.standard_normal(D), rng.standard_normal(D)           # the same vector at every position
    Q = rope(Tensor(np.tile(q, (T, 1))), cos, sin).data
    K = rope(Tensor(np.tile(k, (T, 1))), cos, sin).data
    np.testing.assert_allclose(np.linalg.norm(Q, axis=1), np.linalg.norm(q), rtol=1e-14)
    logits = Q @ K.T
    for d in range(-T + 1, T):                                     # constant along every diagonal
        np.testing.assert_allclose(np.diagonal(logits, d), np.diagonal(logits, d)[0], rtol=1e-12, atol=1e-12)
    x = Tensor(rng.standard_normal((T, D)), requires_grad=True)
    out = rope(x, cos, sin)
    out.backward(out.data)                                         # R^T R x = x
    np.testing.assert_allclose(x.grad, x.data, rtol=1e-14, atol=1e-14)


def test_rope_tables_are_shared_and_follow_the_dtype():
    tables = lambda cfg: GPT(cfg).position.tables  # noqa: E731
    a = tables(tiny_config(pos="rope"))
    assert a is tables(tiny_config(pos="rope", n_layer=5)) and a[0].shape == (8, 2)
    assert tables(tiny_config(pos="rope", dtype="float32"))[0].dtype == np.float32


# ---------------------------------------------------------------- configuration

def test_config_checks_the_positions():
    with pytest.raises(ValueError, match="pos='rope'.*even"):
        GPTConfig(n_embd=12, n_head=4, pos="rope")
    with pytest.raises(ValueError, match="spa_prior.*attention='espa'"):
        GPTConfig(pos="spa_prior")
    with pytest.raises(ValueError, match="block_size=1 is too small for pos='spa_prior'"):
        GPTConfig(attention="softmax", pos="spa_prior", block_size=1)
    with pytest.raises(ValueError, match="GPTConfig.pos='rotary' is not one of"):
        GPTConfig(pos="rotary")
    for pos in LOGIT_POSITIONS:                                    # nothing is added to the embedding
        assert token_variance(pos) == 1.0
        model = GPT(tiny_config(attention="softmax", pos=pos), seed=0)
        np.testing.assert_array_equal(variant("pos", pos).at_init(model.config, tokens=np.array([0, 1, 0])),
                                      input_kernel(np.array([0, 1, 0])))
        assert model.wpe is None and not any(k in model.state_dict() for k in ("pe", "wpe.weight"))


# ---------------------------------------------------------------- models: gradients, dense = blockwise

def variants():
    """Every (attention, residual, norm, norm_position) GPTConfig accepts with each logit
    position (a combination it refuses, such as spa_prior with SPA attention, is skipped):
    read from config, so that variants added later are covered too."""
    out = []
    for a, r, n, p, pos in itertools.product(beyond.values("attention"), beyond.values("residual"), beyond.values("norm"),
                                             config.NORM_POSITIONS, LOGIT_POSITIONS):
        if n == "none" and p == "post":
            continue
        try:
            tiny_config(attention=a, residual=r, norm=n, norm_position=p, pos=pos, activation="gelu")
        except ValueError:
            continue
        out.append((a, r, n, p, pos))
    return out


@pytest.mark.parametrize("attention,residual,norm,position,pos", variants())
def test_model_directional_gradcheck(attention, residual, norm, position, pos):
    model = perturbed_model(tiny_config(attention=attention, residual=residual, norm=norm, norm_position=position,
                                        pos=pos, activation="gelu"))
    assert check_directions(lambda: model(IDX, TARGETS)[1], model.parameters(), n_directions=2) < 1e-6


CASES = [dict(attention="softmax", pos="alibi"), dict(attention="softmax", pos="rope"),
         dict(attention="softmax", pos="spa_prior"), dict(attention="softmax", pos="spa_prior", train_bias=True),
         dict(attention="espa", pos="alibi"), dict(attention="uspa", pos="alibi", train_bias=True),
         dict(attention="espa", pos="rope"), dict(attention="value_skipinit", pos="spa_prior"),
         dict(attention="softmax", pos="alibi", n_head=3, n_embd=12),
         dict(attention="softmax", pos="alibi", residual="standard", norm="layernorm")]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{v}" for v in c.values()))
def test_blockwise_model_equals_dense_model(case):
    """The same weights give the same float64 loss and gradients to 1e-10 (observed ~1e-15)
    whether attention runs densely or by blocks of 3 (not dividing T = 8)."""
    models = [perturbed_model(tiny_config(attention_impl=impl, attention_block=3, activation="gelu", **case))
              for impl in ("dense", "blockwise")]
    assert models[1].blocks[0].attn.evaluate.by_blocks
    losses, grads = [], []
    for m in models:
        _, loss = m(IDX, TARGETS)
        loss.backward()
        losses.append(loss.item())
        grads.append({n: p.grad for n, p in m.named_parameters()})
    assert losses[0] == pytest.approx(losses[1], rel=1e-10, abs=1e-10)
    for n in grads[0]:
        np.testing.assert_allclose(grads[1][n], grads[0][n], rtol=1e-10, atol=1e-10, err_msg=n)


def test_float32_models_stay_float32():
    for pos in LOGIT_POSITIONS:
        for impl in ("dense", "blockwise"):
            model = GPT(tiny_config(attention="softmax", pos=pos, dtype="float32", attention_impl=impl), seed=0)
            logits, loss = model(IDX, TARGETS)
            loss.backward()
            assert logits.dtype == np.float32 and all(p.grad.dtype == np.float32 for p in model.parameters())


# ---------------------------------------------------------------- the SPA prior is E-SPA's B_l

@pytest.mark.parametrize("budget", ["joint", "independent", "qpreserve"])
def test_the_prior_is_the_vanilla_espa_models_bias_bit_for_bit(budget):
    """A Pre-LN model with pos="spa_prior" stores, layer by layer, the B_l of the vanilla
    E-SPA model of the same depth and T (its own plan, signal.attn_bias), dense and as
    blockwise parts, and no D_l."""
    common = dict(vocab_size=13, block_size=16, n_layer=3, n_head=2, n_embd=8, kernel_budget=budget,
                  eta=0.5 if budget != "joint" else 0.0)     # TAT eta 0.9 needs depth >= 13
    espa = GPT(GPTConfig(**common), seed=0)                        # GPTConfig's default: vanilla E-SPA
    pre = dict(common, attention="softmax", residual="standard", norm="layernorm", activation="gelu", pos="spa_prior")
    prior = GPT(GPTConfig(**pre), seed=0)
    assert prior.plan.prior.schedule == espa.plan.schedule and prior.plan.kind is None
    for a, b in zip(prior.blocks, espa.blocks):
        np.testing.assert_array_equal(a.attn.B, b.attn.B)
        assert not hasattr(a.attn, "D")
    assert not any(k.endswith(".D") for k in prior.state_dict())
    blockwise = GPT(GPTConfig(**pre, attention_impl="blockwise"), seed=0)
    ref = GPT(GPTConfig(**common, attention_impl="blockwise"), seed=0)
    for a, b in zip(blockwise.blocks, ref.blocks):
        for key, value in b.attn.parts.items():
            np.testing.assert_array_equal(a.attn.parts[key], value)
    assert prior.plan.info["spa_prior_gamma_final"] == espa.plan.info["gamma_final"]


# ---------------------------------------------------------------- at init: attention matrices

def orthonormal_model(cfg):
    """GPT(cfg) with distinct tokens whose embeddings are orthonormal (Sigma_0 = I exactly)."""
    model = GPT(cfg, seed=0)
    q, _ = np.linalg.qr(np.random.default_rng(0).standard_normal((cfg.n_embd, cfg.n_embd)))
    model.wte.weight.data = q[:cfg.vocab_size] * np.sqrt(cfg.n_embd)
    return model


@pytest.mark.parametrize("case", [dict(attention="softmax", zero_query=True, pos="alibi"),
                                  dict(attention="softmax", zero_query=True, pos="spa_prior"),
                                  dict(attention="softmax", zero_query=True, pos="rope"),
                                  dict(attention="espa", pos="alibi"), dict(attention="uspa", pos="rope")],
                         ids=lambda c: f"{c['attention']}-{c['pos']}")
def test_attention_at_init_is_the_predicted_fixed_matrix(case):
    """With W^Q = 0 the logits are the fixed bias alone: softmax of ALiBi (one matrix per
    head), of the prior's B_l, diag(D_l) softmax(B_l + ALiBi) for SPA; RoPE rotates zero
    queries and leaves the uniform (or SPA) matrix. The model's trace equals
    predict.attention_at_init to rounding, head by head."""
    cfg = tiny_config(n_head=4, n_embd=16, block_size=8, activation="gelu", **case)
    model = GPT(cfg, seed=0)
    tr = model.trace(IDX)
    for l in range(1, cfg.n_layer + 1):
        A = attention_at_init(cfg, model.plan, l, 8)[0]
        heads = A if A.ndim == 3 else np.broadcast_to(A, (4, 8, 8))
        np.testing.assert_allclose(tr.attention[l - 1], np.broadcast_to(heads, (2, 4, 8, 8)), rtol=0, atol=1e-13)
    if case["pos"] == "rope" and case["attention"] == "softmax":
        np.testing.assert_allclose(A, collapse.uniform_causal_attention(8), atol=1e-15)
    if case["pos"] == "alibi" and case["attention"] == "softmax":
        slopes = alibi_slopes(4)
        i, j = np.arange(8)[:, None], np.arange(8)[None, :]
        expected = np.tril(np.exp(-slopes[:, None, None] * (i - j)))
        np.testing.assert_allclose(A, expected / expected.sum(-1, keepdims=True), rtol=1e-14)


def test_logit_bias_and_the_per_head_kernel_map():
    """The position schemes' fixed logits at init: ALiBi per head, the prior's B_l, none for
    RoPE; SPA adds its own B_l to them (its at_init); the kernel map of per-head matrices is
    the mean over heads, and the zero-sample mean field of a biased softmax is that map of
    softmax(bias)."""
    logits = lambda c, l: variant("pos", c.pos).logit_bias_at_init(c, signal.make_plan(c), l, 6)  # noqa: E731
    cfg = GPTConfig(block_size=6, n_layer=2, n_head=2, n_embd=8, attention="espa", pos="alibi", activation="gelu")
    plan = signal.make_plan(cfg)
    np.testing.assert_array_equal(logits(cfg, 2), alibi_bias(alibi_slopes(2), 0, 6, 0, 6))
    B = dense_layer_bias(plan, 2, 6)[0] + alibi_bias(alibi_slopes(2), 0, 6, 0, 6)
    np.testing.assert_array_equal(attention_at_init(cfg, plan, 2, 6)[0], realise(B, dense_layer_bias(plan, 2, 6)[1]))
    pre = GPTConfig(**{**cfg.to_dict(), "attention": "softmax", "pos": "spa_prior"})
    np.testing.assert_array_equal(logits(pre, 1), dense_layer_bias(signal.make_plan(spa_prior_config(pre)), 1, 6)[0])
    rot = GPTConfig(**{**pre.to_dict(), "pos": "rope"})
    assert logits(rot, 1) is None
    rng = np.random.default_rng(2)
    X = rng.standard_normal((6, 6))
    S = X @ X.T / 6
    A = realise(B, np.ones(6))
    np.testing.assert_allclose(attention_map(S, A), (A[0] @ S @ A[0].T + A[1] @ S @ A[1].T) / 2, rtol=1e-14)
    np.testing.assert_allclose(softmax_attention_map(S, n_samples=0, bias=B), attention_map(S, A), rtol=1e-14)


# ---------------------------------------------------------------- random queries: the mean field

def test_rope_logit_covariance_of_the_model_op_and_of_the_mean_field_sampler():
    """With random queries and keys (Sigma = 1 1^T: one token everywhere), RoPE multiplies
    Cov(l_ij, l_i'j') by c((j-i) - (j'-i')) = mean_k cos(. theta_k). Measured on the model's
    op over 4000 draws, and on the mean field's sampler over as many, both within 5 standard
    errors (0.08) of the formula."""
    T, D, n = 5, 8, 4000
    ang = rope_angles(T, D)
    cos, sin = np.cos(ang), np.sin(ang)
    rng = np.random.default_rng(3)
    q = rng.standard_normal((n, 1, D)) * np.ones((1, T, 1))        # (n, T, D): one query at every position
    k = rng.standard_normal((n, 1, D)) * np.ones((1, T, 1))
    l = rope(Tensor(q), cos, sin).data @ rope(Tensor(k), cos, sin).data.transpose(0, 2, 1) / np.sqrt(D)
    rel = (np.arange(T)[None, :] - np.arange(T)[:, None]).ravel()   # j - i of each flattened (i, j)
    expected = rope_correlation(rel[:, None] - rel[None, :], D)
    measured = np.cov(l.reshape(n, -1), rowvar=False)
    assert np.abs(measured - expected).max() < 5 * np.sqrt(2.0 / n)
    assert rope_correlation(0, D) == pytest.approx(1.0)
    draws = []
    orig = collapse._causal_softmax
    try:
        collapse._causal_softmax = lambda G: (draws.append(G.copy()), orig(G))[1]
        softmax_attention_map(np.ones((T, T)), n_samples=n, seed=4, rope=rope_frequencies(D))
    finally:
        collapse._causal_softmax = orig
    G = np.array(draws).reshape(n, -1)
    tri = np.tril(np.ones((T, T), dtype=bool)).ravel()             # the sampler's causal entries
    assert np.abs(np.cov(G, rowvar=False)[np.ix_(tri, tri)] - expected[np.ix_(tri, tri)]).max() < 5 * np.sqrt(2.0 / n)


def test_prediction_notes_and_unchanged_plain_mean_field():
    """Without logit positions the mean-field draws are those of the plain map (bit for bit);
    with RoPE they differ."""
    base = dict(block_size=6, n_layer=2, n_head=2, n_embd=8, attention="softmax", activation="linear")
    plain = predict_kernels(GPTConfig(**base), softmax_samples=8)
    S = np.eye(6)
    np.testing.assert_array_equal(plain.kernel(1, "attn_branch"), softmax_attention_map(S, 8, seed=1))
    rope_pred = predict_kernels(GPTConfig(**base, pos="rope"), softmax_samples=8)
    assert np.abs(rope_pred.kernel(1, "attn_branch") - plain.kernel(1, "attn_branch")).max() > 1e-3


# ---------------------------------------------------------------- at init: kernels of wide models

@pytest.mark.slow    # a wide-network test, as tests/test_predict.py's (pytest.ini)
@pytest.mark.parametrize("extra", [
    dict(attention="softmax", zero_query=True, pos="alibi", residual="standard", norm="layernorm", activation="gelu"),
    dict(attention="softmax", zero_query=True, pos="spa_prior", residual="standard", norm="layernorm",
         activation="gelu"),
    dict(attention="espa", pos="alibi", kernel_budget="independent", gamma_final=0.02, eta=0.6)],
    ids=["preln-alibi", "preln-spa_prior", "espa-alibi"])
def test_predicted_kernels_match_a_wide_network(extra):
    """Width 512 (the tolerances of tests/test_predict.py, d^-1/2 laws): the kernels
    after every attention branch and block of a wide random model at init are the predicted
    ones (ALiBi's per-head matrices averaged over the 4 heads, the prior's softmax(B_l))."""
    width = 512
    c = wide(n_embd=width, **extra)
    c_err, q_err = max_errors(c)
    assert c_err < tol(width) and q_err < q_tol(c)


def test_rope_with_zero_queries_changes_nothing_at_init():
    """Predicted: the kernels of pos="rope" with W^Q = 0 are those without positions, exactly
    (tests/test_predict.py checks those against a wide network); the model's outputs
    at init are those of the same weights without RoPE, to rounding."""
    base = dict(block_size=8, n_layer=3, n_head=2, n_embd=16, attention="softmax", zero_query=True,
                residual="standard", norm="layernorm", activation="gelu", vocab_size=13, dtype="float64")
    a, b = (predict_kernels(GPTConfig(**base, pos=p)) for p in ("rope", "none"))
    for l in range(4):
        np.testing.assert_array_equal(a.kernel(l), b.kernel(l))
    m_rope, m_none = GPT(GPTConfig(**base, pos="rope"), seed=0), GPT(GPTConfig(**base), seed=0)
    np.testing.assert_allclose(m_rope(IDX)[0].data, m_none(IDX)[0].data, rtol=1e-13, atol=1e-13)


def test_the_signal_tables_attention_only_network_sees_the_logit_positions():
    """python -m nanospa.signal's attn-only column: the zero-query attention matrices, with
    ALiBi's per head averaged (the same as predict's with zero_query=True); RoPE: uniform."""
    from nanospa.predict import attention_only_kernels
    for pos in LOGIT_POSITIONS:
        cfg = GPTConfig(block_size=8, n_layer=3, n_head=4, n_embd=16, attention="softmax", pos=pos,
                        activation="gelu")
        zq = GPTConfig(**{**cfg.to_dict(), "zero_query": True})
        plan = signal.make_plan(zq)
        S = np.eye(8)
        for l, K in enumerate(attention_only_kernels(cfg)[1:], start=1):
            S = attention_map(S, attention_at_init(zq, plan, l, 8)[0])
            np.testing.assert_allclose(K, S, rtol=1e-13, atol=1e-15)
        if pos == "rope":
            P = collapse.uniform_causal_attention(8)
            np.testing.assert_allclose(attention_only_kernels(cfg)[1], P @ P.T, rtol=1e-14)
