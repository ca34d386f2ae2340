"""Wide-limit kernel maps of the model at initialisation (docs/method.md §2.2, §3.2, §10, §11):
the input kernel Sigma_0 of a token sequence, and what one attention sublayer, one MLP, one
norm and one residual branch do to a (T, T) kernel Sigma when n_embd -> inf with the model's
own initialisation. Read second: the predictions and the kernel budget's walk run these (the
variants' at_init in model.py call them for the predictions); the model's build runs none.

    input_kernel           Sigma_0 of the embedding output (a whole batch's, for BatchNorm's
                           maps: beyond/norm_maps.py)
    attention_map          Sigma -> A Sigma A^T (heads sharing A, W^V W^O orthogonal; or per head)
    MLPMap                 Sigma'_ij = E[phi_hat(u_i) phi_hat(u_j)], u ~ N(0, Sigma)
    normalise              LayerNorm / RMSNorm (Sigma -> C)
    norm_kernel            a configuration's norm map: the one dispatch, which the model's
                           variants (model.py, at_init) and the kernel budget's walk both call;
                           the extensions' maps (signal/beyond) are imported only when a
                           configuration names one (the residual weights (a, b): plan.py)

Not here: the embedding's variances and positions (inputs.py), the mean field of softmax
attention with random queries and keys (collapse.py: only the predictions use it), the walk
through a whole model (nanospa/predict.py, above the model, whose variants it reads), the
attention matrices themselves (attn_bias.py) and the activation's parameters
(act_transform.py). Everything is float64 NumPy. The model
configuration is read by duck typing (its residual, residual_beta, norm, norm_position and
uses_final_norm fields; n_layer for DeepNorm).
"""
import importlib
import math

import numpy as np

from .act_transform import activation_transform
from .inputs import ADDITIVE_POSITIONS, POS_VARIANCE, sinusoidal_encoding
from .kernels import check_T, flush, normalised_kernel
from .local_maps import LocalMaps


def attention_map(Sigma, A):
    """A Sigma A^T: the kernel after an attention sublayer whose heads share A and whose
    W^V W^O is orthogonal (method §3.2). Sigma, A: (T, T). With one matrix per head, A
    (H, T, T) (ALiBi's slopes differ by head), the mean over heads of A_h Sigma A_h^T: head
    h sees X through the D = C / H columns of the orthogonal W^V it owns, a random projection
    with X P_h X^T -> X X^T / H, and the rows of W^O keep the heads' outputs orthogonal."""
    if A.ndim == 3:
        return flush(np.mean(A @ Sigma @ np.swapaxes(A, -1, -2), axis=0))
    return flush(A @ Sigma @ A.T)


def normalise(Sigma):
    """LayerNorm / RMSNorm in the wide limit: every token rescaled to q = 1 (Sigma -> C)."""
    return normalised_kernel(Sigma)


class MLPMap:
    """The wide-limit kernel map of MLP(X) = phi_hat(X W_1) W_2 with the model's init
    (W_1 W_1^T = m I, W_2 with orthonormal columns): Sigma' = E[phi_hat(u) phi_hat(u)^T],
    u ~ N(0, Sigma), for any diagonal (method §10). activation: the arguments of
    act_transform.activation_transform (a plan's `activation`). Also gives C(c) and its
    inverse on unit-q kernels."""

    def __init__(self, activation):
        self.activation = dict(activation)
        self.phi = activation_transform(**self.activation)
        self.maps = None if self.is_identity else LocalMaps(self.phi)

    @property
    def is_identity(self):
        return self.phi.activation == "linear"

    def __call__(self, Sigma):
        if self.maps is None:
            return np.array(Sigma, dtype=np.float64, copy=True)
        return self.maps.kernel(Sigma)

    def Q1(self):
        """Q(1), the q-value an MLP gives a q = 1 token (1 for shaped activations)."""
        return 1.0 if self.maps is None else float(self.maps.Q(1.0))

    def C(self, c):
        return np.asarray(c, dtype=np.float64) if self.maps is None else self.maps.C(c)


def norm_kernel(cfg, Sigma, batch=None):
    """The kernel map at init of cfg's norm: none (the identity), LayerNorm and RMSNorm
    (normalise), or an extension's (signal/beyond/norm_maps.py: DyT, BatchNorm, PRepBN,
    GroupNorm; batch: None for kernels of one sequence, or B for a whole batch's)."""
    if cfg.norm == "none":
        return Sigma
    if cfg.norm in ("layernorm", "rmsnorm"):
        return normalise(Sigma)
    return importlib.import_module("nanospa.signal.beyond.norm_maps").norm_kernel(cfg, Sigma, batch)


def residual_kernel(a, b, Sigma_x, Sigma_h):
    """The kernel of a x + b h at init: a^2 Sigma_x + b^2 Sigma_h (the cross terms vanish:
    W^O and W_2 are random orthogonal matrices independent of x)."""
    return a * a * Sigma_x + b * b * Sigma_h


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
