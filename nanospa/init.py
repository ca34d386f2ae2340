"""Initialisation: the one bridge from nanospa.signal's float64 numbers to parameters.

docs/method.md §2.4. Every line below that sets a weight is one of the paper's (or one of
nanospa's documented) choices:

    W^V, W^O         independent random orthogonal matrices           [follow-up]
    W^Q              0 for E-SPA, U-SPA and Value-SkipInit            [follow-up]
                     (and for softmax when cfg.zero_query)
    W^K              N(0, 1/d)                                        [choice]
    B_l, D_l         from signal.budget.make_plan (SPA), cast to the model dtype
    alpha, beta      1 and 0 (Value-SkipInit), trainable              [follow-up]
    MLP W_1, W_2     orthogonal times max(sqrt(fan_out / fan_in), 1)  [choice, DKS/TAT]
    embeddings       N(0, 1) tokens (q = 1); with positions N(0, 1 - 0.5) + N(0, 0.5)
    head             N(0, 1/d)                                        [choice]

All random draws come from the model's seeded numpy.random.Generator, on the host.
"""
import math

import numpy as np

from . import backend
from . import functions as F
from .nn import Parameter, orthogonal
from .signal import budget
from .signal.predict import sinusoidal_encoding
from .signal.budget import BUDGETS, make_plan, split_activation  # noqa: F401 (re-exported)

POS_VARIANCE = 0.5  # share of q = 1 given to positional encodings when pos != "none" [choice]


def shaped_names():
    from .signal import shaped_activation_names
    return sorted(shaped_activation_names)


def init_attention(attn, cfg, layer, plan, rng):
    C, H, dt = cfg.n_embd, cfg.n_head, cfg.dtype
    attn.v.weight.data = backend.asarray(orthogonal(rng, C, C), dtype=dt)
    attn.proj.weight.data = backend.asarray(orthogonal(rng, C, C), dtype=dt)
    if cfg.attention != "softmax" or cfg.zero_query:
        attn.q.weight.data = backend.asarray(np.zeros((C, C)), dtype=dt)
    if cfg.attention in ("uspa", "espa"):
        spec = plan.layers[layer - 1]
        B = np.tril(spec["B"])  # above the diagonal the causal mask decides; keep B finite there
        if cfg.train_bias:
            attn.B = Parameter(B, no_decay=True, dtype=dt)  # decaying a bias towards 0 is wrong
        else:
            attn.register_buffer("B", backend.asarray(B, dtype=dt))
        attn.register_buffer("D", backend.asarray(spec["D"], dtype=dt))
    elif cfg.attention == "value_skipinit":
        shape = (H, 1, 1) if cfg.skipinit_per_head else (1,)
        attn.alpha = Parameter(np.ones(shape), no_decay=True, dtype=dt)
        attn.beta = Parameter(np.zeros(shape), no_decay=True, dtype=dt)


def init_mlp(mlp, rng):
    (n_in, n_hidden), dt = mlp.fc.weight.shape, mlp.fc.weight.dtype
    mlp.fc.weight.data = backend.asarray(orthogonal(rng, n_in, n_hidden, max(math.sqrt(n_hidden / n_in), 1.0)), dtype=dt)
    mlp.proj.weight.data = backend.asarray(orthogonal(rng, n_hidden, n_in, max(math.sqrt(n_in / n_hidden), 1.0)), dtype=dt)


class Activation:
    """phi_hat(x) = output_scale * (phi(input_scale * x + input_shift) + output_shift),
    with phi the base activation (leaky ReLU takes negative_slope). Steps whose key is
    absent are skipped. One fused op (functions.Shaped) does the whole map."""

    PLAIN_SLOPE = 0.01  # plain leaky_relu (not shaped)

    def __init__(self, base, method=None, params=None):
        self.base, self.method, self.params = base, method, dict(params or {})
        p = self.params
        self.options = dict(a=float(p.get("input_scale", 1.0)), b=float(p.get("input_shift", 0.0)),
                            s=float(p.get("output_scale", 1.0)), o=float(p.get("output_shift", 0.0)))
        if base == "leaky_relu":
            self.options["slope"] = float(p.get("negative_slope", self.PLAIN_SLOPE))

    def __call__(self, x):
        return F.Shaped.apply(x, base=self.base, **self.options)

    def __repr__(self):
        shown = ", ".join(f"{k}={v:.6g}" for k, v in self.params.items())
        return f"{self.method or 'plain'} {self.base}({shown})"


def sinusoidal(T, C):
    """Sinusoidal positions scaled so each coordinate has mean square POS_VARIANCE (the same
    encoding that signal.predict uses for the input kernel)."""
    return sinusoidal_encoding(T, C, POS_VARIANCE)


def model_plan(cfg):
    """signal.budget's plan plus the engine-side Activation object."""
    plan = budget.make_plan(cfg)
    plan.activation_spec = plan.activation
    plan.activation = Activation(**plan.activation)
    return plan
