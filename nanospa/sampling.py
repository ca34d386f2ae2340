"""Sampling from a GPT: generate(model, idx, ...) and generation's KV cache (KVCache), read
second: train.py's last step and sample.py call it, the training path never does.

generate keeps each block's keys and values (KVCache) and runs each new token alone at its
position, where every variant of the model states on its own class that this is exact
(kv_cache = True; kv_cache_refusal), else it runs the whole window per token.

The model's side of the cache is one argument: GPT.forward(idx, cache=...) takes the new
positions only, start.. (start: the positions the cache holds). In each block's attention
(model.Attention.forward) their queries, keys and values, the keys rotated or normalised by
the hooks at their own positions, join the cache's, and the new rows of P come from the new
queries against every key kept; the fixed logits are the rows start.. of the full bias
(model.dense_bias), output scales by the rows start.. of D_l.
"""
import math

import numpy as np

from . import backend
from .model import REGISTRIES, _checked_ids, evaluation, variant
from .tensor import Tensor, no_grad

MIN_TEMPERATURE = 1e-6  # generate(): temperature 0 means greedy; logits are divided by at least this


def generate(model, idx, max_new_tokens, temperature=1.0, top_k=None, rng=None, cache=True):
    """Sample ``max_new_tokens`` continuations of idx (B, T) with the last block_size tokens
    as context, in evaluation mode (the mode before is restored). Returns a host int64
    array (B, T + max_new_tokens).

    cache=True keeps each block's keys and values (KVCache) where every variant of the
    model says it is exact (kv_cache_refusal): the context's last block_size tokens run
    once (the prefill), then each new token runs alone at its position against the keys
    and values kept, O(t) work at position t instead of a whole window's forward. Once the
    context passes block_size the window moves and every position changes, so the moved
    window runs again from an empty cache, as in the uncached loop: from then on each token
    costs one window's forward either way (O(n) only within the window). The tokens are the
    uncached loop's, the logits equal to rounding (tests/test_kvcache.py). cache=False, or
    a model kv_cache_refusal refuses, runs the uncached loop: a window's forward per token."""
    if not (isinstance(max_new_tokens, (int, np.integer)) and max_new_tokens >= 0):
        raise ValueError(f"generate: max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    if not (math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"generate: temperature must be finite and >= 0, got {temperature!r}")
    if top_k is not None and not (isinstance(top_k, (int, np.integer)) and top_k >= 1):
        raise ValueError(f"generate: top_k must be None or an integer >= 1, got {top_k!r}")
    if not isinstance(cache, (bool, np.bool_)):
        raise ValueError(f"generate: cache must be True or False, got {cache!r}")
    rng = rng if rng is not None else np.random.default_rng(0)
    idx = backend.asarray(_checked_ids(idx, "generate: idx", model.config.vocab_size))  # forward's checks
    out = np.asarray(backend.to_numpy(idx), dtype=np.int64)
    T, kept = model.config.block_size, None
    cached = cache and kv_cache_refusal(model.config) is None
    with no_grad(), model.evaluating():                 # BatchNorm, PRepBN: running statistics
        for _ in range(max_new_tokens):
            if not cached:
                logits, _ = model(out[:, -T:])
            elif kept is not None and kept[0].length < T:     # the next position of the window
                logits, _ = model(out[:, -1:], cache=kept)
            else:                                              # the prompt, or the window moved
                kept = [KVCache(T) for _ in model.blocks]
                logits, _ = model(out[:, -T:], cache=kept)
            z = backend.to_numpy(logits.data[:, -1, :]).astype(np.float64) / max(temperature, MIN_TEMPERATURE)
            if top_k is not None:
                kth = np.sort(z, axis=-1)[:, -min(top_k, z.shape[-1])][:, None]
                z = np.where(z < kth, -np.inf, z)
            p = np.exp(z - z.max(axis=-1, keepdims=True))
            p /= p.sum(axis=-1, keepdims=True)
            nxt = np.array([rng.choice(p.shape[-1], p=row) for row in p])
            out = np.concatenate([out, nxt[:, None]], axis=1)
    return out


class KVCache:
    """One block's keys and values of the positions seen so far (generate): buffers (B, H,
    block_size, hs) of the model's dtype and device whose first `length` rows are filled, the
    keys after the hooks (RoPE's rotation at their own positions, nGPT's unit k). The next
    position the block sees is `length`."""

    def __init__(self, size):
        self.size, self.length, self.k, self.v = size, 0, None, None

    def append(self, k, v):
        """Keep the new positions' keys and values (Tensors (B, H, n, hs)) -> Tensors of all
        those kept, (B, H, length, hs) (views of the buffers, no copy)."""
        t, n = self.length, k.shape[-2]
        if t + n > self.size:
            raise ValueError(f"KVCache: {t} positions kept and {n} new exceed block_size {self.size}")
        if self.k is None:
            shape = k.shape[:-2] + (self.size, k.shape[-1])
            xp = backend.xp_of(k.data)
            self.k, self.v = xp.empty(shape, dtype=k.dtype), xp.empty(shape, dtype=v.dtype)
        self.k[..., t:t + n, :] = k.data
        self.v[..., t:t + n, :] = v.data
        self.length = t + n
        return Tensor(self.k[..., :t + n, :]), Tensor(self.v[..., :t + n, :])


def kv_cache_refusal(cfg):
    """Why generate runs cfg's model without a KV cache (a sentence), or None when it keeps
    one. Each variant cfg names (attention kind, position scheme, residual, norm; an extension's
    class too) and the attention's evaluation (model.evaluation) must state on itself, not by
    inheritance (a subclass changes what it computes), kv_cache = True, or a function of cfg
    returning True: that its forward on the new positions alone, with a KVCache, gives the full
    forward's rows of them. A variant that states nothing, or a reason instead, is not cached."""
    parts = [(f"{field}={getattr(cfg, field)!r}", variant(field, getattr(cfg, field))) for field in REGISTRIES]
    parts.append((f"its attention evaluation (attention_impl={cfg.attention_impl!r}, residual_attention="
                  f"{cfg.residual_attention})", evaluation(cfg)))
    for name, part in parts:
        if part is None:                                   # norm="none": nothing there
            continue
        own = vars(part) if isinstance(part, type) else getattr(part, "__dict__", {})
        said = getattr(part, "kv_cache") if "kv_cache" in own else None
        said = said(cfg) if callable(said) else said
        if said is not True:
            return f"{name}: " + (said if isinstance(said, str) else "it does not say that it is exact with a "
                                  "KV cache (kv_cache = True on its own class: sampling.kv_cache_refusal)")
    return None
