"""Gaussian means of a phi_hat: quadrature, Q-map, C-map, leaky-ReLU closed forms.

Implements docs/activations.md §2, §5 and §8 and the per-entry MLP kernel map of
docs/method.md §10 (bivariate), for a shaped activation

    phi_hat(x) = s * ( phi(a x + b) + o )     (a, b, o, s: input_scale, input_shift,
                                                output_shift, output_scale)

Notation

    z            standard normal; (u, v) standard normals with correlation c
    q            input q-value (second moment) of a pre-activation
    Q(q)         Q-map E[phi_hat(sqrt(q) z)^2]
    C(c)         C-map E[phi_hat(u) phi_hat(v)] / Q(q), for inputs of q-value q (default 1)
    alpha        negative_slope of a leaky ReLU
    beta         C(0) of one TAT leaky-ReLU layer, (1 - alpha)^2 / (pi (1 + alpha^2))

Quadrature (§8): probabilists' Gauss-Hermite for smooth phi_hat; for phi_hat with a kink
(relu, leaky_relu; elu has a jump in phi'') Gauss-Legendre on [-12, 12] split at the kink
x* = -b/a; for leaky ReLU with b = 0, a > 0 the exact closed forms. All float64 NumPy.

Not here: phi_hat itself (activations.PhiHat, which the engine runs too), the DKS/TAT solvers
(act_transform.py), the kernel map of a whole (T, T) kernel by Hermite series, which the
predictions and the kernel budget run (local_maps.py, read second). phi may be a PhiHat, an ActivationTransform (read through .phi_hat), a base
activation's name, or a user's float64 callable (DyT's tanh(alpha x), the tests' references).
"""
import functools
import math
from dataclasses import dataclass

import numpy as np
from numpy.polynomial.hermite_e import hermegauss
from numpy.polynomial.legendre import leggauss

from .activations import PhiHat, base_name

__all__ = ["gauss_rule", "bivariate", "q_map", "c_map",
           "lrelu_beta", "alpha_of_beta", "lrelu_cmap_beta", "lrelu_cmap"]

_GH_NODES = 160          # Gauss-Hermite nodes (per axis) for smooth means: ~1e-14 here (§8)
_GL_NODES = 100          # Gauss-Legendre nodes per piece of the split rule for kinked means
_GL_RANGE = 12.0         # split rule on [-R, R]: N(0, 1) mass outside is ~4e-33
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


def gauss_rule(kink=None, q=1.0, n=None):
    """1-D rule (Z, W) for E[g(sqrt(q) z)] ~ W @ g(sqrt(q) Z) where g is built on a phi_hat
    kinked at x = kink: Gauss-Hermite when kink is None (smooth), else split at kink/sqrt(q)."""
    if kink is None:
        return _gh(n or _GH_NODES)
    return _split_rule([kink / math.sqrt(q)] if q > 0 else [], n or _GL_NODES)


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
