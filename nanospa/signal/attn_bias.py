"""SPA attention matrices in closed form, as the bias B_l and rescaling D_l of their softmax
realisation A = diag(D) softmax(B).

Implements docs/method.md §6 (U-SPA), §7.2 (E-SPA closed form in log space) and §8 (bias
B_l and location-dependent rescaling D_l), with the numerics of §14. Everything is float64
NumPy and prefix consistent (A[:t, :t] built at T equals A built at t).

One source per kind: ``espa_bias`` and ``uspa_bias`` turn a layer's schedule values into
the O(T) "parts" of its B_l and D_l, and ``bias_block`` generates any block of B_l from them
(the whole square for a dense B_l, one (query, key) block at a time for the blockwise
attention). ``layer_bias(plan, l)`` gives block l of a model its (parts, D_l): the model,
the predictions and the command line all call it. The dense references the tests hold these
to (§5's general transfer matrix, §7.2's A_l entry by entry), §8's split of a general A_l,
and B_l and A_l = diag(D_l) softmax(B_l) as dense matrices (dense_layer_bias, realise) are in
cholesky.py; A_l itself as a dense matrix, which the
kernel budget's walk multiplies kernels by, in walks.py.

Notation (docs/method.md §1, §7.2, §8)

    T           sequence length; i (row, query) and j (column, key) are 0-based
    gamma       E-SPA rate of layer l; gamma_prev that of layer l-1 (inf for l = 1)
    rho         U-SPA correlation of layer l; rho_prev that of layer l-1 (0 for l = 1)
    a           sqrt(1 - exp(-2 gamma)), r = a_l / a_{l-1}
    A           (T, T) lower-triangular, non-negative attention matrix of layer l
    logA        log A, -inf above the diagonal (and wherever A is exactly 0)
    B           bias: logA - log D, entries <= 0, -inf above the diagonal
    D           (T,) row sums of A; A = diag(D) softmax(B)
    lse         log D, the row normaliser of B (one of the parts)
"""
import numpy as np

from .kernels import check_T

NEG_RTOL = 1e-12   # entries of A in [-NEG_RTOL max|A|, 0) are rounding (closed forms: ~1e-16)


def _check_order(name, value, prev, increasing):
    ok = prev <= value if increasing else value <= prev
    if not ok:
        rel = "rho >= rho_prev" if increasing else "gamma <= gamma_prev"
        raise ValueError(f"{name}={value!r} after {name}_prev={prev!r}: SPA needs {rel} for a "
                         f"non-negative A (use transfer_matrix for the signed matrix)")


# ---------------------------------------------------------------- E-SPA (method §7.2)

def espa_bias(T, gamma, gamma_prev):
    """E-SPA's B_l and D_l (method §7.2, §8) as O(T) parts, from the closed form of
    A_l = chol(Sigma_l) chol(Sigma_{l-1})^-1 in log space (cholesky.espa_attention_reference
    writes the same A_l out entry by entry, with exp):

        A_1 (gamma_prev = inf): A[i, 0] = e^{-g i}, A[i, j] = a e^{-g (i-j)}     (1 <= j <= i)
        A_l, l >= 2: A[0, 0] = 1, A[i, i] = r, A[i, 0] = (e^{-g} - r e^{-g_prev}) e^{-g (i-1)},
                     A[i, j] = r (e^{-g} - e^{-g_prev}) e^{-g (i-j-1)}                (1 <= j < i)

    log A is Toeplitz in i - j off the first column: v[k] = log A[i, i-k] (j >= 1), c[i] =
    log A[i, 0], and log D[i] = log of row i's sum, by log-sum-exp of the first column and
    the closed-form geometric sum of the rest: no exp underflow, O(T), exact to rounding.
    Needs gamma <= gamma_prev (then every entry is >= 0); gamma == gamma_prev gives A = I.
    -> {"kind": "espa", "u": v reversed and padded (see _toeplitz_block), "c", "lse": log D};
    bias_block(parts, ...) gives B = log A - log D, and D = exp(parts["lse"])."""
    T = check_T(T)
    if not gamma > 0 or not gamma_prev > 0:
        raise ValueError(f"gammas must be > 0 (or inf), got gamma={gamma!r}, gamma_prev={gamma_prev!r}")
    _check_order("gamma", gamma, gamma_prev, increasing=False)
    k = np.arange(T, dtype=np.float64)
    v, c, logD = np.full(T, -np.inf), np.full(T, -np.inf), np.zeros(T)
    v[0] = c[0] = 0.0
    if gamma == gamma_prev:                                   # A = I (also gamma = inf)
        return _espa(v, c, logD)
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
    return _espa(v, c, logD)


def _espa(v, c, logD):
    u = np.concatenate([v[::-1], np.full(v.size - 1, -np.inf)])
    return {"kind": "espa", "u": u, "c": c, "lse": logD}


