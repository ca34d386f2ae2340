"""Base activations phi and their first and second derivatives (docs/activations.md §2, §9).

Holds the untransformed phi (linear, relu, leaky_relu, gelu, gelu_exact, tanh, sigmoid,
softplus, elu, swish), their derivatives phi' and phi'', the ACTIVATIONS registry that both
the engine and the float64 maths read (the one definition of each phi), and the named
constants those formulas use. Every function takes (x, xp=None): xp is the
array module (numpy or cupy), None meaning "the module x came from". Only xp functions
and Python-float constants appear, so float32 inputs stay float32 (NumPy 2 promotion) and
the same body runs on the device.

Not here: Gaussian means of phi and the Q/C maps (qc_maps.py), the shaped phi_hat and
its DKS/TAT parameters (act_transform.py).
"""
import importlib
import math
import sys
from dataclasses import dataclass

import numpy as np

__all__ = [
    "LEAKY_RELU_SLOPE", "GELU_SQRT_2_OVER_PI", "GELU_CUBIC", "GELU_CUBIC_D1", "GELU_CUBIC_D2",
    "ACTIVATIONS", "BaseActivation", "base_name", "array_module", "erf",
    "linear", "relu", "leaky_relu", "gelu", "gelu_exact", "tanh", "sigmoid", "softplus",
    "elu", "swish",
]

LEAKY_RELU_SLOPE = 0.01                  # negative slope of the plain (untransformed) leaky ReLU

# tanh-approximate GELU (GPT-2, dks): 0.5 x (1 + tanh(u(x))), u(x) = sqrt(2/pi) (x + c x^3).
GELU_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
GELU_CUBIC = 0.044715                    # c: the cubic coefficient of the published formula
GELU_CUBIC_D1 = 3.0 * GELU_CUBIC         # u'(x) = sqrt(2/pi) (1 + 3c x^2)   (= 0.134145 exactly)
GELU_CUBIC_D2 = 6.0 * GELU_CUBIC         # u''(x) = sqrt(2/pi) 6c x          (= 0.26829 exactly)

_INV_SQRT_2 = 1.0 / math.sqrt(2.0)           # Phi(x) = (1 + erf(x / sqrt 2)) / 2
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)   # normal pdf at 0


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


_erf_object = np.frompyfunc(math.erf, 1, 1)


def erf(x, xp=None):
    """The error function, elementwise, in x's float dtype. NumPy has none: on the host
    math.erf per element (exact to double precision, slow on big arrays); on a GPU CuPy's."""
    xp = array_module(x, xp)
    if xp is not np:
        return importlib.import_module("cupyx.scipy.special").erf(x)   # ships with CuPy
    x = np.asarray(x)
    return _erf_object(x).astype(x.dtype if x.dtype.kind == "f" else np.float64)


def gelu_exact(x, xp=None):
    """phi(x) = x Phi(x), Phi the normal cdf (1 + erf(x / sqrt 2)) / 2."""
    return 0.5 * x * (1.0 + erf(x * _INV_SQRT_2, xp))


def tanh(x, xp=None):
    """phi(x) = tanh(x)."""
    return array_module(x, xp).tanh(x)


def sigmoid(x, xp=None):
    """phi(x) = 1 / (1 + exp(-x)), written (1 + tanh(x/2)) / 2 (§10: one code path)."""
    return 0.5 * (1.0 + array_module(x, xp).tanh(0.5 * x))


def softplus(x, xp=None):
    """phi(x) = log(1 + exp(x)), in the overflow-free form log1p(exp(-|x|)) + max(x, 0)."""
    xp = array_module(x, xp)
    return xp.log1p(xp.exp(-xp.abs(x))) + xp.maximum(x, 0.0)


def elu(x, xp=None):
    """phi(x) = x for x > 0, exp(x) - 1 otherwise (ELU with alpha = 1)."""
    xp = array_module(x, xp)
    return xp.where(x > 0, x, xp.expm1(xp.minimum(x, 0.0)))


