"""The plan: the numbers a model is initialised with, as one plain value (docs/method.md §7,
§8, §10; docs/kernel_budget.md §1).

    Plan             the SPA schedule (gamma_0 .. gamma_L for E-SPA, rho_0 .. rho_L for U-SPA)
                     and the MLP activation's targets (what activation_transform solves), with
                     notes where a target could not be met; print(plan) shows it all
    split_activation 'tat_lrelu' -> ('leaky_relu', 'tat')
    residual_weights (a, b, g2) of a block's x -> a x + b f(x): the paper's normalised residual

model.GPT(cfg, plan) builds from any plan: B_l and D_l of block l come from
attn_bias.layer_bias(plan, l), phi_hat from activation_transform(**plan.activation). The
kernel budget (budget.make_plan, docs/kernel_budget.md) is how nanospa chooses the numbers
by default, a configuration's activation targets included (budget.activation_spec); read it
second. The configuration is read by duck typing (GPTConfig's fields).
"""
import importlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from .act_transform import activation_transform, shaped_activation_names


def frozen(value):
    """A read-only copy: arrays with writeable=False, mappings as MappingProxyType, lists
    and tuples as tuples (recursively)."""
    if isinstance(value, np.ndarray):
        value = value.copy()
        value.flags.writeable = False
        return value
    if isinstance(value, Mapping):
        return MappingProxyType({k: frozen(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(frozen(v) for v in value)
    return value


@dataclass(frozen=True)
class Plan:
    """The numbers one configuration is initialised with: made by the kernel budget
    (budget.make_plan) or written by hand, e.g. Plan(policy="by hand", kind="espa",
    n_layer=L, block_size=T, schedule=(inf, gamma_1, ..., gamma_L),
    activation=dict(activation="leaky_relu", method="tat", depth=L, eta=0.5)).
    Immutable once built (frozen fields, read-only arrays and mappings).

    policy      the kernel_budget policy
    kind        "espa" / "uspa" for SPA attention, else None
    n_layer, block_size   L and the T the plan was built for
    schedule    (v_0, ..., v_L): gamma_l (E-SPA, v_0 = inf) or rho_l (U-SPA, v_0 = 0); None
                without SPA. attn_bias.layer_bias(plan, l) gives block l's (B_l, D_l)
    overrides   None, or per layer None / (None, D_l) / (B_l, D_l) where the policy moved
                A_l off the schedule's closed form: qpreserve's D_l (B_l stays the closed
                form), mlp_aware's realised A_l (a dense B_l: no closed form); non-default
                policies only (signal/beyond/policies.py): the default plan has None
    activation  the keyword arguments of act_transform.activation_transform for the MLP's
                phi_hat: activation (base), method, and depth and targets when shaped
    info        the chosen targets and what the policy predicted, for printing and logging
    prior       pos="spa_prior": the Plan of the E-SPA model whose B_l the model adds to its
                softmax logits (signal/beyond/positions.py spa_prior_config; its D_l is not used); else None
    notes       what the plan could not do as asked, in words (a target clamped to the largest
                reachable value: TAT's leaky ReLU then is a ReLU, up to rounding)
    """
    policy: str
    kind: object
    n_layer: int
    block_size: int
    schedule: tuple = None
    overrides: tuple = None
    activation: Mapping = None
    info: Mapping = None
    prior: object = None
    notes: tuple = ()

    def __post_init__(self):
        for name in ("activation", "info"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, {})
        for name in ("schedule", "overrides", "activation", "info", "notes"):
            object.__setattr__(self, name, frozen(getattr(self, name)))

    @property
    def params(self):
        """The shaped activation's parameters (input_scale, ..., negative_slope) as floats."""
        return dict(activation_transform(**self.activation).params)

    def __str__(self):
        name = {"espa": "gamma", "uspa": "rho"}.get(self.kind)
        lines = [f"plan ({self.policy}): {self.n_layer} layers, T = {self.block_size}"]
        if name:
            lines.append(f"  {name}_l, l = 0..{self.n_layer}: " + " ".join(f"{v:.4g}" for v in self.schedule))
        spec = ", ".join(f"{k}={v}" for k, v in self.activation.items())
        params = ", ".join(f"{k}={v:.6g}" for k, v in self.params.items())
        lines.append(f"  activation: {spec}" + (f" -> {params}" if params else ""))
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def split_activation(name):
    """'tat_lrelu' -> ('leaky_relu', 'tat'); a plain activation -> (name, None)."""
    shaped = shaped_activation_names
    if name in shaped:
        base, method = shaped[name]
        return base, method
    return name, None


def residual_weights(cfg):
    """(a, b, g2) of a block's x -> a x + b f(x) (method §2.2) and the kernel gain g2 of a
    branch's weights: none (0, 1), standard (1, 1), normalised (sqrt(1 - beta^2), beta), g2 = 1;
    an extension's from signal/beyond/residuals.py (DeepNorm: (alpha, 1), g2 = beta^2)."""
    beta = cfg.residual_beta
    paper = {"none": (0.0, 1.0, 1.0), "standard": (1.0, 1.0, 1.0),
             "normalised": (math.sqrt(1.0 - beta ** 2), float(beta), 1.0)}
    if cfg.residual in paper:
        return paper[cfg.residual]
    return importlib.import_module("nanospa.signal.beyond.residuals").residual_weights(cfg)
