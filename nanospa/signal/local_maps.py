"""The kernel maps of one phi_hat (docs/activations.md §2, §5, §8; docs/method.md §10): the
Q-map and C-map, the bivariate Gaussian mean of one entry, and LocalMaps, the map of a whole
(T, T) kernel vectorised, which maps.MLPMap wraps for the predictions and the kernel budget's
walk (the plan and the model do not run them; read second).

Notation as in gaussian_means.py, and

    Q(q)         Q-map E[phi_hat(sqrt(q) z)^2]
    h_n(q)       Hermite coefficient E[phi_hat(sqrt(q) z) He_n(z)] / sqrt(n!)

For leaky ReLU with b = 0, a > 0 the exact closed forms, else quadrature. phi may be a PhiHat,
an ActivationTransform (read through .phi_hat), a base activation's name, or a user's float64
callable (DyT's tanh(alpha x), the tests' references).

Not here: the quadrature rules and TAT's leaky-ReLU C-map the solvers use (gaussian_means.py).
"""
import math
from dataclasses import dataclass

import numpy as np

from .activations import PhiHat, base_name
from .gaussian_means import (_GH_NODES, _GL_NODES, _GL_RANGE, _gh, _gl, _pdf, _split_rule, gauss_rule, lrelu_beta,
                      lrelu_cmap_beta)

# ------------------------------------------------------------------- bivariate means

def bivariate(h, q1, q2, rho, n=None):
    """E[h(x1) h(x2)], (x1, x2) ~ N(0, [[q1, r], [r, q2]]), rho = r/sqrt(q1 q2), for a phi_hat h
    (a PhiHat, or a user's callable with its kink).

    x1 = sqrt(q1) u, x2 = sqrt(q2) (rho u + sqrt(1 - rho^2) v): n x n Gauss-Hermite, or
    for a kink the outer u split at x*/sqrt(q1) and, per u, the inner v split at
    w* = (x*/sqrt(q2) - rho u) / sqrt(1 - rho^2) (§8).
    """
    R = _GL_RANGE
    r1, r2 = math.sqrt(q1), math.sqrt(q2)
    rho = min(1.0, max(-1.0, float(rho)))
    sc = math.sqrt(max(0.0, 1.0 - rho * rho))
    if sc == 0.0:                            # v = rho u: a 1-D mean
        kinks = [] if h.kink is None else [h.kink / r1 if r1 else None,
                                           rho * h.kink / r2 if r2 else None]
        Z, W = _gh(n or _GH_NODES) if h.kink is None else _split_rule(kinks, n or _GL_NODES)
        return float(W @ (h(r1 * Z) * h(r2 * rho * Z)))
    if h.kink is None:
        Z, W = _gh(n or _GH_NODES)
        U, Wu = Z[:, None], W
        V, Wv = Z[None, :], W[None, :]
    else:
        nn = n or _GL_NODES
        U, Wu = _split_rule([h.kink / r1] if r1 else [], nn)
        U = U[:, None]
        x, w = _gl(nn)
        ws = np.clip((h.kink / r2 - rho * U) / sc, -R, R) if r2 else np.full_like(U, R)
        h1, m1 = 0.5 * (ws + R), 0.5 * (ws - R)              # piece [-R, w*]
        h2, m2 = 0.5 * (R - ws), 0.5 * (R + ws)              # piece [w*, R]
        V = np.concatenate([m1 + h1 * x, m2 + h2 * x], axis=1)
        Wv = np.concatenate([h1 * w, h2 * w], axis=1) * _pdf(V)
    inner = np.sum(Wv * h(r2 * (rho * U + sc * V)), axis=1)
    return float(Wu @ (h(r1 * U[:, 0]) * inner))


@dataclass(frozen=True)
class _UserPhiHat:
    """A user's float64 callable phi_hat, kinked at x = kink (None: smooth); no closed form."""
    fn: object
    kink: object = None
    homogeneous = False

    def __call__(self, x, xp=None):
        return self.fn(x)


def lrelu_cmap(c, negative_slope):
    """Exact C-map of sqrt(2/(1+alpha^2)) LReLU_alpha (TAT leaky ReLU, §5), any shape of c.

    C_alpha(c) = c + beta(alpha) (sqrt(1 - c^2) - c arccos c); C(1) = 1, C(0) = beta.
    Equals E[LReLU(u) LReLU(v)] / E[LReLU(z)^2] for any alpha (also alpha = 0: ReLU).
    """
    return lrelu_cmap_beta(np.asarray(c, dtype=np.float64), lrelu_beta(negative_slope))


