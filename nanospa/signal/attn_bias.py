"""SPA attention matrices in closed form, and their softmax realisation A = diag(D) softmax(B).

Implements docs/method.md §6 (U-SPA), §7.2 (E-SPA closed form in log space), §8 (bias
B_l and location-dependent rescaling D_l) and the numerics of §14/§15. Everything is
float64 NumPy and built once for the longest sequence: every quantity here is prefix
consistent (A[:t, :t] built at T equals A built at t). General kernels go through
cholesky.transfer_matrix; target kernels and schedules live in kernels.py.

Notation (docs/method.md §1, §7.2, §8)

    T           sequence length; i (row, query) and j (column, key) are 0-based
    gamma       E-SPA rate of layer l; gamma_prev that of layer l-1 (inf for l = 1)
    rho         U-SPA correlation of layer l; rho_prev that of layer l-1 (0 for l = 1)
    a           sqrt(1 - exp(-2 gamma)), r = a_l / a_{l-1}
    A           (T, T) lower-triangular, non-negative attention matrix of layer l
    logA        log A, -inf above the diagonal (and wherever A is exactly 0)
    B           bias: logA - logsumexp_row(logA), entries <= 0, -inf above the diagonal
    D           (T,) row sums of A = exp(logsumexp_row(logA)); A = diag(D) softmax(B)
"""
import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from .kernels import DEFAULT_GAMMA_FINAL, DEFAULT_RHO_FINAL, SPA_KINDS, check_T, flush, spa_schedule

NEG_RTOL = 1e-12   # entries of A in [-NEG_RTOL max|A|, 0) are rounding (closed forms: ~1e-16)


def _check_order(name, value, prev, increasing):
    ok = prev <= value if increasing else value <= prev
    if not ok:
        rel = "rho >= rho_prev" if increasing else "gamma <= gamma_prev"
        raise ValueError(f"{name}={value!r} after {name}_prev={prev!r}: SPA needs {rel} for a "
                         f"non-negative A (use transfer_matrix for the signed matrix)")


# ---------------------------------------------------------------- E-SPA (method §7.2)

def _espa_parts(T, gamma, gamma_prev):
    """O(T) pieces of E-SPA's log A: v[k] = log A[i, i-k] for columns j >= 1 (A is
    Toeplitz there), c[i] = log A[i, 0], and logD[i] = log of row sum i."""
    T = check_T(T)
    if not gamma > 0 or not gamma_prev > 0:
        raise ValueError(f"gammas must be > 0 (or inf), got gamma={gamma!r}, gamma_prev={gamma_prev!r}")
    _check_order("gamma", gamma, gamma_prev, increasing=False)
    k = np.arange(T, dtype=np.float64)
    v, c, logD = np.full(T, -np.inf), np.full(T, -np.inf), np.zeros(T)
    v[0] = c[0] = 0.0
    if gamma == gamma_prev:                                   # A = I (also gamma = inf)
        return v, c, logD
    g = float(gamma)
    log_a = 0.5 * np.log(-np.expm1(-2.0 * g))
    geo = np.expm1(-g * k) / np.expm1(-g)                      # geo[n] = sum_{m<n} e^{-g m}
    with np.errstate(divide="ignore"):
        if np.isinf(gamma_prev):                               # layer 1: A_1 = chol(Sigma_1)
            v = log_a - g * k                                  # a e^{-g (i-j)}
            c = -g * k                                         # e^{-g i}
            log_interior = log_a + np.log(geo)                 # row i: a geo[i]
        else:
            log_r = log_a - 0.5 * np.log(-np.expm1(-2.0 * gamma_prev))
            w = np.exp(-g) * -np.expm1(g - gamma_prev)         # e^{-g} - e^{-g_prev} > 0
            v[0] = log_r                                       # diagonal r
            v[1:] = log_r + np.log(w) - g * (k[1:] - 1)        # r w e^{-g (i-j-1)}
            # log(e^{-g} - r e^{-g_prev}) = -g + log(1 - e^x), x = log r + g - g_prev <= 0
            # (clamped: rounding can push x just above 0 when gamma ~ gamma_prev)
            x = min(log_r + g - gamma_prev, 0.0)
            log_col = -g + np.log(-np.expm1(x))
            c[1:] = log_col - g * (k[1:] - 1)
            # row i >= 1: r (1 + w geo[i-1]); row 0 has no entries with j >= 1
            log_interior = np.concatenate([[-np.inf], log_r + np.log1p(w * geo[:-1])])
    logD = np.logaddexp(c, log_interior)                        # first column + interior
    return v, c, logD


