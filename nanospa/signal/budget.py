"""The kernel budget: how attention and the MLP activations share the path from the input
kernel Sigma_0 = I to the last layer (docs/method.md §10; equations, evidence and the
choice of default in docs/kernel_budget.md).

``make_plan(cfg)`` turns a model configuration into every number the model's
initialisation needs, in float64: per layer the SPA bias B_l and rescaling D_l (with
A_l = diag(D_l) softmax(B_l)), and the shaped activation's parameters. init.py only casts
these to the model's dtype and device.

Policies (``cfg.kernel_budget``), for E-SPA (U-SPA: rho in place of gamma):

    independent      gamma_L = 0.005, TAT leaky-ReLU eta = 0.9 over the chain of L MLPs,
                     A_l = chol(Sigma_l) chol(Sigma_{l-1})^-1: each part built as if the
                     other were absent (the known third-party reimplementations)
    joint            eta = 1 - (1 - rho*)^w and gamma_L solved so that the predicted
                     combined kernel at the last layer has mean adjacent correlation
                     rho* (cfg.final_corr, default JOINT_FINAL_CORR), for the actual T, L
    qpreserve        independent targets; D_l[i] = 1 / sqrt((P_l S_{l-1} P_l^T)_ii) with
                     P_l = softmax(B_l) and S_{l-1} the predicted kernel entering the
                     attention, so every position leaves every attention sublayer with q = 1
    mlp_aware        A_l = chol(Pi_l) chol(K_{l-1})^-1 with Pi_l = F^-1(Sigma_l) the
                     pre-image of the target under the MLP's kernel map F (entrywise C^-1)
                     and K_{l-1} the predicted kernel entering block l; layers where Pi_l
                     is not positive definite or A_l has negative entries fall back to the
                     independent A_l and are listed in plan.info["mlp_aware"]
    joint_qpreserve  the joint targets with the q-preserving D_l

Notation: T = block_size, L = n_layer, gamma_l / rho_l the SPA schedule (kernels.py),
a_l = sqrt(1 - exp(-2 gamma_l)), eta / zeta / tau the activation targets
(docs/activations.md), F the MLP's kernel map and C its C-map (predict.MLPMap), K_l the
predicted combined kernel after block l, rho* the joint target, w = JOINT_SPLIT.
"""
import math
from dataclasses import dataclass, field

import numpy as np

from .act_transform import activation_transform, chain_c0, shaped_activation_names
from .attn_bias import bias_and_rescale, espa_log_attention, log_attention_from, uspa_attention
from .kernels import check_T, espa_gammas, espa_kernel, normalised_kernel, uspa_kernel, uspa_rhos
from .predict import BlockMaps, TINY, attention_map, flush

BUDGETS = ("independent", "joint", "qpreserve", "mlp_aware", "joint_qpreserve")
DEFAULT_BUDGET = "joint"

INDEPENDENT_GAMMA_FINAL = 0.005   # the reimplementations' E-SPA gamma_L
INDEPENDENT_ETA = 0.9             # TAT's default C_f(0) target
JOINT_FINAL_CORR = 0.7            # rho*: mean adjacent correlation of K_L (docs/kernel_budget.md)
JOINT_SPLIT = 0.5                 # w: the MLPs' share of log(1 - rho*)
JOINT_SOLVE_T = 256               # longer T: the adjacent correlations beyond it are stationary
GAMMA_BOUNDS = (1e-4, 10.0)       # search range of the joint solve for gamma_L
MLP_AWARE_NEG_TOL = 1e-10         # A entries above -tol * max A count as rounding zeros
PARAM_KEYS = ("input_scale", "input_shift", "output_scale", "output_shift", "negative_slope")


@dataclass
class Plan:
    """Everything init.py needs, as float64 host arrays and Python numbers.

    layers      list of L dicts {"B": (T, T), "D": (T,), "gamma" or "rho": float} for SPA
                attention; None for softmax and Value-SkipInit
    activation  dict(base=..., method=..., params={input_scale, ...}) for the MLP
    info        the chosen targets and what the policy predicted, for printing and logging
    """
    policy: str
    layers: list = None
    activation: dict = field(default_factory=dict)
    info: dict = field(default_factory=dict)


