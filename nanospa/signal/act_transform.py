"""Shaped activations: Q/C maps, DKS and TAT solvers, leaky-ReLU closed forms.

Implements docs/activations.md (the whole of it) and the per-entry MLP kernel map of
docs/method.md §10. A shaped activation is

    phi_hat(x) = output_scale * ( phi(input_scale * x + input_shift) + output_shift )

with the parameters solved, once, in float64 NumPy so that a chain (or a normalised
residual stack) of `depth` MLP blocks has a well-behaved kernel map at initialisation:
DKS (Martens et al. 2021) bounds C'_f(1) by zeta, TAT (Zhang et al. 2022) bounds
C''_f(1) by tau (smooth phi) or C_f(0) by eta (leaky ReLU). Parameter names, defaults
and solver start order follow DeepMind's `dks` library (docs/activations.md §3-§5).

Notation (docs/activations.md §1-§2)

    z            standard normal; (u, v) standard normals with correlation c
    phi          base activation (relu, leaky_relu, gelu, tanh, ...)
    phi_hat      transformed activation, the formula above
    a, b, o, s   input_scale, input_shift, output_shift, output_scale
    alpha        negative_slope of a leaky ReLU
    q            input q-value (second moment) of a pre-activation
    Q(q)         Q-map E[phi_hat(sqrt(q) z)^2]
    C(c)         C-map E[phi_hat(u) phi_hat(v)] / Q(1), for q = 1 inputs
    beta         C(0) of one TAT leaky-ReLU layer, (1 - alpha)^2 / (pi (1 + alpha^2))
    zeta         DKS target: max over subnetworks f of C_f'(1)          (default 1.5)
    eta          TAT leaky-ReLU target: max over subnetworks of C_f(0)  (default 0.9)
    tau          TAT smooth target: max over subnetworks of C_f''(1)    (default 0.3)
    L            depth: number of phi_hat on the longest path (one per MLP block)
    alpha_r, beta_r   weights of a normalised residual x -> alpha_r x + beta_r f(x),
                 alpha_r^2 + beta_r^2 = 1 (`residual_beta` = beta_r)

Quadrature (docs/activations.md §8): Gauss-Hermite for smooth phi_hat; for phi_hat with
a kink (relu, leaky_relu; elu has a jump in phi'') Gauss-Legendre on [-12, 12] split at
the kink, and for leaky ReLU the exact closed forms. Everything here is float64 NumPy
run once at model construction. The only array code meant for the device is the
activation callables, written with array-module functions (`xp.tanh`, `xp.where`, ...)
and Python-float constants so that float32 inputs stay float32 (NumPy 2 promotion).

Not here: the model's use of phi_hat (nanospa/model.py), attention kernels (kernels.py).
"""
import functools
import itertools
import math
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np
from numpy.polynomial.hermite_e import hermegauss
from numpy.polynomial.legendre import leggauss

__all__ = [
    "ACTIVATIONS", "PARAM_KEYS", "ActivationTransform", "LocalMaps",
    "activation_transform", "shaped_activation", "shaped_activation_names",
    "q_map", "c_map", "local_cmap", "lrelu_cmap", "lrelu_beta", "alpha_of_beta",
    "chain_c0", "per_layer_targets",
    "relu", "leaky_relu", "gelu", "gelu_exact", "sigmoid", "tanh", "softplus", "elu",
    "swish", "identity",
]

PARAM_KEYS = ("input_scale", "input_shift", "output_shift", "output_scale", "negative_slope")
DEFAULT_TARGETS = {"zeta": 1.5, "eta": 0.9, "tau": 0.3}

_K = math.sqrt(2.0 / math.pi)            # tanh-GELU constant
_R = 12.0                                # Gauss-Legendre range [-R, R]; N(0,1) mass outside ~4e-33
_N_GH = 160                              # Gauss-Hermite nodes for smooth means (§8)
_N_GL = 100                              # Gauss-Legendre nodes per piece for kinked means


# ------------------------------------------------------------------ base activations
#
# Each takes (x, xp=None): xp is the array module (numpy or cupy); None means "the module
# x came from". Only xp functions and Python floats are used, so dtypes are kept.

def _array_module(x):
    """numpy, or the module of a CuPy array (looked up, never imported, here)."""
    if type(x).__module__.partition(".")[0] == "cupy":
        return sys.modules["cupy"]
    return np


