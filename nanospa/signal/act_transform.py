"""DKS and TAT: solving the parameters of a shaped activation for a given depth.

Implements docs/activations.md §1, §3-§7 and §10-§12. A shaped activation is

    phi_hat(x) = output_scale * ( phi(input_scale * x + input_shift) + output_shift )

with the parameters solved, once, in float64 NumPy so that a chain (or a normalised
residual stack) of `depth` MLP blocks has a well-behaved kernel map at initialisation:
DKS (Martens et al. 2021) bounds C'_f(1) by zeta, TAT (Zhang et al. 2022) bounds
C''_f(1) by tau (smooth phi) or C_f(0) by eta (leaky ReLU). Parameter names, defaults
and solver start order follow DeepMind's `dks` library (docs/activations.md §3-§5).

Notation (docs/activations.md §1-§2)

    phi          base activation (relu, leaky_relu, gelu, tanh, ...)
    phi_hat      transformed activation, the formula above
    a, b, o, s   input_scale, input_shift, output_shift, output_scale
    alpha        negative_slope of a leaky ReLU
    Q(q), C(c)   Q-map and C-map of phi_hat (local_maps.py)
    beta         C(0) of one TAT leaky-ReLU layer, (1 - alpha)^2 / (pi (1 + alpha^2))
    zeta         DKS target: max over subnetworks f of C_f'(1)          (default 1.5)
    eta          TAT leaky-ReLU target: max over subnetworks of C_f(0)  (default 0.9)
    tau          TAT smooth target: max over subnetworks of C_f''(1)    (default 0.3)
    L            depth: number of phi_hat on the longest path (one per MLP block)
    alpha_r, beta_r   weights of a normalised residual x -> alpha_r x + beta_r f(x),
                 alpha_r^2 + beta_r^2 = 1 (`residual_beta` = beta_r)

DKS for a smooth phi (the paper's DKS-GeLU): damped Newton on the per-layer conditions
from dks's start order (§12); TAT leaky ReLU: bisection on beta (§5). DKS leaky ReLU (closed
form, §3), TAT for a smooth phi (§4) and sigmoid (solved as tanh, §10), which the paper's
models do not use, are in signal/beyond/activations.py, imported when one is asked for.
Solutions are cached. The result, ActivationTransform, holds the parameters and their phi_hat.

Not here: phi_hat itself (activations.PhiHat, which the engine runs on the device), the base
activations and their derivatives (activations.py), quadrature and the leaky-ReLU closed forms
(gaussian_means.py), the Q/C maps (local_maps.py), the per-layer targets a depth asks for (depth_targets.py).
"""
import functools
import importlib
import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from .activations import PARAM_KEYS, PhiHat, base_name
from .depth_targets import DEFAULT_TARGETS, chain_c0, check_depth, check_residual_beta, per_layer_targets
from .gaussian_means import alpha_of_beta, gauss_rule

# Newton (§12): a root is accepted when every |residual| < _NEWTON_TOL.
_NEWTON_FD_STEP = 1e-6       # central-difference step of the Jacobian
_NEWTON_TOL = 1e-12
_NEWTON_MAX_ITER = 100
_NEWTON_MIN_DAMPING = 1e-4   # backtracking halves the step down to this factor, then takes it

# dks's start order (§3, §4): the product of the grid values, then seeded uniform draws in
# [low, high] up to _NUM_STARTS starts in all.
_START_GRID = {"input_scale": (1.0, 0.1), "input_shift": (0.0, 1.0, -1.0),
               "output_shift": (0.0, 1.0, -1.0)}
_START_LOW = {"input_scale": 0.0, "input_shift": -3.0, "output_shift": -3.0}
_START_HIGH = {"input_scale": 2.0, "input_shift": 3.0, "output_shift": 3.0}
_NUM_STARTS = 50
_START_SEED = 123

_RELU_BETA = 1.0 / math.pi   # beta of plain ReLU (alpha = 0): the largest beta, §5
_BISECT_WIDTH = 1e-17        # bisection on beta stops below this width (or at float spacing)
_SOLVE_CACHE = 256           # solved transforms kept by _solve


