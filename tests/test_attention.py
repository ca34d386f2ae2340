"""Tests for nanospa/beyond/blockwise.py: the blockwise causal attention against central differences
(full Jacobian, float64, block sizes that do not divide T) and against the dense reference
(fused.softmax on the full scores), alone and inside whole models of every attention
variant (losses and every gradient to 1e-10 in float64); its O(B H T D) saved state; the
choice of implementation; a blockwise model's O(T) bias state, state dict and trace."""
from types import SimpleNamespace

import numpy as np
import pytest

from nanospa.run import threads as cpu
from nanospa import GPT, fused
from nanospa.beyond.blockwise import AUTO_BLOCK, BlockwiseAttention, block_size, causal_attention
from nanospa.model import DENSE_MAX_T, evaluation
from nanospa.gradcheck import check_directions, check_jacobian, tensor64
from nanospa.signal.attn_bias import bias_block, espa_bias, uspa_bias
from nanospa.tensor import Tensor

from conftest import perturbed_model, tiny_config

SCALE = 0.7


def normal(rng, *shape, scale=1.0):
    return scale * rng.standard_normal(shape)


def dense(q, k, v, bias=None, T=None):
    """The reference: fused.softmax on the full (T, T) scores, then P V."""
    T = q.shape[-2]
    b = None if bias is None else bias[:T, :T]
    return fused.softmax(q @ k.transpose(0, 1, 3, 2), b, scale=SCALE, causal=True) @ v


def espa_block_fn(T, gamma, gamma_prev):
    parts = espa_bias(T, gamma, gamma_prev)
    return parts, (lambda i0, i1, j0, j1: bias_block(parts, i0, i1, j0, j1))


# ---------------------------------------------------------------- gradients (float64)


@pytest.mark.parametrize("block", [2, 3])
def test_full_jacobian_without_bias(block):
    """Every entry of q, k and v, T = 5 with blocks of 2 and 3 (neither divides 5)."""
    rng = np.random.default_rng(0)
    q, k, v = (tensor64(normal(rng, 1, 2, 5, 3)) for _ in range(3))
    err = check_jacobian(lambda a, b, c: causal_attention(a, b, c, SCALE, block), [q, k, v])
    assert err < 1e-6


def test_full_jacobian_with_a_trainable_bias_larger_than_T():
    """A (T_max, T_max) bias input, T_max = 6 > T = 5: its gradient on the causal entries
    of the first T rows and columns, zero elsewhere (the Jacobian says so entry by entry)."""
    rng = np.random.default_rng(1)
    q, k, v = (tensor64(normal(rng, 2, 1, 5, 2)) for _ in range(3))
    bias = tensor64(normal(rng, 6, 6))
    err = check_jacobian(lambda a, b, c, d: causal_attention(a, b, c, SCALE, 2, bias=d), [q, k, v, bias])
    assert err < 1e-6
    assert np.all(bias.grad[np.triu_indices(6, 1)] == 0) and np.all(bias.grad[5:] == 0)


def test_full_jacobian_with_a_generated_bias():
    """SPA's fixed E-SPA bias generated block by block (a constant: no gradient)."""
    rng = np.random.default_rng(2)
    _, fn = espa_block_fn(7, 0.4, 1.1)
    q, k, v = (tensor64(normal(rng, 1, 2, 7, 2)) for _ in range(3))
    assert check_jacobian(lambda a, b, c: causal_attention(a, b, c, SCALE, 3, bias_block=fn), [q, k, v]) < 1e-6


def test_full_jacobian_with_a_trainable_bias_and_a_per_head_generated_one():
    """Both at once (a trainable B_l with ALiBi): the generated block is one per head,
    (H, bq, bk); the trainable bias gets the gradient of the sum."""
    rng = np.random.default_rng(4)
    slopes = np.array([0.5, 0.125])
    fn = lambda i0, i1, j0, j1: -slopes[:, None, None] * (np.arange(i0, i1)[:, None] - np.arange(j0, j1)[None, :])
    q, k, v = (tensor64(normal(rng, 2, 2, 5, 2)) for _ in range(3))
    bias = tensor64(normal(rng, 5, 5))
    err = check_jacobian(lambda a, b, c, d: causal_attention(a, b, c, SCALE, 2, bias=d, bias_block=fn), [q, k, v, bias])
    assert err < 1e-6
    dense_bias = Tensor(bias.data + fn(0, 5, 0, 5))                             # (H, T, T)
    ref = dense(Tensor(q.data), Tensor(k.data), Tensor(v.data), dense_bias)
    got = causal_attention(Tensor(q.data), Tensor(k.data), Tensor(v.data), SCALE, 2, bias=Tensor(bias.data),
                           bias_block=fn)
    np.testing.assert_allclose(got.data, ref.data, rtol=1e-13, atol=1e-14)