def _mod(x, xp):
    return _array_module(x) if xp is None else xp


def identity(x, xp=None):
    """phi(x) = x (also called "linear")."""
    return x


def relu(x, xp=None):
    """phi(x) = max(x, 0)."""
    return _mod(x, xp).maximum(x, 0.0)


def leaky_relu(x, negative_slope=0.01, xp=None):
    """phi(x) = x for x > 0, negative_slope * x otherwise."""
    return _mod(x, xp).where(x > 0, x, x * float(negative_slope))


def gelu(x, xp=None):
    """tanh-approximate GELU 0.5 x (1 + tanh(sqrt(2/pi)(x + 0.044715 x^3))) (dks, GPT-2)."""
    xp = _mod(x, xp)
    return 0.5 * x * (1.0 + xp.tanh(_K * (x + 0.044715 * (x * x * x))))


_erf_object = np.frompyfunc(math.erf, 1, 1)


def _erf_numpy(x):
    x = np.asarray(x)
    return _erf_object(x).astype(x.dtype if x.dtype.kind == "f" else np.float64)


def gelu_exact(x, xp=None):
    """phi(x) = x Phi(x), Phi the normal cdf. NumPy only: for comparison with dks."""
    if _mod(x, xp) is not np:
        raise ValueError("gelu_exact is NumPy-only (it needs erf); use 'gelu' on the device")
    return 0.5 * x * (1.0 + _erf_numpy(np.asarray(x) * (1.0 / math.sqrt(2.0))))


def tanh(x, xp=None):
    """phi(x) = tanh(x)."""
    return _mod(x, xp).tanh(x)


def sigmoid(x, xp=None):
    """phi(x) = 1 / (1 + exp(-x)), written (1 + tanh(x/2)) / 2 (§10: one code path)."""
    return 0.5 * (1.0 + _mod(x, xp).tanh(0.5 * x))


def softplus(x, xp=None):
    """phi(x) = log(1 + exp(x)), in the overflow-free form log1p(exp(-|x|)) + max(x, 0)."""
    xp = _mod(x, xp)
    return xp.log1p(xp.exp(-xp.abs(x))) + xp.maximum(x, 0.0)


def elu(x, xp=None):
    """phi(x) = x for x > 0, exp(x) - 1 otherwise (ELU with alpha = 1)."""
    xp = _mod(x, xp)
    return xp.where(x > 0, x, xp.expm1(xp.minimum(x, 0.0)))


def swish(x, xp=None):
    """phi(x) = x sigmoid(x) (SiLU)."""
    return x * sigmoid(x, xp)


# (phi', phi'') of each base activation, docs/activations.md §2; at a kink the right
# derivative for x > 0 and the left one otherwise.

def _d_identity(x, xp):
    return x * 0.0 + 1.0, x * 0.0


def _d_relu(x, xp):
    return xp.where(x > 0, x * 0.0 + 1.0, x * 0.0), x * 0.0


def _d_leaky_relu(x, xp, negative_slope=0.01):
    return xp.where(x > 0, x * 0.0 + 1.0, x * 0.0 + float(negative_slope)), x * 0.0


def _d_gelu(x, xp):
    t = xp.tanh(_K * (x + 0.044715 * (x * x * x)))
    du, d2u = _K * (1.0 + 0.134145 * (x * x)), (0.26829 * _K) * x
    sech2 = 1.0 - t * t
    return (0.5 * (1.0 + t) + 0.5 * x * sech2 * du,
            sech2 * du + 0.5 * x * sech2 * (d2u - 2.0 * t * du * du))


def _d_gelu_exact(x, xp):
    pdf = xp.exp(-0.5 * (x * x)) * (1.0 / math.sqrt(2.0 * math.pi))
    cdf = 0.5 * (1.0 + _erf_numpy(x * (1.0 / math.sqrt(2.0))))
    return cdf + x * pdf, pdf * (2.0 - x * x)


def _d_tanh(x, xp):
    t = xp.tanh(x)
    return 1.0 - t * t, -2.0 * t * (1.0 - t * t)


def _d_sigmoid(x, xp):
    sg = sigmoid(x, xp)
    return sg * (1.0 - sg), sg * (1.0 - sg) * (1.0 - 2.0 * sg)


