"""Positional schemes that act on the attention logits instead of the embedding
(docs/positions.md), and what they do to the attention matrix at initialisation.

    alibi_slopes(H)                      ALiBi's per-head slopes m_1..m_H (Press et al. 2022)
    alibi_bias(slopes, i0, i1, j0, j1)   its bias -m_h (i - j), one (query, key) block, (H, n, w)
    rope_frequencies(D), rope_angles     RoPE's theta_k = base^(-2k/D) and the angles t theta_k
    rope_correlation(delta, D)           c(Delta) = mean_k cos(Delta theta_k), RoPE's logit correlation
    spa_prior_config(cfg)                the E-SPA model whose B_l pos="spa_prior" adds (SPA_PRIOR_MODEL)

Notation: i (query) and j (key) are 0-based positions, H heads of width D, T positions;
B_l the SPA bias of block l (attn_bias.py). ALiBi adds -m_h (i - j) to head h's scaled
logits q.k / sqrt(D); RoPE rotates each pair (x[2k], x[2k+1]) of a query or key at
position t by the angle t theta_k (RoFormer's interleaved pairs), so that the logit of
(i, j) depends on the positions only through j - i. Everything is float64 NumPy; the
configuration is read by duck typing (spa_prior_config needs a dataclass, GPTConfig).
Not here: learned and sinusoidal positions, which are added to the embedding (inputs.py),
and the model's ops (nanospa/beyond/positions.py).
"""
import dataclasses
import math

import numpy as np

ROPE_BASE = 10000.0       # RoPE's wavelength base (Su et al. 2021)
ALIBI_BASE_EXPONENT = 8.0  # ALiBi's geometric slopes 2^(-8 h / H) (Press et al. 2022)
# The E-SPA model whose B_l pos="spa_prior" uses: the vanilla E-SPA transformer of the
# paper's Figure 2 (and GPTConfig's defaults), at the other model's depth, T and kernel-budget
# fields; only these fields are replaced [choice: docs/positions.md].
SPA_PRIOR_MODEL = dict(attention="espa", residual="none", norm="none", pos="none", activation="tat_lrelu")


def _geometric_slopes(n):
    """2^(-8 h / n) for h = 1..n."""
    return 2.0 ** (-ALIBI_BASE_EXPONENT * np.arange(1, n + 1) / n)


def alibi_slopes(H):
    """ALiBi's slopes, (H,) float64: the geometric sequence 2^(-8 h / H), h = 1..H, when H
    is a power of two; otherwise the published interpolation: the slopes of the largest
    power of two n < H, then every other slope of 2n (the ones between them) until H."""
    if not (isinstance(H, (int, np.integer)) and H >= 1):
        raise ValueError(f"alibi_slopes needs a positive number of heads, got {H!r}")
    n = 2 ** int(math.floor(math.log2(H)))
    if n == H:
        return _geometric_slopes(H)
    return np.concatenate([_geometric_slopes(n), _geometric_slopes(2 * n)[0::2][:H - n]])


def alibi_bias(slopes, i0, i1, j0, j1, dtype=np.float64, xp=np):
    """-m_h (i - j) for queries i in [i0, i1) and keys j in [j0, j1), (H, i1-i0, j1-j0),
    computed in float64 and rounded once to dtype. Entries above the diagonal (j > i) are
    positive; the causal mask removes them. ``xp``: the module of slopes (the model's device)."""
    dist = (xp.arange(i0, i1, dtype=np.float64)[:, None] - xp.arange(j0, j1, dtype=np.float64)[None, :])
    return (-xp.asarray(slopes, dtype=np.float64)[:, None, None] * dist).astype(dtype, copy=False)


def rope_frequencies(D, base=ROPE_BASE):
    """theta_k = base^(-2k / D), k = 0 .. D/2 - 1 (D even)."""
    if D % 2:
        raise ValueError(f"RoPE rotates pairs of coordinates: the head width must be even, got {D}")
    return base ** (-np.arange(0, D, 2, dtype=np.float64) / D)


def rope_angles(T, D, base=ROPE_BASE):
    """The angles t theta_k of positions t = 0..T-1, (T, D/2)."""
    return np.arange(T, dtype=np.float64)[:, None] * rope_frequencies(D, base)[None, :]


def rope_correlation(delta, D, base=ROPE_BASE):
    """c(Delta) = (2/D) sum_k cos(Delta theta_k): with queries and keys independent Gaussian
    projections (random W^Q, W^K), Cov(l_ij, l_i'j') = Sigma_ii' Sigma_jj' c((j-i) - (j'-i')),
    where without RoPE c = 1. c(0) = 1: each logit keeps its variance."""
    delta = np.asarray(delta, dtype=np.float64)
    return np.cos(delta[..., None] * rope_frequencies(D, base)).mean(axis=-1)


def spa_prior_config(cfg):
    """The configuration of the E-SPA model whose B_l a pos="spa_prior" model adds to its
    logits: cfg with the SPA_PRIOR_MODEL fields (same n_layer, block_size, kernel_budget,
    gamma_final, final_corr, eta, shaping_depth; budget.make_plan gives its plan.prior)."""
    return dataclasses.replace(cfg, **SPA_PRIOR_MODEL)