def _lrelu_bivariate(h, q1, q2, r):
    """E[phi_hat(x1) phi_hat(x2)] in closed form for phi_hat = s (LReLU(a x) + o), a > 0."""
    q1, q2, r = (np.asarray(v, dtype=np.float64) for v in (q1, q2, r))
    al, a = h.alpha, h.a
    g1, g2 = a * np.sqrt(q1), a * np.sqrt(q2)                   # input std devs
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = np.where(g1 * g2 > 0, a * a * r / (g1 * g2), 0.0)
    m = (1.0 - al) / math.sqrt(2.0 * math.pi)                    # E[LReLU(z)]
    uu = 0.5 * (1.0 + al * al) * g1 * g2 * lrelu_cmap_beta(rho, float(lrelu_beta(al)))
    return h.s * h.s * (uu + h.o * m * (g1 + g2) + h.o * h.o)


# ------------------------------------------------------------------- Q-map and C-map

def _as_hat(phi, kink=None):
    if isinstance(phi, PhiHat):
        return phi
    if isinstance(getattr(phi, "phi_hat", None), PhiHat):        # an ActivationTransform
        return phi.phi_hat
    if isinstance(phi, str):
        return PhiHat.of(base_name(phi), {})
    if callable(phi):
        return _UserPhiHat(phi, kink)
    raise ValueError(f"phi must be a PhiHat, ActivationTransform, activation name or callable, got {phi!r}")


def q_map(phi, q, kink=None):
    """Q(q) = E[phi(sqrt(q) z)^2], z ~ N(0, 1); q a scalar or any array of q >= 0.

    phi: a PhiHat, an ActivationTransform, a base activation name, or a float64 callable
    (smooth, or with a kink at x = `kink`). Closed form for leaky ReLU, else quadrature (§8).
    """
    h = _as_hat(phi, kink)
    q = np.asarray(q, dtype=np.float64)
    if np.any(q < 0):
        raise ValueError(f"q must be >= 0, got {q.min()}")
    if h.homogeneous:
        return _lrelu_bivariate(h, q, q, q)[()]
    out = []
    for qi in q.ravel():
        Z, W = gauss_rule(h.kink, qi)
        out.append(float(W @ h(math.sqrt(qi) * Z) ** 2))
    return np.array(out).reshape(q.shape)[()]


def c_map(phi, c, q=1.0, kink=None, n=None):
    """C(c) = E[phi(u) phi(v)] / Q(q), (u, v) ~ N(0, q [[1, c], [c, 1]]); c scalar or array.

    For q = 1 and a transformed phi (Q(1) = 1) this is the C-map of docs/activations.md
    §2: C(1) = 1, increasing and convex on [0, 1]. Closed form for leaky ReLU/ReLU,
    2-D Gauss-Hermite (n x n, default 160) for smooth phi, split Gauss-Legendre at the
    kink for elu and for callables given a `kink`.
    """
    h = _as_hat(phi, kink)
    c = np.asarray(c, dtype=np.float64)
    q = float(q)
    if np.any(np.abs(c) > 1.0) or q <= 0.0:
        raise ValueError(f"need -1 <= c <= 1 and q > 0, got c in [{c.min()}, {c.max()}], q={q}")
    if h.homogeneous:
        return (_lrelu_bivariate(h, q, q, q * c) / _lrelu_bivariate(h, q, q, q))[()]
    Q = bivariate(h, q, q, 1.0, n)
    out = [bivariate(h, q, q, ci, n) / Q for ci in c.ravel()]
    return np.array(out).reshape(c.shape)[()]


# ------------------------------------------------------------------- a whole kernel

_SERIES_NODES = (160, 320)   # Gauss-Hermite sizes tried for the Hermite series; hermegauss
                             # overflows beyond ~350 nodes
_SERIES_TAIL = 1e-13     # Parseval tail accepted for the series, relative to max(Q(q), 1)


def _norm_hermite(Z, N):
    """He_n(Z)/sqrt(n!) for n = 0..N, shape (N+1, len(Z)), by the stable recurrence."""
    H = np.empty((N + 1, Z.size))
    H[0] = 1.0
    if N >= 1:
        H[1] = Z
    for k in range(1, N):
        H[k + 1] = (Z * H[k] - math.sqrt(k) * H[k - 1]) / math.sqrt(k + 1)
    return H