def _d_softplus(x, xp):
    sg = sigmoid(x, xp)
    return sg, sg * (1.0 - sg)


def _d_elu(x, xp):
    e = xp.exp(xp.minimum(x, 0.0))
    return xp.where(x > 0, x * 0.0 + 1.0, e), xp.where(x > 0, x * 0.0, e)


def _d_swish(x, xp):
    sg = sigmoid(x, xp)
    ds = sg * (1.0 - sg)
    return sg + x * ds, ds * (2.0 + x * (1.0 - 2.0 * sg))


@dataclass(frozen=True)
class _Base:
    fn: object           # phi(x, xp=None, **kw)
    d12: object          # (phi', phi'')(x, xp, **kw)
    kinked: bool         # phi or phi' or phi'' jumps at x = 0: split quadrature there


ACTIVATIONS = {
    "identity": _Base(identity, _d_identity, False),
    "relu": _Base(relu, _d_relu, True),
    "leaky_relu": _Base(leaky_relu, _d_leaky_relu, True),
    "gelu": _Base(gelu, _d_gelu, False),
    "gelu_exact": _Base(gelu_exact, _d_gelu_exact, False),
    "sigmoid": _Base(sigmoid, _d_sigmoid, False),
    "tanh": _Base(tanh, _d_tanh, False),
    "softplus": _Base(softplus, _d_softplus, False),
    "elu": _Base(elu, _d_elu, True),
    "swish": _Base(swish, _d_swish, False),
}
_ALIASES = {"linear": "identity", "silu": "swish", "lrelu": "leaky_relu"}


def _base_name(name):
    key = _ALIASES.get(name, name)
    if key not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; known: {sorted(ACTIVATIONS)}")
    return key


# ----------------------------------------------------------------------- quadrature

@functools.lru_cache(maxsize=None)
def _gh(n):
    """Probabilists' Gauss-Hermite rule: E[g(z)] ~ W @ g(Z), z ~ N(0, 1)."""
    Z, W = hermegauss(n)
    return Z, W / math.sqrt(2.0 * math.pi)


@functools.lru_cache(maxsize=None)
def _gl(n):
    return leggauss(n)


def _pdf(x):
    return np.exp(-0.5 * x * x) * (1.0 / math.sqrt(2.0 * math.pi))


def _split_rule(kinks, n=_N_GL):
    """Gauss-Legendre rule for E[g(z)] on [-R, R], split at the given points."""
    cuts = sorted(k for k in kinks if k is not None and -_R < k < _R)
    edges = [-_R] + cuts + [_R]
    x, w = _gl(n)
    Z = np.concatenate([0.5 * (lo + hi) + 0.5 * (hi - lo) * x for lo, hi in zip(edges, edges[1:])])
    W = np.concatenate([0.5 * (hi - lo) * w for lo, hi in zip(edges, edges[1:])])
    return Z, W * _pdf(Z)


class _Hat:
    """phi_hat(x) = s (phi(a x + b) + o) as numbers; kink at x* = -b/a when phi has one."""

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
        return float(self.kw.get("negative_slope", 0.01)) if self.name == "leaky_relu" else 0.0

    def rule(self, q=1.0, n=None):
        """1-D rule for E[g(sqrt(q) z)]: Gauss-Hermite, or split at the kink."""
        if self.kink is None:
            return _gh(n or _N_GH)
        return _split_rule([self.kink / math.sqrt(q)] if q > 0 else [], n or _N_GL)

    def mean(self, g, q=1.0, n=None):
        """E[g(sqrt(q) z)], z ~ N(0, 1)."""
        Z, W = self.rule(q, n)
        return float(W @ g(math.sqrt(q) * Z))

    def bivariate(self, q1, q2, rho, n=None):
        """E[phi_hat(x1) phi_hat(x2)], (x1, x2) ~ N(0, [[q1, r], [r, q2]]), rho = r/sqrt(q1 q2)."""
        r1, r2 = math.sqrt(q1), math.sqrt(q2)
        rho = min(1.0, max(-1.0, float(rho)))
        sc = math.sqrt(max(0.0, 1.0 - rho * rho))
        if sc == 0.0:                            # v = rho u: a 1-D mean
            kinks = [] if self.kink is None else [self.kink / r1 if r1 else None,
                                                 rho * self.kink / r2 if r2 else None]
            Z, W = _gh(n or _N_GH) if self.kink is None else _split_rule(kinks, n or _N_GL)
            return float(W @ (self(r1 * Z) * self(r2 * rho * Z)))
        if self.kink is None:
            Z, W = _gh(n or _N_GH)
            U, Wu = Z[:, None], W
            V, Wv = Z[None, :], W[None, :]
        else:
            nn = n or _N_GL
            U, Wu = _split_rule([self.kink / r1] if r1 else [], nn)
            U = U[:, None]
            x, w = _gl(nn)
            ws = np.clip((self.kink / r2 - rho * U) / sc, -_R, _R) if r2 else np.full_like(U, _R)
            h1, m1 = 0.5 * (ws + _R), 0.5 * (ws - _R)            # piece [-R, w*]
            h2, m2 = 0.5 * (_R - ws), 0.5 * (_R + ws)            # piece [w*, R]
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