def _toeplitz_lower(v, shift, out=None, dtype=np.float64):
    """out[i, j] = v[i - j] - shift[i] for j <= i and -inf above the diagonal, in one
    fused pass over a strided view (no (T, T) temporaries). Computed in float64 and
    rounded once if out/dtype is narrower."""
    T = v.size
    u = np.concatenate([v[::-1], np.full(T - 1, -np.inf)])     # row i is u[T-1-i : 2T-1-i]
    if out is None:
        out = np.empty((T, T), dtype=dtype)
    np.subtract(sliding_window_view(u, T)[::-1], shift[:, None], out=out, casting="same_kind")
    return out


def espa_log_attention(T, gamma, gamma_prev, out=None, dtype=np.float64):
    """log A_l for E-SPA (method §7.2), (T, T), -inf above the diagonal; no exp underflow.

    A_1 (gamma_prev = inf): A[i, 0] = e^{-g i}, A[i, j] = a e^{-g (i-j)} for 1 <= j <= i.
    A_l, l >= 2: A[0, 0] = 1, A[i, i] = r, A[i, j] = r (e^{-g} - e^{-g_prev}) e^{-g (i-j-1)}
    for 1 <= j < i, A[i, 0] = (e^{-g} - r e^{-g_prev}) e^{-g (i-1)}. Needs gamma <= gamma_prev
    (then every entry is >= 0); gamma == gamma_prev gives I. `out` is an optional (T, T)
    buffer to fill; `dtype` (when out is None) rounds the float64 values once on write."""
    v, c, _ = _espa_parts(T, gamma, gamma_prev)
    logA = _toeplitz_lower(v, np.zeros(v.size), out, dtype)
    logA[:, 0] = c
    return logA


def espa_attention(T, gamma, gamma_prev):
    """A_l = chol(Sigma_l) chol(Sigma_{l-1})^-1 for E-SPA (exp of espa_log_attention)."""
    return np.exp(espa_log_attention(T, gamma, gamma_prev))


def espa_bias_and_rescale(T, gamma, gamma_prev, out=None, dtype=np.float64):
    """(B, D) for E-SPA without forming A: B = logA - log D, D = row sums. log D comes from
    log-sum-exp of the first-column term and the closed-form geometric sum of the Toeplitz
    part, O(T) and exact to rounding. B is finite on the lower triangle whenever
    gamma < gamma_prev (gamma == gamma_prev gives A = I, B = -inf off the diagonal).
    `out`/`dtype` as in espa_log_attention; D is always float64, shape (T,)."""
    v, c, logD = _espa_parts(T, gamma, gamma_prev)
    B = _toeplitz_lower(v, logD, out, dtype)
    B[:, 0] = c - logD
    return B, np.exp(logD)


# ---------------------------------------------------------------- U-SPA (method §6)

def _uspa_factors(T, rho):
    """chol((1-rho) I + rho 1 1^T) = L with L[j, j] = d_j, L[i, j] = c_j (i > j); its
    inverse has L^-1[i, i] = 1/d_i and L^-1[i, j] = -beta_i / d_i (j < i), where
    beta_i = rho / (1 + (i-1) rho) is the regression weight E[x_i | x_<i] = beta_i sum x_<i."""
    j = np.arange(T, dtype=np.float64)
    u_prev, u = 1.0 + (j - 1.0) * rho, 1.0 + j * rho           # u_{j-1}, u_j; u_{-1} = 1 - rho
    d = np.sqrt((1.0 - rho) * u / u_prev)
    c = rho * np.sqrt(1.0 - rho) / np.sqrt(u_prev * u)
    beta = rho / u_prev
    beta[0] = 0.0
    return d, c, beta


