"""Why causal PRepBN blew up in the norms study (docs/norms.md, "Why eta = 1 fails at depth").

    python results/norms/diagnose_prepbn.py PATH_TO_TINY_SHAKESPEARE [init] [train]

init:  at initialisation, no training: the RMS of the last block's output of the quick model
       (width 64, 8 sequences of T = 64) with every PRepBN layer set to lambda = 1, 0.5,
       0.25, 0 (its steps_done), at depths 6, 12, 24; LayerNorm's beside it. Seconds.
train: the first steps of the norms study's run (depth 24, AdamW, warm-up 40 of 400 steps,
       cosine decay, clip 1): loss and residual-stream RMS every few steps for causal
       PRepBN (switch over 64 steps, lr 3e-3), the non-causal form, eta held at 0, the
       switch over 400 steps, lr 1e-3 and 3e-4, and LayerNorm. About 10 CPU-minutes.
"""
import sys

import numpy as np

import data
from nanospa.config import GPTConfig
from nanospa.experiments.common import get_batch
from nanospa.experiments.runner import PRE_LN
from nanospa.model import GPT
from nanospa.optim import clip_grad_norm, cosine_lr
from nanospa.beyond.optimizers import OPTIMIZER_DEFAULTS, make_optimizer
from nanospa.tensor import Tensor, no_grad

PREPBN = dict(norm="prepbn", norm_causal=True, prepbn_steps=64)


def model(ds, n_layer=24, **kw):
    cfg = GPTConfig(vocab_size=ds.vocab_size, n_layer=n_layer, n_embd=64, n_head=2, block_size=64,
                    **dict(PRE_LN, **kw))
    return GPT(cfg, seed=0)


def prepbn_layers(m):
    return [n for b in m.blocks for n in (b.norm1, b.norm2)] + [m.ln_f]


def stream_rms(m, x):
    with no_grad():
        h = m.embed(x)
        for b in m.blocks:
            h = b(h, None, None)
    return float(np.sqrt((h.data.astype(np.float64) ** 2).mean()))


def at_init(ds):
    x, _ = get_batch(ds.train, 8, 64, np.random.default_rng(0))
    for L in (6, 12, 24):
        row = []
        for done in (0, 32, 48, 64):
            m = model(ds, L, **PREPBN)
            for n in prepbn_layers(m):
                n.steps_done = np.array([done], dtype=np.int64)
            row.append(f"lambda {prepbn_layers(m)[0].lam:.2f}: {stream_rms(m, x):.3g}")
        print(f"init, depth {L}, last block RMS: " + "; ".join(row)
              + f"; LayerNorm {stream_rms(model(ds, L), x):.3g}", flush=True)


def train(ds, name, steps=64, lr=3e-3, total=400, eta_zero=False, **kw):
    m = model(ds, **kw)
    if eta_zero:                  # eta held at 0: a constant, not a parameter
        for n in prepbn_layers(m):
            n.eta = Tensor(np.zeros(1, dtype=np.float32))
    opt = make_optimizer({**OPTIMIZER_DEFAULTS, "learning_rate": lr, "beta1": 0.9, "beta2": 0.95,
                          "weight_decay": 0.0}, m, seed=0)
    rng, every, out = np.random.default_rng(1), (8 if steps <= 64 else 40), []
    for it in range(steps):
        opt.lr = cosine_lr(it, lr, total // 10, total, lr * 0.1)
        x, y = get_batch(ds.train, 8, 64, rng)
        _, loss = m(x, y)
        loss.backward()
        clip_grad_norm(m.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        m.after_step()
        if it % every == every - 1 or it == steps - 1:
            out.append(f"{it + 1}: loss {loss.item():.3g} RMS {stream_rms(m, x):.3g}")
    print(f"train, {name}: " + "; ".join(out), flush=True)


def main(argv):
    ds = data.load_dataset(argv[0])
    parts = argv[1:] or ["init", "train"]
    if "init" in parts:
        at_init(ds)
    if "train" in parts:
        train(ds, "causal PRepBN, switch over 64 steps, lr 3e-3", **PREPBN)
        train(ds, "non-causal PRepBN", **dict(PREPBN, norm_causal=False))
        train(ds, "eta held at 0", eta_zero=True, **PREPBN)
        train(ds, "switch over 400 steps", steps=400, **dict(PREPBN, prepbn_steps=400))
        train(ds, "lr 1e-3", steps=400, lr=1e-3, **PREPBN)
        train(ds, "lr 3e-4", steps=400, lr=3e-4, **PREPBN)
        train(ds, "LayerNorm", **{})


if __name__ == "__main__":
    main(sys.argv[1:])
