"""Future leakage of a causal LM: how much the loss at position t depends on the input at a
later position t' > t (docs/norms.md). Zero for every per-token norm (LayerNorm, RMSNorm,
DyT, GroupNorm); not zero for norms whose training-mode statistics pool positions
(BatchNorm, PRepBN with norm_causal=False), which then learn from the future.

    future_leakage(model, idx, targets, training)   max |dL_t / de_t'| over t' > t and <= t
    python -m nanospa.experiments causality                     the table of docs/norms.md

e = model.embed(idx), (B, T, C), is the input of the first block; L_t is the mean over the
batch of the cross-entropy at position t. Not here: the norms (norms.py, nn.py).
"""
import sys

import numpy as np

from .. import backend
from ..config import GPTConfig
from ..fused import cross_entropy
from ..model import GPT
from ..run.settings import SettingsError, help_text, parse_settings, run_command, source_notes, wants_help
from ..tensor import Tensor, no_grad

NORM_CASES = (("none", False), ("layernorm", False), ("rmsnorm", False), ("groupnorm", False),
              ("batchnorm", False), ("batchnorm", True), ("prepbn", False), ("prepbn", True))


def _pending_lists(model):
    """{module: list} of every module that records batch statistics (norms.BatchNorm)."""
    out, todo = {}, [model]
    while todo:
        m = todo.pop()
        if isinstance(getattr(m, "pending", None), list):
            out[m] = list(m.pending)
        todo.extend(child for _, child in m.children())
    return out


def future_leakage(model, idx, targets, training=True):
    """dict(future=max over t < t' of |dL_t / de_t'|, past=the same over t' <= t, ratio=
    future / past), all entries of the batch and channels, with the model in training or
    evaluation mode. One forward and backward per position; the model's mode, gradients and
    pending batch statistics are left as they were (parameter gradients go to a dict)."""
    idx, targets = np.asarray(idx), np.asarray(targets)
    T = idx.shape[1]
    before, pending = model.training, _pending_lists(model)
    model.train(training)
    future = past = 0.0
    try:
        with no_grad():
            e = model.embed(idx).data
        for t in range(T):
            leaf = Tensor(e.copy(), requires_grad=True)
            model.embed = lambda _idx, start=0, leaf=leaf: leaf      # shadows GPT.embed for this call
            logits, _ = model(idx)
            grads = {}
            cross_entropy(logits[:, t], targets[:, t]).backward(leaf_grads=grads)
            g = np.abs(backend.to_numpy(grads[leaf]))                 # (B, T, C)
            past = max(past, float(g[:, :t + 1].max()))
            if t + 1 < T:
                future = max(future, float(g[:, t + 1:].max()))
    finally:
        model.__dict__.pop("embed", None)
        model.train(before)
        for m, saved in pending.items():
            m.pending = saved
    return dict(future=future, past=past, ratio=future / past if past else float("nan"))


def leakage_table(n_layer=2, n_embd=32, T=16, batch=4, seed=0):
    """Rows (norm, causal, mode, future, past, ratio) for a small float64 Pre-LN model of each
    norm, after one training-mode forward and after_step (running statistics moved once;
    PRepBN halfway through a 2-step schedule, lambda = 0.5)."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, 64, size=(batch, T + 1))
    x, y = idx[:, :-1], idx[:, 1:]
    rows = []
    for norm, causal in NORM_CASES:
        cfg = GPTConfig(vocab_size=64, block_size=T, n_layer=n_layer, n_head=4, n_embd=n_embd, dtype="float64",
                        attention="softmax", activation="gelu", residual="standard", pos="learned",
                        norm=norm, norm_causal=causal, prepbn_steps=2)
        model = GPT(cfg, seed=seed)
        with no_grad():
            model(x, y)
        model.after_step()
        for training in (True, False):
            r = future_leakage(model, x, y, training=training)
            rows.append((norm, causal, "train" if training else "eval", r["future"], r["past"], r["ratio"]))
    return rows


DEFAULTS = dict(
    n_layer=2,          # blocks of each Pre-LN model
    n_embd=32,          # width (4 heads)
    T=16,               # positions per sequence
    batch=4,            # sequences
    seed=0,             # seeds the tokens and the weights
)


def table(s):
    """Print the leakage table for settings s (exit status 0)."""
    for key in ("n_layer", "n_embd", "T", "batch"):
        if s[key] < 1:
            raise SettingsError(f"{key} must be a positive integer, got {s[key]!r}")
    if s["seed"] < 0:
        raise SettingsError(f"seed must be >= 0, got {s['seed']!r}")
    if s["n_embd"] % 4:
        raise SettingsError(f"n_embd must be a multiple of the 4 heads, got {s['n_embd']}")
    print(f"{'norm':>10} {'causal':>6} {'mode':>5} {'future':>10} {'past':>10} {'ratio':>10}")
    for norm, causal, mode, future, past, ratio in leakage_table(s["n_layer"], s["n_embd"], s["T"], s["batch"], s["seed"]):
        print(f"{norm:>10} {str(causal):>6} {mode:>5} {future:10.3g} {past:10.3g} {ratio:10.3g}")
    return 0


def settings(argv):
    s = parse_settings(argv, DEFAULTS)
    del s["_explicit"]
    return s


def main(argv=None):
    """python -m nanospa.experiments causality [--key=value ...] -> exit status (0, or 2 with
    one error: line for a bad setting)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if wants_help(argv):
        print(help_text("python -m nanospa.experiments causality: " + __doc__.splitlines()[0], DEFAULTS,
                        source_notes(__file__)))
        return 0
    return run_command(lambda: table(settings(argv)))


if __name__ == "__main__":
    sys.exit(main())
