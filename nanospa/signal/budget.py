"""The kernel budget: how attention and the MLP activations share the path from the input
kernel Sigma_0 = I to the last layer (docs/method.md §10; equations, evidence and the
choice of default in docs/kernel_budget.md).

``make_plan(cfg)`` turns a model configuration into the choices the model's initialisation
needs, as an immutable Plan: the SPA schedule gamma_0..gamma_L (rho for U-SPA), whose
per-layer bias B_l and rescaling D_l (A_l = diag(D_l) softmax(B_l)) attn_bias.layer_bias
builds in closed form, the policy's own (B_l, D_l) where it moves A_l off that closed form,
and the arguments of act_transform.activation_transform for the MLP's shaped activation.
The configuration is read by duck typing (GPTConfig's fields); nothing here imports the
model. Not here: the sublayer kernel maps (maps.py) and the closed forms (attn_bias.py).

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
    qpreserve, mlp_aware, joint_qpreserve   beyond the default: A_l moved off the closed
                     form (q-preserving D_l, the MLP's pre-image), signal/beyond/policies.py

Notation: T = block_size, L = n_layer, gamma_l / rho_l the SPA schedule (kernels.py),
a_l = sqrt(1 - exp(-2 gamma_l)), eta / zeta / tau the activation targets
(docs/activations.md), F the MLP's kernel map and C its C-map (maps.MLPMap), K_l the
predicted combined kernel after block l, X_l the kernel between two sequences with no token
in common (the part of K_l common to all inputs), rho* and eta_net the joint targets.
"""
import importlib
import math

from .depth_targets import DEFAULT_TARGETS, chain_c0
from .kernels import DEFAULT_GAMMA_FINAL
from .act_transform import activation_transform
from .plan import Plan, split_activation
from .walks import JOINT_SOLVE_T, SPA_KINDS, network_stats, pair_walk, spa_schedule

BUDGETS = ("independent", "joint", "qpreserve", "mlp_aware", "joint_qpreserve")
DEFAULT_BUDGET = "joint"

INDEPENDENT_GAMMA_FINAL = DEFAULT_GAMMA_FINAL   # the reimplementations' E-SPA gamma_L, 0.005
ETA = DEFAULT_TARGETS["eta"]      # TAT's C_f(0) target, 0.9: of the MLP chain (independent), of the
                                  # whole network (joint's eta_net)
JOINT_FINAL_CORR = 0.4            # rho*: adjacent correlation of the input-dependent part of K_L
GAMMA_BOUNDS = (1e-4, 10.0)       # search range of the joint solve for gamma_L
RHO_LOGIT_BOUNDS = (-8.0, 8.0)    # and for logit(rho_L) (U-SPA)
ETA_MAX_MARGIN = 1e-9             # eta is kept this fraction below the largest reachable C_f(0)
ROOT_TOL = 1e-5                   # the joint solve's tolerance on rho and on c_f0
ETA_SEARCH_MIN = 1e-3             # the smallest eta the joint solve tries


def shaping_depth(cfg):
    """Nonlinear layers on the longest path: one shaped activation per MLP block."""
    return cfg.shaping_depth or cfg.n_layer


def activation_spec(cfg, eta=None):
    """The keyword arguments of activation_transform for the MLP activation (eta only for
    TAT leaky ReLU): {activation, method} for a plain activation, plus depth, the target
    (zeta, eta or tau) and, with a normalised residual, residual_beta for a shaped one.
    Solving it here checks that the target is reachable (ValueError otherwise)."""
    base, method = split_activation(cfg.activation)
    if method is None:
        return dict(activation=base, method=None)
    spec = dict(activation=base, method=method, depth=shaping_depth(cfg))
    spec.update({"dks": {"zeta": cfg.zeta},
                 "tat": {"eta": eta} if base == "leaky_relu" else {"tau": cfg.tau}}[method])
    if cfg.residual == "normalised":
        spec["residual_beta"] = cfg.residual_beta
    activation_transform(**spec)
    return spec


def _name(cfg):
    return "gamma" if cfg.attention == "espa" else "rho"


# ------------------------------------------------------------------ the joint solve

def uses_eta(cfg):
    """True when the activation's target is TAT leaky ReLU's eta = C_f(0)."""
    return split_activation(cfg.activation) == ("leaky_relu", "tat")


