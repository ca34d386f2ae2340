"""The GPT-style decoder in every variant the paper compares (docs/method.md §2, §4, §8).

    GPTConfig   one dataclass, validated on construction
    GPT         embedding (+ optional positions) -> L blocks -> optional final norm -> head

A block is an attention sublayer then an MLP sublayer, combined as ``residual`` and
``norm`` say:

    residual="none",   norm="none"   X' = MHA(X);                 X_out = MLP(X')   (vanilla)
    residual="none",   norm=N, pre   X' = MHA(N(X));              X_out = MLP(N(X'))
    residual="standard", N, pre      X' = X + MHA(N(X));          X_out = X' + MLP(N(X'))  (Pre-LN)
    residual="standard", N, post     X' = N(X + MHA(X));          X_out = N(X' + MLP(X'))  (Post-LN)
    residual="normalised"            X' = a X + b MHA(N(X)),  a^2 + b^2 = 1 (b = residual_beta)

Attention (per head h; B_l, D_l are fixed buffers computed by init.py from nanospa.signal):

    softmax          P_h = softmax(Q_h K_h^T / sqrt(D) + causal mask)
    value_skipinit   A_h = alpha I + beta P_h        (alpha = 1, beta = 0 trainable)
    uspa / espa      A_h = diag(D_l) softmax(Q_h K_h^T / sqrt(D) + B_l + causal mask)

This file does no signal-propagation maths: it adds stored biases, scales rows by a stored
vector and calls the shaped activation whose parameters init.py chose.
Shapes: B batch, T time, C = n_embd, H heads, D = C / H head width, V vocabulary.
"""
from dataclasses import asdict, dataclass, fields

import numpy as np

from . import backend
from . import functions as F
from . import init as spa_init
from .nn import Embedding, LayerNorm, Linear, Module, Parameter, RMSNorm, DyT
from .tensor import Tensor, no_grad

ATTENTIONS = ("softmax", "value_skipinit", "uspa", "espa")
BASE_ACTIVATIONS = ("relu", "gelu", "gelu_exact", "sigmoid", "tanh", "leaky_relu", "softplus",
                    "elu", "swish", "linear")
RESIDUALS = ("none", "standard", "normalised")
NORMS = ("none", "layernorm", "rmsnorm", "dyt")
NORM_POSITIONS = ("pre", "post")
POSITIONS = ("none", "learned", "sinusoidal")
DTYPES = ("float32", "float64")
BUDGETS = spa_init.BUDGETS


@dataclass
class GPTConfig:
    vocab_size: int = 256
    block_size: int = 128          # maximum sequence length T; SPA buffers are built for it
    n_layer: int = 12
    n_head: int = 4
    n_embd: int = 128
    mlp_ratio: int = 4             # MLP hidden width = mlp_ratio * n_embd
    attention: str = "espa"        # softmax | value_skipinit | uspa | espa
    activation: str = "tat_lrelu"  # plain: relu, gelu, ...; shaped: dks_gelu, tat_lrelu, tat_gelu, ...
    residual: str = "none"         # none | standard | normalised
    residual_beta: float = 0.1     # branch weight b of a normalised residual (a = sqrt(1 - b^2))
    norm: str = "none"             # none | layernorm | rmsnorm | dyt
    norm_position: str = "pre"     # pre | post
    final_norm: str = "auto"       # auto (a final norm when norm != none and residual != none) | yes | no
    pos: str = "none"              # none | learned | sinusoidal
    dtype: str = "float32"         # float32 | float64 (parameters and activations)
    kernel_budget: str = "joint"   # how attention and MLPs share the kernel (docs/kernel_budget.md)
    gamma_final: float = 0.0       # E-SPA final gamma_L; 0 = chosen by kernel_budget
    rho_final: float = 0.8         # U-SPA final rho_L
    final_corr: float = 0.0        # joint budget: adjacent corr. of the input-dependent last kernel; 0 = 0.4
    zeta: float = 1.5              # DKS target max C'(1)
    eta: float = 0.0               # TAT leaky-ReLU target C_f(0) of the MLP stack; 0 = chosen by kernel_budget
    tau: float = 0.3               # TAT smooth target C''(1)
    shaping_depth: int = 0         # nonlinear layers the activation is shaped for; 0 = n_layer
    train_bias: bool = False       # make the SPA bias B_l trainable
    zero_query: bool = False       # softmax attention: W^Q = 0 at init (uniform attention)
    skipinit_per_head: bool = False  # Value-SkipInit: alpha, beta per head instead of per layer
    bias: bool = False             # bias vectors in linear layers

    def __post_init__(self):
        def choice(name, allowed):
            if getattr(self, name) not in allowed:
                raise ValueError(f"GPTConfig.{name}={getattr(self, name)!r} is not one of {list(allowed)}")

        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "mlp_ratio"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"GPTConfig.{name} must be a positive integer, got {value!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"GPTConfig.n_embd={self.n_embd} is not divisible by n_head={self.n_head}")
        choice("attention", ATTENTIONS)
        choice("residual", RESIDUALS)
        choice("norm", NORMS)
        choice("norm_position", NORM_POSITIONS)
        choice("final_norm", ("auto", "yes", "no"))
        choice("pos", POSITIONS)
        choice("dtype", DTYPES)
        choice("kernel_budget", BUDGETS)
        base, method = spa_init.split_activation(self.activation)
        if base not in BASE_ACTIVATIONS:
            allowed = list(BASE_ACTIVATIONS) + spa_init.shaped_names()
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