# ---------------------------------------------------------------- equality with the dense path


def _compare(rng, shape, block, bias=None, bias_fn=None, dense_bias=None, logit_scale=1.0):
    """Blockwise and dense outputs and gradients (q, k, v, bias) for one random upstream
    gradient; returns the largest absolute difference."""
    q, k, v = (normal(rng, *shape, scale=logit_scale) for _ in range(3))
    arrays = [q, k, v] + ([bias] if bias is not None else [])
    a = [Tensor(x.copy(), requires_grad=True) for x in arrays]
    b = [Tensor(x.copy(), requires_grad=True) for x in arrays]
    y_blk = causal_attention(*a[:3], SCALE, block, bias=a[3] if bias is not None else None, bias_block=bias_fn)
    ref_bias = b[3] if bias is not None else (None if dense_bias is None else Tensor(dense_bias))
    y_ref = dense(*b[:3], ref_bias)
    R = rng.standard_normal(y_ref.shape)
    y_blk.backward(R)
    y_ref.backward(R)
    diffs = [np.abs(y_blk.data - y_ref.data).max()]
    diffs += [np.abs(x.grad - y.grad).max() for x, y in zip(a, b)]
    return max(diffs)


@pytest.mark.parametrize("block", [1, 3, 4, 16, 40])
def test_equals_dense_for_every_block_size(block):
    """T = 16 with blocks of 1, 3 (does not divide), 4, T and more than T; float64 outputs
    and gradients of q, k, v and a trainable bias agree to rounding (observed ~1e-15)."""
    rng = np.random.default_rng(3)
    assert _compare(rng, (2, 3, 16, 4), block) < 1e-12
    assert _compare(rng, (2, 3, 16, 4), block, bias=normal(rng, 16, 16)) < 1e-12


def test_equals_dense_with_spa_biases_and_large_logits():
    """E-SPA layer 1 (entries down to about -60 here), an identity step (bias -inf off the
    diagonal: the diagonal block must come first) and U-SPA, from generated blocks; and
    logits of size ~100, where the running maximum does the work."""
    rng = np.random.default_rng(4)
    T = 29
    for kind, value, prev in (("espa", 2.0, np.inf), ("espa", 0.3, 0.3), ("uspa", 0.6, 0.2)):
        parts = {"espa": espa_bias, "uspa": uspa_bias}[kind](T, value, prev)
        B = bias_block(parts, 0, T, 0, T)
        fn = lambda i0, i1, j0, j1, p=parts: bias_block(p, i0, i1, j0, j1)
        assert _compare(rng, (1, 2, T, 3), 5, bias_fn=fn, dense_bias=np.tril(B)) < 1e-12
    # q, k, v ~ N(0, 16): logits up to ~50 and gradients ~1e2, so rounding ~1e2 eps (observed 3e-13)
    assert _compare(rng, (2, 2, T, 8), 7, logit_scale=4.0) < 1e-11


def test_keeps_float32():
    rng = np.random.default_rng(5)
    q, k, v = (Tensor(normal(rng, 1, 2, 9, 4).astype(np.float32), requires_grad=True) for _ in range(3))
    bias = Tensor(normal(rng, 9, 9).astype(np.float32), requires_grad=True)
    y = causal_attention(q, k, v, SCALE, 4, bias=bias)
    assert y.dtype == np.float32
    y.backward(np.ones(y.shape, np.float32))
    assert all(t.grad.dtype == np.float32 for t in (q, k, v, bias))
    np.testing.assert_allclose(y.data, dense(q, k, v, bias).data, rtol=2e-5, atol=2e-6)


