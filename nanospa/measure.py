"""Kernels measured on a real model at initialisation: what nanospa.signal predicts in the
wide limit, measured at finite width (docs/method.md §13).

    token_batch(cfg, batch, tokens, data, seed)   (batch, T) ids: distinct tokens or text
    measure_config(cfg, width)                     the same model at width `width`, float64
    measured_kernels(model, idx)                   batch-mean kernels of every block output
    layer_stats(kernels), show(stats)              their per-layer cosine and q, as train.py logs them

Here, above nanospa/signal/, because it builds a GPT and reads data; signal/ itself never
imports the model. Used by `python -m nanospa.signal --empirical=True`, the fig1 and budget
experiments and the tests of the predictions.
"""
import math
from dataclasses import replace

import numpy as np

from .model import GPT
from .signal import kernel_matrix, mean_offdiag, normalised_kernel, q_values

TOKENS = ("distinct", "data")


def token_batch(cfg, batch, tokens="distinct", data="default", seed=0):
    """(batch, T) int64 token ids: T distinct ids per row (Sigma_0 = I in the wide limit),
    or random windows of a dataset (data.load_dataset(data))."""
    T = cfg.block_size
    rng = np.random.default_rng(seed)
    if tokens == "distinct":
        if T > cfg.vocab_size:
            raise ValueError(f"--tokens=distinct needs block_size <= vocab_size={cfg.vocab_size}, "
                             f"got {T}; use --tokens=data")
        return np.stack([rng.permutation(cfg.vocab_size)[:T] for _ in range(batch)]).astype(np.int64)
    if tokens == "data":
        import data as nanospa_data                 # the top-level data.py; only this path needs it
        ds = nanospa_data.load_dataset(data)
        nanospa_data.check_length(ds, T)
        x, _ = nanospa_data.get_batch(ds.train, batch, T, rng)
        return np.asarray(x, dtype=np.int64)
    raise ValueError(f"tokens={tokens!r} is not one of {list(TOKENS)}")


def measure_config(cfg, width):
    """The configuration measured: the same model, n_embd = width, float64."""
    if width % cfg.n_head:
        raise ValueError(f"width={width} is not divisible by n_head={cfg.n_head}")
    return replace(cfg, n_embd=width, dtype="float64")


def measured_kernels(model, idx):
    """Batch-mean kernels X X^T / d of a model on idx (B, T): dict(hidden=[Sigma_0, ...,
    Sigma_L] (the embedding output, then every block output: predict's kernel(l)),
    attn_branch=[...] (each attention sublayer's output before any residual: predict's
    "attn_branch"))."""
    tr = model.trace(idx)
    return dict(hidden=[kernel_matrix(h, mean=True) for h in tr.hidden],
                attn_branch=[kernel_matrix(h, mean=True) for h in tr.attn_out])


def measured_model_kernels(cfg, idx, seed=0):
    """[Sigma_0, ..., Sigma_L] measured on GPT(cfg, seed) at init (cfg as given: set n_embd
    and dtype first, e.g. with measure_config), in evaluation mode, as predict_kernels
    predicts them without batch= (BatchNorm, PRepBN: running statistics; others: no change)."""
    return measured_kernels(GPT(cfg, seed=seed).eval(), idx)["hidden"]


STAT_DECIMALS = 6      # log.jsonl keeps cos[l] and q[l] to this many decimals
SHOWN_LAYERS = 12      # the printed statistics show about this many layers (log.jsonl has all)


def layer_stats(kernels):
    """Per-layer mean off-diagonal cosine and mean q-value of kernels Sigma_l (T, T), the
    rank-collapse watch train.py logs (docs/method.md §13)."""
    cos = [mean_offdiag(normalised_kernel(S)) if np.all(np.diag(S) > 0) else math.nan for S in kernels]
    return dict(cos=[round(v, STAT_DECIMALS) for v in cos],
                q=[round(float(q_values(S).mean()), STAT_DECIMALS) for S in kernels])


def show(stats):
    """Per-layer cos and q on one line, about SHOWN_LAYERS layers (log.jsonl has them all)."""
    step = max(1, len(stats["cos"]) // SHOWN_LAYERS)
    return (f"cos[0::{step}] " + " ".join(f"{v:.2f}" for v in stats["cos"][::step]) +
            f" | q[0::{step}] " + " ".join(f"{v:.2g}" for v in stats["q"][::step]))