def make_norm(cfg):
    if cfg.norm == "layernorm":
        return LayerNorm(cfg.n_embd, dtype=cfg.dtype)
    if cfg.norm == "rmsnorm":
        return RMSNorm(cfg.n_embd, dtype=cfg.dtype)
    if cfg.norm == "dyt":
        return DyT(cfg.n_embd, dtype=cfg.dtype)
    return None


class Attention(Module):
    def __init__(self, cfg, layer, plan, rng):
        super().__init__()
        C, H, dt = cfg.n_embd, cfg.n_head, cfg.dtype
        self.n_head, self.kind = H, cfg.attention
        self.q = Linear(C, C, bias=cfg.bias, rng=rng, dtype=dt)
        self.k = Linear(C, C, bias=cfg.bias, rng=rng, dtype=dt)
        self.v = Linear(C, C, bias=cfg.bias, rng=rng, dtype=dt)
        self.proj = Linear(C, C, bias=cfg.bias, rng=rng, dtype=dt)
        spa_init.init_attention(self, cfg, layer, plan, rng)  # q/k/v/proj weights, B_l, D_l, alpha, beta

    def forward(self, x, record=None):
        B, T, C = x.shape
        H, D = self.n_head, C // self.n_head
        q = self.q(x).reshape(B, T, H, D).transpose(0, 2, 1, 3)  # (B, T, C) -> (B, H, T, D)
        k = self.k(x).reshape(B, T, H, D).transpose(0, 2, 1, 3)
        v = self.v(x).reshape(B, T, H, D).transpose(0, 2, 1, 3)
        bias, causal = self.logit_bias(T)
        P = F.softmax(q @ k.transpose(0, 1, 3, 2), bias, scale=1.0 / np.sqrt(D), causal=causal)  # (B, H, T, T)
        y = P @ v                                                   # (B, H, T, D)
        if self.kind in ("uspa", "espa"):
            y = y * Tensor(self.D[:T, None])                         # row i scaled by D_l[i]
        elif self.kind == "value_skipinit":
            y = v * self.alpha + y * self.beta                       # (alpha I + beta P) V
        if record is not None:
            record["attention"] = self.effective_attention(P.data, T)
        y = y.transpose(0, 2, 1, 3).reshape(B, T, C)                # (B, H, T, D) -> (B, T, C)
        return self.proj(y)

    def logit_bias(self, T):
        """What softmax adds to the scaled logits, and whether it must still add the causal
        mask: for a fixed SPA bias, B_l[:T, :T] + mask (-inf above the diagonal), computed
        once per length and cached (it holds B_l, so a new B_l from load_state_dict is seen);
        for a trainable B_l, B_l itself; for the other kinds nothing."""
        if self.kind not in ("uspa", "espa"):
            return None, True
        if isinstance(self.B, Tensor):
            return self.B[:T, :T], True
        cache = self.__dict__.get("_logit_bias")
        if cache is None or cache[0] is not self.B or cache[1].shape[-1] != T:
            mask = F.causal_mask(backend.xp_of(self.B), T, self.B.dtype)
            cache = self._logit_bias = (self.B, Tensor(self.B[:T, :T] + mask))
        return cache[1], False

    def effective_attention(self, P, T):
        """The matrix that multiplies the values: D P (SPA), alpha I + beta P, or P."""
        xp = backend.xp_of(P)
        if self.kind in ("uspa", "espa"):
            return P * self.D[:T, None]
        if self.kind == "value_skipinit":
            return self.alpha.data * xp.eye(T, dtype=P.dtype) + self.beta.data * P
        return P


class MLP(Module):
    def __init__(self, cfg, plan, rng):
        super().__init__()
        C, M = cfg.n_embd, cfg.mlp_ratio * cfg.n_embd
        self.fc = Linear(C, M, bias=cfg.bias, rng=rng, dtype=cfg.dtype)
        self.proj = Linear(M, C, bias=cfg.bias, rng=rng, dtype=cfg.dtype)
        self.act = plan.activation  # a spa_init.Activation: phi_hat(x) = s (phi(a x + b) + o)
        spa_init.init_mlp(self, rng)

    def forward(self, x):
        return self.proj(self.act(self.fc(x)))  # (B, T, C) -> (B, T, 4C) -> (B, T, C)