def split_activation(name):
    """'tat_lrelu' -> ('leaky_relu', 'tat'); a plain activation -> (name, None)."""
    shaped = shaped_activation_names
    if name in shaped:
        base, method = shaped[name]
        return base, method
    return name, None


def shaping_depth(cfg):
    """Nonlinear layers on the longest path: one shaped activation per MLP block."""
    return cfg.shaping_depth or cfg.n_layer


def uses_eta(cfg):
    """True when the activation's target is TAT leaky ReLU's eta = C_f(0)."""
    return split_activation(cfg.activation) == ("leaky_relu", "tat")


def activation_plan(cfg, eta=None):
    """dict(base, method, params) of the MLP activation; eta only for TAT leaky ReLU."""
    base, method = split_activation(cfg.activation)
    if method is None:
        return dict(base=base, method=None, params={})
    targets = {"dks": {"zeta": cfg.zeta},
               "tat": {"eta": eta} if base == "leaky_relu" else {"tau": cfg.tau}}[method]
    kwargs = {}
    if cfg.residual == "normalised":
        kwargs["residual_beta"] = cfg.residual_beta
    result = activation_transform(base, method, shaping_depth(cfg), **targets, **kwargs)
    params = getattr(result, "params", result)
    return dict(base=base, method=method, params={k: float(params[k]) for k in PARAM_KEYS if k in params})


def max_eta(cfg):
    """The largest reachable C_f(0) of the TAT leaky-ReLU stack (plain ReLU layers)."""
    rb = cfg.residual_beta if cfg.residual == "normalised" else None
    return chain_c0(1.0 / math.pi, shaping_depth(cfg), rb)


def joint_eta(cfg, rho_star):
    """The joint policy's eta: (1 - eta) = (1 - rho*)^w, i.e. the MLP stack gets the share w
    of the log-decorrelation budget log(1 - rho*). Clamped just below the reachable maximum
    (short stacks cannot reach large eta); cfg.eta overrides."""
    if cfg.eta:
        return cfg.eta, False
    eta = 1.0 - (1.0 - rho_star) ** JOINT_SPLIT
    top = max_eta(cfg)
    if eta >= top:
        return top * (1.0 - 1e-9), True
    return eta, False


# ------------------------------------------------------------------ SPA schedules

def schedule(cfg, final):
    """[v_0, v_1, ..., v_L]: E-SPA gammas (v_0 = inf) or U-SPA rhos (v_0 = 0)."""
    if cfg.attention == "espa":
        return espa_gammas(cfg.n_layer, final)
    return uspa_rhos(cfg.n_layer, final)


def target_kernel(cfg, T, value):
    if cfg.attention == "espa":
        return espa_kernel(T, value)
    return uspa_kernel(T, value)


def spa_matrix(cfg, T, value, value_prev):
    """The attention-only SPA A_l (T, T), float64, subnormals flushed."""
    if cfg.attention == "espa":
        with np.errstate(under="ignore"):
            return flush(np.exp(espa_log_attention(T, value, value_prev)))
    return flush(np.maximum(uspa_attention(T, value, value_prev), 0.0))


def split_bias(A):
    """(B, D) with A = diag(D) softmax(B) for a non-negative lower-triangular A."""
    return bias_and_rescale(log_attention_from(A))


def spa_layer(cfg, T, value, value_prev):
    """{"B", "D"} of the attention-only SPA step, in log space for E-SPA (method §7.2)."""
    if cfg.attention == "espa":
        B, D = bias_and_rescale(espa_log_attention(T, value, value_prev))
    else:
        B, D = split_bias(uspa_attention(T, value, value_prev))
    return dict(B=B, D=D)


def _name(cfg):
    return "gamma" if cfg.attention == "espa" else "rho"


# ------------------------------------------------------------------ the layer walk

