"""Gaussian means of a phi_hat: quadrature, Q-map, C-map, kernel map, leaky-ReLU closed forms.

Implements docs/activations.md §2, §5 and §8 and the per-entry MLP kernel map of
docs/method.md §10, for a shaped activation

    phi_hat(x) = s * ( phi(a x + b) + o )     (a, b, o, s: input_scale, input_shift,
                                                output_shift, output_scale)

Notation

    z            standard normal; (u, v) standard normals with correlation c
    q            input q-value (second moment) of a pre-activation
    Q(q)         Q-map E[phi_hat(sqrt(q) z)^2]
    C(c)         C-map E[phi_hat(u) phi_hat(v)] / Q(q), for inputs of q-value q (default 1)
    alpha        negative_slope of a leaky ReLU
    beta         C(0) of one TAT leaky-ReLU layer, (1 - alpha)^2 / (pi (1 + alpha^2))
    h_n(q)       Hermite coefficient E[phi_hat(sqrt(q) z) He_n(z)] / sqrt(n!)

Quadrature (§8): probabilists' Gauss-Hermite for smooth phi_hat; for phi_hat with a kink
(relu, leaky_relu; elu has a jump in phi'') Gauss-Legendre on [-12, 12] split at the kink
x* = -b/a; for leaky ReLU with b = 0, a > 0 the exact closed forms. All float64 NumPy.

Not here: the base activations (activations.py), the DKS/TAT solvers and the
ActivationTransform object (act_transform.py); phi may be an ActivationTransform, which
this module reads only through its `activation` and `params` attributes.
"""
import functools
import math

import numpy as np
from numpy.polynomial.hermite_e import hermegauss
from numpy.polynomial.legendre import leggauss

from .activations import ACTIVATIONS, LEAKY_RELU_SLOPE, base_name

__all__ = ["PhiHat", "q_map", "c_map", "LocalMaps", "local_cmap",
           "lrelu_beta", "alpha_of_beta", "lrelu_cmap_beta", "lrelu_cmap"]

_GH_NODES = 160          # Gauss-Hermite nodes (per axis) for smooth means: ~1e-14 here (§8)
_GL_NODES = 100          # Gauss-Legendre nodes per piece of the split rule for kinked means
_GL_RANGE = 12.0         # split rule on [-R, R]: N(0, 1) mass outside is ~4e-33
_SERIES_NODES = (160, 320)   # Gauss-Hermite sizes tried for the Hermite series; hermegauss
                             # overflows beyond ~350 nodes
_SERIES_TAIL = 1e-13     # Parseval tail accepted for the series, relative to max(Q(q), 1)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


# ----------------------------------------------------------------------- quadrature

@functools.lru_cache(maxsize=None)
def _gh(n):
    """Probabilists' Gauss-Hermite rule: E[g(z)] ~ W @ g(Z), z ~ N(0, 1)."""
    Z, W = hermegauss(n)
    return Z, W / math.sqrt(2.0 * math.pi)


@functools.lru_cache(maxsize=None)
def _gl(n):
    """Gauss-Legendre nodes and weights on [-1, 1]."""
    return leggauss(n)


def _pdf(x):
    return np.exp(-0.5 * x * x) * _INV_SQRT_2PI


def _split_rule(kinks, n=_GL_NODES):
    """Gauss-Legendre rule for E[g(z)] on [-R, R], split at the given points."""
    R = _GL_RANGE
    cuts = sorted(k for k in kinks if k is not None and -R < k < R)
    edges = [-R] + cuts + [R]
    x, w = _gl(n)
    Z = np.concatenate([0.5 * (lo + hi) + 0.5 * (hi - lo) * x for lo, hi in zip(edges, edges[1:])])
    W = np.concatenate([0.5 * (hi - lo) * w for lo, hi in zip(edges, edges[1:])])
    return Z, W * _pdf(Z)


