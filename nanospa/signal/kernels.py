"""Kernels, and the depth schedules of the SPA target kernels.

Implements docs/method.md §3.1 (kernel, normalised kernel), §6 (U-SPA rho schedule) and
§7.3 (E-SPA gamma schedule); the targets Sigma_l themselves (§6, §7.1, stated below) are
built as dense matrices in cholesky.py, read second. Everything is float64 NumPy on host
arrays. The attention matrices that map one target kernel to the next live in
attn_bias.py (closed forms, log space, bias/rescale split; the general one, their reference,
in cholesky.py); rank collapse under plain attention and its measures (§3.4, §4) in
collapse.py, and the target and schedule of a kind given by name (walks.py spa_kernel,
spa_schedule), read second.

Notation (docs/method.md §1)

    T          sequence length
    d          width
    L          number of blocks (n_layer)
    X          (..., T, d) token representations
    Sigma      (..., T, T) kernel X X^T / d; its diagonal holds the q-values
    C          normalised kernel diag(Sigma)^-1/2 Sigma diag(Sigma)^-1/2 (cosines)
    gamma_l    E-SPA decay rate: Sigma_l[i, j] = exp(-gamma_l |i - j|), gamma_0 = inf
    a_l        AR(1) innovation scale sqrt(1 - exp(-2 gamma_l))
    rho_l      U-SPA correlation: Sigma_l = (1 - rho_l) I + rho_l 1 1^T, rho_0 = 0
    P          causal attention matrix (row-stochastic, lower triangular)
"""
import operator

import numpy as np

TINY = 1e-250  # |entries| below this are flushed to 0: subnormal floats slow matrix products ~10x
DEFAULT_GAMMA_FINAL = 0.005  # E-SPA's final gamma_L unless a kernel budget chooses it [nanospa's choice]
DEFAULT_RHO_FINAL = 0.8      # U-SPA's final rho_L [nanospa's choice]


def check_T(T):
    """Return T as a Python int >= 1, or raise ValueError."""
    try:
        T = operator.index(T)
    except TypeError:
        raise ValueError(f"T must be an integer, got {T!r}") from None
    if T < 1:
        raise ValueError(f"T must be >= 1, got {T}")
    return T


def flush(M):
    """M with |entries| < TINY set to 0 (exp underflow of SPA biases gives subnormals)."""
    return np.where(np.abs(M) < TINY, 0.0, M)


# ---------------------------------------------------------------- empirical kernels

def kernel_matrix(X, mean=False):
    """Sigma = X X^T / d.  X: (..., T, d) -> (..., T, T); mean=True averages over the
    leading (batch) dims and returns (T, T)."""
    X = np.asarray(X, dtype=np.float64)
    if X.ndim < 2:
        raise ValueError(f"X must have shape (..., T, d), got shape {X.shape}")
    Sigma = X @ np.swapaxes(X, -1, -2) / X.shape[-1]            # (..., T, T)
    if mean and Sigma.ndim > 2:
        Sigma = Sigma.reshape(-1, *Sigma.shape[-2:]).mean(axis=0)
    return Sigma


def q_values(Sigma):
    """Diagonal of Sigma: (..., T, T) -> (..., T), the per-token second moments."""
    return np.diagonal(np.asarray(Sigma, dtype=np.float64), axis1=-2, axis2=-1).copy()


def normalised_kernel(Sigma):
    """C = diag(Sigma)^-1/2 Sigma diag(Sigma)^-1/2, batched over leading dims; unit diagonal."""
    Sigma = np.asarray(Sigma, dtype=np.float64)
    q = q_values(Sigma)
    if not np.all(q > 0):
        raise ValueError(f"normalised_kernel needs a positive diagonal, min q = {q.min():.3g}")
    s = 1.0 / np.sqrt(q)
    return Sigma * s[..., :, None] * s[..., None, :]


# ---------------------------------------------------------------- SPA schedules

def espa_gammas(n_layer, gamma_final=DEFAULT_GAMMA_FINAL):
    """[gamma_0 = inf, gamma_1, ..., gamma_L] with a_l = a_L^(l/L) (method §7.3), i.e.
    gamma_l = -1/2 log(1 - (1 - exp(-2 gamma_L))^(l/L)). Each layer then has the same
    diagonal a_L^(1/L) and log det Sigma_l falls linearly in l.

    Computed in log space so large gamma_final keeps its precision; gamma_L is set to
    gamma_final exactly. Default gamma_final = 0.005 is nanospa's choice (method §7.3),
    not a value known from the paper."""
    L = operator.index(n_layer)
    if L < 1:
        raise ValueError(f"n_layer must be >= 1, got {n_layer}")
    if not 0.0 < gamma_final < np.inf:
        raise ValueError(f"gamma_final must be finite and > 0, got {gamma_final!r}")
    log_a2_L = np.log(-np.expm1(-2.0 * gamma_final))          # log a_L^2
    frac = np.arange(1, L + 1) / L                             # l / L
    gammas = np.concatenate([[np.inf], -0.5 * np.log(-np.expm1(frac * log_a2_L))])
    gammas[L] = gamma_final
    return gammas


def uspa_rhos(n_layer, rho_final=DEFAULT_RHO_FINAL):
    """[rho_0 = 0, rho_1, ..., rho_L] with 1 - rho_l = (1 - rho_L)^(l/L) (method §6), the
    analogue of the E-SPA schedule. Default rho_final = 0.8 is nanospa's choice."""
    L = operator.index(n_layer)
    if L < 1:
        raise ValueError(f"n_layer must be >= 1, got {n_layer}")
    if not 0.0 <= rho_final < 1.0:
        raise ValueError(f"rho_final must be in [0, 1), got {rho_final!r}")
    frac = np.arange(1, L + 1) / L
    rhos = np.concatenate([[0.0], -np.expm1(frac * np.log1p(-rho_final))])
    rhos[L] = rho_final
    return rhos