# ----------------------------------------------------------------- transform object

@dataclass(frozen=True, eq=False)
class ActivationTransform(Mapping):
    """A solved phi_hat: a read-only mapping of its parameters, and phi_hat itself.

    Keys (dks names; a missing key means its step is skipped):
        input_scale, input_shift, output_shift, output_scale, negative_slope.
        DKS smooth: all but negative_slope.  TAT smooth: all but negative_slope.
        DKS leaky_relu: negative_slope, output_shift, output_scale.
        TAT leaky_relu: negative_slope, output_scale.   method "none": no keys.
    t.phi_hat is their activations.PhiHat, which the engine and the Q/C maps evaluate;
    t(x, xp=None) and t.derivative(x, xp=None) are its phi_hat(x) and phi_hat'(x), in x's
    dtype and module; t.params is the dict of Python floats.
    """
    activation: str
    method: str
    depth: object
    params: Mapping
    targets: Mapping = field(default_factory=dict)
    local_targets: Mapping = field(default_factory=dict)
    residual_beta: object = None
    phi_hat: PhiHat = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "phi_hat", PhiHat.of(self.activation, self.params))

    def __getitem__(self, key):
        return self.params[key]

    def __iter__(self):
        return iter(self.params)

    def __len__(self):
        return len(self.params)

    def __call__(self, x, xp=None):
        return self.phi_hat(x, xp)

    def derivative(self, x, xp=None):
        return self.phi_hat.d1(x, xp)

    def __repr__(self):
        ps = ", ".join(f"{k}={v:.10g}" for k, v in self.params.items())
        return f"ActivationTransform({self.activation!r}, {self.method!r}, depth={self.depth}, {ps})"


def _make(activation, method, depth, params, targets=None, local=None, rb=None):
    params = {k: float(params[k]) for k in PARAM_KEYS if k in params}
    return ActivationTransform(activation, method, depth, MappingProxyType(params),
                               MappingProxyType(dict(targets or {})),
                               MappingProxyType(dict(local or {})), rb)


# ------------------------------------------------------------------- root finding (§12)

def _local(name, a, b, o):
    """Per-layer quantities of phi_hat = s (phi(a x + b) + o), s set so that Q(1) = 1:
    output_scale, C(0), Q'(1), C'(1), C''(1) by the Price identities (§2), and
    mean = E[phi(a z + b)] + o."""
    h = PhiHat(name, a=a, b=b, s=1.0, o=o)                               # phi_hat / s
    Z, W = gauss_rule(h.kink)
    y, y1, y2 = h(Z), h.d1(Z), h.d2(Z)
    s2 = 1.0 / (W @ (y * y))
    return dict(output_scale=math.sqrt(s2), C0=s2 * (W @ y) ** 2, Qslope=s2 * (W @ (y * y1 * Z)),
                Cslope=s2 * (W @ (y1 * y1)), Ccurv=s2 * (W @ (y2 * y2)), mean=float(W @ y))


def _newton(res, x):
    """Damped Newton with a central-difference Jacobian; RuntimeError if it stalls."""
    x, h = np.asarray(x, dtype=np.float64), _NEWTON_FD_STEP
    r = res(x)
    for _ in range(_NEWTON_MAX_ITER):
        if not np.all(np.isfinite(r)):
            break
        if np.max(np.abs(r)) < _NEWTON_TOL:
            return x
        J = np.stack([(res(x + h * e) - res(x - h * e)) / (2 * h) for e in np.eye(x.size)], 1)
        step, t = np.linalg.lstsq(J, r, rcond=None)[0], 1.0
        while True:                              # backtrack until |r| drops
            x_new = x - t * step
            r_new = res(x_new)
            if t < _NEWTON_MIN_DAMPING or (np.all(np.isfinite(r_new))
                                           and np.linalg.norm(r_new) < np.linalg.norm(r)):
                break
            t *= 0.5
        x, r = x_new, r_new
    raise RuntimeError("no convergence from this start")