class PhiHat:
    """phi_hat(x) = s (phi(a x + b) + o) as float64 numbers, with its Gaussian means.

    PhiHat(name, params) for a base activation and a dict of transform parameters, or
    PhiHat("callable", fn=f, kink=k) for a user callable x -> phi_hat(x). `kink` is
    x* = -b/a for a kinked phi (None when smooth): the split point of the quadrature.
    """

    def __init__(self, name, params=None, fn=None, kink=None):
        p = dict(params or {})
        self.name = name
        if fn is not None:                       # a user callable: x -> phi_hat(x)
            self.base, self.fn_user, self.kw = None, fn, {}
            self.a, self.b, self.o, self.s = 1.0, 0.0, 0.0, 1.0
            self.kink = kink
            return
        self.base, self.fn_user = ACTIVATIONS[name], None
        self.kw = {"negative_slope": p["negative_slope"]} if name == "leaky_relu" and \
            "negative_slope" in p else {}
        self.a = float(p.get("input_scale", 1.0))
        self.b = float(p.get("input_shift", 0.0))
        self.o = float(p.get("output_shift", 0.0))
        self.s = float(p.get("output_scale", 1.0))
        self.kink = (-self.b / self.a if self.a != 0.0 else None) if self.base.kinked else None

    def __call__(self, x):                       # float64 numpy
        if self.fn_user is not None:
            return self.fn_user(x)
        return self.s * (self.base.fn(self.a * x + self.b, xp=np, **self.kw) + self.o)

    @property
    def is_leaky(self):                          # exact closed forms apply
        return self.name in ("relu", "leaky_relu") and self.base is not None and \
            self.b == 0.0 and self.a > 0.0

    @property
    def alpha(self):
        if self.name != "leaky_relu":
            return 0.0
        return float(self.kw.get("negative_slope", LEAKY_RELU_SLOPE))

    def rule(self, q=1.0, n=None):
        """1-D rule for E[g(sqrt(q) z)]: Gauss-Hermite, or split at the kink."""
        if self.kink is None:
            return _gh(n or _GH_NODES)
        return _split_rule([self.kink / math.sqrt(q)] if q > 0 else [], n or _GL_NODES)

    def mean(self, g, q=1.0, n=None):
        """E[g(sqrt(q) z)], z ~ N(0, 1)."""
        Z, W = self.rule(q, n)
        return float(W @ g(math.sqrt(q) * Z))

    def bivariate(self, q1, q2, rho, n=None):
        """E[phi_hat(x1) phi_hat(x2)], (x1, x2) ~ N(0, [[q1, r], [r, q2]]), rho = r/sqrt(q1 q2).

        x1 = sqrt(q1) u, x2 = sqrt(q2) (rho u + sqrt(1 - rho^2) v): n x n Gauss-Hermite, or
        for a kink the outer u split at x*/sqrt(q1) and, per u, the inner v split at
        w* = (x*/sqrt(q2) - rho u) / sqrt(1 - rho^2) (§8).
        """
        R = _GL_RANGE
        r1, r2 = math.sqrt(q1), math.sqrt(q2)
        rho = min(1.0, max(-1.0, float(rho)))
        sc = math.sqrt(max(0.0, 1.0 - rho * rho))
        if sc == 0.0:                            # v = rho u: a 1-D mean
            kinks = [] if self.kink is None else [self.kink / r1 if r1 else None,
                                                 rho * self.kink / r2 if r2 else None]
            Z, W = _gh(n or _GH_NODES) if self.kink is None else _split_rule(kinks, n or _GL_NODES)
            return float(W @ (self(r1 * Z) * self(r2 * rho * Z)))
        if self.kink is None:
            Z, W = _gh(n or _GH_NODES)
            U, Wu = Z[:, None], W
            V, Wv = Z[None, :], W[None, :]
        else:
            nn = n or _GL_NODES
            U, Wu = _split_rule([self.kink / r1] if r1 else [], nn)
            U = U[:, None]
            x, w = _gl(nn)
            ws = np.clip((self.kink / r2 - rho * U) / sc, -R, R) if r2 else np.full_like(U, R)
            h1, m1 = 0.5 * (ws + R), 0.5 * (ws - R)              # piece [-R, w*]
            h2, m2 = 0.5 * (R - ws), 0.5 * (R + ws)              # piece [w*, R]
            V = np.concatenate([m1 + h1 * x, m2 + h2 * x], axis=1)
            Wv = np.concatenate([h1 * w, h2 * w], axis=1) * _pdf(V)
        inner = np.sum(Wv * self(r2 * (rho * U + sc * V)), axis=1)
        return float(Wu @ (self(r1 * U[:, 0]) * inner))


# -------------------------------------------------------------- leaky-ReLU closed forms

def lrelu_beta(negative_slope):
    """beta(alpha) = (1 - alpha)^2 / (pi (1 + alpha^2)): C(0) of the TAT leaky ReLU (§5)."""
    a = np.asarray(negative_slope, dtype=np.float64)
    return (1.0 - a) ** 2 / (np.pi * (1.0 + a * a))


def alpha_of_beta(beta):
    """Inverse of lrelu_beta on alpha in [0, 1]: k = 1 - pi beta, alpha = k / (1 + sqrt(1 - k^2))."""
    k = 1.0 - np.pi * np.asarray(beta, dtype=np.float64)
    return k / (1.0 + np.sqrt(np.clip(1.0 - k * k, 0.0, None)))


def lrelu_cmap_beta(c, beta):
    """The TAT leaky-ReLU C-map written with beta = C(0): c + beta (sqrt(1 - c^2) - c arccos c)."""
    c = np.clip(c, -1.0, 1.0)
    return c + beta * (np.sqrt(1.0 - c * c) - c * np.arccos(c))


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
    if hasattr(phi, "activation") and hasattr(phi, "params"):    # an ActivationTransform
        return PhiHat(phi.activation, phi.params)
    if isinstance(phi, str):
        return PhiHat(base_name(phi))
    if callable(phi):
        return PhiHat("callable", fn=phi, kink=kink)
    raise ValueError(f"phi must be an ActivationTransform, activation name or callable, got {phi!r}")


def q_map(phi, q, kink=None):
    """Q(q) = E[phi(sqrt(q) z)^2], z ~ N(0, 1); q a scalar or any array of q >= 0.

    phi: an ActivationTransform, a base activation name, or a float64 callable (smooth,
    or with a kink at x = `kink`). Closed form for leaky ReLU, else quadrature (§8).
    """
    h = _as_hat(phi, kink)
    q = np.asarray(q, dtype=np.float64)
    if np.any(q < 0):
        raise ValueError(f"q must be >= 0, got {q.min()}")
    if h.is_leaky:
        return _lrelu_bivariate(h, q, q, q)[()]
    out = [h.mean(lambda x: h(x) ** 2, qi) for qi in q.ravel()]
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
    if h.is_leaky:
        return (_lrelu_bivariate(h, q, q, q * c) / _lrelu_bivariate(h, q, q, q))[()]
    Q = h.bivariate(q, q, 1.0, n)
    out = [h.bivariate(q, q, ci, n) / Q for ci in c.ravel()]
    return np.array(out).reshape(c.shape)[()]


# ------------------------------------------------------------ local maps (vectorised)

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
        self.mode = "closed form" if self._h.is_leaky else (
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
                out[idx] = out[idx[:-2] + (j, i)] = self._h.bivariate(qi, qj, rho[idx])
        return out


def local_cmap(phi):
    """LocalMaps (C, Q and the full kernel map) of an ActivationTransform or activation name."""
    return LocalMaps(phi)
