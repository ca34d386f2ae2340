"""Tests for nanospa/model.py: gradient checks of every variant, the theory's identities at
initialisation (the plan's B_l, D_l and activation stored inline), state dicts, dtypes.
GPTConfig's validation: tests/test_config.py."""
import itertools

import numpy as np
import pytest

from nanospa import GPT, GPTConfig, beyond, config, signal
from conftest import tiny_config
from nanospa.gradcheck import check_directions
from nanospa.model import ShapedActivation
from nanospa.sampling import generate
from nanospa.tensor import Tensor


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

def combos():
    """Every attention x residual x norm x norm_position GPTConfig accepts, from its own lists
    (a value added there is checked here without a test edit); positions learned with a norm."""
    out = []
    for a, r, n, p in itertools.product(beyond.values("attention"), beyond.values("residual"), beyond.values("norm"), config.NORM_POSITIONS):
        if n == "none" and p == "post":
            continue                                      # the same model as pre
        try:
            tiny(attention=a, residual=r, norm=n, norm_position=p, pos=_pos(r, n))
        except ValueError:                                # a contradiction the config names (e.g. DeepNorm pre)
            continue
        out.append((a, r, n, p))
    return out


def _pos(residual, norm):
    return "learned" if norm != "none" and residual != "ngpt" else "none"


@pytest.mark.filterwarnings("ignore:norm=")          # BatchNorm / PRepBN's future-leak warning
@pytest.mark.parametrize("attention,residual,norm,position", combos())
def test_model_directional_gradcheck(attention, residual, norm, position):
    cfg = tiny(attention=attention, residual=residual, norm=norm, norm_position=position, pos=_pos(residual, norm))
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
        B, D = signal.dense_layer_bias(model.plan, l + 1)
        expected = np.exp(B) * D[:, None]                    # D_l softmax(B_l) = A_l (B rows normalised)
        for h in range(cfg.n_head):
            # the model's fused softmax against exp(B): entries <= D_max < 2, a few ulps
            # (observed 6e-17; was 1e-12)
            np.testing.assert_allclose(A[h], np.tril(expected), rtol=0, atol=1e-14)
        assert np.all(A >= 0) and np.allclose(np.triu(A[0], 1), 0)
        # finite-width identity: K(attention output) = A K(block input) A^T, exact up to the
        # rounding of products over d = 64 and T = 16 of entries <= 1: (d + 2T) eps = 2e-14
        # (observed 1e-15; was 1e-10)
        X, Y = tr.hidden[l][0], tr.attn_out[l][0]
        K_in, K_out = signal.kernel_matrix(X), signal.kernel_matrix(Y)
        np.testing.assert_allclose(K_out, A[0] @ K_in @ A[0].T, rtol=0, atol=1e-13)


def test_espa_attention_matches_closed_form_from_signal():
    T, L = 12, 3
    cfg = GPTConfig(vocab_size=16, block_size=T, n_layer=L, n_head=2, n_embd=16, dtype="float64",
                    attention="espa", activation="gelu", kernel_budget="independent", gamma_final=0.05)
    model = GPT(cfg)
    tr = model.trace(np.arange(T)[None, :])
    gammas = signal.espa_gammas(L, 0.05)
    for l in range(L):
        # fused softmax of the closed-form B against exp(log A): a few ulps of entries <= 2
        # (observed 2e-16; was 1e-12)
        np.testing.assert_allclose(tr.attention[l][0, 1], signal.espa_attention(T, gammas[l + 1], gammas[l]),
                                   rtol=0, atol=1e-14)


def test_attention_only_espa_reaches_target_kernel_exactly():
    """With a linear MLP (orthogonal, so kernel-preserving) and Sigma_0 = I, the last layer's
    kernel is exactly the E-SPA target at finite width."""
    T, L = 16, 6
    cfg = GPTConfig(vocab_size=16, block_size=T, n_layer=L, n_head=4, n_embd=64, dtype="float64",
                    attention="espa", activation="linear", mlp_ratio=1, kernel_budget="independent",
                    gamma_final=0.05)
    model = model_with_orthonormal_embedding(cfg)
    tr = model.trace(np.arange(T)[None, :])
    # 6 blocks of products over d = 64 and T = 16: L (d + 2T) eps = 1.3e-13 (observed 2e-15;
    # was 1e-10)
    np.testing.assert_allclose(signal.kernel_matrix(tr.hidden[-1][0]), signal.espa_kernel(T, 0.05),
                               rtol=0, atol=1e-12)


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
    target = signal.mean_offdiag(signal.espa_kernel(T, espa.plan.schedule[-1]))
    assert c_espa == pytest.approx(target, abs=1e-10) and c_espa < 0.99


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
    out = generate(model, IDX[:, :3], 5, top_k=4)
    assert out.shape == (2, 8) and out.dtype == np.int64 and (out < 11).all()