def walk(cfg, activation, values, d_rule="spa", T=None, sigma_0=None, mlp_aware=False,
         keep_layers=True):
    """Build the L attention layers along the schedule `values` ([v_0..v_L]) while
    predicting the kernels (predict.BlockMaps), and return (layers, K_L, report).

    d_rule "spa": D_l = row sums of the SPA A_l (attention-only targets met exactly).
    d_rule "qpreserve": D_l[i] = 1 / sqrt((P_l S P_l^T)_ii), P_l = softmax(B_l), S the
        predicted kernel entering the attention: q = 1 after every attention sublayer.
    mlp_aware: A_l = chol(F^-1(Sigma_l)) chol(K_{l-1})^-1 where realisable (see module doc).
    K_L is the predicted kernel after the last block (before any final norm)."""
    T = cfg.block_size if T is None else T
    maps = BlockMaps(cfg, activation)
    if mlp_aware:
        if cfg.residual != "none":
            raise ValueError(f"kernel_budget='mlp_aware' needs residual='none' (the pre-image is "
                             f"that of the skipless block), got residual={cfg.residual!r}")
        if abs(maps.mlp_map.Q1() - 1.0) > 1e-8:
            raise ValueError(f"kernel_budget='mlp_aware' needs an activation with Q(1) = 1 (a "
                             f"DKS/TAT-shaped one or 'linear'), got activation={cfg.activation!r}")
    S = np.eye(T) if sigma_0 is None else np.asarray(sigma_0, dtype=np.float64)
    name, layers, report = _name(cfg), [], []
    for l in range(1, cfg.n_layer + 1):
        A = spa_matrix(cfg, T, values[l], values[l - 1])
        entry = {}
        if mlp_aware:
            A, entry = _mlp_aware_step(cfg, maps, S, target_kernel(cfg, T, values[l]), A)
            entry["layer"] = l
            report.append(entry)
        S_in = maps.branch_input(S)
        if d_rule == "qpreserve":
            P = A / A.sum(axis=1, keepdims=True)
            h = attention_map(S_in, P)
            D = 1.0 / np.sqrt(np.diagonal(h))
            A = P * D[:, None]
            h = h * D[:, None] * D[None, :]
        else:
            h = attention_map(S_in, A)
        S = maps.combine(S, h)
        S = maps.combine(S, maps.mlp_map(maps.branch_input(S)))
        if keep_layers:
            if entry.get("realised"):
                B, D_l = split_bias(A)               # exact zeros of A become -inf in B
                layer = dict(B=B, D=D_l)
            else:                                    # B in log space: no exp underflow
                layer = spa_layer(cfg, T, values[l], values[l - 1])
                if d_rule == "qpreserve":
                    layer["D"] = D
            layer[name] = float(values[l])
            layers.append(layer)
    return layers, S, report


def _mlp_aware_step(cfg, maps, S, Sigma_l, A_spa):
    """A_l = chol(Pi) chol(S)^-1 with Pi = F^-1(Sigma_l) (entrywise C^-1 on a unit-diagonal
    target, for MLPs with Q(1) = 1), when Pi is positive definite and A_l >= 0; otherwise
    the attention-only A_spa. Returns (A, report entry)."""
    mlp = maps.mlp_map
    entry = dict(realised=False)
    Pi = mlp.C_inverse(Sigma_l)
    lam = float(np.linalg.eigvalsh(Pi).min())
    entry["min_eig_preimage"] = lam
    if lam <= 0:
        entry["reason"] = "pre-image not positive definite"
        return A_spa, entry
    S_in = maps.branch_input(S)
    try:
        L_in, L_pi = np.linalg.cholesky(S_in), np.linalg.cholesky(Pi)
    except np.linalg.LinAlgError:
        entry["reason"] = "incoming kernel not positive definite"
        return A_spa, entry
    A = np.tril(np.linalg.solve(L_in.T, L_pi.T).T)                # A L_in = L_pi
    entry["min_A"] = float(A.min())
    if A.min() < -MLP_AWARE_NEG_TOL * np.abs(A).max():
        entry["reason"] = "negative entries in A_l"
        return A_spa, entry
    entry["realised"] = True
    return flush(np.maximum(A, 0.0)), entry


# ------------------------------------------------------------------ the joint solve

def adjacent_mean(K, T_full=None):
    """Mean of C[i, i+1] over the T - 1 adjacent pairs of the normalised kernel of K. With
    T_full > T, the pairs beyond the computed prefix take the last computed value (the
    causal maps are prefix consistent and the adjacent correlations stationary there)."""
    c = np.diagonal(normalised_kernel(K), 1)
    if T_full is None or T_full <= K.shape[0]:
        return float(c.mean())
    return float((c.sum() + (T_full - K.shape[0]) * c[-1]) / (T_full - 1))