def _lrelu_cmap_beta(c, beta):
    c = np.clip(c, -1.0, 1.0)
    return c + beta * (np.sqrt(1.0 - c * c) - c * np.arccos(c))


def lrelu_cmap(c, negative_slope):
    """Exact C-map of sqrt(2/(1+alpha^2)) LReLU_alpha (TAT leaky ReLU, §5), any shape of c.

    C_alpha(c) = c + beta(alpha) (sqrt(1 - c^2) - c arccos c); C(1) = 1, C(0) = beta.
    Equals E[LReLU(u) LReLU(v)] / E[LReLU(z)^2] for any alpha (also alpha = 0: ReLU).
    """
    return _lrelu_cmap_beta(np.asarray(c, dtype=np.float64), lrelu_beta(negative_slope))


def _lrelu_bivariate(h, q1, q2, r):
    """E[phi_hat(x1) phi_hat(x2)] in closed form for phi_hat = s (LReLU(a x) + o), a > 0."""
    q1, q2, r = (np.asarray(v, dtype=np.float64) for v in (q1, q2, r))
    al, a = h.alpha, h.a
    g1, g2 = a * np.sqrt(q1), a * np.sqrt(q2)                   # input std devs
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = np.where(g1 * g2 > 0, a * a * r / (g1 * g2), 0.0)
    m = (1.0 - al) / math.sqrt(2.0 * math.pi)                    # E[LReLU(z)]
    uu = 0.5 * (1.0 + al * al) * g1 * g2 * _lrelu_cmap_beta(rho, float(lrelu_beta(al)))
    return h.s * h.s * (uu + h.o * m * (g1 + g2) + h.o * h.o)


# ------------------------------------------------------------------- Q-map and C-map