@pytest.mark.parametrize("budget", ["independent", "qpreserve"])
def test_model_stores_the_plan_cast_to_its_dtype(budget):
    """model.plan is make_plan(cfg); every SPA block holds tril(B_l) and D_l of
    signal.dense_layer_bias (the plan's overrides included), cast to the model's dtype; the shared
    activation is the plan's activation_transform."""
    cfg = GPTConfig(vocab_size=16, block_size=8, n_layer=3, n_head=2, n_embd=16, dtype="float32",
                    kernel_budget=budget, gamma_final=0.05, eta=0.5)
    model = GPT(cfg)
    plan = signal.make_plan(cfg)
    assert model.plan.schedule == plan.schedule and model.plan.info == plan.info
    assert dict(model.plan.activation) == dict(plan.activation)
    assert (model.plan.overrides is None) == (budget == "independent")
    for l, block in enumerate(model.blocks, start=1):
        B, D = signal.dense_layer_bias(plan, l)
        assert block.attn.B.dtype == np.float32 and block.attn.D.dtype == np.float32
        np.testing.assert_array_equal(block.attn.B, np.tril(B).astype(np.float32))   # finite above
        np.testing.assert_array_equal(block.attn.D, D.astype(np.float32))
        assert block.mlp.act is model.activation
    act = model.activation
    assert isinstance(act, ShapedActivation) and act.params == plan.params and act.method == "tat"
    assert repr(act).startswith("tat leaky_relu(output_scale=")
    x = np.linspace(-2, 2, 9)
    p = plan.params
    expected = p["output_scale"] * np.where(x > 0, x, p["negative_slope"] * x)
    np.testing.assert_allclose(act(Tensor(x)).data, expected, rtol=1e-14)


def test_embeddings_follow_the_input_kernel_variances():
    cfg = tiny(pos="sinusoidal", n_embd=16, block_size=6)
    model = GPT(cfg)
    np.testing.assert_allclose(model.pe, signal.sinusoidal_encoding(6, 16), rtol=1e-15)
    learned = GPT(tiny(pos="learned", n_embd=512, vocab_size=64, n_layer=1))   # the blocks play no part
    # N(0, sigma^2) draws: 64 x 512 entries, sample variance within 5 sqrt(2 / n) (relative)
    n = 64 * 512
    assert np.var(learned.wte.weight.data) == pytest.approx(signal.token_variance("learned"), rel=5 * np.sqrt(2 / n))
    assert np.var(learned.wpe.weight.data) == pytest.approx(signal.POS_VARIANCE, rel=5 * np.sqrt(2 / (6 * 512)))


def test_an_edit_of_B_is_seen_by_the_next_call():
    """No cache stands between B_l and the softmax: an in-place edit of the stored B (one
    row's bias moved) changes the next forward exactly as loading the edited state does."""
    idx = np.arange(6).reshape(1, 6) % 11
    model = GPT(tiny(attention="espa"))
    before = model(idx)[0].data.copy()
    state = model.state_dict()
    state["blocks.0.attn.B"][5, :3] += 1.0
    edited = GPT(tiny(attention="espa"))
    edited.load_state_dict(state)
    model.blocks[0].attn.B[5, :3] += 1.0                         # in place, on the buffer
    after = model(idx)[0].data
    assert np.abs(after - before).max() > 1e-3
    np.testing.assert_array_equal(after, edited(idx)[0].data)
    assert GPT(tiny(attention="softmax")).blocks[0].attn.logit_bias() == (None, None)


def test_attention_implementation_follows_the_config():
    """auto: the dense reference up to model.DENSE_MAX_T positions, by blocks above (a SPA
    block then keeps B_l's O(T) parts and no (T, T) buffer); dense and blockwise as set."""
    from nanospa.model import DENSE_MAX_T
    blocks = lambda model, l=0: getattr(model.blocks[l].attn.evaluate, "by_blocks", False)  # noqa: E731
    short, long_ = (GPT(tiny(attention="espa", block_size=T)) for T in (DENSE_MAX_T, DENSE_MAX_T + 1))
    assert not blocks(short) and short.blocks[0].attn.B.shape == (DENSE_MAX_T,) * 2
    assert blocks(long_) and long_.blocks[0].attn.B is None
    assert long_.blocks[0].attn.parts["kind"] == "espa"
    forced = GPT(tiny(attention="uspa", attention_impl="dense", block_size=DENSE_MAX_T + 1))
    assert not blocks(forced, 1) and forced.blocks[1].attn.parts is None
    assert blocks(GPT(tiny(attention="softmax", attention_impl="blockwise")))


def test_after_step_calls_each_module_hook_once_in_module_order():
    from nanospa.config import GPTConfig
    from nanospa.model import GPT
    model = GPT(GPTConfig(n_layer=2, n_embd=8, n_head=2, block_size=4, vocab_size=11))
    calls = []
    for i, block in enumerate(model.blocks):
        block.mlp.after_step = lambda i=i: calls.append(i)
    model.after_step()
    assert calls == [0, 1]
    model.after_step()                    # a model without hooks: nothing (and no error)
    assert calls == [0, 1, 0, 1]