def solve_final(cfg, activation, rho_star, d_rule="spa"):
    """gamma_L (E-SPA) or rho_L (U-SPA) such that the predicted combined kernel after the
    last block has mean adjacent correlation rho*, by regula falsi (Illinois) in log gamma
    or in logit rho. Returns (value, achieved, reached)."""
    T = min(cfg.block_size, JOINT_SOLVE_T)

    def f(x):
        v = math.exp(x) if cfg.attention == "espa" else 1.0 / (1.0 + math.exp(-x))
        _, K, _ = walk(cfg, activation, schedule(cfg, v), d_rule, T=T, keep_layers=False)
        return v, adjacent_mean(K, cfg.block_size) - rho_star

    if cfg.attention == "espa":                   # correlation falls as gamma grows
        lo, hi = math.log(GAMMA_BOUNDS[0]), math.log(GAMMA_BOUNDS[1])
    else:                                         # and rises with rho
        lo, hi = -8.0, 8.0
    (v_lo, f_lo), (v_hi, f_hi) = f(lo), f(hi)
    sign = 1.0 if cfg.attention == "espa" else -1.0   # make g decreasing in x
    g_lo, g_hi = sign * f_lo, sign * f_hi
    if g_lo <= 0:
        return v_lo, f_lo + rho_star, False
    if g_hi >= 0:
        return v_hi, f_hi + rho_star, False
    side = 0
    for _ in range(60):
        x = hi - g_hi * (hi - lo) / (g_hi - g_lo)
        v, fx = f(x)
        gx = sign * fx
        if abs(fx) < 1e-6:
            return v, fx + rho_star, True
        if gx > 0:
            lo, g_lo = x, gx
            if side == 1:
                g_hi *= 0.5
            side = 1
        else:
            hi, g_hi = x, gx
            if side == -1:
                g_lo *= 0.5
            side = -1
    return v, fx + rho_star, abs(fx) < 1e-4


# ------------------------------------------------------------------ make_plan

def make_plan(cfg):
    """The kernel-budget plan of cfg (see the module docstring for the policies)."""
    policy = cfg.kernel_budget
    if policy not in BUDGETS:
        raise ValueError(f"kernel_budget={policy!r} is not one of {list(BUDGETS)}")
    spa = cfg.attention in ("espa", "uspa")
    if policy == "mlp_aware" and spa and cfg.residual != "none":
        raise ValueError(f"kernel_budget='mlp_aware' needs residual='none' (the pre-image is "
                         f"that of the skipless block), got residual={cfg.residual!r}")
    joint = policy in ("joint", "joint_qpreserve")
    info = dict(policy=policy, depth=shaping_depth(cfg))
    if joint:
        rho_star = cfg.final_corr or JOINT_FINAL_CORR
        info["final_corr"] = rho_star
        eta, clamped = joint_eta(cfg, rho_star)
        if clamped:
            info["eta_clamped_to_max"] = True
    else:
        eta = cfg.eta or INDEPENDENT_ETA
    activation = activation_plan(cfg, eta)
    if uses_eta(cfg):
        info["eta"] = eta
    if not spa:
        return Plan(policy=policy, layers=None, activation=activation, info=info)

    name = _name(cfg)
    given = cfg.gamma_final if cfg.attention == "espa" else None
    d_rule = "qpreserve" if policy in ("qpreserve", "joint_qpreserve") else "spa"
    if joint and not given:
        final, achieved, reached = solve_final(cfg, activation, rho_star, d_rule)
        info.update(final_corr_achieved=achieved, final_corr_reached=reached)
    elif cfg.attention == "espa":
        final = given or INDEPENDENT_GAMMA_FINAL
    else:
        final = cfg.rho_final
    info[f"{name}_final"] = final
    values = schedule(cfg, final)
    if policy == "independent" or (joint and d_rule == "spa"):
        layers = [dict(spa_layer(cfg, cfg.block_size, values[l], values[l - 1]), **{name: float(values[l])})
                  for l in range(1, cfg.n_layer + 1)]
    else:
        layers, _, report = walk(cfg, activation, values, d_rule, mlp_aware=(policy == "mlp_aware"))
        if policy == "mlp_aware":
            info["mlp_aware"] = report
            info["mlp_aware_realised"] = [e["layer"] for e in report if e["realised"]]
    return Plan(policy=policy, layers=layers, activation=activation, info=info)