def _as_hat(phi, kink=None):
    if isinstance(phi, ActivationTransform):
        return phi._hat
    if isinstance(phi, str):
        return _Hat(_base_name(phi))
    if callable(phi):
        return _Hat("callable", fn=phi, kink=kink)
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

    Smooth phi_hat: Hermite series Sigma'_ij = sum_n h_n(q_i) h_n(q_j) rho_ij^n with
    h_n(q) = E[phi_hat(sqrt(q) z) He_n(z)] / sqrt(n!), its truncation error (Parseval
    tail) checked below 1e-13 Q(q); entries whose q is too large for the series (steep
    phi_hat, q >~ 100) fall back to 2-D quadrature. Leaky ReLU: closed form. Other kinked
    (elu): split quadrature per entry (about 1 ms an entry: slow for large T).
    """

    _TAIL = 1e-13

    def __init__(self, phi):
        self.phi = phi
        self._h = _as_hat(phi)
        self.mode = "closed form" if self._h.is_leaky else (
            "quadrature" if self._h.kink is not None else "hermite")
        self._c_coef = None

    def _coeffs(self, q):
        """h_n(q) for each q (shape (M,)) -> (A (M, N+1), ok (M,)): N grows until the
        Parseval tail Q(q) - sum_n h_n(q)^2 is below 1e-13 Q(q); ok marks converged rows."""
        for n_nodes in (160, 320):               # hermegauss overflows beyond ~350 nodes
            Z, W = _gh(n_nodes)
            N = n_nodes // 2                      # keep N well below n_nodes: honest tail
            F = self._h(np.sqrt(q)[:, None] * Z[None, :])                  # (M, n_nodes)
            A = (F * W) @ _norm_hermite(Z, N).T                            # (M, N+1)
            Q = (F * F) @ W
            ok = Q - np.sum(A * A, axis=1) <= self._TAIL * np.maximum(Q, 1.0)
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


# ----------------------------------------------------------------- transform object

@dataclass(frozen=True, eq=False)
class ActivationTransform(Mapping):
    """A solved phi_hat: a read-only mapping of its parameters, and the callable itself.

    Keys (dks names; a missing key means its step is skipped):
        input_scale, input_shift, output_shift, output_scale, negative_slope.
        DKS smooth: all but negative_slope.  TAT smooth: all but negative_slope.
        DKS leaky_relu: negative_slope, output_shift, output_scale.
        TAT leaky_relu: negative_slope, output_scale.   method "none": no keys.
    t(x, xp=None) applies phi_hat to a NumPy or CuPy array, keeping its dtype;
    t.derivative(x, xp=None) is phi_hat'(x); t.params is the dict of Python floats.
    """
    activation: str
    method: str
    depth: object
    params: Mapping
    targets: Mapping = field(default_factory=dict)
    local_targets: Mapping = field(default_factory=dict)
    residual_beta: object = None
    solve_seconds: float = 0.0

    def __getitem__(self, key):
        return self.params[key]

    def __iter__(self):
        return iter(self.params)

    def __len__(self):
        return len(self.params)

    @property
    def _hat(self):
        return _Hat(self.activation, self.params)

    def __call__(self, x, xp=None):
        xp = _mod(x, xp)
        p = self.params
        if "input_scale" in p:
            x = x * p["input_scale"]
        if "input_shift" in p:
            x = x + p["input_shift"]
        kw = {"negative_slope": p["negative_slope"]} if "negative_slope" in p else {}
        y = ACTIVATIONS[self.activation].fn(x, xp=xp, **kw)
        if "output_shift" in p:
            y = y + p["output_shift"]
        if "output_scale" in p:
            y = y * p["output_scale"]
        return y

    @property
    def fn(self):
        """phi_hat as a plain function (x, xp=None) -> array."""
        return self.__call__

    def derivative(self, x, xp=None):
        """phi_hat'(x) = s a phi'(a x + b), same dtype as x (for a fused backward)."""
        xp = _mod(x, xp)
        p = self.params
        a = p.get("input_scale", 1.0)
        kw = {"negative_slope": p["negative_slope"]} if "negative_slope" in p else {}
        d1, _ = ACTIVATIONS[self.activation].d12(x * a + p.get("input_shift", 0.0), xp, **kw)
        return d1 * (a * p.get("output_scale", 1.0))

    def __repr__(self):
        ps = ", ".join(f"{k}={v:.10g}" for k, v in self.params.items())
        return f"ActivationTransform({self.activation!r}, {self.method!r}, depth={self.depth}, {ps})"


def _make(activation, method, depth, params, targets=None, local=None, rb=None, seconds=0.0):
    params = {k: float(params[k]) for k in PARAM_KEYS if k in params}
    return ActivationTransform(activation, method, depth, MappingProxyType(params),
                               MappingProxyType(dict(targets or {})),
                               MappingProxyType(dict(local or {})), rb, seconds)


# ------------------------------------------------------------ per-layer targets (§6)

def _check_rb(residual_beta):
    if residual_beta is None:
        return None
    rb = float(residual_beta)
    if not 0.0 < rb <= 1.0:
        raise ValueError(f"residual_beta must lie in (0, 1], got {residual_beta!r}")
    return None if rb == 1.0 else rb


def _subnet_max(x0, r, L, rb):
    """dks's subnetwork maximum: chain of L local maps r, or the normalised residual stack
    x -> alpha_r^2 x + beta_r^2 r(x) (L blocks) together with one branch alone."""
    x = x0
    if rb is None:
        for _ in range(L):
            x = r(x)
        return x
    b2 = rb * rb
    for _ in range(L):
        x = (1.0 - b2) * x + b2 * r(x)
    return max(x, r(x0))


def chain_c0(beta, L, residual_beta=None):
    """C_f(0) maximised over subnetworks, for TAT leaky-ReLU layers of C(0) = beta (§5-§6).

    beta = lrelu_beta(negative_slope). Chain: C_beta^{oL}(0). Normalised residual: the max
    of one layer and L iterations of x -> alpha_r^2 x + beta_r^2 C_beta(x). Increasing in
    beta; beta = 1/pi (plain ReLU) gives the largest reachable eta.
    """
    return float(_subnet_max(0.0, lambda x: float(_lrelu_cmap_beta(x, beta)),
                             _check_depth(L), _check_rb(residual_beta)))


def per_layer_targets(method, depth, zeta=1.5, tau=0.3, residual_beta=None):
    """Per-layer C'(1) (DKS) or C''(1) (TAT smooth) meeting the network target (§6).

    Chain: zeta^(1/L) and tau/L. Normalised residual: min(zeta, (zeta^(1/L) - alpha_r^2)/beta_r^2)
    and tau / max(1, L beta_r^2).
    """
    L, rb = _check_depth(depth), _check_rb(residual_beta)
    b2 = 1.0 if rb is None else rb * rb
    if method == "dks":
        return min(zeta, (zeta ** (1.0 / L) - (1.0 - b2)) / b2) if rb else zeta ** (1.0 / L)
    if method == "tat":
        return tau / max(1.0, L * b2)
    raise ValueError(f"method must be 'dks' or 'tat', got {method!r}")


def _check_depth(depth):
    if isinstance(depth, bool) or not isinstance(depth, (int, np.integer)) or depth < 1:
        raise ValueError(f"depth must be an integer >= 1, got {depth!r}")
    return int(depth)


# ------------------------------------------------------------------- root finding (§12)

def _local(name, a, b, o, kw=None):
    """Per-layer quantities of phi_hat = s (phi(a x + b) + o), s set so that Q(1) = 1."""
    h = _Hat(name, dict(input_scale=a, input_shift=b, **(kw or {})))
    Z, W = h.rule()
    x = a * Z + b
    d1, d2 = h.base.d12(x, np, **h.kw)
    y, y1, y2 = h.base.fn(x, xp=np, **h.kw) + o, a * d1, a * a * d2     # phi_hat/s and derivatives
    s2 = 1.0 / (W @ (y * y))
    return dict(output_scale=math.sqrt(s2), C0=s2 * (W @ y) ** 2, Qslope=s2 * (W @ (y * y1 * Z)),
                Cslope=s2 * (W @ (y1 * y1)), Ccurv=s2 * (W @ (y2 * y2)), mean=float(W @ y))


def _newton(res, x, h=1e-6, tol=1e-12, max_iter=100):
    """Damped Newton with a central-difference Jacobian; RuntimeError if it stalls."""
    x = np.asarray(x, dtype=np.float64)
    r = res(x)
    for _ in range(max_iter):
        if not np.all(np.isfinite(r)):
            break
        if np.max(np.abs(r)) < tol:
            return x
        J = np.stack([(res(x + h * e) - res(x - h * e)) / (2 * h) for e in np.eye(x.size)], 1)
        step, t = np.linalg.lstsq(J, r, rcond=None)[0], 1.0
        while True:                              # backtrack until |r| drops
            x_new = x - t * step
            r_new = res(x_new)
            if t < 1e-4 or (np.all(np.isfinite(r_new)) and np.linalg.norm(r_new) < np.linalg.norm(r)):
                break
            t *= 0.5
        x, r = x_new, r_new
    raise RuntimeError("no convergence from this start")


_TRY = {"input_scale": (1.0, 0.1), "input_shift": (0.0, 1.0, -1.0), "output_shift": (0.0, 1.0, -1.0)}
_LOW = {"input_scale": 0.0, "input_shift": -3.0, "output_shift": -3.0}
_HIGH = {"input_scale": 2.0, "input_shift": 3.0, "output_shift": 3.0}


def _starts(names, num_tries=50, seed=123):
    """dks's start order: the product of fixed values, then seeded uniform draws."""
    fixed = list(itertools.product(*(_TRY[n] for n in names)))
    rng = np.random.default_rng(seed)
    rand = [tuple(rng.uniform(_LOW[n], _HIGH[n]) for n in names)
            for _ in range(num_tries - len(fixed))]
    return fixed + rand


