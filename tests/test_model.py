"""The model: gradient checks of every variant, the theory's identities at initialisation,
configuration errors, state dicts, dtypes."""
import itertools

import numpy as np
import pytest

from nanospa import GPT, GPTConfig, signal
from nanospa.gradcheck import check_directions


def tiny(**kw):
    base = dict(vocab_size=11, block_size=6, n_layer=2, n_head=2, n_embd=8, dtype="float64",
                activation="gelu")
    base.update(kw)
    return GPTConfig(**base)


def perturb(model, scale=0.2, seed=1):
    rng = np.random.default_rng(seed)
    for p in model.parameters():
        p.data = p.data + scale * rng.standard_normal(p.shape)


IDX = np.array([[1, 4, 4, 0, 9, 2], [3, 3, 7, 10, 1, 5]])
TARGETS = np.roll(IDX, -1, axis=1)

COMBOS = [(a, r, n, p) for a, r, n, p in itertools.product(
    ["softmax", "value_skipinit", "uspa", "espa"], ["none", "standard", "normalised"],
    ["none", "layernorm", "rmsnorm", "dyt"], ["pre", "post"]) if not (n == "none" and p == "post")]


@pytest.mark.parametrize("attention,residual,norm,position", COMBOS)
def test_model_directional_gradcheck(attention, residual, norm, position):
    cfg = tiny(attention=attention, residual=residual, norm=norm, norm_position=position,
               pos="learned" if norm != "none" else "none")
    model = GPT(cfg, seed=0)
    perturb(model)
    err = check_directions(lambda: model(IDX, TARGETS)[1], model.parameters(), n_directions=2)
    assert err < 1e-6


@pytest.mark.parametrize("extra", [dict(train_bias=True), dict(skipinit_per_head=True, attention="value_skipinit"),
                                   dict(pos="sinusoidal", bias=True), dict(activation="tat_lrelu", eta=0.4),
                                   dict(activation="dks_gelu"), dict(activation="tat_gelu")])
def test_model_options_directional_gradcheck(extra):
    model = GPT(tiny(**extra), seed=0)
    perturb(model)
    assert check_directions(lambda: model(IDX, TARGETS)[1], model.parameters(), n_directions=2) < 1e-6