@pytest.mark.parametrize("attention", beyond.values("attention"))
@pytest.mark.parametrize("zero_query", [False, True])
def test_the_model_at_init_is_what_signal_says_each_attention_is(attention, zero_query):
    """The attention matrices a fresh model applies (its trace) are, layer by layer, the one
    definition of each attention at initialisation (its kind's at_init); a softmax with
    random queries has none and is data-dependent."""
    from nanospa.predict import attention_at_init
    cfg = tiny(attention=attention, zero_query=zero_query and attention == "softmax", n_layer=3)
    model = GPT(cfg, seed=0)
    tr = model.trace(IDX)
    for l in range(1, cfg.n_layer + 1):
        A = attention_at_init(cfg, model.plan, l, IDX.shape[1])[0]
        if A is None:
            assert attention == "softmax" and not cfg.zero_query
            continue
        for h in range(cfg.n_head):
            np.testing.assert_allclose(tr.attention[l - 1][:, h], np.broadcast_to(A, tr.attention[l - 1][:, h].shape),
                                       rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name", ["idx", "targets"])
@pytest.mark.parametrize("bad, message", [
    (-1, r"\[0, vocab_size=13\), got -1\.\.\d+ \(nanospa has no padding id"),
    (13, r"\[0, vocab_size=13\), got 0\.\.13"),
])
def test_ids_outside_the_vocabulary_are_refused_naming_the_argument(name, bad, message):
    """-1 (the usual padding id) would be read as the last token by the embedding's indexing
    and as the last class by the cross-entropy: refused, never silently misread."""
    model = GPT(tiny_config())
    x = np.random.default_rng(0).integers(0, 13, (2, 8))
    y = x.copy()
    (x if name == "idx" else y)[1, 3] = bad
    with pytest.raises(ValueError, match=rf"^{name}: token ids must lie in " + message):
        model(x, y)


def test_shapes_of_idx_and_targets_are_checked():
    model = GPT(tiny_config())
    x = np.zeros((2, 8), dtype=np.int64)
    with pytest.raises(ValueError, match=r"^idx: expected a \(batch, time\).*shape \(8,\) \(add a batch axis"):
        model(x[0])
    with pytest.raises(ValueError, match=r"^idx: .*shape \(0, 8\)"):
        model(x[:0], x[:0])                                 # an empty batch, not a loss of 0
    with pytest.raises(ValueError, match=r"^targets of shape \(2, 7\) should match idx's \(2, 8\)"):
        model(x, x[:, :7])
    with pytest.raises(ValueError, match=r"^targets: token ids must be integers"):
        model(x, x.astype(np.float32))


def test_generate_checks_its_settings():
    model = GPT(tiny_config())
    x = np.zeros((1, 2), dtype=np.int64)
    for kw, name in [(dict(max_new_tokens=-1), "max_new_tokens"), (dict(max_new_tokens=2.5), "max_new_tokens"),
                     (dict(max_new_tokens=1, temperature=float("nan")), "temperature"),
                     (dict(max_new_tokens=1, temperature=-1.0), "temperature"),
                     (dict(max_new_tokens=1, top_k=0), "top_k")]:
        with pytest.raises(ValueError, match=f"^generate: {name}"):
            generate(model, x, **kw)
    assert generate(model, x, max_new_tokens=3, top_k=1).shape == (1, 5)


def test_a_plan_written_by_hand_builds_the_model_without_the_budget(monkeypatch):
    """The plan is plain data: a Plan written out by hand (an E-SPA gamma schedule, TAT leaky
    ReLU with eta = 0.5) builds the model with the kernel budget never called, and each block
    applies at init the A_l = diag(D_l) softmax(B_l) of that schedule."""
    from nanospa.signal import budget
    from nanospa.signal.plan import Plan
    L, T = 3, 8
    plan = Plan(policy="by hand", kind="espa", n_layer=L, block_size=T,
                schedule=(np.inf,) + tuple(signal.espa_gammas(L, 0.2)[1:]),
                activation=dict(activation="leaky_relu", method="tat", depth=L, eta=0.5))

    def no_budget(*a, **k):
        raise AssertionError("the kernel budget ran")
    monkeypatch.setattr(budget, "make_plan", no_budget)
    monkeypatch.setattr(signal, "make_plan", no_budget)
    model = GPT(GPTConfig(vocab_size=16, block_size=T, n_layer=L, n_head=2, n_embd=16, dtype="float64"),
                plan=plan)
    attention = model.trace(np.arange(T)[None]).attention
    for l in range(1, L + 1):
        A = signal.realise(*signal.dense_layer_bias(plan, l, T))
        assert np.abs(attention[l - 1][0] - A).max() < 1e-12
    assert model.activation.params["negative_slope"] > 0.1     # eta = 0.5 at depth 3: a real leaky ReLU
    assert "by hand" in str(model.plan) and "eta=0.5" in str(model.plan)
