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
    joint            gamma_L and the MLP stack's eta solved together for the actual T, L so
                     that, for the whole network at init (pair_walk, network_stats):
                     (i) C_f(0) = eta_net = 0.9, TAT's condition with attention included
                     (two inputs with no token in common end with correlation eta_net), and
                     (ii) the input-dependent part of the last kernel, K_L - X_L, has mean
                     adjacent correlation rho* (cfg.final_corr, default JOINT_FINAL_CORR);
                     with skips (residual != "none") the attention-only final target takes
                     rho* instead: exp(-gamma_L) = rho* (rho_L = rho*)
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
predicted combined kernel after block l, X_l the kernel between two sequences with no token
in common (the part of K_l common to all inputs), rho* and eta_net the joint targets.
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
JOINT_NET_ETA = 0.9               # eta_net: TAT's C_f(0) target, for the whole network
JOINT_FINAL_CORR = 0.4            # rho*: adjacent correlation of the input-dependent part of K_L
JOINT_SOLVE_T = 64                # the solve runs at min(T, this); beyond it the per-position
                                  # statistics are stationary and extrapolated
GAMMA_BOUNDS = (1e-4, 10.0)       # search range of the joint solve for gamma_L
RHO_LOGIT_BOUNDS = (-8.0, 8.0)    # and for logit(rho_L) (U-SPA)
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

def pair_walk(cfg, activation, values, d_rule="spa", T=None):
    """The walk of two sequences a, b of T distinct tokens with no token in common (input
    kernel I_2T): returns (K, X), K = K_aa the kernel of one sequence after the last block
    and X = K_ab the kernel between the sequences, both (T, T). X is the part of K common to
    all inputs (for a TAT leaky ReLU mostly its mean, which attention rescales by D_l), so
    K - X is the input-dependent part. Attention acts on each sequence (block-diagonal),
    the MLP and norms entrywise on the 2T x 2T kernel."""
    T = min(cfg.block_size, JOINT_SOLVE_T) if T is None else T
    maps = BlockMaps(cfg, activation)
    S = np.eye(2 * T)
    a, b = slice(0, T), slice(T, 2 * T)
    for l in range(1, cfg.n_layer + 1):
        A = spa_matrix(cfg, T, values[l], values[l - 1])
        S_in = maps.branch_input(S)
        if d_rule == "qpreserve":
            A = A / A.sum(axis=1, keepdims=True)
            A = A / np.sqrt(np.diagonal(attention_map(S_in[a, a], A)))[:, None]
        H = np.empty_like(S)
        H[a, a] = H[b, b] = attention_map(S_in[a, a], A)
        H[a, b] = H[b, a] = attention_map(S_in[a, b], A)
        S = maps.combine(S, H)
        S = maps.combine(S, maps.mlp_map(maps.branch_input(S)))
    return S[a, a], S[a, b]


def _position_mean(v, T_full):
    """Mean of a per-position statistic over T_full positions, the positions beyond the
    computed ones taking the last computed value (stationarity)."""
    if T_full <= v.size:
        return float(v.mean())
    return float((v.sum() + (T_full - v.size) * v[-1]) / T_full)


def network_stats(K, X, T_full=None):
    """(c_f0, rho): c_f0 = mean_i X_ii / K_ii, the whole network's C_f(0) (the correlation
    of the outputs of two inputs with no token in common, at the same position), and rho =
    the mean adjacent correlation of the normalised input-dependent kernel K - X."""
    T_full = K.shape[0] if T_full is None else T_full
    c_f0 = _position_mean(np.diagonal(X) / np.diagonal(K), T_full)
    R = K - X
    if np.min(np.diagonal(R)) <= 1e-12 * np.max(np.diagonal(K)):
        # No input-dependent part left at some position (e.g. a plain sigmoid MLP at depth):
        # the network is collapsed there, which counts as adjacent correlation 1.
        return c_f0, 1.0
    c = np.diagonal(normalised_kernel(R), 1)
    rho = _position_mean(c, T_full - 1) if c.size else float("nan")
    return c_f0, rho


def adjacent_mean(K, T_full=None):
    """Mean of C[i, i+1] over the adjacent pairs of the normalised kernel of K (extrapolated
    to T_full positions as in _position_mean)."""
    c = np.diagonal(normalised_kernel(K), 1)
    return _position_mean(c, (T_full or K.shape[0]) - 1)


def _falling_root(f, lo, hi, tol):
    """x in [lo, hi] with f(x) = 0 for f decreasing, by regula falsi (Illinois). Returns
    (x, f(x), reached); a target outside the bracket returns the nearer end."""
    f_lo, f_hi = f(lo), f(hi)
    if f_lo <= 0:
        return lo, f_lo, abs(f_lo) < tol
    if f_hi >= 0:
        return hi, f_hi, abs(f_hi) < tol
    side, x, fx = 0, lo, f_lo
    for _ in range(100):
        x = hi - f_hi * (hi - lo) / (f_hi - f_lo)
        fx = f(x)
        if abs(fx) < tol or hi - lo < 1e-12:
            break
        if fx > 0:
            lo, f_lo = x, fx
            if side == 1:
                f_hi *= 0.5
            side = 1
        else:
            hi, f_hi = x, fx
            if side == -1:
                f_lo *= 0.5
            side = -1
    return x, fx, abs(fx) < tol


