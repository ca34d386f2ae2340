"""Rank collapse at init (docs/method.md §3.4, §4): the measures of a kernel, standard
attention at init (uniform causal attention, Value-SkipInit) and the mean field of causal
softmax attention with random W^Q, W^K.

    mean_offdiag, min_entry, effective_rank, kernel_stats   what a kernel's rank collapse reads as
    uniform_causal_attention, value_skipinit_attention     P and alpha I + beta P at init
    softmax_attention_map                                  Sigma -> E[P Sigma P^T] (+ fixed logits,
                                                           RoPE's rotation: beyond/positions.py)

The predictions (nanospa/predict.py, the model's at_init), the table (`python -m
nanospa.signal`) and the measurements (nanospa/measure.py) use these; the plan and the model
do not, so this file is read second. Float64 NumPy; notation as in kernels.py. Not here:
the kernel maps the plan uses (maps.py), the SPA attention matrices (attn_bias.py).
"""
import numpy as np

from .kernels import check_T, normalised_kernel, q_values
from .maps import attention_map


# ---------------------------------------------------------------- rank-collapse measures

def _offdiag(C):
    C = np.asarray(C, dtype=np.float64)
    return C[~np.eye(C.shape[-1], dtype=bool)]                    # (T (T - 1),)


def mean_offdiag(C):
    """Mean of C[i, j] over i != j (nan for T = 1). Tends to 1 under rank collapse."""
    off = _offdiag(C)
    return float(off.mean()) if off.size else float("nan")


def min_entry(C):
    """Smallest entry of C, diagonal included (the "min C_l entry" of method §3.4)."""
    return float(np.min(C))


def effective_rank(Sigma):
    """exp(H(p)), p_k = lambda_k / sum(lambda): the exponential of the Shannon entropy of
    the normalised eigenvalue distribution (Roy & Vetterli's effective rank). It is T for
    Sigma proportional to I and 1 for a rank-one Sigma; eigenvalues below 0 from rounding
    are treated as 0. Batched over leading dims."""
    lam = np.clip(np.linalg.eigvalsh(np.asarray(Sigma, dtype=np.float64)), 0.0, None)
    p = lam / lam.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        plogp = np.where(p > 0, p * np.log(p), 0.0)
    return np.exp(-plogp.sum(axis=-1))


def kernel_stats(Sigma):
    """Summary of one (T, T) kernel: q-values (min/mean/max) and, on the normalised kernel
    C, the mean off-diagonal, min entry, first-to-last C[0, T-1], the mean adjacent
    correlation C[i, i+1], and the effective rank of Sigma. Values are Python floats."""
    Sigma = np.asarray(Sigma, dtype=np.float64)
    if Sigma.ndim != 2 or Sigma.shape[0] != Sigma.shape[1]:
        raise ValueError(f"kernel_stats needs one square (T, T) kernel, got shape {Sigma.shape}")
    q, C = q_values(Sigma), normalised_kernel(Sigma)
    T = Sigma.shape[0]
    return {
        "q_min": float(q.min()), "q_mean": float(q.mean()), "q_max": float(q.max()),
        "mean_offdiag": mean_offdiag(C),
        "min_entry": min_entry(C),
        "first_to_last": float(C[0, -1]) if T > 1 else float("nan"),
        "adjacent_mean": float(np.diagonal(C, 1).mean()) if T > 1 else float("nan"),
        "effective_rank": float(effective_rank(Sigma)),
    }


# ---------------------------------------------------------------- standard attention at init

def uniform_causal_attention(T):
    """Causal softmax with zero queries and no bias (method §3.4): P[i, j] = 1/(i+1), j <= i."""
    T = check_T(T)
    return np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]


def value_skipinit_attention(T, alpha=1.0, beta=0.0, P=None):
    """Value-SkipInit mixing (method §4): alpha I + beta P, with P the uniform causal
    matrix by default (zero queries). At init alpha = 1, beta = 0 it is I, so Sigma passes
    through the attention sublayer unchanged."""
    T = check_T(T)
    if P is None:
        P = uniform_causal_attention(T)
    P = np.asarray(P, dtype=np.float64)
    if P.shape != (T, T):
        raise ValueError(f"P must have shape ({T}, {T}), got {P.shape}")
    return alpha * np.eye(T) + beta * P


