"""SPA in general: the targets Sigma_l as dense matrices (espa_kernel, uspa_kernel: method §6,
§7.1), checked Cholesky factors, the general transfer matrix and its B_l and D_l,
the dense references the closed forms of attn_bias.py are checked against (the tests run
this file, and the kernel budget's policies beyond the default; read second); and the dense
B_l and A_l = diag(D_l) softmax(B_l) of a plan's block, which the predictions and the table
run (dense_layer_bias, realise).

Implements docs/method.md §5 (general recipe A_l = chol(Sigma_l) chol(Sigma_{l-1})^-1),
§7.2's E-SPA A_l written out entry by entry, §8's split A = diag(D) softmax(B) of a general
A by a row reduction, §9 (non-causal variant with symmetric square roots) and the
construction checks of §14.
Float64 NumPy only; no explicit inverses (triangular systems are solved with
np.linalg.solve on the transposed system) and no silent jitter: a kernel that is not
positive definite raises ValueError with its minimum eigenvalue. Closed forms for
E-SPA/U-SPA and the softmax bias/rescale split live in attn_bias.py.

Notation (docs/method.md §1)

    Sigma_prev  Sigma_{l-1}, (T, T) symmetric positive definite kernel entering block l
    Sigma_next  Sigma_l, (T, T) target kernel after block l
    chol(S)     lower-triangular factor, S = chol(S) chol(S)^T
    A           attention matrix of block l, A Sigma_prev A^T = Sigma_next
"""
import numpy as np

from .attn_bias import NEG_RTOL, bias_block, layer_bias, rescale
from .kernels import check_T, flush

# Relative symmetry tolerance for input kernels: propagated kernels A S A^T are symmetric
# only up to rounding (a few ulps of the largest entry), so allow 1e-10 of max |S|.
SYM_RTOL = 1e-10


# ---------------------------------------------------------------- SPA targets, dense (method §6, §7.1)

def espa_kernel(T, gamma):
    """E-SPA target (method §7.1): Sigma[i, j] = exp(-gamma |i - j|); gamma = inf gives I."""
    T = check_T(T)
    if not gamma > 0:
        raise ValueError(f"gamma must be > 0 (or inf), got {gamma!r}")
    if np.isinf(gamma):
        return np.eye(T)
    i = np.arange(T)
    return np.exp(-gamma * np.abs(i[:, None] - i[None, :]).astype(np.float64))


def uspa_kernel(T, rho):
    """U-SPA target (method §6): Sigma = (1 - rho) I + rho 1 1^T, 0 <= rho < 1."""
    T = check_T(T)
    if not 0.0 <= rho < 1.0:
        raise ValueError(f"rho must be in [0, 1), got {rho!r}")
    return (1.0 - rho) * np.eye(T) + rho * np.ones((T, T))


# ---------------------------------------------------------------- checked Cholesky (method §5)

def _square(S, name):
    S = np.asarray(S, dtype=np.float64)
    if S.ndim != 2 or S.shape[0] != S.shape[1]:
        raise ValueError(f"{name} must be a square (T, T) matrix, got shape {S.shape}")
    if not np.all(np.isfinite(S)):
        raise ValueError(f"{name} has non-finite entries")
    return S


def _symmetric(S, name):
    S = _square(S, name)
    asym = np.max(np.abs(S - S.T), initial=0.0)
    if asym > SYM_RTOL * np.max(np.abs(S), initial=0.0):
        raise ValueError(f"{name} is not symmetric: max |S - S^T| = {asym:.3g}")
    return S


def checked_cholesky(Sigma, name="Sigma"):
    """Lower-triangular L with Sigma = L L^T. Raises ValueError naming the minimum
    eigenvalue if Sigma is not positive definite; never adds jitter."""
    Sigma = _symmetric(Sigma, name)
    try:
        return np.linalg.cholesky(Sigma)
    except np.linalg.LinAlgError:
        lam_min = np.linalg.eigvalsh(Sigma).min()
        raise ValueError(f"{name} is not positive definite: min eigenvalue {lam_min:.6g}") from None


def transfer_matrix(Sigma_prev, Sigma_next):
    """A = chol(Sigma_next) chol(Sigma_prev)^-1 (method §5), (T, T) lower triangular, with
    A Sigma_prev A^T = Sigma_next. Solved as L_prev^T A^T = L_next^T. Non-negativity is
    not enforced here: it depends on the schedule (method §6, §7.2); see check_attention."""
    L_prev = checked_cholesky(Sigma_prev, "Sigma_prev")
    L_next = checked_cholesky(Sigma_next, "Sigma_next")
    if L_prev.shape != L_next.shape:
        raise ValueError(f"kernel shapes differ: {L_prev.shape} vs {L_next.shape}")
    A = np.linalg.solve(L_prev.T, L_next.T).T                   # A L_prev = L_next
    # L_prev^T is upper triangular, so the LU inside solve never pivots and the entries
    # above the diagonal come out as exact zeros; tril only makes that explicit.
    return np.tril(A)