def swish(x, xp=None):
    """phi(x) = x sigmoid(x) (SiLU)."""
    return x * sigmoid(x, xp)


# ------------------------------------------------------------ phi' and phi'', §2
#
# Each takes (x, xp) with xp the array module; at a kink the right derivative for x > 0
# and the left one otherwise. phi' is what the engine's backward multiplies by
# (functions.Activation, functions.Shaped); phi'' enters the DKS/TAT conditions.

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


def _d1_gelu_exact(x, xp):
    return 0.5 * (1.0 + erf(x * _INV_SQRT_2, xp)) + x * (xp.exp(-0.5 * (x * x)) * _INV_SQRT_2PI)


def _d2_gelu_exact(x, xp):
    return xp.exp(-0.5 * (x * x)) * _INV_SQRT_2PI * (2.0 - x * x)


def _d1_tanh(x, xp):
    t = xp.tanh(x)
    return 1.0 - t * t


def _d2_tanh(x, xp):
    t = xp.tanh(x)
    return -2.0 * t * (1.0 - t * t)


def _d1_sigmoid(x, xp):
    sg = sigmoid(x, xp)
    return sg * (1.0 - sg)


def _d2_sigmoid(x, xp):
    sg = sigmoid(x, xp)
    return sg * (1.0 - sg) * (1.0 - 2.0 * sg)


def _d1_elu(x, xp):
    return xp.where(x > 0, _one(x), xp.exp(xp.minimum(x, 0.0)))


def _d2_elu(x, xp):
    return xp.where(x > 0, x * 0.0, xp.exp(xp.minimum(x, 0.0)))


def _d1_swish(x, xp):
    sg = sigmoid(x, xp)
    return sg + x * (sg * (1.0 - sg))


def _d2_swish(x, xp):
    sg = sigmoid(x, xp)
    return sg * (1.0 - sg) * (2.0 + x * (1.0 - 2.0 * sg))


# ------------------------------------------------------------------------ registry

@dataclass(frozen=True)
class BaseActivation:
    """One base activation: phi and its first two derivatives, each (x, xp, **kw) on arrays
    of any float dtype and module. The one definition of phi: the engine's ops
    (functions.Activation, functions.Shaped) evaluate fn and d1, the Q/C maps and the DKS/TAT
    solvers fn, d1 and d2; tests/test_activations.py holds the three equal to each other
    and to finite differences, in float64, for every entry."""
    fn: object           # phi(x, xp=None, **kw)
    d1: object           # phi'(x, xp, **kw)
    d2: object           # phi''(x, xp, **kw)
    kinked: bool         # phi or phi' or phi'' jumps at x = 0: split quadrature there


ACTIVATIONS = {
    "linear": BaseActivation(linear, _d1_linear, _d2_zero, False),
    "relu": BaseActivation(relu, _d1_relu, _d2_zero, True),
    "leaky_relu": BaseActivation(leaky_relu, _d1_leaky_relu, _d2_zero, True),
    "gelu": BaseActivation(gelu, _d1_gelu, _d2_gelu, False),
    "gelu_exact": BaseActivation(gelu_exact, _d1_gelu_exact, _d2_gelu_exact, False),
    "sigmoid": BaseActivation(sigmoid, _d1_sigmoid, _d2_sigmoid, False),
    "tanh": BaseActivation(tanh, _d1_tanh, _d2_tanh, False),
    "softplus": BaseActivation(softplus, sigmoid, _d1_sigmoid, False),   # phi' = sigmoid
    "elu": BaseActivation(elu, _d1_elu, _d2_elu, True),   # phi'' jumps from 1 to 0 at 0
    "swish": BaseActivation(swish, _d1_swish, _d2_swish, False),
}


def base_name(name):
    """``name`` when it is an ACTIVATIONS key; ValueError listing the known names."""
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; known: {sorted(ACTIVATIONS)}")
    return name