# ---------------------------------------------------------------- softmax attention at init

def _root(K):
    """R with R R^T = K (symmetric eigendecomposition, negative rounding clipped)."""
    w, V = np.linalg.eigh(K)
    return V * np.sqrt(np.clip(w, 0.0, None))


def softmax_attention_map(Sigma, n_samples=32, seed=0, logit_kernels=None, bias=None, rope=None):
    """Mean-field kernel map of causal softmax attention with random W^Q, W^K ~ N(0, 1/d)
    at init, estimated by Monte Carlo: in the wide limit the logits of one head are a
    Gaussian matrix with Cov(l_ij, l_i'j') = Sigma_ii' Sigma_jj' (queries and keys are
    independent Gaussian projections of the same tokens), so

        Sigma' = E[P Sigma P^T],  P = softmax_causal(G),  G = chol(Sigma) Z chol(Sigma)^T

    with Z a (T, T) standard normal matrix; averaging over the H heads of a wide layer
    gives the expectation. n_samples = 0 returns the uniform-attention approximation
    P = E[P] (exact with zero queries, and the mean of P when all q-values are equal).
    The estimate is seeded (deterministic); its Monte Carlo error is O(n_samples^-1/2)
    relative to the off-uniform part.

    logit_kernels: the kernels K_1..K_m whose logit matrices add, G = sum_k R_k Z_k R_k^T
    with independent Z_k (default [Sigma]): RealFormer's carried scores (the layers' own
    independent W^Q, W^K) and nGPT's logits, drawn from the normalised kernel
    (docs/residuals.md). The values are always Sigma.

    Positions acting on the logits (positions.py): bias, a fixed (T, T) or per-head
    (H, T, T) addition to G (ALiBi, the SPA prior; each sample then uses every head's bias
    and the heads are averaged); rope, RoPE's frequencies theta (K,), which multiply the
    covariance by c((j-i) - (j'-i')) = mean_k cos(((j-i) - (j'-i')) theta_k): sampled as
    G = K^-1/2 sum_k (G_k cos((j-i) theta_k) + G'_k sin((j-i) theta_k)) with 2K independent
    Gaussian matrices like G above. With neither, the draws are those of the plain map."""
    T = Sigma.shape[0]
    P0 = uniform_causal_attention(T)
    if n_samples <= 0:
        return attention_map(Sigma, P0 if bias is None else _causal_softmax(np.asarray(bias, dtype=np.float64)))
    rng = np.random.default_rng(seed)
    roots = [_root(K) for K in (logit_kernels if logit_kernels is not None else [Sigma])]
    if rope is not None:
        phase = (np.arange(T)[None, :] - np.arange(T)[:, None])[None] * np.asarray(rope)[:, None, None]
        cos, sin = np.cos(phase), np.sin(phase)                # (K, T, T), angle (j - i) theta_k

    def draw(root):                                            # one logit matrix of covariance root root^T
        if rope is None:
            return root @ rng.standard_normal((T, T)) @ root.T
        Z = root @ rng.standard_normal((2, len(rope), T, T)) @ root.T
        return (Z[0] * cos + Z[1] * sin).sum(axis=0) / np.sqrt(len(rope))

    out = np.zeros_like(Sigma)
    for _ in range(n_samples):
        G = draw(roots[0])
        for root in roots[1:]:                                 # RealFormer: the carried layers' logits
            G = G + draw(root)
        P = _causal_softmax(G if bias is None else G + bias)
        out += np.mean(P @ Sigma @ np.swapaxes(P, -1, -2), axis=0) if P.ndim == 3 else P @ Sigma @ P.T
    return out / n_samples


def _causal_softmax(G):
    """softmax over j <= i of the last two axes (entries above the diagonal ignored)."""
    T = G.shape[-1]
    G = np.where(np.tri(T, dtype=bool), G, -np.inf)
    G = G - G.max(axis=-1, keepdims=True)
    with np.errstate(under="ignore"):
        P = np.exp(G)
    return P / P.sum(axis=-1, keepdims=True)
