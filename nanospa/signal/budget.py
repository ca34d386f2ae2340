"""The kernel budget: how attention and the MLP activations share the path from the input
kernel Sigma_0 = I to the last layer (docs/method.md §10).

``make_plan(cfg)`` turns a model configuration into every number the model's
initialisation needs, in float64: per layer the SPA bias B_l and rescaling D_l, and the
shaped activation's parameters. init.py only casts these to the model's dtype and device.

Policies (``cfg.kernel_budget``):

    independent   E-SPA/U-SPA targets and the activation shaped separately, as the known
                  third-party reimplementations do: gamma_L = 0.005 (rho_L = cfg.rho_final),
                  TAT leaky ReLU eta = 0.9 over the chain of n_layer MLPs.

Notation: T = block_size, L = n_layer, gamma_l / rho_l the SPA schedule, eta / zeta / tau
the activation targets (docs/activations.md).
"""
from dataclasses import dataclass, field

import numpy as np

from .act_transform import activation_transform, shaped_activation_names
from .attn_bias import bias_and_rescale, espa_log_attention, log_attention_from, uspa_attention
from .kernels import espa_gammas, uspa_rhos

BUDGETS = ("independent", "joint")

INDEPENDENT_GAMMA_FINAL = 0.005
INDEPENDENT_ETA = 0.9
PARAM_KEYS = ("input_scale", "input_shift", "output_scale", "output_shift", "negative_slope")


@dataclass
class Plan:
    """Everything init.py needs, as float64 host arrays and Python numbers.

    layers      list of L dicts {"B": (T, T), "D": (T,), "gamma" or "rho": float} for SPA
                attention; None for softmax and Value-SkipInit
    activation  dict(base=..., method=..., params={input_scale, ...}) for the MLP
    info        the chosen targets, for printing and logging
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


def activation_plan(cfg, eta=None):
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


def spa_layers(cfg, gamma_final):
    """Per-layer B_l, D_l realising the attention-only SPA targets."""
    T, L = cfg.block_size, cfg.n_layer
    layers = []
    if cfg.attention == "espa":
        gammas = espa_gammas(L, gamma_final)
        for l in range(1, L + 1):
            B, D = bias_and_rescale(espa_log_attention(T, gammas[l], gammas[l - 1]))
            layers.append(dict(B=B, D=D, gamma=float(gammas[l])))
    elif cfg.attention == "uspa":
        rhos = uspa_rhos(L, cfg.rho_final)
        for l in range(1, L + 1):
            B, D = bias_and_rescale(log_attention_from(uspa_attention(T, rhos[l], rhos[l - 1])))
            layers.append(dict(B=B, D=D, rho=float(rhos[l])))
    else:
        return None
    return layers


def make_plan(cfg):
    if cfg.kernel_budget not in BUDGETS:
        raise ValueError(f"kernel_budget={cfg.kernel_budget!r} is not one of {list(BUDGETS)}")
    gamma_final = cfg.gamma_final or INDEPENDENT_GAMMA_FINAL
    eta = cfg.eta or INDEPENDENT_ETA
    info = dict(policy=cfg.kernel_budget, gamma_final=gamma_final, eta=eta,
                depth=shaping_depth(cfg))
    return Plan(policy=cfg.kernel_budget, layers=spa_layers(cfg, gamma_final),
                activation=activation_plan(cfg, eta), info=info)
