"""Base activations phi, their first and second derivatives, and the shaped phi_hat built on
them (docs/activations.md §1, §2, §9).

Holds the untransformed phi of the paper's models (linear, relu, leaky_relu, gelu, sigmoid),
their derivatives phi' and phi'', the ACTIVATIONS registry, phi_hat with its parameters
(PhiHat), and the named constants those formulas use: the one definition of each, which both
the engine and the float64 maths evaluate. The registry's other entries (gelu_exact, tanh,
softplus, elu, swish) are signal/beyond/activations.py's, imported when one is looked up. Every function takes (x,
xp=None): xp is the array module (numpy or cupy), None meaning "the module x came from". Only
xp functions and Python-float constants appear, so float32 inputs stay float32 (NumPy 2
promotion) and the same body runs on the device.

Not here: Gaussian means of phi_hat (gaussian_means.py) and the Q/C maps (local_maps.py), the DKS/TAT solvers
(act_transform.py).
"""
import importlib
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

LEAKY_RELU_SLOPE = 0.01                  # negative slope of the plain (untransformed) leaky ReLU

# tanh-approximate GELU (GPT-2, dks): 0.5 x (1 + tanh(u(x))), u(x) = sqrt(2/pi) (x + c x^3).
GELU_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
GELU_CUBIC = 0.044715                    # c: the cubic coefficient of the published formula
GELU_CUBIC_D1 = 3.0 * GELU_CUBIC         # u'(x) = sqrt(2/pi) (1 + 3c x^2)   (= 0.134145 exactly)
GELU_CUBIC_D2 = 6.0 * GELU_CUBIC         # u''(x) = sqrt(2/pi) 6c x          (= 0.26829 exactly)


def array_module(x, xp=None):
    """xp when given, else the module x came from: numpy, or cupy (looked up, never imported)."""
    if xp is not None:
        return xp
    if type(x).__module__.partition(".")[0] == "cupy":
        return sys.modules["cupy"]
    return np


# ------------------------------------------------------------------ base activations

def linear(x, xp=None):
    """phi(x) = x."""
    return x


def relu(x, xp=None):
    """phi(x) = max(x, 0)."""
    return array_module(x, xp).maximum(x, 0.0)


def leaky_relu(x, negative_slope=LEAKY_RELU_SLOPE, xp=None):
    """phi(x) = x for x > 0, negative_slope * x otherwise."""
    return array_module(x, xp).where(x > 0, x, x * float(negative_slope))


def gelu(x, xp=None):
    """tanh-approximate GELU 0.5 x (1 + tanh(sqrt(2/pi)(x + 0.044715 x^3))) (dks, GPT-2)."""
    xp = array_module(x, xp)
    return 0.5 * x * (1.0 + xp.tanh(GELU_SQRT_2_OVER_PI * (x + GELU_CUBIC * (x * x * x))))


def sigmoid(x, xp=None):
    """phi(x) = 1 / (1 + exp(-x)), written (1 + tanh(x/2)) / 2 (§10: one code path)."""
    return 0.5 * (1.0 + array_module(x, xp).tanh(0.5 * x))


# ------------------------------------------------------------ phi' and phi'', §2
#
# Each takes (x, xp) with xp the array module; at a kink the right derivative for x > 0
# and the left one otherwise. phi' is what the engine's backward multiplies by
# (functions.Shaped through PhiHat, and more_ops.Activation); phi'' enters the DKS/TAT conditions.

def _one(x):
    return x * 0.0 + 1.0             # a constant 1 of x's shape and dtype


def _d1_linear(x, xp):
    return _one(x)


def _d1_relu(x, xp):
    return (x > 0).astype(x.dtype)


def _d1_leaky_relu(x, xp, negative_slope=LEAKY_RELU_SLOPE):
    return xp.where(x > 0, _one(x), x * 0.0 + float(negative_slope))


def _d2_zero(x, xp, **kw):
    return x * 0.0


