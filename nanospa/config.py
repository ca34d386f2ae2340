"""GPTConfig: the one description of a model, validated on construction (docs/method.md §2).

Every variant the paper compares is a value of a field: attention (softmax, Value-SkipInit,
U-SPA, E-SPA), residual and norm arrangement, positions, the shaped activation and the
kernel budget that shares the kernel between attention and MLPs (docs/kernel_budget.md).
The allowed values of attention, residual, norm and pos are model.py's registries; a value
they do not hold is an extension of nanospa/beyond/, which checks it (and the fields of the
last block below) only when one is set: a configuration of the paper's variants never loads
beyond/. A bad field raises ValueError naming the field and the allowed values. Not here:
building the model (model.py) and the signal-propagation numbers it is initialised with
(nanospa/signal, read by duck typing from these fields).
"""
import importlib
from dataclasses import asdict, dataclass, fields

import numpy as np

from .model import REGISTRIES
from .signal import BUDGETS, shaped_activation_names, split_activation
from .signal.activations import ACTIVATIONS
from .signal.kernels import DEFAULT_RHO_FINAL

BASE_ACTIVATIONS = tuple(ACTIVATIONS)   # the one registry of phi (signal/activations.py)
NORM_POSITIONS = ("pre", "post")
DTYPES = ("float32", "float64")
MIN_SPA_BLOCK = 2     # U-SPA / E-SPA: a kernel over one position has no correlation to schedule
SPA = ("uspa", "espa")


