"""Tests for nanospa/measure.py: token batches, the measured configuration and the kernels
measured on a real model at init (what nanospa.signal predicts in the wide limit; the
comparison itself: tests/test_predict.py)."""
import numpy as np
import pytest

from nanospa import GPT, GPTConfig
from nanospa.measure import measure_config, measured_kernels, measured_model_kernels, token_batch
from nanospa.signal import kernel_matrix


def small(**kw):
    base = dict(vocab_size=32, block_size=8, n_layer=3, n_head=2, n_embd=16, activation="gelu")
    base.update(kw)
    return GPTConfig(**base)


def test_distinct_token_batch():
    cfg = small()
    idx = token_batch(cfg, 5, seed=1)
    assert idx.shape == (5, 8) and idx.dtype == np.int64
    assert all(len(set(row.tolist())) == 8 for row in idx) and idx.min() >= 0 and idx.max() < 32
    np.testing.assert_array_equal(idx, token_batch(cfg, 5, seed=1))        # seeded
    assert not np.array_equal(idx, token_batch(cfg, 5, seed=2))
    with pytest.raises(ValueError, match="block_size <= vocab_size=32"):
        token_batch(small(block_size=40), 2)
    with pytest.raises(ValueError, match="tokens='words' is not one of"):
        token_batch(cfg, 2, tokens="words")


def test_data_token_batch(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOSPA_CACHE", str(tmp_path / "cache"))
    text = tmp_path / "t.txt"
    text.write_text("abcdefghijklmnopqrstuvwxyz" * 40, encoding="utf-8")
    idx = token_batch(small(vocab_size=256), 3, tokens="data", data=str(text), seed=0)
    assert idx.shape == (3, 8) and idx.dtype == np.int64
    for row in idx:                                       # windows of the byte text
        assert bytes(row.tolist()).decode() in "abcdefghijklmnopqrstuvwxyz" * 2


def test_measure_config():
    cfg = small(dtype="float32", attention="uspa")
    m = measure_config(cfg, 64)
    assert m.n_embd == 64 and m.dtype == "float64" and m.attention == "uspa" and m.n_layer == 3
    assert cfg.n_embd == 16                               # a copy, the original unchanged
    with pytest.raises(ValueError, match="width=15 is not divisible by n_head=2"):
        measure_config(cfg, 15)


def test_measured_kernels_are_batch_means_of_the_trace():
    cfg = small(dtype="float64")
    model = GPT(cfg, seed=0)
    idx = token_batch(cfg, 3, seed=0)
    meas = measured_kernels(model, idx)
    tr = model.trace(idx)
    assert len(meas["hidden"]) == cfg.n_layer + 1 and len(meas["attn_branch"]) == cfg.n_layer
    for l, h in enumerate(tr.hidden):
        expected = np.mean([h[b] @ h[b].T / cfg.n_embd for b in range(3)], axis=0)
        np.testing.assert_allclose(meas["hidden"][l], expected, rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(meas["attn_branch"][1], kernel_matrix(tr.attn_out[1], mean=True), rtol=0, atol=0)
    # the embedding output of distinct tokens: q near 1 (token variance 1 without positions);
    # each q is a mean of 16 squares (sd sqrt(2/16)), averaged over >= 8 distinct tokens: 5 sd
    assert np.mean(np.diag(meas["hidden"][0])) == pytest.approx(1.0, abs=5 * np.sqrt(2 / 16 / 8))
    # measured_model_kernels builds GPT(cfg, seed) itself
    for a, b in zip(measured_model_kernels(cfg, idx, seed=0), meas["hidden"]):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(measured_model_kernels(cfg, idx, seed=1)[2], meas["hidden"][2])


@pytest.mark.parametrize("kw", [dict(attention="espa"), dict(attention="uspa"), dict(attention="value_skipinit"),
                                dict(attention="softmax", residual="standard", norm="layernorm", pos="learned")])
def test_the_first_positions_statistics_are_those_of_the_whole_sequence(kw):
    """train.py measures and predicts cos[l], q[l] on the first SIGNAL_POSITIONS positions only
    (O(W^2) memory where the whole (T, T) kernels cost more than the step at long T). The
    model is causal, so the kernels of the first W positions are the top-left block of the
    whole sequence's, measured and predicted alike (the plan is the whole T's)."""
    from nanospa.predict import predicted_kernels
    cfg = GPTConfig(vocab_size=64, block_size=32, n_layer=3, n_head=2, n_embd=16, dtype="float64", **kw)
    model = GPT(cfg)
    idx = np.random.default_rng(0).integers(0, 64, (3, 32))
    whole, window = measured_kernels(model, idx)["hidden"], measured_kernels(model, idx[:, :8])["hidden"]
    for S, W in zip(whole, window):
        np.testing.assert_allclose(W, S[:8, :8], rtol=1e-12, atol=1e-14)
    if kw["attention"] != "softmax":            # softmax with random queries: a Monte Carlo estimate
        whole, window = predicted_kernels(cfg, model.plan, idx), predicted_kernels(cfg, model.plan, idx[:, :8])
        for S, W in zip(whole, window):
            np.testing.assert_allclose(W, S[:8, :8], rtol=1e-12, atol=1e-14)
