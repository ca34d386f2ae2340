"""DeepNorm (residual="deepnorm") and RealFormer (residual_attention=True): the combination
rules GPTConfig enforces, DeepNorm's constants, initial gains and block equation, RealFormer's
carried scores (zero in layer 1, content only with SPA biases, through Value-SkipInit, dense
only) and float64 gradient checks of both through whole models (nanospa/beyond/schemes.py,
docs/residuals.md). nGPT: tests/test_ngpt.py; the wide-limit predictions:
tests/test_signal_residuals.py."""
import math

import numpy as np
import pytest

from nanospa.model import dense_bias
from nanospa import GPT, GPTConfig, fused
from nanospa.gradcheck import check_directions
from nanospa.signal.beyond.residuals import deepnorm_alpha, deepnorm_beta
from nanospa.tensor import Tensor, no_grad

from test_model import perturb  # the shared random move off the initialisation

IDX = np.array([[1, 4, 4, 0, 9, 2], [3, 3, 7, 10, 1, 5]])
TARGETS = np.roll(IDX, -1, axis=1)
DEEPNORM = dict(residual="deepnorm", norm="layernorm", norm_position="post")
PRE_LN = dict(residual="standard", norm="layernorm")


def tiny(**kw):
    base = dict(vocab_size=11, block_size=6, n_layer=2, n_head=2, n_embd=8, dtype="float64",
                activation="gelu", attention="softmax")
    base.update(kw)
    return GPTConfig(**base)


# ------------------------------------------------------------------ configuration

def test_a_single_valid_choice_is_taken_when_unset():
    """DeepNorm is Post-LN: norm_position left unset means post; nGPT's attention is softmax:
    attention left unset means softmax. Unset elsewhere: the paper's defaults (pre, E-SPA)."""
    from nanospa.config import GPTConfig
    assert GPTConfig(residual="deepnorm", norm="layernorm").norm_position == "post"
    assert GPTConfig(residual="ngpt", activation="swish").attention == "softmax"
    assert (GPTConfig().norm_position, GPTConfig().attention) == ("pre", "espa")
    with pytest.raises(ValueError, match="norm_position='pre'.*residual='deepnorm'"):
        GPTConfig(residual="deepnorm", norm="layernorm", norm_position="pre")   # both settings named
    with pytest.raises(ValueError, match="attention='espa'.*residual='ngpt'"):
        GPTConfig(residual="ngpt", activation="swish", attention="espa")


@pytest.mark.parametrize("kw,field", [
    (dict(residual="deepnorm"), "norm"),                                   # DeepNorm needs a norm
    (dict(residual="deepnorm", norm="dyt", norm_position="post"), "norm"),
    (dict(residual="deepnorm", norm="layernorm", norm_position="pre"), "norm_position"),   # Post-LN: pre refused
    (dict(residual_attention=True, attention_impl="blockwise"), "attention_impl"),
    (dict(residual_attention=1), "residual_attention"),
])
def test_bad_combinations_name_the_field(kw, field):
    with pytest.raises(ValueError, match=rf"^GPTConfig\.{field}="):
        GPTConfig(**kw)


def test_accepted_combinations():
    for norm in ("layernorm", "rmsnorm"):
        GPTConfig(**{**DEEPNORM, "norm": norm})
    for attention in ("softmax", "value_skipinit", "uspa", "espa"):
        GPTConfig(attention=attention, residual_attention=True, attention_impl="dense", **PRE_LN)
        GPTConfig(attention=attention, **DEEPNORM)


def test_realformer_is_dense_even_where_auto_would_choose_blockwise():
    cfg = tiny(block_size=300, residual_attention=True, n_layer=1, vocab_size=8)
    assert not getattr(GPT(cfg).blocks[0].attn.evaluate, "by_blocks", False)
    assert GPT(tiny(block_size=300, n_layer=1, vocab_size=8)).blocks[0].attn.evaluate.by_blocks


# ------------------------------------------------------------------ DeepNorm

def test_deepnorm_constants():
    """DeepNet's decoder-only constants, computed here from their definitions."""
    for N in (1, 2, 12, 36):
        assert deepnorm_alpha(N) == pytest.approx((2 * N) ** 0.25, rel=1e-15)
        assert deepnorm_beta(N) == pytest.approx(1.0 / (8 * N) ** 0.25, rel=1e-15)
    assert deepnorm_alpha(12) == pytest.approx(2.2134, abs=1e-4)
    assert deepnorm_beta(12) == pytest.approx(0.31947, abs=1e-5)


