"""generate's KV cache (sampling.KVCache): the prompt's window runs once, then each new token
runs alone at its position against the keys and values kept; past block_size the moved window
runs again. For every registered value of attention, pos, residual and norm (model.py's
registries and beyond.EXTENSIONS: a value added later is checked here with no edit), and the
settings that change how attention is evaluated or stored (by blocks, RealFormer's carried
scores, a trainable B_l, a budget's own B_l or D_l), in float64 and float32 (float32's
generate in the full suite only):

- each cached step's logits are the full forward's row of that position, to rounding;
- generate with the cache gives the uncached loop's tokens, greedy and sampled with one rng
  over a prompt of 5 and 12 new tokens at block_size 8 (the window moves 8 times), and feeds
  the model one token at a time where it may (the cache is really used).

A variant that does not say on its own class that it is exact with the cache, or says why not
(BatchNorm's causal running statistics, per position), runs the uncached loop: tested here,
with the wrong answer the cache would give it. Planted mistakes, each reverted (2026-12-03):
the fixed logits' rows 0.. for the new rows start.. (132 of 165 tests failed), D_l's rows 0..
(112), the causal mask aligned top-left (152), the embedding's position start - 1 (13), RoPE's
new keys rotated at position 0 (8), RealFormer's scores not carried in the cached steps (8),
the moved window prefilled one token short (78), kv_cache read through inheritance (1).
(ALiBi's new row at position 0 fails nothing, rightly: -m (i - j) shifted by a constant per
row leaves the softmax unchanged.)
"""
import warnings

import numpy as np
import pytest

from nanospa import GPT, beyond
from nanospa.model import ATTENTIONS, Attention
from nanospa.sampling import KVCache, generate, kv_cache_refusal
from nanospa.tensor import no_grad

from conftest import tiny_config

PROMPT, NEW, T = 5, 12, 8        # tiny_config's block_size 8: the context passes it after 3 tokens
COMPANIONS = {("residual", "deepnorm"): dict(norm="layernorm"),
              ("residual", "ngpt"): dict(attention="softmax", activation="swish"),
              ("pos", "spa_prior"): dict(attention="softmax"),
              ("norm", "groupnorm"): dict(norm_groups=2)}
SETTINGS = {"blockwise": dict(attention_impl="blockwise", attention_block=3),
            "blockwise-uspa": dict(attention="uspa", attention_impl="blockwise", attention_block=3),
            "blockwise-alibi-espa": dict(pos="alibi", attention_impl="blockwise", attention_block=3),
            "blockwise-rope-softmax": dict(pos="rope", attention="softmax", attention_impl="blockwise",
                                           attention_block=3),
            "blockwise-spa_prior": dict(pos="spa_prior", attention="softmax", attention_impl="blockwise",
                                        attention_block=3),
            "realformer": dict(residual_attention=True, attention="softmax"),
            "realformer-espa-alibi": dict(residual_attention=True, pos="alibi"),
            "train_bias": dict(train_bias=True),
            "blockwise-train_bias": dict(train_bias=True, attention_impl="blockwise", attention_block=3),
            "spa_prior-train_bias": dict(pos="spa_prior", attention="softmax", train_bias=True),
            "blockwise-mlp_aware": dict(kernel_budget="mlp_aware", activation="dks_gelu", attention_block=3,
                                        attention_impl="blockwise"),                # B_l, D_l of its own
            "blockwise-qpreserve": dict(kernel_budget="qpreserve", activation="gelu", attention_block=3,
                                        attention_impl="blockwise"),                # its own D_l
            "train_bias-alibi": dict(train_bias=True, pos="alibi"),
            "skipinit_per_head": dict(attention="value_skipinit", skipinit_per_head=True),
            "post-ln-learned": dict(residual="standard", norm="layernorm", norm_position="post", pos="learned"),
            "tied-dropout": dict(tie_embeddings=True, dropout=0.2, bias=True),
            "prepbn-mixing": dict(residual="standard", norm="prepbn", prepbn_steps=4)}


