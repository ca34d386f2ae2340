"""Gaussian means of a phi_hat that the DKS/TAT solvers use: the quadrature rules, and the
leaky-ReLU closed forms of TAT (docs/activations.md §2, §5, §8), for a shaped activation

    phi_hat(x) = s * ( phi(a x + b) + o )     (a, b, o, s: input_scale, input_shift,
                                                output_shift, output_scale)

Notation

    z            standard normal; (u, v) standard normals with correlation c
    q            input q-value (second moment) of a pre-activation
    C(c)         C-map E[phi_hat(u) phi_hat(v)] / Q(q), for inputs of q-value q (default 1)
    alpha        negative_slope of a leaky ReLU
    beta         C(0) of one TAT leaky-ReLU layer, (1 - alpha)^2 / (pi (1 + alpha^2))

Quadrature (§8): probabilists' Gauss-Hermite for smooth phi_hat; for phi_hat with a kink
(relu, leaky_relu; elu has a jump in phi'') Gauss-Legendre on [-12, 12] split at the kink
x* = -b/a. All float64 NumPy.

Not here: phi_hat itself (activations.PhiHat, which the engine runs too), the DKS/TAT solvers
(act_transform.py), and the Q-map, C-map and bivariate means of any phi_hat, with the kernel
map of a whole (T, T) kernel, which the predictions, the kernel budget and the tests run
(local_maps.py, read second).
"""
import functools
import math

import numpy as np
from numpy.polynomial.hermite_e import hermegauss
from numpy.polynomial.legendre import leggauss

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