def orthonormal_tokens(B, T, d, seed=0):
    """Token ids with distinct embeddings whose rows are exactly orthonormal * sqrt(d):
    then the input kernel X X^T / d is exactly I."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.standard_normal((d, d)))
    return q[: B * T] * np.sqrt(d)


def model_with_orthonormal_embedding(cfg, seed=0):
    model = GPT(cfg, seed=seed)
    V, d = cfg.vocab_size, cfg.n_embd
    model.wte.weight.data = orthonormal_tokens(1, V, d)
    return model


@pytest.mark.parametrize("attention", ["espa", "uspa"])
def test_spa_attention_at_init_equals_target_and_kernel_identity(attention):
    T, L = 16, 4
    cfg = GPTConfig(vocab_size=16, block_size=T, n_layer=L, n_head=4, n_embd=64, dtype="float64",
                    attention=attention, activation="gelu")
    model = model_with_orthonormal_embedding(cfg)
    idx = np.arange(T)[None, :]
    tr = model.trace(idx)
    for l in range(L):
        A = tr.attention[l][0]                               # (H, T, T)
        target = model.plan.layers[l]
        expected = np.exp(target["B"]) * target["D"][:, None]  # D_l softmax(B_l) = A_l
        for h in range(cfg.n_head):
            np.testing.assert_allclose(A[h], np.tril(expected), atol=1e-12)
        assert np.all(A >= 0) and np.allclose(np.triu(A[0], 1), 0)
        # finite-width identity: K(attention output) = A K(block input) A^T
        X, Y = tr.hidden[l][0], tr.attn_out[l][0]
        K_in, K_out = signal.kernel_matrix(X), signal.kernel_matrix(Y)
        np.testing.assert_allclose(K_out, A[0] @ K_in @ A[0].T, atol=1e-10)


def test_espa_attention_matches_closed_form_from_signal():
    T, L = 12, 3
    cfg = GPTConfig(vocab_size=16, block_size=T, n_layer=L, n_head=2, n_embd=16, dtype="float64",
                    attention="espa", activation="gelu", kernel_budget="independent", gamma_final=0.05)
    model = GPT(cfg)
    tr = model.trace(np.arange(T)[None, :])
    gammas = signal.espa_gammas(L, 0.05)
    for l in range(L):
        np.testing.assert_allclose(tr.attention[l][0, 1], signal.espa_attention(T, gammas[l + 1], gammas[l]),
                                   atol=1e-12)


def test_attention_only_espa_reaches_target_kernel_exactly():
    """With a linear MLP (orthogonal, so kernel-preserving) and Sigma_0 = I, the last layer's
    kernel is exactly the E-SPA target at finite width."""
    T, L = 16, 6
    cfg = GPTConfig(vocab_size=16, block_size=T, n_layer=L, n_head=4, n_embd=64, dtype="float64",
                    attention="espa", activation="linear", mlp_ratio=1, kernel_budget="independent",
                    gamma_final=0.05)
    model = model_with_orthonormal_embedding(cfg)
    tr = model.trace(np.arange(T)[None, :])
    np.testing.assert_allclose(signal.kernel_matrix(tr.hidden[-1][0]), signal.espa_kernel(T, 0.05), atol=1e-10)


def test_value_skipinit_leaves_the_kernel_unchanged_at_init():
    cfg = tiny(attention="value_skipinit", n_embd=32, n_head=4, block_size=8, vocab_size=32)
    model = GPT(cfg)
    tr = model.trace(np.arange(8)[None, :])
    for l in range(cfg.n_layer):
        np.testing.assert_allclose(signal.kernel_matrix(tr.attn_out[l][0]),
                                   signal.kernel_matrix(tr.hidden[l][0]), atol=1e-12)
        np.testing.assert_allclose(tr.attention[l][0, 0], np.eye(8), atol=0)


def test_standard_attention_collapses_and_espa_does_not():
    T, L, d = 32, 12, 128
    common = dict(vocab_size=T, block_size=T, n_layer=L, n_head=4, n_embd=d, dtype="float64",
                  activation="linear", mlp_ratio=1)
    idx = np.arange(T)[None, :]
    soft = model_with_orthonormal_embedding(GPTConfig(attention="softmax", zero_query=True, **common))
    espa = model_with_orthonormal_embedding(GPTConfig(attention="espa", **common))
    c_soft = signal.mean_offdiag(signal.normalised_kernel(signal.kernel_matrix(soft.trace(idx).hidden[-1][0])))
    c_espa = signal.mean_offdiag(signal.normalised_kernel(signal.kernel_matrix(espa.trace(idx).hidden[-1][0])))
    assert c_soft > 0.999          # uniform attention: rank collapse (method §3.4)
    target = signal.mean_offdiag(signal.espa_kernel(T, espa.plan.layers[-1]["gamma"]))
    assert c_espa == pytest.approx(target, abs=1e-10) and c_espa < 0.99


@pytest.mark.parametrize("field,value,message", [
    ("attention", "linear", "attention='linear' is not one of"),
    ("activation", "swishy", "activation='swishy' is not one of"),
    ("residual", "skip", "residual='skip'"),
    ("norm", "batchnorm", "norm='batchnorm'"),
    ("norm_position", "middle", "norm_position='middle'"),
    ("pos", "rope", "pos='rope'"),
    ("dtype", "float16", "dtype='float16'"),
    ("kernel_budget", "magic", "kernel_budget='magic'"),
    ("n_layer", 0, "n_layer must be a positive integer"),
    ("n_embd", -4, "n_embd must be a positive integer"),
    ("n_head", 3, "not divisible by n_head=3"),
    ("residual_beta", 1.5, "residual_beta must be in"),
    ("rho_final", 1.0, "rho_final must be in"),
    ("zeta", 0.5, "zeta must be > 1"),
])
def test_invalid_config_fields(field, value, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        GPTConfig(**{field: value})


def test_unreachable_activation_target_is_a_clear_error():
    with pytest.raises(ValueError, match="eta"):
        GPT(GPTConfig(n_layer=2, activation="tat_lrelu", eta=0.95, kernel_budget="independent"))


def test_state_dict_roundtrip_and_determinism():
    cfg = tiny(attention="espa")
    a, b = GPT(cfg, seed=3), GPT(cfg, seed=3)
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        assert np.array_equal(p.data, q.data), n
    c = GPT(cfg, seed=4)
    c.load_state_dict(a.state_dict())
    np.testing.assert_array_equal(c(IDX)[0].data, a(IDX)[0].data)
    assert "blocks.0.attn.B" in a.state_dict() and "blocks.1.attn.D" in a.state_dict()


def test_float32_model_stays_float32():
    model = GPT(tiny(dtype="float32", attention="espa", activation="tat_lrelu", eta=0.4))
    logits, loss = model(IDX, TARGETS)
    assert logits.dtype == np.float32 and loss.dtype == np.float32
    loss.backward()
    assert all(p.grad.dtype == np.float32 for p in model.parameters() if p.grad is not None)


def test_initial_loss_is_near_log_vocab():
    cfg = GPTConfig(vocab_size=256, block_size=32, n_layer=4, n_head=4, n_embd=64, eta=0.5)
    model = GPT(cfg)
    idx = np.random.default_rng(0).integers(0, 256, (4, 32))
    loss = model(idx, np.roll(idx, -1, 1))[1].item()
    assert abs(loss - np.log(256)) < 0.6


def test_generate_shapes():
    model = GPT(tiny())
    out = model.generate(IDX[:, :3], 5, top_k=4)
    assert out.shape == (2, 8) and out.dtype == np.int64 and (out < 11).all()