def _starts(names):
    """dks's start order: the product of the grid values, then seeded uniform draws."""
    fixed = list(itertools.product(*(_START_GRID[n] for n in names)))
    rng = np.random.default_rng(_START_SEED)
    rand = [tuple(rng.uniform(_START_LOW[n], _START_HIGH[n]) for n in names)
            for _ in range(_NUM_STARTS - len(fixed))]
    return fixed + rand


def _first_root(res, names, ok=lambda p: True):
    for x0 in _starts(names):
        try:
            p = _newton(res, x0)
        except (RuntimeError, np.linalg.LinAlgError):
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


# --------------------------------------------------------------------------- solvers

def activation_transform(activation, method, depth=None, *, zeta=None, eta=None, tau=None,
                         residual_beta=None):
    """Solve the DKS or TAT transform of `activation` for a network of `depth` phi_hat.

    activation: relu, leaky_relu, gelu (tanh approx.), gelu_exact, sigmoid, tanh,
        softplus, elu, swish (linear only with method "none").
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
    name = base_name(activation)
    m = "none" if method is None else str(method).lower()
    if m == "none":
        return _make(name, "none", depth, {})
    if m not in ("dks", "tat"):
        raise ValueError(f"method must be 'dks', 'tat' or 'none', got {method!r}")
    if name in ("linear", "relu"):
        raise ValueError(f"{name} has no free parameter under {m.upper()}" + (
            " (it is linear); use method 'none'" if name == "linear" else
            " (it is leaky_relu with negative_slope 0); use 'leaky_relu'"))
    L, rb = check_depth(depth), check_residual_beta(residual_beta)
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


@functools.lru_cache(maxsize=_SOLVE_CACHE)
def _solve(name, method, L, target, rb):
    if name == "sigmoid" or (method == "tat") != (name == "leaky_relu"):   # beyond DKS-GeLU, TAT-LReLU
        return importlib.import_module("nanospa.signal.beyond.activations").solve(name, method, L, target, rb)
    res_txt = "" if rb is None else f", residual_beta={rb}"
    if method == "dks":                                        # smooth phi: Newton, §3, §12
        key, local = {"zeta": target}, per_layer_targets("dks", L, zeta=target, residual_beta=rb)
        loc = {"q_slope_1": 1.0, "c_val_0": 0.0, "c_slope_1": local}
        params = _solve_dks_smooth(name, local)
        if params is None:
            raise ValueError(f"DKS found no root for {name} with zeta={target} at depth {L}"
                             f"{res_txt} (per-layer C'(1)={local:.6g})")
    else:                                                      # TAT leaky ReLU: bisection on beta, §5
        key = {"eta": target}
        top = chain_c0(_RELU_BETA, L, rb)                      # plain ReLU: the largest C_f(0)
        if top < target:
            raise ValueError(f"eta={target} is unreachable for leaky_relu with TAT at depth {L}"
                             f"{res_txt}: the largest reachable C_f(0) is {top:.6f} (plain "
                             "ReLU); use a smaller eta or more layers")
        lo, hi = 0.0, _RELU_BETA
        while hi - lo > _BISECT_WIDTH:
            mid = 0.5 * (lo + hi)
            if mid in (lo, hi):
                break
            lo, hi = (mid, hi) if chain_c0(mid, L, rb) < target else (lo, mid)
        beta = 0.5 * (lo + hi)
        al = float(alpha_of_beta(beta))
        params = dict(negative_slope=al, output_scale=math.sqrt(2.0 / (1.0 + al * al)))
        loc = {"q_slope_1": 1.0, "c_slope_1": 1.0, "c_val_0": beta}
    return _make(name, method, L, params, key, loc, rb)


# ---------------------------------------------------------------- model-facing names

shaped_activation_names = {
    f"{m}_{short}": (base, m)
    for m in ("dks", "tat")
    for short, base in (("lrelu", "leaky_relu"), ("gelu", "gelu"), ("tanh", "tanh"),
                        ("sigmoid", "sigmoid"), ("softplus", "softplus"), ("elu", "elu"),
                        ("swish", "swish"))
}
shaped_activation_names = MappingProxyType(shaped_activation_names)