class Block(Module):
    def __init__(self, cfg, layer, plan, rng):
        super().__init__()
        self.residual, self.position = cfg.residual, cfg.norm_position
        self.attn = Attention(cfg, layer, plan, rng)
        self.mlp = MLP(cfg, plan, rng)
        self.norm1, self.norm2 = make_norm(cfg), make_norm(cfg)
        self.a = float(np.sqrt(1.0 - cfg.residual_beta ** 2))
        self.b = float(cfg.residual_beta)

    def sublayer(self, x, f, norm, record=None, key=None):
        if norm is not None and self.position == "pre":
            h = f(norm(x))
        else:
            h = f(x)
        if record is not None and key:
            record[key] = h.data
        if self.residual == "standard":
            h = x + h
        elif self.residual == "normalised":
            h = x * self.a + h * self.b
        if norm is not None and self.position == "post":
            h = norm(h)
        return h

    def forward(self, x, record=None):
        x = self.sublayer(x, lambda u: self.attn(u, record), self.norm1, record, "attn_out")
        return self.sublayer(x, self.mlp, self.norm2)


class Trace:
    """What ``GPT.trace`` returns: host arrays, one entry per layer (see docs/api.md)."""

    def __init__(self):
        self.hidden, self.attn_out, self.attention = [], [], []


class GPT(Module):
    def __init__(self, cfg, seed=0):
        super().__init__()
        self.config = cfg
        rng = np.random.default_rng(seed)  # all init drawn on the host: same weights on CPU and GPU
        self.plan = spa_init.model_plan(cfg)  # B_l, D_l, the shaped activation: signal maths, float64
        C, dt = cfg.n_embd, cfg.dtype
        pos_var = spa_init.POS_VARIANCE if cfg.pos != "none" else 0.0
        self.wte = Embedding(cfg.vocab_size, C, std=np.sqrt(1.0 - pos_var), rng=rng, dtype=dt)
        self.wpe = None
        if cfg.pos == "learned":
            self.wpe = Embedding(cfg.block_size, C, std=np.sqrt(pos_var), rng=rng, dtype=dt)
        elif cfg.pos == "sinusoidal":
            self.register_buffer("pe", backend.asarray(spa_init.sinusoidal(cfg.block_size, C), dtype=dt))
        self.blocks = [Block(cfg, layer, self.plan, rng) for layer in range(1, cfg.n_layer + 1)]
        self.ln_f = make_norm(cfg) if cfg.uses_final_norm else None
        self.head = Linear(C, cfg.vocab_size, bias=False, rng=rng, dtype=dt)  # N(0, 1/C)

    def embed(self, idx):
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.config.block_size}")
        x = self.wte(idx)                                   # (B, T) -> (B, T, C)
        if self.wpe is not None:
            x = x + self.wpe(np.arange(T))                  # + (T, C)
        elif self.config.pos == "sinusoidal":
            x = x + Tensor(self.pe[:T])
        return x

    def forward(self, idx, targets=None, record=None):
        idx = _as_index(idx)
        x = self.embed(idx)
        if record is not None:
            record.hidden.append(backend.to_numpy(x.data))
        for block in self.blocks:
            layer = {} if record is not None else None
            x = block(x, layer)
            if record is not None:
                record.hidden.append(backend.to_numpy(x.data))
                record.attn_out.append(backend.to_numpy(layer["attn_out"]))
                record.attention.append(backend.to_numpy(layer["attention"]))
        if self.ln_f is not None:
            x = self.ln_f(x)
        logits = self.head(x)                               # (B, T, V)
        loss = None if targets is None else F.cross_entropy(logits, _as_index(targets))
        return logits, loss

    def trace(self, idx):
        """Run without autograd and keep, per block, the block output (``hidden``; [0] is the
        embedding output), the attention sublayer's output before any residual (``attn_out``)
        and the effective attention matrices (``attention``, (B, H, T, T))."""
        tr = Trace()
        with no_grad():
            self.forward(idx, record=tr)
        return tr

    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, rng=None):
        """Sample ``max_new_tokens`` continuations of idx (B, T) with the last block_size tokens
        as context. Returns a host int64 array (B, T + max_new_tokens)."""
        rng = rng if rng is not None else np.random.default_rng(0)
        out = np.asarray(backend.to_numpy(idx), dtype=np.int64)
        with no_grad():
            for _ in range(max_new_tokens):
                logits, _ = self(out[:, -self.config.block_size:])
                z = backend.to_numpy(logits.data[:, -1, :]).astype(np.float64) / max(temperature, 1e-6)
                if top_k is not None:
                    kth = np.sort(z, axis=-1)[:, -min(top_k, z.shape[-1])][:, None]
                    z = np.where(z < kth, -np.inf, z)
                p = np.exp(z - z.max(axis=-1, keepdims=True))
                p /= p.sum(axis=-1, keepdims=True)
                nxt = np.array([rng.choice(p.shape[-1], p=row) for row in p])
                out = np.concatenate([out, nxt[:, None]], axis=1)
        return out

    def num_params(self):
        return sum(p.size for p in self.parameters())


def _as_index(idx):
    idx = idx.data if isinstance(idx, Tensor) else idx
    if not backend.is_device_array(idx):
        idx = np.asarray(idx)
    if idx.dtype.kind not in "iu":
        raise ValueError(f"token indices must be integers, got dtype {idx.dtype}")
    return backend.asarray(idx)