def _gelu_parts(x, xp):
    """t = tanh(u(x)) and u'(x) of the tanh-approximate GELU."""
    t = xp.tanh(GELU_SQRT_2_OVER_PI * (x + GELU_CUBIC * (x * x * x)))
    return t, GELU_SQRT_2_OVER_PI * (1.0 + GELU_CUBIC_D1 * (x * x))


def _d1_gelu(x, xp):
    # phi = x (1 + t)/2 with t = tanh(u): phi' = (1 + t)/2 + x sech^2 u' / 2
    t, du = _gelu_parts(x, xp)
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du


def _d2_gelu(x, xp):
    # phi'' = sech^2 u' + x sech^2 (u'' - 2 t u'^2) / 2,  u'' = sqrt(2/pi) 6c x
    t, du = _gelu_parts(x, xp)
    sech2, d2u = 1.0 - t * t, (GELU_CUBIC_D2 * GELU_SQRT_2_OVER_PI) * x
    return sech2 * du + 0.5 * x * sech2 * (d2u - 2.0 * t * du * du)


def _d1_sigmoid(x, xp):
    sg = sigmoid(x, xp)
    return sg * (1.0 - sg)


def _d2_sigmoid(x, xp):
    sg = sigmoid(x, xp)
    return sg * (1.0 - sg) * (1.0 - 2.0 * sg)


# ------------------------------------------------------------------------ registry

@dataclass(frozen=True)
class BaseActivation:
    """One base activation: phi and its first two derivatives, each (x, xp, **kw) on arrays
    of any float dtype and module. The one definition of phi: the engine's ops
    (functions.Shaped through PhiHat, and more_ops.Activation) evaluate fn and d1, the Q/C
    maps and the DKS/TAT solvers (through PhiHat) fn, d1 and d2; tests/test_activations.py
    holds the three equal to each other and to finite differences, in float64, for every
    entry."""
    fn: object           # phi(x, xp=None, **kw)
    d1: object           # phi'(x, xp, **kw)
    d2: object           # phi''(x, xp, **kw)
    kinked: bool         # phi or phi' or phi'' jumps at x = 0: split quadrature there


class Registry(Mapping):
    """name -> BaseActivation: the entries of `own`, and those named in `beyond`, which are
    signal/beyond/activations.py's, imported the first time one of them is looked up (a model
    of the paper's activations never loads it)."""

    def __init__(self, own, beyond):
        self.own, self.beyond = own, tuple(beyond)

    def __getitem__(self, name):
        if name in self.own:
            return self.own[name]
        if name in self.beyond:
            return importlib.import_module("nanospa.signal.beyond.activations").ACTIVATIONS[name]
        raise KeyError(name)

    def __contains__(self, name):
        return name in self.own or name in self.beyond

    def __iter__(self):
        return iter((*self.own, *self.beyond))

    def __len__(self):
        return len(self.own) + len(self.beyond)


ACTIVATIONS = Registry({
    "linear": BaseActivation(linear, _d1_linear, _d2_zero, False),
    "relu": BaseActivation(relu, _d1_relu, _d2_zero, True),
    "leaky_relu": BaseActivation(leaky_relu, _d1_leaky_relu, _d2_zero, True),
    "gelu": BaseActivation(gelu, _d1_gelu, _d2_gelu, False),
    "sigmoid": BaseActivation(sigmoid, _d1_sigmoid, _d2_sigmoid, False),
}, beyond=("gelu_exact", "tanh", "softplus", "elu", "swish"))


def base_name(name):
    """``name`` when it is an ACTIVATIONS key; ValueError listing the known names."""
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; known: {sorted(ACTIVATIONS)}")
    return name


# ------------------------------------------------------------- the shaped phi_hat, §1

PARAM_KEYS = ("input_scale", "input_shift", "output_shift", "output_scale", "negative_slope")