@pytest.mark.parametrize("attention", ["softmax", "espa"])
def test_deepnorm_scales_value_output_and_mlp_weights_by_beta(attention):
    """Same seed, same draws as the Post-LN model; W^V, W^O, W_1, W_2 times beta, the rest equal."""
    N = 3
    post = GPT(tiny(n_layer=N, attention=attention, residual="standard", norm="layernorm", norm_position="post"))
    deep = GPT(tiny(n_layer=N, attention=attention, **DEEPNORM))
    a, b = post.state_dict(), deep.state_dict()
    assert a.keys() == b.keys()
    scaled = ("attn.v.weight", "attn.proj.weight", "mlp.fc.weight", "mlp.proj.weight")
    beta = (8 * N) ** -0.25
    for name in a:
        expected = a[name] * beta if name.endswith(scaled) else a[name]
        np.testing.assert_allclose(b[name], expected, rtol=1e-15, atol=0, err_msg=name)
    assert sum(name.endswith(scaled) for name in a) == 4 * N


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_deepnorm_block_is_post_ln_with_alpha(norm):
    """x' = N1(alpha x + MHA(x)), out = N2(alpha x' + MLP(x')), alpha = (2N)^(1/4), from the
    block's own sublayers."""
    N = 2
    model = GPT(tiny(n_layer=N, **{**DEEPNORM, "norm": norm}))
    perturb(model, 0.1)
    block, alpha = model.blocks[0], (2 * N) ** 0.25
    with no_grad():
        x = model.embed(IDX)
        h = block.norm1(x * alpha + block.attn(x))
        expected = block.norm2(h * alpha + block.mlp(h))
        np.testing.assert_allclose(block(x).data, expected.data, rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("extra", [dict(), dict(norm="rmsnorm"), dict(attention="espa", activation="tat_lrelu"),
                                   dict(attention="value_skipinit", final_norm="no")])
def test_deepnorm_directional_gradcheck(extra):
    model = GPT(tiny(**{**DEEPNORM, **extra}), seed=0)
    perturb(model)
    assert check_directions(lambda: model(IDX, TARGETS)[1], model.parameters(), n_directions=2) < 1e-6


# ------------------------------------------------------------------ RealFormer

def scores_of(model, idx, layer):
    """Layer `layer`'s content scores Q K^T / sqrt(D) (B, H, T, T), recomputed from its input."""
    attn, T = model.blocks[layer].attn, idx.shape[1]
    with no_grad():
        x = model.embed(idx)
        carry = {} if model.config.residual_attention else None
        for block in model.blocks[:layer]:
            x = block(x, None, carry)
        if model.blocks[layer].norm1 is not None and not model.blocks[layer].post:
            x = model.blocks[layer].norm1(x)
        B, _, C = x.shape
        H, D = attn.n_head, C // attn.n_head
        q = attn.q(x).data.reshape(B, T, H, D).transpose(0, 2, 1, 3)
        k = attn.k(x).data.reshape(B, T, H, D).transpose(0, 2, 1, 3)
    return q @ k.transpose(0, 1, 3, 2) / math.sqrt(D)


@pytest.mark.parametrize("attention", ["softmax", "uspa", "espa", "value_skipinit"])
def test_realformer_layer_one_is_plain_attention(attention):
    """Nothing is carried into layer 1: a one-layer RealFormer is the plain model (same seed,
    same weights), whatever W^Q is."""
    plain = GPT(tiny(n_layer=1, attention=attention, **PRE_LN))
    real = GPT(tiny(n_layer=1, attention=attention, residual_attention=True, **PRE_LN))
    perturb(plain), perturb(real)
    np.testing.assert_allclose(real(IDX)[0].data, plain(IDX)[0].data, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("attention", ["uspa", "espa", "value_skipinit"])
def test_realformer_at_init_with_zero_queries_is_the_plain_model(attention):
    """W^Q = 0: every content score is 0, so nothing is carried and every layer is exact."""
    cfg = dict(n_layer=3, attention=attention, **PRE_LN)
    plain, real = GPT(tiny(**cfg)), GPT(tiny(residual_attention=True, **cfg))
    np.testing.assert_array_equal(real(IDX)[0].data, plain(IDX)[0].data)


@pytest.mark.parametrize("attention", ["softmax", "espa", "value_skipinit"])
def test_realformer_second_layer_adds_the_first_layers_content_scores(attention):
    """Layer 2 attends with softmax(S_2 + S_1 + B_2 + mask): the content scores of layer 1
    carried, SPA's bias B_2 of its own layer only (B_1 is not carried)."""
    cfg = tiny(n_layer=2, attention=attention, residual_attention=True, **PRE_LN)
    model = GPT(cfg)
    perturb(model, 0.5, seed=3)                                  # W^Q != 0, alpha, beta moved
    S = scores_of(model, IDX, 0) + scores_of(model, IDX, 1)
    bias, causal = dense_bias(model.blocks[1].attn.logit_bias(), IDX.shape[1], np.float64), True
    P = fused.softmax(Tensor(S), bias, causal=causal).data
    tr = model.trace(IDX)
    A = tr.attention[1]                                          # effective: diag(D) P, alpha I + beta P
    expected = model.blocks[1].attn.effective(P)
    np.testing.assert_allclose(A, expected, rtol=1e-12, atol=1e-14)
    plain = fused.softmax(Tensor(scores_of(model, IDX, 1)), bias, causal=causal).data
    assert np.abs(model.blocks[1].attn.effective(plain) - A).max() > 1e-3


@pytest.mark.parametrize("extra", [dict(), dict(attention="espa", train_bias=True),
                                   dict(attention="value_skipinit"), DEEPNORM])
def test_realformer_directional_gradcheck_through_two_layers(extra):
    """Central differences of the whole loss against the backward pass: the gradient through the
    carried scores (layer 1's W^Q, W^K reach layer 2's softmax) must be in it."""
    model = GPT(tiny(n_layer=2, residual_attention=True, **{**PRE_LN, **extra}), seed=0)
    perturb(model)
    assert check_directions(lambda: model(IDX, TARGETS)[1], model.parameters(), n_directions=3) < 1e-6


def test_realformer_gradient_of_first_layer_queries_through_the_carried_scores():
    """Only layer 1's W^Q moves: its finite-difference derivative has a part that reaches the loss
    through layer 2's carried scores, and the backward pass has it too."""
    model = GPT(tiny(n_layer=2, residual_attention=True, **PRE_LN), seed=0)
    perturb(model)
    wq = model.blocks[0].attn.q.weight
    assert check_directions(lambda: model(IDX, TARGETS)[1], [wq], n_directions=4) < 1e-6