def settings():
    """(name, GPTConfig fields): one per registered value, with what it needs beside it, then SETTINGS."""
    out = []
    for field in ("attention", "pos", "residual", "norm"):
        for value in beyond.values(field):
            kw = {field: value, **COMPANIONS.get((field, value), {})}
            if field == "norm" and value != "none":
                kw["residual"] = "standard"
            out.append((f"{field}={value}", kw))
    return out + list(SETTINGS.items())


def model_of(kw, dtype):
    """A tiny model of kw and dtype off its initialisation (conftest.perturbed_model's, in the
    model's dtype), BatchNorm's running statistics and PRepBN's schedule moved too."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                       # BatchNorm's non-causal warning
        model = GPT(tiny_config(dtype=dtype, **kw))
    rng = np.random.default_rng(3)
    for p in model.parameters():                              # W^Q = 0 at init: move every weight
        p.data = p.data + (0.3 * rng.standard_normal(p.shape)).astype(dtype)
    for m in model.modules():
        if hasattr(m, "running_mean"):
            m.running_mean = m.running_mean + rng.standard_normal(m.running_mean.shape).astype(dtype)
            m.running_var = m.running_var * np.exp(rng.standard_normal(m.running_var.shape)).astype(dtype)
        if hasattr(m, "steps_done"):
            for _ in range(2):
                m.after_step()                                # PRepBN: 0 < lambda < 1, LN and BN mixed
    return model


def widths(model, *args, **kw):
    """generate(*args, **kw) -> (tokens, the width of each forward's input)."""
    seen, forward = [], model.forward
    model.forward = lambda idx, *a, **k: (seen.append(np.shape(idx)[1]), forward(idx, *a, **k))[1]
    try:
        return generate(model, *args, **kw), seen
    finally:
        del model.forward


IDS = [name for name, _ in settings()]
TOL = {"float64": 1e-12, "float32": 3e-5}     # of the largest logit; measured at most 2.1e-15 and 2.7e-6


@pytest.mark.parametrize("name, kw", settings(), ids=IDS)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_each_cached_step_is_the_full_forwards_row(name, kw, dtype):
    """Prefill 3 positions, then 5 one at a time: the logits are the full forward's rows."""
    model = model_of(kw, dtype)
    if kv_cache_refusal(model.config) is not None:
        pytest.skip("runs uncached (test_a_variant_that_refuses_the_cache_runs_uncached)")
    idx = np.random.default_rng(1).integers(0, model.config.vocab_size, (2, T))
    with no_grad(), model.evaluating():
        full = model(idx)[0].data
        kept = [KVCache(T) for _ in model.blocks]
        rows = [model(idx[:, :3], cache=kept)[0].data] + [model(idx[:, t:t + 1], cache=kept)[0].data
                                                          for t in range(3, T)]
    assert [c.length for c in kept] == [T] * len(kept)
    err = np.abs(np.concatenate(rows, axis=1) - full).max() / np.abs(full).max()
    assert err < TOL[dtype], err


@pytest.mark.parametrize("name, kw", settings(), ids=IDS)
@pytest.mark.parametrize("dtype", ["float64", pytest.param("float32", marks=pytest.mark.slow)])
def test_cached_generate_gives_the_uncached_tokens(name, kw, dtype):
    """Greedy and sampled (one rng seed), the window moving 8 times. (float32 in the full
    suite only: the fast tier checks its logits above.)"""
    model = model_of(kw, dtype)
    prompt = np.random.default_rng(2).integers(0, model.config.vocab_size, (2, PROMPT))
    cached = kv_cache_refusal(model.config) is None
    for temperature in (0.0, 1.0):
        args = (prompt, NEW, temperature)
        plain, w_plain = widths(model, *args, rng=np.random.default_rng(7), cache=False)
        got, w_got = widths(model, *args, rng=np.random.default_rng(7))
        np.testing.assert_array_equal(got, plain, err_msg=f"temperature {temperature}")
        assert w_plain == [5, 6, 7, 8] + [8] * 8
        assert w_got == ([5, 1, 1, 1] + [8] * 8 if cached else w_plain)   # a window's prefill once full


def test_a_prompt_longer_than_the_window_is_cropped_as_without_the_cache():
    model = model_of(dict(pos="learned"), "float64")
    prompt = np.random.default_rng(2).integers(0, 13, (1, 11))
    got, w = widths(model, prompt, 3, 1.0, rng=np.random.default_rng(7))
    assert w == [8, 8, 8]                                     # each token a moved window's prefill
    np.testing.assert_array_equal(got, generate(model, prompt, 3, 1.0, rng=np.random.default_rng(7), cache=False))


def test_every_registered_value_is_cached_except_causal_batch_statistics():
    """Which variants run uncached, and why: nothing else falls back."""
    refused = {name: kv_cache_refusal(tiny_config(**kw)) for name, kw in settings()}
    assert {k for k, v in refused.items() if v} == set()
    for norm in ("batchnorm", "prepbn"):
        why = kv_cache_refusal(tiny_config(residual="standard", norm=norm, norm_causal=True))
        assert why.startswith(f"norm={norm!r}: ") and "does not know t" in why


@pytest.mark.parametrize("norm", ["batchnorm", "prepbn"])
def test_a_variant_that_refuses_the_cache_runs_uncached(norm):
    """Causal BatchNorm normalises position t by running statistics of its own: called on one
    new token it reads position 0's, so the cache would be wrong; generate runs uncached."""
    model = model_of(dict(residual="standard", norm=norm, norm_causal=True), "float64")
    prompt = np.random.default_rng(2).integers(0, 13, (2, PROMPT))
    got, w = widths(model, prompt, NEW, 0.0)
    assert w == [5, 6, 7, 8] + [8] * 8
    np.testing.assert_array_equal(got, generate(model, prompt, NEW, 0.0, cache=False))
    with no_grad(), model.evaluating():                       # what the cache would have given
        kept = [KVCache(T) for _ in model.blocks]
        model(prompt, cache=kept)
        step = model(prompt[:, :1], cache=kept)[0].data[:, 0]
        full = model(np.concatenate([prompt, prompt[:, :1]], axis=1))[0].data[:, -1]
    assert np.abs(step - full).max() > 1e-3


def test_a_variant_that_does_not_say_runs_uncached(monkeypatch):
    """An attention kind inherits no kv_cache: a subclass changes what it computes."""
    monkeypatch.setitem(ATTENTIONS, "quiet", type("Quiet", (Attention,), {}))
    cfg = tiny_config(attention="quiet")
    assert "attention='quiet': it does not say that it is exact with a KV cache" in kv_cache_refusal(cfg)
    model = GPT(cfg)
    assert widths(model, np.zeros((1, 2), dtype=np.int64), 3)[1] == [2, 3, 4]


def test_generate_checks_cache_and_the_cache_its_length():
    model = GPT(tiny_config())
    with pytest.raises(ValueError, match="^generate: cache must be True or False, got 'yes'"):
        generate(model, np.zeros((1, 2), dtype=np.int64), 2, cache="yes")
    kept = [KVCache(T) for _ in model.blocks]
    with no_grad():
        model(np.zeros((1, 6), dtype=np.int64), cache=kept)
        with pytest.raises(ValueError, match="sequence length 9 exceeds block_size 8"):
            model(np.zeros((1, 3), dtype=np.int64), cache=kept)


@pytest.mark.parametrize("kw", [{}, dict(attention="softmax", pos="rope"), dict(residual_attention=True),
                                dict(attention_impl="blockwise", attention_block=3, pos="alibi")],
                         ids=["espa", "rope", "realformer", "blockwise-alibi"])
def test_cached_generate_on_the_device_gives_the_cpus_tokens(gpu, kw):
    """On the strict CuPy stand-in (tests/test_gpu.py): the cache's buffers live on the device."""
    from nanospa import backend
    prompt = np.random.default_rng(2).integers(0, 13, (2, PROMPT))
    backend.use("cpu")
    host = model_of(kw, "float64")
    backend.use("cuda")
    model = GPT(host.config)
    model.load_state_dict(host.state_dict())
    got = generate(model, prompt, NEW, 1.0, rng=np.random.default_rng(7))
    backend.use("cpu")
    np.testing.assert_array_equal(got, generate(host, prompt, NEW, 1.0, rng=np.random.default_rng(7)))