@dataclass(frozen=True)
class PhiHat:
    """phi_hat(x) = s (phi(a x + b) + o), the one definition that the engine (functions.Shaped:
    pre, post, grad) and the float64 maths (gaussian_means' quadrature, act_transform's solvers, whose
    result carries it as .phi_hat) evaluate. base: an ACTIVATIONS name; a, b, s, o (the fields'
    order): dks's input_scale, input_shift, output_scale, output_shift (PhiHat.of reads those names);
    negative_slope: required for leaky_relu, refused elsewhere. Numbers are Python floats
    (float32 stays float32); a step whose parameter is the identity is skipped."""
    base: str
    a: float = 1.0
    b: float = 0.0
    s: float = 1.0
    o: float = 0.0
    negative_slope: object = None

    def __post_init__(self):
        base_name(self.base)
        if (self.negative_slope is None) == (self.base == "leaky_relu"):
            raise ValueError(f"PhiHat: negative_slope={self.negative_slope!r} with base {self.base!r} "
                             "(a slope is needed for 'leaky_relu' and only there)")
        for k in ("a", "b", "s", "o") + (() if self.negative_slope is None else ("negative_slope",)):
            object.__setattr__(self, k, float(getattr(self, k)))

    @classmethod
    def of(cls, base, params):
        """From a mapping of PARAM_KEYS (a missing key: the identity; no slope: LEAKY_RELU_SLOPE)."""
        g = params.get
        slope = g("negative_slope", LEAKY_RELU_SLOPE) if base == "leaky_relu" else None
        return cls(base, g("input_scale", 1.0), g("input_shift", 0.0), g("output_scale", 1.0),
                   g("output_shift", 0.0), slope)

    def _kw(self):
        return {} if self.negative_slope is None else {"negative_slope": self.negative_slope}

    def pre(self, x):
        """u = a x + b, phi's argument."""
        u = x * self.a if self.a != 1.0 else x
        return u + self.b if self.b != 0.0 else u

    def post(self, u, xp=None):
        """phi_hat(x) = s (phi(u) + o) from u = pre(x)."""
        y = ACTIVATIONS[self.base].fn(u, xp=array_module(u, xp), **self._kw())
        if self.o != 0.0:
            y = y + self.o
        return y * self.s if self.s != 1.0 else y

    def grad(self, u, g=None, xp=None):
        """g phi_hat'(x) = g s a phi'(u) from u = pre(x); phi_hat'(x) itself when g is None."""
        d = ACTIVATIONS[self.base].d1(u, array_module(u, xp), **self._kw())
        if g is not None:
            d = g * d
        k = self.s * self.a
        return d * k if k != 1.0 else d

    def __call__(self, x, xp=None):
        """phi_hat(x), in x's dtype and module."""
        return self.post(self.pre(x), xp)

    def d1(self, x, xp=None):
        """phi_hat'(x) = s a phi'(a x + b)."""
        return self.grad(self.pre(x), None, xp)

    def d2(self, x, xp=None):
        """phi_hat''(x) = s a^2 phi''(a x + b)."""
        d = ACTIVATIONS[self.base].d2(self.pre(x), array_module(x, xp), **self._kw())
        return d * (self.s * self.a * self.a)

    @property
    def kink(self):
        """x* = -b/a, where phi_hat or a derivative jumps (a kinked phi); None when smooth."""
        return -self.b / self.a if ACTIVATIONS[self.base].kinked and self.a != 0.0 else None

    @property
    def homogeneous(self):
        """phi positively homogeneous (relu, leaky_relu), b = 0, a > 0: phi_hat(x) is
        x (s a if x > 0 else s a alpha) + s o, the engine's fast path and the maps' closed forms."""
        return self.base in ("relu", "leaky_relu") and self.b == 0.0 and self.a > 0.0

    @property
    def alpha(self):
        return 0.0 if self.negative_slope is None else self.negative_slope

    @property
    def pieces(self):
        """(s a, s a alpha, s o): a homogeneous phi_hat's slopes for x > 0 and x <= 0, its offset."""
        k = self.s * self.a
        return k, k * self.alpha, self.s * self.o