def uspa_attention(T, rho, rho_prev, out=None):
    """A_l = chol(Sigma_l) chol(Sigma_{l-1})^-1 for U-SPA in closed form, O(T^2).

    A[i, i] = d'_i / d_i and, for j < i, A[i, j] = phi_j - psi_i with
    phi_j = c'_j / d_j + G_j, psi_i = G_{i-1} + d'_i beta_i / d_i, G_m = sum_{k<=m} c'_k beta_k / d_k
    (primes: layer l, rho; plain: layer l-1, rho_prev). Needs 0 <= rho_prev <= rho < 1
    (then A >= 0); rho == rho_prev gives I. The difference phi - psi makes tiny entries
    accurate to about 1e-16 absolute, not relative. `out`: optional (T, T) buffer."""
    T = check_T(T)
    if not (0.0 <= rho_prev < 1.0 and 0.0 <= rho < 1.0):
        raise ValueError(f"rhos must be in [0, 1), got rho={rho!r}, rho_prev={rho_prev!r}")
    _check_order("rho", rho, rho_prev, increasing=True)
    if rho == rho_prev:
        A = np.zeros((T, T)) if out is None else out
        A.fill(0.0)
        A[np.diag_indices(T)] = 1.0
        return A
    d_n, c_n, _ = _uspa_factors(T, rho)
    d_p, _, beta_p = _uspa_factors(T, rho_prev)
    G = np.cumsum(c_n * beta_p / d_p)
    phi = c_n / d_p + G
    psi = np.concatenate([[0.0], G[:-1]]) + d_n * beta_p / d_p
    A = np.subtract(phi[None, :], psi[:, None], out=out)      # (T, T), valid for j < i
    A *= np.tri(T, k=-1, dtype=bool)                            # zero the diagonal and above
    A[np.diag_indices(T)] = d_n / d_p
    return A


def uspa_bias_and_rescale(T, rho, rho_prev, out=None):
    """(B, D) for U-SPA: D = row sums of A (non-negative terms, so accurate), B = log A -
    log D, -inf above the diagonal. Entries that rounding pushed below 0 (at most about
    1e-16, see uspa_attention) are treated as 0. `out`: optional (T, T) buffer."""
    A = uspa_attention(T, rho, rho_prev, out)
    if A.min() < -NEG_RTOL:                                    # bound from uspa_attention
        raise ValueError(f"U-SPA matrix has a negative entry {A.min():.3g}")
    D = A.sum(axis=1)                                           # (T,)
    np.maximum(A, 0.0, out=A)
    with np.errstate(divide="ignore"):
        B = np.log(A, out=A)
    B -= np.log(D)[:, None]
    return B, D


# ---------------------------------------------------------------- generic (method §5, §8)

def log_attention_from(A, neg_rtol=NEG_RTOL):
    """log A of a non-negative lower-triangular (T, T) A, -inf above the diagonal and at
    exact zeros. Entries above the diagonal must be 0; entries in [-neg_rtol max|A|, 0)
    are rounding and become -inf; anything more negative raises ValueError."""
    A = np.asarray(A, dtype=np.float64)
    if A.ndim != 2 or A.shape[0] != A.shape[1]:
        raise ValueError(f"A must be a square (T, T) matrix, got shape {A.shape}")
    upper = np.triu(A, 1)
    if np.any(upper != 0):
        raise ValueError(f"A is not lower triangular: max |A[i, j>i]| = {np.abs(upper).max():.3g}")
    if A.min() < -neg_rtol * np.abs(A).max():
        raise ValueError(f"A has a negative entry {A.min():.3g}; softmax cannot realise it")
    with np.errstate(divide="ignore"):
        return np.log(np.maximum(A, 0.0))


def bias_and_rescale(logA):
    """Split A = diag(D) softmax(B) (method §8) for a general log A: lse_i = logsumexp_j
    logA[i, j], B = logA - lse (entries <= 0, -inf above the diagonal), D = exp(lse) (row
    sums). Every row needs a finite entry (the diagonal of a SPA matrix always is). The
    closed forms above do the same for E-SPA and U-SPA without a row reduction."""
    logA = np.asarray(logA, dtype=np.float64)
    m = logA.max(axis=1, keepdims=True)                         # (T, 1)
    if not np.all(np.isfinite(m)):
        raise ValueError("bias_and_rescale: every row of logA needs a finite entry")
    lse = m + np.log(np.exp(logA - m).sum(axis=1, keepdims=True))
    return logA - lse, np.exp(lse[:, 0])


def rescale(X, D):
    """diag(D_l) X: row i (position i) of X scaled by D_l[i] (method §8). X: (..., T, k),
    a float64 array, a device array or an engine Tensor (only `*` is used), T <= len(D);
    D: (T_max,). The model applies it to its attention output D_l (P V), realise to P."""
    return X * D[:X.shape[-2], None]


def realise(B, D, T=None):
    """A_l = diag(D_l) softmax(B_l) (method §8), (T, T) float64, for the first T positions
    (T <= len(D); every quantity here is prefix consistent). The softmax runs over the
    causal entries j <= i only, whatever B holds above the diagonal; entries below
    kernels.TINY are flushed to 0."""
    T = len(D) if T is None else T
    logits = np.where(np.tri(T, dtype=bool), np.asarray(B, dtype=np.float64)[:T, :T], -np.inf)
    with np.errstate(under="ignore"):
        P = np.exp(logits - logits.max(axis=1, keepdims=True))
    P /= P.sum(axis=1, keepdims=True)
    return flush(rescale(P, np.asarray(D, dtype=np.float64)))


