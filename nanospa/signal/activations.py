"""Base activations phi and their first and second derivatives (docs/activations.md §2, §9).

Holds the untransformed phi (identity, relu, leaky_relu, gelu, gelu_exact, tanh, sigmoid,
softplus, elu, swish), their (phi', phi'') pairs, the ACTIVATIONS registry with ALIASES,
and the named constants those formulas use. Every function takes (x, xp=None): xp is the
array module (numpy or cupy), None meaning "the module x came from". Only xp functions
and Python-float constants appear, so float32 inputs stay float32 (NumPy 2 promotion) and
the same body runs on the device.

Not here: Gaussian means of phi and the Q/C maps (qc_maps.py), the shaped phi_hat and
its DKS/TAT parameters (act_transform.py).
"""
import math
import sys
from dataclasses import dataclass

import numpy as np

__all__ = [
    "LEAKY_RELU_SLOPE", "GELU_SQRT_2_OVER_PI", "GELU_CUBIC", "GELU_CUBIC_D1", "GELU_CUBIC_D2",
    "ACTIVATIONS", "ALIASES", "BaseActivation", "base_name", "array_module",
    "identity", "relu", "leaky_relu", "gelu", "gelu_exact", "tanh", "sigmoid", "softplus",
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

def identity(x, xp=None):
    """phi(x) = x (also called "linear")."""
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


def _erf_numpy(x):
    """math.erf elementwise, keeping a float dtype (NumPy has no erf ufunc)."""
    x = np.asarray(x)
    return _erf_object(x).astype(x.dtype if x.dtype.kind == "f" else np.float64)


def gelu_exact(x, xp=None):
    """phi(x) = x Phi(x), Phi the normal cdf. NumPy only: for comparison with dks."""
    if array_module(x, xp) is not np:
        raise ValueError("gelu_exact is NumPy-only (it needs erf); use 'gelu' on the device")
    return 0.5 * x * (1.0 + _erf_numpy(np.asarray(x) * _INV_SQRT_2))


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


# ------------------------------------------------------------ (phi', phi''), §2
#
# Each takes (x, xp) with xp the array module; at a kink the right derivative for x > 0
# and the left one otherwise. `x * 0.0 + 1.0` builds a constant of x's shape and dtype.

def _d_identity(x, xp):
    return x * 0.0 + 1.0, x * 0.0


def _d_relu(x, xp):
    return xp.where(x > 0, x * 0.0 + 1.0, x * 0.0), x * 0.0


def _d_leaky_relu(x, xp, negative_slope=LEAKY_RELU_SLOPE):
    return xp.where(x > 0, x * 0.0 + 1.0, x * 0.0 + float(negative_slope)), x * 0.0


def _d_gelu(x, xp):
    # phi = x (1 + t)/2 with t = tanh(u): phi' = (1 + t)/2 + x sech^2 u' / 2,
    # phi'' = sech^2 u' + x sech^2 (u'' - 2 t u'^2) / 2
    t = xp.tanh(GELU_SQRT_2_OVER_PI * (x + GELU_CUBIC * (x * x * x)))
    du = GELU_SQRT_2_OVER_PI * (1.0 + GELU_CUBIC_D1 * (x * x))
    d2u = (GELU_CUBIC_D2 * GELU_SQRT_2_OVER_PI) * x
    sech2 = 1.0 - t * t
    return (0.5 * (1.0 + t) + 0.5 * x * sech2 * du,
            sech2 * du + 0.5 * x * sech2 * (d2u - 2.0 * t * du * du))


def _d_gelu_exact(x, xp):
    pdf = xp.exp(-0.5 * (x * x)) * _INV_SQRT_2PI
    cdf = 0.5 * (1.0 + _erf_numpy(x * _INV_SQRT_2))
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


# ------------------------------------------------------------------------ registry

@dataclass(frozen=True)
class BaseActivation:
    fn: object           # phi(x, xp=None, **kw)
    d12: object          # (phi', phi'')(x, xp, **kw)
    kinked: bool         # phi or phi' or phi'' jumps at x = 0: split quadrature there


ACTIVATIONS = {
    "identity": BaseActivation(identity, _d_identity, False),
    "relu": BaseActivation(relu, _d_relu, True),
    "leaky_relu": BaseActivation(leaky_relu, _d_leaky_relu, True),
    "gelu": BaseActivation(gelu, _d_gelu, False),
    "gelu_exact": BaseActivation(gelu_exact, _d_gelu_exact, False),
    "sigmoid": BaseActivation(sigmoid, _d_sigmoid, False),
    "tanh": BaseActivation(tanh, _d_tanh, False),
    "softplus": BaseActivation(softplus, _d_softplus, False),
    "elu": BaseActivation(elu, _d_elu, True),   # phi'' jumps from 1 to 0 at 0
    "swish": BaseActivation(swish, _d_swish, False),
}
ALIASES = {"linear": "identity", "silu": "swish", "lrelu": "leaky_relu"}


def base_name(name):
    """The ACTIVATIONS key for a name or alias; ValueError listing the known names."""
    key = ALIASES.get(name, name)
    if key not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; known: {sorted(ACTIVATIONS)}")
    return key