def _first_root(res, names, ok=lambda p: True):
    for x0 in _starts(names):
        try:
            p = _newton(res, x0)
        except (RuntimeError, np.linalg.LinAlgError, FloatingPointError):
            continue
        if ok(p):
            return p
    return None


def _solve_dks_smooth(name, target):
    shift = lambda a, b: -_local(name, a, b, 0.0)["mean"]            # C(0) = 0
    def res(p):
        m = _local(name, p[0], p[1], shift(p[0], p[1]))
        return np.array([m["Qslope"] - 1.0, m["Cslope"] - target])
    with np.errstate(all="ignore"):
        p = _first_root(res, ("input_scale", "input_shift"))
    if p is None:
        return None
    a, b = float(p[0]), float(p[1])
    o = shift(a, b)
    return dict(input_scale=a, input_shift=b, output_shift=o,
                output_scale=_local(name, a, b, o)["output_scale"])


def _solve_tat_smooth(name, target):
    def res(p):
        m = _local(name, *p)
        return np.array([m["Qslope"] - 1.0, m["Cslope"] - 1.0, m["Ccurv"] - target])
    ok = lambda p: p[0] * _local(name, *p)["output_scale"] < 2.0      # dks's guard (§4)
    with np.errstate(all="ignore"):
        p = _first_root(res, ("input_scale", "input_shift", "output_shift"), ok)
    if p is None:
        return None
    a, b, o = (float(v) for v in p)
    return dict(input_scale=a, input_shift=b, output_shift=o,
                output_scale=_local(name, a, b, o)["output_scale"])