def test_saves_O_BHTD_and_skips_blocks_above_the_diagonal():
    """The forward keeps scale Q, K, V, Y (B, H, T, D) and lse (B, H, T): no (T, T) array;
    and it computes only the blocks J <= I: T = 12 in blocks of 4 makes 6 score blocks, not
    9 (counted through the bias function, asked once per block)."""
    rng = np.random.default_rng(6)
    B, H, T, D = 2, 2, 12, 3
    asked = []

    def fn(i0, i1, j0, j1):
        asked.append((i0, j0))
        return np.zeros((i1 - i0, j1 - j0))

    q, k, v = (Tensor(normal(rng, B, H, T, D), requires_grad=True) for _ in range(3))
    y = causal_attention(q, k, v, SCALE, 4, bias_block=fn)
    ctx = y._ctx
    assert isinstance(ctx, BlockwiseAttention)
    saved = [a for a in ctx.saved if a is not None]
    assert sum(a.size for a in saved) == 4 * B * H * T * D + B * H * T
    assert sorted(asked) == [(0, 0), (4, 0), (4, 4), (8, 0), (8, 4), (8, 8)]
    y.backward(np.ones(y.shape))
    assert len(asked) == 12                                  # the backward recomputes the same 6


def test_block_size_and_implementation_choice():
    assert block_size(100, 0) == min(100, AUTO_BLOCK) and block_size(5000, 0) == AUTO_BLOCK
    assert block_size(100, 7) == 7
    impl = lambda i, T: "blockwise" if getattr(evaluation(SimpleNamespace(  # noqa: E731
        attention_impl=i, block_size=T, residual_attention=False, attention_block=0)), "by_blocks", False) else "dense"
    assert impl("auto", DENSE_MAX_T) == "dense"
    assert impl("auto", DENSE_MAX_T + 1) == "blockwise"
    assert impl("dense", 10 ** 6) == "dense" and impl("blockwise", 4) == "blockwise"
    with pytest.raises(ValueError, match="attention_impl"):
        tiny_config(attention_impl="flash")


# ---------------------------------------------------------------- whole models


MODEL_CASES = [dict(attention="softmax"), dict(attention="value_skipinit"),
               dict(attention="value_skipinit", skipinit_per_head=True), dict(attention="uspa"),
               dict(attention="espa"), dict(attention="espa", train_bias=True),
               dict(attention="uspa", train_bias=True),
               dict(attention="espa", kernel_budget="qpreserve", activation="gelu"),
               dict(attention="espa", kernel_budget="mlp_aware", activation="dks_gelu"),
               dict(attention="espa", residual="standard", norm="layernorm", pos="learned"),
               dict(attention="uspa", residual="normalised", norm="rmsnorm", norm_position="post")]


@pytest.mark.parametrize("case", MODEL_CASES, ids=lambda c: "-".join(f"{v}" for v in c.values()))
def test_blockwise_model_equals_dense_model(case):
    """Every attention variant (SPA with bias and D_l, Value-SkipInit, trainable biases, the
    policies with their own D_l and dense B_l): the same weights give the same float64 loss
    and the same gradient of every parameter to 1e-10 (observed ~1e-15), with a block of 3
    that does not divide T = 8."""
    models = [perturbed_model(tiny_config(attention_impl=impl, attention_block=3, **case))
              for impl in ("dense", "blockwise")]
    idx = np.random.default_rng(7).integers(0, 13, (2, 8))
    tgt = np.roll(idx, -1, axis=1)
    losses, grads = [], []
    for m in models:
        _, loss = m(idx, tgt)
        loss.backward()
        losses.append(loss.item())
        grads.append({n: p.grad for n, p in m.named_parameters()})
    assert models[1].blocks[0].attn.evaluate.by_blocks
    assert losses[0] == pytest.approx(losses[1], rel=1e-10, abs=1e-10)
    assert grads[0].keys() == grads[1].keys()
    for n in grads[0]:
        np.testing.assert_allclose(grads[1][n], grads[0][n], rtol=1e-10, atol=1e-10, err_msg=n)


