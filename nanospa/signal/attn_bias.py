"""SPA attention matrices in closed form, and their softmax realisation A = diag(D) softmax(B).

Implements docs/method.md §6 (U-SPA), §7.2 (E-SPA closed form in log space), §8 (bias
B_l and location-dependent rescaling D_l) and the numerics of §14/§15. Everything is
float64 NumPy and built once for the longest sequence: every quantity here is prefix
consistent (A[:t, :t] built at T equals A built at t). General kernels go through
cholesky.transfer_matrix; target kernels and schedules live in kernels.py.

Each layer's B_l is kept as O(T) numbers, its "parts" (espa_parts, uspa_parts), and any
block of it, rows [i0, i1) by columns [j0, j1), is generated from them by bias_block; the
dense (T, T) forms below (espa_bias_and_rescale, uspa_bias_and_rescale, spa_layer,
layer_bias) are bias_block over the whole square, so a block and the slice of the dense
matrix agree bit for bit. The model's blockwise attention asks for one block at a time.

Notation (docs/method.md §1, §7.2, §8)

    T           sequence length; i (row, query) and j (column, key) are 0-based
    gamma       E-SPA rate of layer l; gamma_prev that of layer l-1 (inf for l = 1)
    rho         U-SPA correlation of layer l; rho_prev that of layer l-1 (0 for l = 1)
    a           sqrt(1 - exp(-2 gamma)), r = a_l / a_{l-1}
    A           (T, T) lower-triangular, non-negative attention matrix of layer l
    logA        log A, -inf above the diagonal (and wherever A is exactly 0)
    B           bias: logA - logsumexp_row(logA), entries <= 0, -inf above the diagonal
    D           (T,) row sums of A = exp(logsumexp_row(logA)); A = diag(D) softmax(B)
    lse         log D, the row normaliser of B (a part)
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


def _toeplitz_block(u, c, shift, i0, i1, j0, j1, out=None, dtype=np.float64):
    """Rows [i0, i1), columns [j0, j1) of M[i, j] = v[i - j] - shift[i] (j <= i; -inf above
    the diagonal) with column 0 replaced by c[i] - shift[i], where u = v reversed and padded
    with T - 1 entries -inf: row i of M is the contiguous slice u[T-1-i+j0 : T-1-i+j1], so
    the block is one fused pass over a strided view (no index arrays). Computed in float64
    and rounded once if out/dtype is narrower."""
    T, w = c.size, j1 - j0
    view = sliding_window_view(u, w)[T - i1 + j0:T - i0 + j0][::-1]     # (i1 - i0, w)
    if out is None:
        out = np.empty((i1 - i0, w), dtype=dtype)
    np.subtract(view, shift[i0:i1, None], out=out, casting="same_kind")
    if j0 == 0:
        out[:, 0] = c[i0:i1] - shift[i0:i1]
    return out


def espa_parts(T, gamma, gamma_prev):
    """E-SPA's B_l in O(T) numbers (the Toeplitz part v, the first column c, the row
    normaliser lse = log D): {"kind": "espa", "u": v reversed and padded (see
    _toeplitz_block), "c", "lse"}; bias_block generates any block of B from them."""
    v, c, logD = _espa_parts(T, gamma, gamma_prev)
    u = np.concatenate([v[::-1], np.full(v.size - 1, -np.inf)])
    return {"kind": "espa", "u": u, "c": c, "lse": logD}


def espa_log_attention(T, gamma, gamma_prev, out=None, dtype=np.float64):
    """log A_l for E-SPA (method §7.2), (T, T), -inf above the diagonal; no exp underflow.

    A_1 (gamma_prev = inf): A[i, 0] = e^{-g i}, A[i, j] = a e^{-g (i-j)} for 1 <= j <= i.
    A_l, l >= 2: A[0, 0] = 1, A[i, i] = r, A[i, j] = r (e^{-g} - e^{-g_prev}) e^{-g (i-j-1)}
    for 1 <= j < i, A[i, 0] = (e^{-g} - r e^{-g_prev}) e^{-g (i-1)}. Needs gamma <= gamma_prev
    (then every entry is >= 0); gamma == gamma_prev gives I. `out` is an optional (T, T)
    buffer to fill; `dtype` (when out is None) rounds the float64 values once on write."""
    p = espa_parts(T, gamma, gamma_prev)
    return _toeplitz_block(p["u"], p["c"], np.zeros(p["c"].size), 0, p["c"].size, 0, p["c"].size, out, dtype)


def espa_attention(T, gamma, gamma_prev):
    """A_l = chol(Sigma_l) chol(Sigma_{l-1})^-1 for E-SPA (exp of espa_log_attention)."""
    return np.exp(espa_log_attention(T, gamma, gamma_prev))


def espa_bias_and_rescale(T, gamma, gamma_prev, out=None, dtype=np.float64):
    """(B, D) for E-SPA without forming A: B = logA - log D, D = row sums. log D comes from
    log-sum-exp of the first-column term and the closed-form geometric sum of the Toeplitz
    part, O(T) and exact to rounding. B is finite on the lower triangle whenever
    gamma < gamma_prev (gamma == gamma_prev gives A = I, B = -inf off the diagonal).
    `out`/`dtype` as in espa_log_attention; D is always float64, shape (T,)."""
    p = espa_parts(T, gamma, gamma_prev)
    return bias_block(p, 0, T, 0, T, dtype, out), np.exp(p["lse"])


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


def _check_rhos(rho, rho_prev):
    if not (0.0 <= rho_prev < 1.0 and 0.0 <= rho < 1.0):
        raise ValueError(f"rhos must be in [0, 1), got rho={rho!r}, rho_prev={rho_prev!r}")
    _check_order("rho", rho, rho_prev, increasing=True)


def uspa_parts(T, rho, rho_prev):
    """U-SPA's A_l in O(T) numbers: A[i, j] = phi_j - psi_i (j < i), A[i, i] = diag_i, with
    phi_j = c'_j / d_j + G_j, psi_i = G_{i-1} + d'_i beta_i / d_i, G_m = sum_{k<=m} c'_k beta_k / d_k
    (primes: layer l, rho; plain: layer l-1, rho_prev), and the row sums in O(T):
    D_i = diag_i + sum_{j<i} phi_j - i psi_i, summed in extended precision (np.longdouble)
    because the last two terms nearly cancel (about 1e-3 of their size at T = 2048).
    -> {"kind": "uspa", "phi", "psi", "diag", "lse": log D}. Needs 0 <= rho_prev <= rho < 1;
    rho == rho_prev gives I. Raises if an entry is below -NEG_RTOL (checked in O(T): the
    smallest entry of row i is min_{j<i} phi_j - psi_i)."""
    T = check_T(T)
    _check_rhos(rho, rho_prev)
    if rho == rho_prev:
        zero = np.zeros(T)
        return {"kind": "uspa", "phi": zero, "psi": zero, "diag": np.ones(T), "lse": zero}
    d_n, c_n, _ = _uspa_factors(T, rho)
    d_p, _, beta_p = _uspa_factors(T, rho_prev)
    G = np.cumsum(c_n * beta_p / d_p)
    phi = c_n / d_p + G
    psi = np.concatenate([[0.0], G[:-1]]) + d_n * beta_p / d_p
    diag = d_n / d_p
    if T > 1:
        low = np.minimum.accumulate(phi)[:-1] - psi[1:]           # row minima, rows i >= 1
        if low.min() < -NEG_RTOL:
            raise ValueError(f"U-SPA matrix has a negative entry {low.min():.3g}")
    ext = np.longdouble
    S = np.concatenate([[0.0], np.cumsum(phi.astype(ext))[:-1]])  # sum_{j<i} phi_j
    D = (diag.astype(ext) + S - np.arange(T, dtype=ext) * psi.astype(ext)).astype(np.float64)
    return {"kind": "uspa", "phi": phi, "psi": psi, "diag": diag, "lse": np.log(D)}


def _uspa_block(p, i0, i1, j0, j1):
    """A[i0:i1, j0:j1] of U-SPA from its parts, float64: phi_j - psi_i below the diagonal,
    diag_i on it, 0 above."""
    i, j = np.arange(i0, i1)[:, None], np.arange(j0, j1)[None, :]
    A = np.subtract(p["phi"][None, j0:j1], p["psi"][i0:i1, None])  # (n, w), valid for j < i
    A *= j < i                                                     # zero the diagonal and above
    on = np.arange(max(i0, j0), min(i1, j1))                       # positions with i == j
    A[on - i0, on - j0] = p["diag"][on]
    return A


def uspa_attention(T, rho, rho_prev, out=None):
    """A_l = chol(Sigma_l) chol(Sigma_{l-1})^-1 for U-SPA in closed form (uspa_parts), O(T^2).
    The difference phi - psi makes tiny entries accurate to about 1e-16 absolute, not
    relative. `out`: optional (T, T) buffer."""
    A = _uspa_block(uspa_parts(T, rho, rho_prev), 0, T, 0, T)
    if out is None:
        return A
    out[...] = A
    return out


def uspa_bias_and_rescale(T, rho, rho_prev, out=None):
    """(B, D) for U-SPA: D the row sums of A (uspa_parts, O(T)), B = log A - log D, -inf
    above the diagonal. Entries that rounding pushed below 0 (at most about 1e-16, see
    uspa_attention) are treated as 0. `out`: optional (T, T) buffer."""
    p = uspa_parts(T, rho, rho_prev)
    return bias_block(p, 0, T, 0, T, out=out), np.exp(p["lse"])


# ---------------------------------------------------------------- blocks of B (O(T) state)

def bias_parts(kind, T, value, value_prev):
    """The O(T) parts of one layer's B_l (espa_parts or uspa_parts; value = gamma_l or rho_l,
    value_prev that of layer l-1); D_l = exp(parts["lse"])."""
    if kind == "espa":
        return espa_parts(T, value, value_prev)
    if kind == "uspa":
        return uspa_parts(T, value, value_prev)
    raise ValueError(f"kind must be 'espa' or 'uspa', got {kind!r}")


def bias_block(parts, i0, i1, j0, j1, dtype=np.float64, out=None):
    """B[i0:i1, j0:j1] (queries i, keys j) generated from a layer's O(T) parts, computed in
    float64 and rounded once to `dtype` (or written into `out`): the same operations as the
    dense (T, T) closed form, so a block equals the slice of the dense B bit for bit. -inf
    above the diagonal. Parts: espa_parts, uspa_parts, or {"kind": "dense", "B": B} for a
    policy's own B_l (no closed form: plan overrides of mlp_aware), which is sliced."""
    kind = parts["kind"]
    if kind == "espa":
        return _toeplitz_block(parts["u"], parts["c"], parts["lse"], i0, i1, j0, j1, out, dtype)
    if out is None:
        out = np.empty((i1 - i0, j1 - j0), dtype=dtype)
    if kind == "dense":
        out[...] = parts["B"][i0:i1, j0:j1]
        return out
    if kind != "uspa":
        raise ValueError(f"bias parts of kind {kind!r}: expected 'espa', 'uspa' or 'dense'")
    A = _uspa_block(parts, i0, i1, j0, j1)
    np.maximum(A, 0.0, out=A)
    with np.errstate(divide="ignore"):
        np.log(A, out=A)
    np.subtract(A, parts["lse"][i0:i1, None], out=out, casting="same_kind")
    return out


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
    kernels.TINY are flushed to 0. B may have leading axes (one bias per head: (H, T, T))."""
    T = len(D) if T is None else T
    logits = np.where(np.tri(T, dtype=bool), np.asarray(B, dtype=np.float64)[..., :T, :T], -np.inf)
    with np.errstate(under="ignore"):
        P = np.exp(logits - logits.max(axis=-1, keepdims=True))
    P /= P.sum(axis=-1, keepdims=True)
    return flush(rescale(P, np.asarray(D, dtype=np.float64)))


# ---------------------------------------------------------------- per-layer build

def spa_layer(kind, T, value, value_prev, with_logA=True, buffers=None, dtype=np.float64):
    """One layer's {"logA", "B", "D"} for kind "espa" (value = gamma_l, value_prev =
    gamma_{l-1}) or "uspa" (rho_l, rho_{l-1}), dense, from the O(T) parts (bias_parts,
    bias_block; log A is bias_block with a zero row normaliser); logA is None when
    with_logA=False. `buffers` is an optional dict of (T, T) arrays {"logA", "B"} to fill,
    so a caller building many layers at large T does not allocate each time. logA and B are
    computed in float64 and rounded once to `dtype`; D stays float64."""
    buffers = buffers or {}
    parts = bias_parts(kind, T, value, value_prev)
    logA = None
    if with_logA:
        logA = bias_block(dict(parts, lse=np.zeros(T)), 0, T, 0, T, dtype, buffers.get("logA"))
    B = bias_block(parts, 0, T, 0, T, dtype, buffers.get("B"))
    return {"logA": logA, "B": B, "D": np.exp(parts["lse"])}


def spa_matrix(kind, T, value, value_prev):
    """The attention-only SPA A_l = chol(Sigma_l) chol(Sigma_{l-1})^-1 of kind "espa" or
    "uspa" in closed form, (T, T) float64, entries below kernels.TINY flushed to 0."""
    if kind == "espa":
        with np.errstate(under="ignore"):
            return flush(np.exp(espa_log_attention(T, value, value_prev)))
    if kind == "uspa":
        return flush(np.maximum(uspa_attention(T, value, value_prev), 0.0))
    raise ValueError(f"kind must be 'espa' or 'uspa', got {kind!r}")


def layer_parts(plan, l, T=None):
    """(parts, D_l) of block l (1-based) of a kernel-budget plan (budget.make_plan) for the
    first T positions (default plan.block_size), in O(T) numbers: the closed-form parts along
    the plan's schedule (bias_parts) with D_l = exp(lse), or where the policy moved A_l off
    the schedule's closed form, its own D_l (qpreserve: override (None, D_l)) and, with no
    closed form left for B_l (mlp_aware: override (B_l, D_l)), {"kind": "dense", "B": B_l}.
    The plan is read by duck typing (kind, schedule, overrides, block_size)."""
    T = plan.block_size if T is None else T
    own = plan.overrides[l - 1] if plan.overrides is not None else None
    if own is not None and own[0] is not None:
        return {"kind": "dense", "B": own[0][:T, :T]}, own[1][:T]
    parts = bias_parts(plan.kind, T, plan.schedule[l], plan.schedule[l - 1])
    return parts, (np.exp(parts["lse"]) if own is None else own[1][:T])


def layer_bias(plan, l, T=None):
    """(B_l, D_l) of block l of a plan, dense: B (T, T) float64, -inf above the diagonal,
    generated from layer_parts; D (T,). The readable reference (tests, trace, small T)."""
    T = plan.block_size if T is None else T
    parts, D = layer_parts(plan, l, T)
    return bias_block(parts, 0, T, 0, T), D


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
