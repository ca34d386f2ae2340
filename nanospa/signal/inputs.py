"""The input kernel Sigma_0 of a token sequence (docs/method.md §11) and the positional
encodings it depends on (a whole batch's, for BatchNorm's maps: beyond/norm_maps.py).

The model's embedding gives each token id a vector of variance sigma_e^2 per coordinate and
(with additive positions, ADDITIVE_POSITIONS) adds one of variance sigma_p^2 = POS_VARIANCE,
so that every position has q = 1 at the embedding output. Positional schemes that act on the
attention logits instead (beyond/positions.py) add nothing here: Sigma_0 is as without
positions. Not here: what the blocks do to Sigma_0 (maps.py, nanospa/predict.py).
"""
import math

import numpy as np

from .kernels import check_T

POS_VARIANCE = 0.5          # share of q = 1 given to positions when pos != "none" [nanospa's choice]
SINUSOID_BASE = 10000.0     # the wavelength base of sinusoidal positions (Vaswani et al. 2017)
ADDITIVE_POSITIONS = ("learned", "sinusoidal")   # added to the embedding


def token_variance(pos):
    """sigma_e^2, the token embedding's variance per coordinate: 1 - POS_VARIANCE with
    additive positions, 1 without (none, and the schemes that act in attention)."""
    return 1.0 - POS_VARIANCE if pos in ADDITIVE_POSITIONS else 1.0


def sinusoidal_encoding(T, n_embd, pos_variance=POS_VARIANCE):
    """The model's sinusoidal positions (T, n_embd), mean square pos_variance per coordinate."""
    T = check_T(T)
    pos = np.arange(T)[:, None]
    freq = np.exp(-math.log(SINUSOID_BASE) * (np.arange(0, n_embd, 2) / n_embd))
    pe = np.zeros((T, n_embd))
    pe[:, 0::2] = np.sin(pos * freq)
    pe[:, 1::2] = np.cos(pos * freq)[:, : n_embd // 2]
    return pe * math.sqrt(2.0 * pos_variance)


def input_kernel(tokens=None, T=None, pos="none", n_embd=None, pos_variance=POS_VARIANCE):
    """Sigma_0 of the embedding output in the wide limit (method §11), (T, T).

        Sigma_0[i, j] = sigma_e^2 1[t_i = t_j] + sigma_p^2 1[i = j]      pos = "learned"
        Sigma_0[i, j] = sigma_e^2 1[t_i = t_j] + (P P^T / d)[i, j]       pos = "sinusoidal"
        Sigma_0[i, j] = 1[t_i = t_j]                      pos = "none" (also for positions in the logits)

    with sigma_p^2 = pos_variance and sigma_e^2 = 1 - sigma_p^2 (sigma_e^2 = 1 without
    positions). tokens: a (T,) sequence of ids, or None for T distinct tokens (then
    Sigma_0 = I for pos "none" / "learned"). The sinusoidal term is the exact P P^T / d of
    the model's encoding, so it needs n_embd.
    """
    if tokens is None:
        if T is None:
            raise ValueError("input_kernel needs tokens or T")
        T = check_T(T)
        same = np.eye(T)
    else:
        t = np.asarray(tokens)
        if t.ndim != 1 or t.size == 0:
            raise ValueError(f"tokens must be a non-empty 1-D sequence, got shape {t.shape}")
        if T is not None and check_T(T) != t.size:
            raise ValueError(f"T={T} does not match len(tokens)={t.size}")
        T = t.size
        same = (t[:, None] == t[None, :]).astype(np.float64)
    if pos == "none":
        return same
    if pos not in ADDITIVE_POSITIONS:
        raise ValueError(f"pos={pos!r} is not one of {['none', *ADDITIVE_POSITIONS]} (positions that act in "
                         "the logits add nothing to the embedding: pass pos='none')")
    if not 0.0 < pos_variance < 1.0:
        raise ValueError(f"pos_variance must be in (0, 1), got {pos_variance}")
    if pos == "learned":
        return (1.0 - pos_variance) * same + pos_variance * np.eye(T)
    if not n_embd:
        raise ValueError("input_kernel with pos='sinusoidal' needs n_embd")
    P = sinusoidal_encoding(T, n_embd, pos_variance)
    return (1.0 - pos_variance) * same + P @ P.T / n_embd