@dataclass
class GPTConfig:
    vocab_size: int = 256
    block_size: int = 128          # maximum sequence length T; SPA buffers are built for it
    n_layer: int = 12
    n_head: int = 4
    n_embd: int = 128
    mlp_ratio: int = 4             # MLP hidden width = mlp_ratio * n_embd
    attention: str = "auto"        # softmax | value_skipinit | uspa | espa; auto: espa (an extension may choose)
    activation: str = "tat_lrelu"  # plain: relu, gelu, ...; shaped: dks_gelu, tat_lrelu, tat_gelu, ...
    residual: str = "none"         # none | standard | normalised (extensions: docs/residuals.md)
    residual_beta: float = 0.1     # branch weight b of a normalised residual (a = sqrt(1 - b^2))
    norm: str = "none"             # none | layernorm | rmsnorm (extensions: docs/norms.md)
    norm_position: str = "auto"    # pre | post; auto: pre (an extension may choose)
    final_norm: str = "auto"       # auto (a final norm when norm != none and residual != none) | yes | no
    pos: str = "none"              # none | learned | sinusoidal, added to the embedding (extensions: docs/positions.md)
    dtype: str = "float32"         # float32 | float64 (parameters and activations)
    kernel_budget: str = "joint"   # how attention and MLPs share the kernel (docs/kernel_budget.md)
    gamma_final: float = 0.0       # E-SPA final gamma_L; 0 = chosen by kernel_budget
    rho_final: float = DEFAULT_RHO_FINAL  # U-SPA final rho_L (0.8)
    final_corr: float = 0.0        # joint budget: adjacent corr. of the input-dependent last kernel; 0 = 0.4
    zeta: float = 1.5              # DKS target max C'(1)
    eta: float = 0.0               # TAT leaky-ReLU target C_f(0) of the MLP stack; 0 = chosen by kernel_budget
    tau: float = 0.3               # TAT smooth target C''(1)
    shaping_depth: int = 0         # nonlinear layers the activation is shaped for; 0 = n_layer
    train_bias: bool = False       # make the SPA bias B_l trainable
    zero_query: bool = False       # softmax attention: W^Q = 0 at init (uniform attention)
    skipinit_per_head: bool = False  # Value-SkipInit: alpha, beta per head instead of per layer
    bias: bool = False             # bias vectors in linear layers
    # -- beyond the paper: read by nanospa/beyond/ (checked there when one is set)
    norm_causal: bool = False      # batchnorm, prepbn: statistics over positions <= t only (no future leakage)
    norm_groups: int = 4           # groupnorm: groups of n_embd / norm_groups channels; 1 = LayerNorm
    prepbn_steps: int = 400        # prepbn: optimiser steps over which LN's share falls from 1 to 0
    prepbn_eta: float = 1.0        # prepbn: RepBN's eta at init (SLAB's 1; 0: RepBN starts as plain BN)
    attention_impl: str = "auto"   # auto (dense up to T = 256, else by blocks: nanospa/beyond/blockwise.py) | dense | blockwise
    attention_block: int = 0       # blockwise attention's query/key block size; 0 = chosen by T
    residual_attention: bool = False  # RealFormer: pre-softmax scores carried to the next layer (dense only)
    tie_embeddings: bool = False   # the head is W_e^T / sqrt(n_embd), the token embedding's one Parameter (nanoGPT's tying; beyond/tied.py)
    dropout: float = 0.0           # inverted dropout in training mode: attention probabilities, sublayer outputs, embedding (nanoGPT's; beyond/dropout.py)

    def __post_init__(self):
        beyond = None if self.paper_only() else importlib.import_module("nanospa.beyond")
        if beyond:
            beyond.resolve_auto(self)                   # an extension's own "auto" values first
        if self.attention == "auto":
            self.attention = "espa"
        if self.norm_position == "auto":
            self.norm_position = "pre"

        def choice(name, allowed):
            if getattr(self, name) not in allowed:
                raise ValueError(f"GPTConfig.{name}={getattr(self, name)!r} is not one of {list(allowed)}")

        for f in fields(self):              # nan passes a range check written as `x <= 1` or `x < 0`
            value = getattr(self, f.name)
            if f.type in (float, "float") and not (isinstance(value, (int, float, np.number))
                                                    and not isinstance(value, bool) and np.isfinite(value)):
                raise ValueError(f"GPTConfig.{f.name} must be a finite number, got {value!r}")
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "mlp_ratio"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"GPTConfig.{name} must be a positive integer, got {value!r}")
        if self.attention in SPA and self.block_size < MIN_SPA_BLOCK:
            raise ValueError(f"GPTConfig.block_size={self.block_size} is too small for attention={self.attention!r}: "
                             f"SPA shapes the correlations between positions, so it needs block_size >= "
                             f"{MIN_SPA_BLOCK}")
        if self.n_embd % self.n_head:
            raise ValueError(f"GPTConfig.n_embd={self.n_embd} is not divisible by n_head={self.n_head}")
        for name in REGISTRIES:
            if beyond is None:
                choice(name, REGISTRIES[name])
        choice("norm_position", NORM_POSITIONS)
        choice("final_norm", ("auto", "yes", "no"))
        choice("dtype", DTYPES)
        choice("kernel_budget", BUDGETS)
        base, method = split_activation(self.activation)
        if base not in BASE_ACTIVATIONS:
            allowed = list(BASE_ACTIVATIONS) + sorted(shaped_activation_names)
            raise ValueError(f"GPTConfig.activation={self.activation!r} is not one of {allowed}")
        if not 0.0 < self.residual_beta < 1.0:
            raise ValueError(f"GPTConfig.residual_beta must be in (0, 1), got {self.residual_beta}")
        if not 0.0 <= self.rho_final < 1.0:
            raise ValueError(f"GPTConfig.rho_final must be in [0, 1), got {self.rho_final}")
        if self.gamma_final < 0:
            raise ValueError(f"GPTConfig.gamma_final must be > 0 (or 0 for the budget's choice), "
                             f"got {self.gamma_final}")
        if not 0.0 <= self.final_corr < 1.0:
            raise ValueError(f"GPTConfig.final_corr must be in [0, 1), got {self.final_corr}")
        if not 0.0 <= self.eta < 1.0:
            raise ValueError(f"GPTConfig.eta must be in [0, 1) (0 = budget's choice), got {self.eta}")
        if self.zeta <= 1.0:
            raise ValueError(f"GPTConfig.zeta must be > 1, got {self.zeta}")
        if self.tau <= 0.0:
            raise ValueError(f"GPTConfig.tau must be > 0, got {self.tau}")
        if self.shaping_depth < 0:
            raise ValueError(f"GPTConfig.shaping_depth must be >= 0, got {self.shaping_depth}")
        if beyond:
            beyond.configure(self)                      # the extensions' values and fields

    def paper_only(self):
        """True when every field names one of the paper's variants and the fields of the
        last block keep their defaults: nothing of nanospa/beyond/ is needed."""
        named = all(getattr(self, f) in REGISTRIES[f] or getattr(self, f) == "auto" and f == "attention"
                    for f in REGISTRIES)
        return named and all(getattr(self, f.name) == f.default for f in fields(self) if f.name in BEYOND_FIELDS)

    @property
    def head_size(self):
        return self.n_embd // self.n_head

    @property
    def uses_final_norm(self):
        if self.final_norm == "auto":
            return self.norm != "none" and self.residual != "none"
        return self.final_norm == "yes"

    def to_dict(self):
        return asdict(self)

    @classmethod
    def from_dict(cls, d):
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


BEYOND_FIELDS = ("norm_causal", "norm_groups", "prepbn_steps", "prepbn_eta", "attention_impl", "attention_block",
                 "residual_attention", "tie_embeddings", "dropout")