def test_blockwise_model_directional_gradcheck():
    model = perturbed_model(tiny_config(attention="espa", attention_impl="blockwise", attention_block=3,
                                        train_bias=True))
    idx = np.random.default_rng(8).integers(0, 13, (2, 8))
    assert check_directions(lambda: model(idx, np.roll(idx, -1, 1))[1], model.parameters(), n_directions=2) < 1e-6


def test_blockwise_model_keeps_O_T_bias_state_and_its_state_dict_round_trips():
    """A blockwise SPA model stores no (T, T) array: D_l (T,) and B_l's parts (a few
    length-T vectors, not in the state dict: a fixed B_l is a function of the config).
    Loading its state dict into a model of another seed reproduces it; trace() runs the
    dense reference on the generated B_l and reports the dense model's attention."""
    T = 1024
    cfg = tiny_config(attention="espa", block_size=T, attention_impl="blockwise", n_layer=2, activation="gelu")
    a = GPT(cfg, seed=0)
    state = a.state_dict()
    assert not any(k.endswith("attn.B") for k in state) and state["blocks.1.attn.D"].shape == (T,)
    for block in a.blocks:
        parts = block.attn.parts
        assert max(x.size for x in parts.values() if isinstance(x, np.ndarray)) < 2 * T
    assert max(x.size for x in state.values()) < T * 64
    b = GPT(cfg, seed=5)
    b.load_state_dict(state)
    idx = np.random.default_rng(9).integers(0, 13, (1, 40))
    np.testing.assert_array_equal(b(idx)[0].data, a(idx)[0].data)
    dense_model = GPT(tiny_config(**{**cfg.to_dict(), "attention_impl": "dense"}), seed=0)
    tr, ref = a.trace(idx[:, :12]), dense_model.trace(idx[:, :12])
    for x, y in zip(tr.attention, ref.attention):
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-14)


def test_the_benchmark_yardstick_sees_the_dense_bias_of_a_blockwise_model():
    """The benchmark hands PyTorch a blockwise model with the dense tril(B_l) it no longer
    stores, generated per key when asked: the dense model's state dict, entry for entry."""
    from nanospa.bench.view import DenseView
    cfg = tiny_config(attention="uspa", block_size=12)
    blockwise = GPT(tiny_config(**{**cfg.to_dict(), "attention_impl": "blockwise"}), seed=0)
    dense_state = GPT(cfg, seed=0).state_dict()
    view = DenseView(blockwise).state_dict()
    assert sorted(view) == sorted(dense_state) and len(view) == len(dense_state)
    for k, v in view.items():
        np.testing.assert_array_equal(v, dense_state[k], err_msg=k)


def test_worker_threads_split_the_blocks_without_changing_the_result():
    """From the main thread with run/threads.threads() = 2 the blocks are split between two
    workers: Y, dK, dV and the bias gradient are the serial ones bit for bit, dQ (a sum of
    two partials) to rounding, and two threaded runs agree bit for bit. run/threads.balanced_groups balances
    the work (query block a costs a + 1 key blocks) and covers every block once."""
    from nanospa import backend
    from nanospa.beyond.blockwise import _workers
    _groups = cpu.balanced_groups
    rng = np.random.default_rng(10)
    arrays = [normal(rng, 2, 2, 23, 3) for _ in range(3)] + [normal(rng, 23, 23)]

    def run():
        ts = [Tensor(a.copy(), requires_grad=True) for a in arrays]
        y = causal_attention(*ts[:3], SCALE, 4, bias=ts[3])
        y.backward(np.cos(np.arange(y.size)).reshape(y.shape))
        return [y.data] + [t.grad for t in ts]

    serial = run()
    previous = cpu.set_threads(2)
    try:
        assert _workers(6) == 2 and _workers(1) == 1
        threaded, again = run(), run()
    finally:
        cpu.set_threads(previous)
    for i in (0, 2, 3, 4):
        np.testing.assert_array_equal(threaded[i], serial[i])
    np.testing.assert_allclose(threaded[1], serial[1], rtol=0, atol=1e-14)
    for x, z in zip(threaded, again):
        np.testing.assert_array_equal(x, z)
    groups = _groups([a + 1 for a in range(6)], 2)
    assert sorted(i for g in groups for i in g) == list(range(6))
    assert [sum(a + 1 for a in g) for g in groups] == [11, 10]
    assert _groups([1, 1], 4) == [[0], [1]]