def solve_joint(cfg, rho_star, eta_net, d_rule="spa"):
    """The joint policy's targets (docs/kernel_budget.md):

        (i)  c_f0(K_L) = eta_net    TAT's condition, for the whole network (attention included)
        (ii) rho(K_L)  = rho*       E-SPA's final adjacent correlation, on the input-dependent part

    (network_stats of pair_walk at T_s = min(T, JOINT_SOLVE_T), extrapolated to T). Unknowns:
    the final gamma_L (rho_L for U-SPA), and the MLP stack's eta for a TAT leaky ReLU unless
    cfg.eta fixes it (other activations keep their zeta / tau; only (ii) is solved). Nested
    regula falsi: gamma_L for (ii) at each eta, eta for (i). Returns dict(final, eta, c_f0,
    rho, rho_reached, eta_net_reached (None when eta is not solved), eta_clamped: (i) needs
    more than the largest reachable eta, so eta is that maximum)."""
    T_s = min(cfg.block_size, JOINT_SOLVE_T)
    espa = cfg.attention == "espa"

    def value(x):
        return math.exp(x) if espa else 1.0 / (1.0 + math.exp(-x))

    def inner(eta):
        act = activation_plan(cfg, eta)
        memo = {}

        def g(x):                                   # decreasing in x for both kinds
            K, X = pair_walk(cfg, act, schedule(cfg, value(x)), d_rule, T_s)
            memo[x] = network_stats(K, X, cfg.block_size)
            return (memo[x][1] - rho_star) * (1.0 if espa else -1.0)

        lo, hi = (math.log(GAMMA_BOUNDS[0]), math.log(GAMMA_BOUNDS[1])) if espa else RHO_LOGIT_BOUNDS
        x, _, ok = _falling_root(g, lo, hi, 1e-5)
        c_f0, rho = memo[x]
        return dict(final=value(x), eta=eta, c_f0=c_f0, rho=rho, rho_reached=ok)

    if not uses_eta(cfg) or cfg.eta:
        return dict(inner(cfg.eta or None), eta_net_reached=None, eta_clamped=False)
    top = max_eta(cfg) * (1.0 - 1e-9)
    memo = {}

    def h(eta):                                     # falls: c_f0 rises with eta
        memo[eta] = inner(eta)
        return eta_net - memo[eta]["c_f0"]

    eta, _, ok = _falling_root(h, 1e-3, top, 1e-5)
    return dict(memo[eta], eta_net_reached=ok, eta_clamped=(eta == top and not ok))


_JOINT_CACHE = {}
_JOINT_FIELDS = ("attention", "activation", "residual", "residual_beta", "norm", "norm_position",
                 "block_size", "n_layer", "shaping_depth", "zeta", "tau", "eta", "rho_final")


def joint_solution(cfg, rho_star, eta_net, d_rule):
    """solve_joint, cached on the configuration fields it depends on."""
    key = tuple(getattr(cfg, f) for f in _JOINT_FIELDS) + (rho_star, eta_net, d_rule)
    if key not in _JOINT_CACHE:
        _JOINT_CACHE[key] = solve_joint(cfg, rho_star, eta_net, d_rule)
    return dict(_JOINT_CACHE[key])


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
    name = _name(cfg)
    given = cfg.gamma_final if cfg.attention == "espa" else None
    d_rule = "qpreserve" if policy in ("qpreserve", "joint_qpreserve") else "spa"
    eta = cfg.eta or INDEPENDENT_ETA
    final = None
    if joint:
        rho_star = cfg.final_corr or JOINT_FINAL_CORR
        info.update(final_corr=rho_star, eta_net=JOINT_NET_ETA)
        if spa and not given and cfg.residual != "none":
            # With skips the block outputs stay close to the input kernel, so neither
            # whole-network target constrains the attention branch: its last SPA target
            # takes the adjacent correlation rho* itself (exp(-gamma_L) = rho*, rho_L = rho*).
            final = -math.log(rho_star) if cfg.attention == "espa" else rho_star
            info["joint_mode"] = "residual: attention-only final target"
            if not cfg.eta:
                eta = min(JOINT_NET_ETA, max_eta(cfg) * (1.0 - 1e-9))
        elif spa and not given:
            sol = joint_solution(cfg, rho_star, JOINT_NET_ETA, d_rule)
            final, eta = sol["final"], sol["eta"] or eta
            info.update(net_c_f0=sol["c_f0"], final_corr_achieved=sol["rho"],
                        final_corr_reached=sol["rho_reached"])
            if sol["eta_net_reached"] is not None:
                info["eta_net_reached"] = sol["eta_net_reached"]
            if sol["eta_clamped"]:
                info["eta_clamped_to_max"] = True
        elif not cfg.eta:                           # no SPA schedule to solve: the MLP stack's
            eta = min(JOINT_NET_ETA, max_eta(cfg) * (1.0 - 1e-9))   # own eta, clamped
    activation = activation_plan(cfg, eta)
    if uses_eta(cfg):
        info["eta"] = eta
    if not spa:
        return Plan(policy=policy, layers=None, activation=activation, info=info)
    if final is None:
        final = (given or INDEPENDENT_GAMMA_FINAL) if cfg.attention == "espa" else cfg.rho_final
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