class LocalMaps:
    """Vectorised kernel maps of one phi_hat (docs/method.md §10).

        C(c)          C-map for q = 1 inputs, any array of c in [-1, 1]
        Q(q)          Q-map, any array of q >= 0
        kernel(Sigma) Sigma'_ij = E[phi_hat(u_i) phi_hat(u_j)], u ~ N(0, Sigma): the exact
                      wide-limit kernel after an MLP nonlinearity, for any input kernel
                      (..., T, T), diagonal q-values not necessarily 1
        __call__      = C

    Smooth phi_hat: Hermite series Sigma'_ij = sum_n h_n(q_i) h_n(q_j) rho_ij^n, its
    truncation error (Parseval tail) checked below 1e-13 Q(q); entries whose q is too
    large for the series (steep phi_hat, q >~ 100) fall back to 2-D quadrature. Leaky
    ReLU: closed form. Other kinked (elu): split quadrature per entry (about 1 ms an
    entry: slow for large T).
    """

    def __init__(self, phi):
        self.phi = phi
        self._h = _as_hat(phi)
        self.mode = "closed form" if self._h.homogeneous else (
            "quadrature" if self._h.kink is not None else "hermite")
        self._c_coef = None

    def _coeffs(self, q):
        """h_n(q) for each q (shape (M,)) -> (A (M, N+1), ok (M,)): N grows until the
        Parseval tail Q(q) - sum_n h_n(q)^2 is below 1e-13 Q(q); ok marks converged rows."""
        for n_nodes in _SERIES_NODES:
            Z, W = _gh(n_nodes)
            N = n_nodes // 2                      # keep N well below n_nodes: honest tail
            F = self._h(np.sqrt(q)[:, None] * Z[None, :])                  # (M, n_nodes)
            A = (F * W) @ _norm_hermite(Z, N).T                            # (M, N+1)
            Q = (F * F) @ W
            ok = Q - np.sum(A * A, axis=1) <= _SERIES_TAIL * np.maximum(Q, 1.0)
            if np.all(ok):
                break
        return A, ok

    def C(self, c):
        c = np.asarray(c, dtype=np.float64)
        if np.any(np.abs(c) > 1.0):
            raise ValueError(f"c must lie in [-1, 1], got [{c.min()}, {c.max()}]")
        if self.mode != "hermite":
            return c_map(self.phi, c)
        if self._c_coef is None:
            A, ok = self._coeffs(np.array([1.0]))
            self._c_coef = A[0] * A[0] / np.sum(A[0] * A[0]) if ok[0] else False
        if self._c_coef is False:                # series too slow: quadrature per c
            return c_map(self.phi, c)
        return np.polynomial.polynomial.polyval(c, self._c_coef)[()]

    __call__ = C

    def Q(self, q):
        return q_map(self.phi, q)

    def kernel(self, Sigma):
        S = np.asarray(Sigma, dtype=np.float64)
        if S.ndim < 2 or S.shape[-1] != S.shape[-2]:
            raise ValueError(f"Sigma must have shape (..., T, T), got {S.shape}")
        q = np.diagonal(S, axis1=-2, axis2=-1)
        if np.any(q < 0):
            raise ValueError("Sigma has a negative diagonal entry")
        if self.mode == "closed form":
            return _lrelu_bivariate(self._h, q[..., :, None], q[..., None, :], S)
        den = np.sqrt(q[..., :, None] * q[..., None, :])
        with np.errstate(invalid="ignore", divide="ignore"):
            rho = np.clip(np.where(den > 0, S / den, 0.0), -1.0, 1.0)
        out = np.zeros_like(S)
        todo = np.ones(S.shape, dtype=bool)      # entries left for per-entry quadrature
        if self.mode == "hermite":
            uq, inv = np.unique(q.ravel(), return_inverse=True)
            A, ok = self._coeffs(uq)
            A, ok = A[inv].reshape(q.shape + (-1,)), ok[inv].reshape(q.shape)   # (..., T, N+1)
            for k in range(A.shape[-1] - 1, -1, -1):                       # Horner in rho
                out = out * rho + A[..., :, None, k] * A[..., None, :, k]
            todo = ~(ok[..., :, None] & ok[..., None, :])
        for idx in zip(*np.nonzero(todo)):       # kinked phi_hat, or q beyond the series
            i, j = idx[-2], idx[-1]
            if j <= i:                           # symmetric: fill (i, j) and (j, i)
                qi, qj = q[idx[:-1]], q[idx[:-2] + (j,)]
                out[idx] = out[idx[:-2] + (j, i)] = bivariate(self._h, qi, qj, rho[idx])
        return out
