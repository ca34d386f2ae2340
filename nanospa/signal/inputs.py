"""The embedding's variances and the positional encodings the model is built with (docs/method.md
§11).

The model's embedding gives each token id a vector of variance sigma_e^2 per coordinate and
(with additive positions, ADDITIVE_POSITIONS) adds one of variance sigma_p^2 = POS_VARIANCE,
so that every position has q = 1 at the embedding output. Positional schemes that act on the
attention logits instead (beyond/positions.py) add nothing here. Not here: the input kernel
Sigma_0 these give a token sequence, and what the blocks do to it (maps.py, read second;
nanospa/predict.py).
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