def _tanh_to_sigmoid(p):
    """tanh (a, b, o, s) -> sigmoid (2a, 2b, (o - 1)/2, 2s): the same phi_hat (§10)."""
    return dict(input_scale=2.0 * p["input_scale"], input_shift=2.0 * p["input_shift"],
                output_shift=0.5 * (p["output_shift"] - 1.0), output_scale=2.0 * p["output_scale"])


# --------------------------------------------------------------------------- solvers

def activation_transform(activation, method, depth=None, *, zeta=None, eta=None, tau=None,
                         residual_beta=None):
    """Solve the DKS or TAT transform of `activation` for a network of `depth` phi_hat.

    activation: relu, leaky_relu, gelu (tanh approx.), gelu_exact, sigmoid, tanh,
        softplus, elu, swish (identity only with method "none").
    method: "dks", "tat", or None/"none" (untransformed: no parameters, phi_hat = phi).
    depth: L, phi_hat count on the longest path (= n_layer, one per MLP block).
    zeta (dks, default 1.5), eta (tat leaky_relu, 0.9), tau (tat smooth, 0.3): the
        network-level targets; targets that do not apply to the method are ignored.
    residual_beta: None (skipless chain) or beta_r of a normalised residual
        x -> alpha_r x + beta_r f(x); per-layer targets then follow §6.
    Returns an ActivationTransform (mapping of parameters + callable). Raises ValueError
    for unknown names, bad targets, and unreachable targets (with the reachable bound).
    Results are cached; solving takes milliseconds to a few tenths of a second.
    """
    name = _base_name(activation)
    m = "none" if method is None else str(method).lower()
    if m == "none":
        return _make(name, "none", depth, {})
    if m not in ("dks", "tat"):
        raise ValueError(f"method must be 'dks', 'tat' or 'none', got {method!r}")
    if name in ("identity", "relu"):
        raise ValueError(f"{name} has no free parameter under {m.upper()}" + (
            " (it is linear); use method 'none'" if name == "identity" else
            " (it is leaky_relu with negative_slope 0); use 'leaky_relu'"))
    L, rb = _check_depth(depth), _check_rb(residual_beta)
    zeta = DEFAULT_TARGETS["zeta"] if zeta is None else float(zeta)
    eta = DEFAULT_TARGETS["eta"] if eta is None else float(eta)
    tau = DEFAULT_TARGETS["tau"] if tau is None else float(tau)
    if m == "dks":
        if not zeta > 1.0:
            raise ValueError(f"DKS needs zeta > 1, got zeta={zeta}")
        return _solve(name, "dks", L, zeta, rb)
    if name == "leaky_relu":
        target = eta
        if not 0.0 <= eta < 1.0:
            raise ValueError(f"TAT leaky_relu needs 0 <= eta < 1, got eta={eta}")
    else:
        target = tau
        if not tau > 0.0:
            raise ValueError(f"TAT needs tau > 0, got tau={tau}")
    return _solve(name, "tat", L, target, rb)