def _toeplitz_block(u, c, shift, i0, i1, j0, j1, out=None, dtype=np.float64, xp=np):
    """Rows [i0, i1), columns [j0, j1) of M[i, j] = v[i - j] - shift[i] (j <= i; -inf above
    the diagonal) with column 0 replaced by c[i] - shift[i], where u = v reversed and padded
    with T - 1 entries -inf: row i of M is the contiguous slice u[T-1-i+j0 : T-1-i+j1], so
    the block is one fused pass over a strided view (no index arrays). Computed in float64
    and rounded once if out/dtype is narrower."""
    T, w = c.size, j1 - j0
    view = xp.lib.stride_tricks.sliding_window_view(u, w)[T - i1 + j0:T - i0 + j0][::-1]   # (i1 - i0, w)
    if out is None:
        out = xp.empty((i1 - i0, w), dtype=dtype)
    xp.subtract(view, shift[i0:i1, None], out=out, casting="same_kind")
    if j0 == 0:
        out[:, 0] = c[i0:i1] - shift[i0:i1]
    return out


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


def uspa_bias(T, rho, rho_prev):
    """U-SPA's B_l and D_l (method §6, §8) as O(T) parts of A_l: A[i, j] = phi_j - psi_i (j < i), A[i, i] = diag_i, with
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


def _uspa_block(p, i0, i1, j0, j1, xp=np):
    """A[i0:i1, j0:j1] of U-SPA from its parts, float64: phi_j - psi_i below the diagonal,
    diag_i on it, 0 above."""
    i, j = xp.arange(i0, i1)[:, None], xp.arange(j0, j1)[None, :]
    A = xp.subtract(p["phi"][None, j0:j1], p["psi"][i0:i1, None])  # (n, w), valid for j < i
    A *= j < i                                                     # zero the diagonal and above
    on = xp.arange(max(i0, j0), min(i1, j1))                       # positions with i == j
    A[on - i0, on - j0] = p["diag"][on]
    return A


# ---------------------------------------------------------------- blocks of B (O(T) state)

def bias_block(parts, i0, i1, j0, j1, dtype=np.float64, out=None, xp=np):
    """B[i0:i1, j0:j1] (queries i, keys j) generated from a layer's O(T) parts, computed in
    float64 and rounded once to `dtype` (or written into `out`): the same operations as the
    whole square, so a block equals the slice of the dense B bit for bit. -inf above the
    diagonal. Parts: espa_bias's, uspa_bias's, or {"kind": "dense", "B": B} for a policy's
    own B_l (no closed form: plan overrides of mlp_aware), which is sliced. ``xp``: the module
    of the parts' arrays (numpy; the model keeps them on its device, cupy on a GPU, and makes
    each block there)."""
    kind = parts["kind"]
    if kind == "espa":
        return _toeplitz_block(parts["u"], parts["c"], parts["lse"], i0, i1, j0, j1, out, dtype, xp)
    if out is None:
        out = xp.empty((i1 - i0, j1 - j0), dtype=dtype)
    if kind == "dense":
        out[...] = parts["B"][i0:i1, j0:j1]
        return out
    if kind != "uspa":
        raise ValueError(f"bias parts of kind {kind!r}: expected 'espa', 'uspa' or 'dense'")
    A = _uspa_block(parts, i0, i1, j0, j1, xp)
    xp.maximum(A, 0.0, out=A)
    with np.errstate(divide="ignore"):
        xp.log(A, out=A)
    xp.subtract(A, parts["lse"][i0:i1, None], out=out, casting="same_kind")
    return out


# ---------------------------------------------------------------- D_l (method §8)

def rescale(X, D):
    """diag(D_l) X: row i (position i) of X scaled by D_l[i] (method §8). X: (..., T, k),
    a float64 array, a device array or an engine Tensor (only `*` is used), T <= len(D);
    D: (T_max,). The model applies it to its attention output D_l (P V), cholesky.realise to P."""
    return X * D[:X.shape[-2], None]


# ---------------------------------------------------------------- per layer

def layer_bias(plan, l, T=None):
    """(parts, D_l) of block l (1-based) of a kernel-budget plan (budget.make_plan) for the
    first T positions (default plan.block_size): B_l as O(T) parts along the plan's schedule
    (espa_bias or uspa_bias of gamma_l / rho_l and the previous layer's; bias_block generates
    B_l from them) with D_l = exp(lse), or, where the policy moved A_l off the schedule's
    closed form, its own D_l (qpreserve: override (None, D_l)) and, with no closed form left
    for B_l (mlp_aware: override (B_l, D_l)), {"kind": "dense", "B": B_l}. What the model's
    SPA attention adds to its logits and multiplies its output by; the predictions and
    `python -m nanospa.signal` read the same. The plan is read by duck typing (kind,
    schedule, overrides, block_size)."""
    T = plan.block_size if T is None else T
    own = plan.overrides[l - 1] if plan.overrides is not None else None   # non-default policies only
    if own is not None and own[0] is not None:
        return {"kind": "dense", "B": own[0][:T, :T]}, own[1][:T]
    source = {"espa": espa_bias, "uspa": uspa_bias}.get(plan.kind)
    if source is None:
        raise ValueError(f"layer_bias: plan of kind {plan.kind!r} has no SPA bias (expected 'espa' or 'uspa')")
    parts = source(T, plan.schedule[l], plan.schedule[l - 1])
    return parts, (np.exp(parts["lse"]) if own is None else own[1][:T])