# ---------------------------------------------------------------- per-layer build

def spa_layer(kind, T, value, value_prev, with_logA=True, buffers=None, dtype=np.float64):
    """One layer's {"logA", "B", "D"} for kind "espa" (value = gamma_l, value_prev =
    gamma_{l-1}) or "uspa" (rho_l, rho_{l-1}), from the closed forms above; logA is None
    when with_logA=False. `buffers` is an optional dict of (T, T) arrays {"logA", "B"} to
    fill, so a caller building many layers at large T does not allocate each time. logA
    and B are computed in float64 and rounded once to `dtype`; D stays float64."""
    buffers = buffers or {}
    if kind == "espa":
        logA = None
        if with_logA:
            logA = espa_log_attention(T, value, value_prev, buffers.get("logA"), dtype)
        B, D = espa_bias_and_rescale(T, value, value_prev, buffers.get("B"), dtype)
        return {"logA": logA, "B": B, "D": D}
    if kind == "uspa":
        work = buffers.get("B") if np.dtype(dtype) == np.float64 else None
        B, D = uspa_bias_and_rescale(T, value, value_prev, work)   # float64
        logA = None
        if with_logA:
            logA = buffers.get("logA")
            if logA is None:
                logA = np.empty((T, T), dtype)
            np.add(B, np.log(D)[:, None], out=logA, casting="same_kind")
        return {"logA": logA, "B": B.astype(dtype, copy=False), "D": D}
    raise ValueError(f"kind must be 'espa' or 'uspa', got {kind!r}")


def spa_matrix(kind, T, value, value_prev):
    """The attention-only SPA A_l = chol(Sigma_l) chol(Sigma_{l-1})^-1 of kind "espa" or
    "uspa" in closed form, (T, T) float64, entries below kernels.TINY flushed to 0."""
    if kind == "espa":
        with np.errstate(under="ignore"):
            return flush(np.exp(espa_log_attention(T, value, value_prev)))
    if kind == "uspa":
        return flush(np.maximum(uspa_attention(T, value, value_prev), 0.0))
    raise ValueError(f"kind must be 'espa' or 'uspa', got {kind!r}")


def layer_bias(plan, l, T=None):
    """(B_l, D_l) of block l (1-based) of a kernel-budget plan (budget.make_plan), for the
    first T positions (default plan.block_size): the closed form spa_layer along the plan's
    schedule, or the plan's own (B_l, D_l) where its policy moved A_l off the schedule's
    closed form (qpreserve, mlp_aware). The plan is read by duck typing (kind, schedule,
    overrides, block_size). B: (T, T) float64, -inf above the diagonal; D: (T,)."""
    T = plan.block_size if T is None else T
    if plan.overrides is not None and plan.overrides[l - 1] is not None:
        B, D = plan.overrides[l - 1]
        return B[:T, :T], D[:T]
    layer = spa_layer(plan.kind, T, plan.schedule[l], plan.schedule[l - 1], with_logA=False)
    return layer["B"], layer["D"]


def spa_layers(kind, T, n_layer, gamma_final=DEFAULT_GAMMA_FINAL, rho_final=DEFAULT_RHO_FINAL, with_logA=True,
               reuse_buffers=False, dtype=np.float64):
    """Yield, for l = 1..L, {"l", "logA", "B", "D", "gamma" or "rho"} along the default
    schedules (kernels.espa_gammas / kernels.uspa_rhos). A generator: at T = 8192 one
    float64 (T, T) matrix is 0.5 GB, so layers are built one at a time. With
    reuse_buffers=True the yielded logA and B arrays are overwritten by the next
    layer: copy or cast them before advancing. Cost is dominated by writing the (T, T)
    outputs (memory bandwidth): about 45 ms per float64 matrix at T = 8192 on one core."""
    T = check_T(T)
    if kind not in SPA_KINDS:
        raise ValueError(f"kind must be 'espa' or 'uspa', got {kind!r}")
    name = "gamma" if kind == "espa" else "rho"
    sched = spa_schedule(kind, n_layer, gamma_final if kind == "espa" else rho_final)
    buffers = None
    if reuse_buffers:
        buffers = {"B": np.empty((T, T), dtype)}
        if with_logA:
            buffers["logA"] = np.empty((T, T), dtype)
    for l in range(1, len(sched)):
        layer = spa_layer(kind, T, sched[l], sched[l - 1], with_logA, buffers, dtype)
        yield {"l": l, name: float(sched[l]), **layer}