def espa_attention_reference(T, gamma, gamma_prev):
    """A_l of E-SPA written entry by entry from docs/method.md §7.2, in float64 with exp (it
    underflows where espa_bias does not: a reference for small T, for the tests)."""
    A = np.zeros((T, T))
    a = np.sqrt(1 - np.exp(-2 * gamma))
    for i in range(T):
        for j in range(i + 1):
            if np.isinf(gamma_prev):                                            # layer 1
                A[i, j] = np.exp(-gamma * i) if j == 0 else a * np.exp(-gamma * (i - j))
            else:
                r = a / np.sqrt(1 - np.exp(-2 * gamma_prev))
                A[i, j] = (1.0 if i == 0 else r if i == j else
                           (np.exp(-gamma) - r * np.exp(-gamma_prev)) * np.exp(-gamma * (i - 1)) if j == 0 else
                           r * (np.exp(-gamma) - np.exp(-gamma_prev)) * np.exp(-gamma * (i - j - 1)))
    return A


def sym_sqrt(S, power=0.5):
    """Symmetric matrix power S^power = V diag(lambda^power) V^T of a symmetric positive
    definite S (eigh). Raises ValueError with the minimum eigenvalue otherwise."""
    S = _symmetric(S, "S")
    lam, V = np.linalg.eigh(S)
    if lam.min() <= 0:
        raise ValueError(f"sym_sqrt needs a positive definite matrix: min eigenvalue {lam.min():.6g}")
    return (V * lam ** power) @ V.T


def noncausal_attention(Sigma_prev, Sigma_next, neg_rtol=1e-12):
    """Bidirectional SPA (method §9): A = Sigma_next^(1/2) Sigma_prev^(-1/2), dense, with
    A Sigma_prev A^T = Sigma_next. Non-negativity has no proof (it held in every numerical
    check), so it is asserted here: an entry below -neg_rtol * max|A| raises ValueError.
    Not prefix consistent: build it for the exact T."""
    A = sym_sqrt(Sigma_next, 0.5) @ sym_sqrt(Sigma_prev, -0.5)
    scale = np.max(np.abs(A))
    if A.min() < -neg_rtol * scale:
        raise ValueError(f"non-causal SPA matrix has a negative entry {A.min():.3g}")
    return A


def check_attention(A, Sigma_prev, Sigma_next, causal=True, kernel_atol=1e-8,
                    neg_rtol=1e-12, raise_error=True):
    """Construction checks of method §14 for one attention matrix.

    Returns {"kernel_err": max |A Sigma_prev A^T - Sigma_next|, "upper_max": max |A| above
    the diagonal (reported as 0 when causal=False), "min_entry": min A}. Raises
    ValueError (if raise_error) when kernel_err > kernel_atol (the kernels have unit-scale
    entries, so an absolute tolerance; default 1e-8 from method §14), when a causal A has
    a non-zero entry above the diagonal, or when min A < -neg_rtol * max|A| (exact zeros
    from exp underflow are fine, sign errors are not)."""
    A = _square(A, "A")
    Sigma_prev, Sigma_next = _square(Sigma_prev, "Sigma_prev"), _square(Sigma_next, "Sigma_next")
    if not A.shape == Sigma_prev.shape == Sigma_next.shape:
        raise ValueError(f"shapes differ: A {A.shape}, Sigma_prev {Sigma_prev.shape}, "
                         f"Sigma_next {Sigma_next.shape}")
    report = {
        "kernel_err": float(np.max(np.abs(A @ Sigma_prev @ A.T - Sigma_next))),
        "upper_max": float(np.max(np.abs(np.triu(A, 1)), initial=0.0)) if causal else 0.0,
        "min_entry": float(A.min()),
    }
    if raise_error:
        if report["kernel_err"] > kernel_atol:
            raise ValueError(f"A Sigma_prev A^T misses Sigma_next by {report['kernel_err']:.3g}")
        if report["upper_max"] > 0.0:
            raise ValueError(f"A is not lower triangular: max |A[i, j>i]| = {report['upper_max']:.3g}")
        if report["min_entry"] < -neg_rtol * np.max(np.abs(A)):
            raise ValueError(f"A has a negative entry {report['min_entry']:.3g}")
    return report


# ---------------------------------------------------------------- B_l and D_l of a general A_l (method §8)

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
    closed forms of attn_bias.py do the same for E-SPA and U-SPA without a row reduction."""
    logA = np.asarray(logA, dtype=np.float64)
    m = logA.max(axis=1, keepdims=True)                         # (T, 1)
    if not np.all(np.isfinite(m)):
        raise ValueError("bias_and_rescale: every row of logA needs a finite entry")
    lse = m + np.log(np.exp(logA - m).sum(axis=1, keepdims=True))
    return logA - lse, np.exp(lse[:, 0])


# ---------------------------------------------------------------- A_l from B_l and D_l, dense (method §8)

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


def dense_layer_bias(plan, l, T=None):
    """(B_l, D_l) of block l with B_l dense, (T, T) float64, -inf above the diagonal:
    layer_bias, and bias_block over the whole square (the table, the predictions, small T)."""
    T = plan.block_size if T is None else T
    parts, D = layer_bias(plan, l, T)
    return bias_block(parts, 0, T, 0, T), D
