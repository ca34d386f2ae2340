"""run/heads.py: dense attention by groups of heads on the worker threads.

The model with share_heads at 2, 3 and 4 threads gives bit for bit the loss and every
parameter's gradient of the same model evaluating densely on one thread: for every attention
kind, a per-head bias (ALiBi), RoPE, float32 and float64, a batch of 1 and of 2. Where a split
would change a number (dropout in training, a trained bias B_l) or has nothing to split (one
thread, a worker thread, generation's cache, a trace) it falls back to dense_attention, and
the op is then not called.
"""
import numpy as np
import pytest

from nanospa import model as M
from nanospa.config import GPTConfig
from nanospa.model import GPT
from nanospa.run import heads, threads
from nanospa.sampling import generate


@pytest.fixture(autouse=True)
def _one_thread_after(monkeypatch):
    monkeypatch.setattr(heads, "MIN_GROUP_LOGITS", 0)     # these models are small: split them anyway
    yield
    threads.set_threads(1)


def config(**kw):
    base = dict(n_layer=2, n_head=4, n_embd=32, block_size=48, vocab_size=40)
    return GPTConfig(**{**base, **kw})


def batch(cfg, B, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.integers(0, cfg.vocab_size, (B, cfg.block_size)),
            rng.integers(0, cfg.vocab_size, (B, cfg.block_size)))


def loss_and_grads(cfg, n_threads, B=1, share=True):
    threads.set_threads(n_threads)
    m = GPT(cfg, seed=3)
    changed = heads.share_heads(m) if share else 0
    _, loss = m(*batch(cfg, B))
    loss.backward()
    return changed, loss.data.copy(), {k: p.grad.copy() for k, p in m.named_parameters()}


CASES = {
    "espa": dict(attention="espa"),
    "uspa": dict(attention="uspa"),
    "softmax": dict(attention="softmax"),
    "value_skipinit per head": dict(attention="value_skipinit", skipinit_per_head=True),
    "softmax with alibi (a bias per head)": dict(attention="softmax", pos="alibi"),
    "espa with rope": dict(attention="espa", pos="rope"),
    "float64 espa, 3 heads": dict(attention="espa", dtype="float64", n_head=3, n_embd=24),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("n_threads", [2, 3, 4])
@pytest.mark.parametrize("B", [1, 2])
def test_heads_on_threads_are_the_dense_attention_of_one_thread_bit_for_bit(monkeypatch, case, n_threads, B):
    cfg = config(**CASES[case])
    _, loss1, grads1 = loss_and_grads(cfg, 1, B, share=False)
    calls = calls_of_the_op(monkeypatch)
    changed, loss, grads = loss_and_grads(cfg, n_threads, B)
    assert changed == cfg.n_layer
    assert calls == [min(n_threads, cfg.n_head)] * cfg.n_layer      # the split ran, in every layer
    assert loss == loss1
    assert grads.keys() == grads1.keys()
    for name in grads1:
        np.testing.assert_array_equal(grads[name], grads1[name], err_msg=name)


def calls_of_the_op(monkeypatch):
    calls = []
    apply = heads.HeadGroups.apply
    monkeypatch.setattr(heads.HeadGroups, "apply", lambda *a, **k: calls.append(k["groups"]) or apply(*a, **k))
    return calls


def test_the_op_runs_with_threads_and_groups_no_more_than_heads(monkeypatch):
    calls = calls_of_the_op(monkeypatch)
    loss_and_grads(config(attention="espa", n_head=2, n_embd=16), 4)
    assert calls == [2, 2]                       # two layers, 4 threads but 2 heads: 2 groups


@pytest.mark.parametrize("why", ["one thread", "small groups", "dropout in training", "trained bias", "in a worker"])
def test_falls_back_to_dense_attention_where_a_split_would_change_a_number(monkeypatch, why):
    calls = calls_of_the_op(monkeypatch)
    kw = dict(attention="espa")
    if why == "dropout in training":
        kw = dict(attention="softmax", dropout=0.1)
    if why == "trained bias":
        kw = dict(attention="espa", train_bias=True)
    if why == "small groups":                    # 2 heads of 48 x 48 logits a group: 4,608
        monkeypatch.setattr(heads, "MIN_GROUP_LOGITS", 2 * 48 * 48 + 1)
    cfg = config(**kw)
    n = 1 if why == "one thread" else 2
    _, loss1, grads1 = loss_and_grads(cfg, 1, share=False)
    if why == "in a worker":
        threads.set_threads(2)
        out = threads.parallel_map(lambda i: loss_and_grads(cfg, 2)[1:] if i == 0 else None, range(2))
        loss, grads = out[0]
    else:
        _, loss, grads = loss_and_grads(cfg, n)
    assert calls == []
    assert loss == loss1
    for name in grads1:
        np.testing.assert_array_equal(grads[name], grads1[name], err_msg=name)


def test_a_trace_and_the_cached_rows_are_dense_attention_s(monkeypatch):
    cfg = config(attention="espa")
    threads.set_threads(2)
    shared, plain = GPT(cfg, seed=1), GPT(cfg, seed=1)
    heads.share_heads(shared)
    idx = batch(cfg, 1)[0][:, :20]
    calls = calls_of_the_op(monkeypatch)
    a, b = shared.trace(idx), plain.trace(idx)
    for x, y in zip(a.attention, b.attention):
        np.testing.assert_array_equal(x, y)
    assert calls == []                           # a trace asks dense_attention (by_blocks)
    out = generate(shared, idx, 12, temperature=0.0, cache=True)
    ref = generate(plain, idx, 12, temperature=0.0, cache=True)
    np.testing.assert_array_equal(out, ref)
    assert calls == [2, 2]                       # the prompt's forward only; each new token's rows are dense


def test_share_heads_leaves_other_evaluations_alone():
    threads.set_threads(2)
    m = GPT(config(attention="softmax", attention_impl="blockwise", attention_block=16), seed=0)
    assert heads.share_heads(m) == 0
    assert all(a.evaluate is not heads.by_heads for a in m.modules() if isinstance(a, M.Attention))