@functools.lru_cache(maxsize=256)
def _solve(name, method, L, target, rb):
    t0 = time.perf_counter()
    res_txt = "" if rb is None else f", residual_beta={rb}"
    if method == "dks":
        key, local = {"zeta": target}, per_layer_targets("dks", L, zeta=target, residual_beta=rb)
        loc = {"q_slope_1": 1.0, "c_val_0": 0.0, "c_slope_1": local}
        if name == "leaky_relu":                               # closed form, §3
            top = math.pi / (math.pi - 1.0)                    # C'(1) of the centred ReLU
            if not local < top:
                bound = _subnet_max(1.0, lambda x: top * x, L, rb)
                raise ValueError(f"zeta={target} is unreachable for leaky_relu with DKS at depth "
                                 f"{L}{res_txt}: zeta must stay below {bound:.6f} (plain ReLU)")
            al = float(alpha_of_beta(1.0 - 1.0 / local))
            params = dict(negative_slope=al, output_shift=-(1.0 - al) / math.sqrt(2.0 * math.pi),
                          output_scale=1.0 / math.sqrt(0.5 * (1.0 + al * al)
                                                       - (1.0 - al) ** 2 / (2.0 * math.pi)))
        else:
            solve_name = "tanh" if name == "sigmoid" else name
            params = _solve_dks_smooth(solve_name, local)
            if params is None:
                raise ValueError(f"DKS found no root for {name} with zeta={target} at depth {L}"
                                 f"{res_txt} (per-layer C'(1)={local:.6g})")
            if name == "sigmoid":
                params = _tanh_to_sigmoid(params)
    else:
        if name == "leaky_relu":                               # bisection on beta, §5
            key = {"eta": target}
            top = chain_c0(1.0 / math.pi, L, rb)               # plain ReLU: the largest C_f(0)
            if top < target:
                raise ValueError(f"eta={target} is unreachable for leaky_relu with TAT at depth {L}"
                                 f"{res_txt}: the largest reachable C_f(0) is {top:.6f} (plain "
                                 "ReLU); use a smaller eta or more layers")
            lo, hi = 0.0, 1.0 / math.pi
            while hi - lo > 1e-17:
                mid = 0.5 * (lo + hi)
                if mid in (lo, hi):
                    break
                lo, hi = (mid, hi) if chain_c0(mid, L, rb) < target else (lo, mid)
            beta = 0.5 * (lo + hi)
            al = float(alpha_of_beta(beta))
            params = dict(negative_slope=al, output_scale=math.sqrt(2.0 / (1.0 + al * al)))
            loc = {"q_slope_1": 1.0, "c_slope_1": 1.0, "c_val_0": beta}
        else:
            key, local = {"tau": target}, per_layer_targets("tat", L, tau=target, residual_beta=rb)
            loc = {"q_slope_1": 1.0, "c_slope_1": 1.0, "c_curv_1": local}
            solve_name = "tanh" if name == "sigmoid" else name
            params = _solve_tat_smooth(solve_name, local)
            if params is None:
                raise ValueError(f"TAT found no acceptable root for {name} with tau={target} at "
                                 f"depth {L}{res_txt} (per-layer C''(1)={local:.6g})")
            if name == "sigmoid":
                params = _tanh_to_sigmoid(params)
    return _make(name, method, L, params, key, loc, rb, time.perf_counter() - t0)


# ---------------------------------------------------------------- model-facing names

shaped_activation_names = {
    f"{m}_{short}": (base, m)
    for m in ("dks", "tat")
    for short, base in (("lrelu", "leaky_relu"), ("gelu", "gelu"), ("tanh", "tanh"),
                        ("sigmoid", "sigmoid"), ("softplus", "softplus"), ("elu", "elu"),
                        ("swish", "swish"))
}
shaped_activation_names = MappingProxyType(shaped_activation_names)


def shaped_activation(name, depth=None, **targets):
    """The phi_hat for a model activation name: "tat_lrelu", "dks_gelu", ... or a plain
    base name ("gelu", "relu", ...: method "none"). targets as in activation_transform."""
    if name in shaped_activation_names:
        base, method = shaped_activation_names[name]
        return activation_transform(base, method, depth, **targets)
    return activation_transform(name, "none", depth)
