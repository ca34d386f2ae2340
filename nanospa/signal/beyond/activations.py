"""The activations beyond the paper's and the DKS/TAT solver paths its models do not use
(docs/activations.md §3, §4, §9, §10). The paper's models use DKS-GeLU, TAT leaky ReLU, plain
GeLU and plain sigmoid (docs/activations.md), which never load this file.

    gelu_exact, tanh, softplus, elu, swish   phi, phi', phi'' (conventions of activations.py):
                           entries of activations.ACTIVATIONS, which imports this file the
                           first time one of them is looked up
    solve                  act_transform's solve for DKS leaky ReLU (closed form, §3), TAT with a
                           smooth phi (§4) and sigmoid under DKS or TAT (solved as tanh, then
                           rewritten: §10)
"""
import importlib
import math

import numpy as np

from ..act_transform import _first_root, _local, _make, _solve
from ..activations import BaseActivation, _d1_sigmoid, _one, array_module, sigmoid
from ..depth_targets import per_layer_targets, subnet_max
from ..gaussian_means import alpha_of_beta

_INV_SQRT_2 = 1.0 / math.sqrt(2.0)           # Phi(x) = (1 + erf(x / sqrt 2)) / 2
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)   # normal pdf at 0
_TAT_MAX_GAIN = 2.0          # dks's guard: TAT roots need input_scale * output_scale < 2 (§4)
_DKS_LRELU_TOP = math.pi / (math.pi - 1.0)   # C'(1) = 1/(1 - beta) of the centred ReLU: the
                                             # bound on a DKS leaky-ReLU per-layer C'(1), §3


# ------------------------------------------------------------------ base activations

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


ACTIVATIONS = {
    "gelu_exact": BaseActivation(gelu_exact, _d1_gelu_exact, _d2_gelu_exact, False),
    "tanh": BaseActivation(tanh, _d1_tanh, _d2_tanh, False),
    "softplus": BaseActivation(softplus, sigmoid, _d1_sigmoid, False),   # phi' = sigmoid
    "elu": BaseActivation(elu, _d1_elu, _d2_elu, True),   # phi'' jumps from 1 to 0 at 0
    "swish": BaseActivation(swish, _d1_swish, _d2_swish, False),
}


# --------------------------------------------------------------------------- solvers

def _solve_tat_smooth(name, target):
    def res(p):
        m = _local(name, *p)
        return np.array([m["Qslope"] - 1.0, m["Cslope"] - 1.0, m["Ccurv"] - target])
    ok = lambda p: p[0] * _local(name, *p)["output_scale"] < _TAT_MAX_GAIN
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


def solve(name, method, L, target, rb):
    """act_transform's cached solve for what the paper's models do not use: sigmoid, the tanh
    transform rewritten (§10), DKS leaky ReLU in closed form (§3), and TAT for a smooth phi (§4)."""
    if name == "sigmoid":
        t = _solve("tanh", method, L, target, rb)
        return _make(name, method, L, _tanh_to_sigmoid(t.params), t.targets, t.local_targets, rb)
    res_txt = "" if rb is None else f", residual_beta={rb}"
    if method == "dks":                                        # leaky_relu: closed form, §3
        local = per_layer_targets("dks", L, zeta=target, residual_beta=rb)
        if not local < _DKS_LRELU_TOP:
            bound = subnet_max(1.0, lambda x: _DKS_LRELU_TOP * x, L, rb)
            raise ValueError(f"zeta={target} is unreachable for leaky_relu with DKS at depth "
                             f"{L}{res_txt}: zeta must stay below {bound:.6f} (plain ReLU)")
        al = float(alpha_of_beta(1.0 - 1.0 / local))
        params = dict(negative_slope=al, output_shift=-(1.0 - al) / math.sqrt(2.0 * math.pi),
                      output_scale=1.0 / math.sqrt(0.5 * (1.0 + al * al)
                                                   - (1.0 - al) ** 2 / (2.0 * math.pi)))
        return _make(name, method, L, params, {"zeta": target},
                     {"q_slope_1": 1.0, "c_val_0": 0.0, "c_slope_1": local}, rb)
    local = per_layer_targets("tat", L, tau=target, residual_beta=rb)
    params = _solve_tat_smooth(name, local)
    if params is None:
        raise ValueError(f"TAT found no acceptable root for {name} with tau={target} at "
                         f"depth {L}{res_txt} (per-layer C''(1)={local:.6g})")
    return _make(name, "tat", L, params, {"tau": target},
                 {"q_slope_1": 1.0, "c_slope_1": 1.0, "c_curv_1": local}, rb)