def max_eta(cfg):
    """The largest reachable C_f(0) of the TAT leaky-ReLU stack (plain ReLU layers)."""
    rb = cfg.residual_beta if cfg.residual == "normalised" else None
    return chain_c0(1.0 / math.pi, shaping_depth(cfg), rb)


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
        act = activation_spec(cfg, eta)
        memo = {}

        def g(x):                                   # decreasing in x for both kinds
            K, X = pair_walk(cfg, act, spa_schedule(cfg.attention, cfg.n_layer, value(x)), d_rule, T_s)
            memo[x] = network_stats(K, X, cfg.block_size)
            return (memo[x][1] - rho_star) * (1.0 if espa else -1.0)

        lo, hi = (math.log(GAMMA_BOUNDS[0]), math.log(GAMMA_BOUNDS[1])) if espa else RHO_LOGIT_BOUNDS
        x, _, ok = _falling_root(g, lo, hi, ROOT_TOL)
        c_f0, rho = memo[x]
        return dict(final=value(x), eta=eta, c_f0=c_f0, rho=rho, rho_reached=ok)

    if not uses_eta(cfg) or cfg.eta:
        return dict(inner(cfg.eta or None), eta_net_reached=None, eta_clamped=False)
    top = max_eta(cfg) * (1.0 - ETA_MAX_MARGIN)
    memo = {}

    def h(eta):                                     # falls: c_f0 rises with eta
        memo[eta] = inner(eta)
        return eta_net - memo[eta]["c_f0"]

    eta, _, ok = _falling_root(h, ETA_SEARCH_MIN, top, ROOT_TOL)
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
    spa = cfg.attention in SPA_KINDS
    if policy == "mlp_aware" and spa and cfg.residual != "none":
        raise ValueError(f"kernel_budget='mlp_aware' needs residual='none' (the pre-image is "
                         f"that of the skipless block), got residual={cfg.residual!r}")
    joint = policy in ("joint", "joint_qpreserve")
    info = dict(policy=policy, depth=shaping_depth(cfg))
    name = _name(cfg)
    given = cfg.gamma_final if cfg.attention == "espa" else None
    d_rule = "qpreserve" if policy in ("qpreserve", "joint_qpreserve") else "spa"
    eta = cfg.eta or ETA
    final = None
    if joint:
        rho_star = cfg.final_corr or JOINT_FINAL_CORR
        info.update(final_corr=rho_star, eta_net=ETA)
        if spa and not given and cfg.residual != "none":
            # With skips the block outputs stay close to the input kernel, so neither
            # whole-network target constrains the attention branch: its last SPA target
            # takes the adjacent correlation rho* itself (exp(-gamma_L) = rho*, rho_L = rho*).
            final = -math.log(rho_star) if cfg.attention == "espa" else rho_star
            info["joint_mode"] = "residual: attention-only final target"
            if not cfg.eta:
                eta = min(ETA, max_eta(cfg) * (1.0 - ETA_MAX_MARGIN))
        elif spa and not given:
            sol = joint_solution(cfg, rho_star, ETA, d_rule)
            final, eta = sol["final"], sol["eta"] or eta
            info.update(net_c_f0=sol["c_f0"], final_corr_achieved=sol["rho"],
                        final_corr_reached=sol["rho_reached"])
            if sol["eta_net_reached"] is not None:
                info["eta_net_reached"] = sol["eta_net_reached"]
            if sol["eta_clamped"]:
                info["eta_clamped_to_max"] = True
        elif not cfg.eta:                           # no SPA schedule to solve: the MLP stack's
            eta = min(ETA, max_eta(cfg) * (1.0 - ETA_MAX_MARGIN))   # own eta, clamped
    activation = activation_spec(cfg, eta)
    if uses_eta(cfg):
        info["eta"] = eta
    common = dict(policy=policy, n_layer=cfg.n_layer, block_size=cfg.block_size, activation=activation)
    common["notes"] = clamp_notes(cfg, eta, activation, info)
    if getattr(cfg, "pos", None) == "spa_prior":                # E-SPA's B_l for another model
        spa_prior_config = importlib.import_module("nanospa.signal.beyond.positions").spa_prior_config
        common["prior"] = make_plan(spa_prior_config(cfg))
        info["spa_prior_gamma_final"] = common["prior"].info["gamma_final"]
    if not spa:
        return Plan(kind=None, info=info, **common)
    if final is None:
        final = (given or INDEPENDENT_GAMMA_FINAL) if cfg.attention == "espa" else cfg.rho_final
    info[f"{name}_final"] = final
    values = spa_schedule(cfg.attention, cfg.n_layer, final)
    overrides = None
    if policy in ("qpreserve", "mlp_aware", "joint_qpreserve"):   # A_l off the closed form
        policies = importlib.import_module("nanospa.signal.beyond.policies")
        overrides, more = policies.overrides(cfg, activation, values, policy, final)
        info.update(more)
    return Plan(kind=cfg.attention, schedule=tuple(float(v) for v in values), overrides=overrides,
                info=info, **common)


def clamp_notes(cfg, eta, activation, info):
    """The plan's notes, in words: where the MLPs' eta is the largest reachable C_f(0) (plain
    ReLU layers, max_eta) because the budget aimed higher, the solved TAT leaky ReLU is a ReLU
    up to rounding."""
    if not uses_eta(cfg) or cfg.eta or eta < max_eta(cfg) * (1.0 - 2 * ETA_MAX_MARGIN):
        return ()
    slope = activation_transform(**activation).params.get("negative_slope", 0.0)
    return (f"eta clamped to its largest reachable value {eta:.4g} (plain ReLU layers at depth "
            f"{shaping_depth(cfg)}, below the target {ETA:g}): the TAT leaky ReLU's negative slope is "
            f"{slope:.2g}, a ReLU",)
