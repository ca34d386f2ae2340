"""nGPT, the normalised transformer (Loshchilov, Hsieh, Sun, Ginsburg 2024; docs/residuals.md
§3): every hidden state, and every weight matrix along its embedding dimension, on the unit
sphere; residual updates are normalised interpolations with learnable per-dimension rates.

    unit(x)               x / ||x|| over the last axis
    renormalise(p, axis)  a weight parameter's vectors along `axis` back to norm 1, in place
    Scaled                a learnable vector stored at s_scale, used as stored * s_init / s_scale
    QKNorm                q, k of each head on the unit sphere times s_qk; logit scale sqrt(d_k)
    MLP                   h_M = (s_u o u) o phi(s_v o nu sqrt(d)) W_o,  u = h W_u, nu = h W_nu
    Block                 h <- Norm(h + alpha_A o (Norm(h_A) - h)), then the same with alpha_M, h_M
    Embedding, Head       unit token rows; logits s_z o (h W_z) with unit columns of W_z

The weight vectors along the embedding dimension (d_model) are, with nanospa's (in, out)
weights: the columns of W^Q, W^K, W^V, W_u, W_nu and W_z (axis 0), the rows of W^O, the
MLP's W_o and the embedding table (axis 1). They are normalised once at construction and
again after every optimiser step by the modules' after_step() (GPT.after_step() calls it;
train.py, the experiments and the benchmark call that), so a checkpoint holds them as the
plain parameters they are. Constants: signal/beyond/residuals.py (NGPT_INITS).

    NGPT                  the registry row of residual="ngpt" (beyond.EXTENSIONS): its embedding,
                          block (softmax attention with QKNormHook) and head for model.GPT, and
                          its walk at init (NGPTMaps, predict.BlockMaps with the maps of
                          signal/beyond/ngpt_maps.py)

Not here: the combination rules (schemes.check_config), the constants
(signal/beyond/residuals.py).
"""
import math

import numpy as np

from .. import backend
from ..fused import rms_norm
from ..model import variant
from ..nn import Embedding as TokenEmbedding
from ..nn import Linear, Module, Parameter
from ..predict import BlockMaps
from ..signal.beyond import ngpt_maps
from ..signal.beyond.residuals import NGPT_ALPHA_INIT, ngpt_scale, ngpt_value
from ..tensor import Tensor


def unit(x):
    """x / ||x|| over the last axis: RMSNorm without eps and with the constant gain 1/sqrt(n)
    (fused.rms_norm: x / sqrt(mean(x^2)) / sqrt(n) = x / sqrt(sum(x^2)))."""
    n = x.shape[-1]
    gain = Tensor(backend.xp_of(x.data).full((n,), 1.0 / math.sqrt(n), dtype=x.dtype))
    return rms_norm(x, gain, eps=0.0)


def renormalise(p, axis):
    """Divide a parameter's data by its norms along `axis`, in place (same buffer, same layout)."""
    w = p.data
    w /= backend.xp_of(w).sqrt((w * w).sum(axis=axis, keepdims=True))


def update(h, branch, alpha):
    """nGPT's residual step h <- Norm(h + alpha o (Norm(branch) - h)), alpha per dimension."""
    return unit(h + (unit(branch) - h) * alpha)


class Scaled(Module):
    """nGPT's learnable vector `name` (a key of signal.residuals.NGPT_INITS): stored at
    s_scale, used as stored * (s_init / s_scale), so it starts at s_init and Adam moves the
    used value s_init / s_scale times faster than the stored one. Never weight-decayed."""

    def __init__(self, shape, name, d, dtype):
        super().__init__()
        scale = ngpt_scale(name, d)
        self.weight = Parameter(np.full(shape, scale), no_decay=True, dtype=dtype)
        self.factor = ngpt_value(name) / scale

    def forward(self):
        return self.weight * self.factor


class QKNormHook:
    """nGPT's attention hook (model.Attention.attach): q and k of each head on the unit sphere
    times s_qk (a QKNorm, attn.qk_norm), the softmax scale sqrt(d_k)."""

    def __init__(self, cfg):
        self.cfg = cfg

    def attach(self, attn):
        attn.qk_norm = self.module = QKNorm(self.cfg)

    def logits(self, q, k, scale, bias, start=0):
        return self.module(q), self.module(k), self.module.scale(q.shape[-1]), bias


class QKNorm(Module):
    """q and k of each head to the unit sphere, times s_qk (one per head dimension, (H, 1, D)):
    the logits are then sqrt(d_k) (s_qk o q_hat) . (s_qk o k_hat), the softmax scale sqrt(d_k)
    in place of 1 / sqrt(d_k) (scale())."""

    def __init__(self, cfg):
        super().__init__()
        self.s_qk = Scaled((cfg.n_head, 1, cfg.head_size), "s_qk", cfg.n_embd, cfg.dtype)

    def forward(self, q):
        return unit(q) * self.s_qk()                 # (B, H, T, D), unit rows times s_qk

    @staticmethod
    def scale(D):
        return math.sqrt(D)


class MLP(Module):
    """nGPT's gated MLP: u = h W_u, nu = h W_nu (each (C, M), unit columns), h_M =
    ((s_u o u) o phi(s_v o nu sqrt(C))) W_o with W_o (M, C) of unit rows. The sqrt(C) brings
    nu, a projection of a unit vector, to unit variance. The reference code scales u by
    sqrt(C) as well; the output is normalised next, so that changes nothing (not even s_u's
    gradient). phi: the configuration's plain activation (the paper's: swish)."""

    def __init__(self, cfg, act, rng):
        super().__init__()
        C, M, dt = cfg.n_embd, cfg.mlp_ratio * cfg.n_embd, cfg.dtype
        self.fc_u = Linear(C, M, rng=rng, dtype=dt)     # N(0, 1/C) draws, normalised below
        self.fc_v = Linear(C, M, rng=rng, dtype=dt)
        self.proj = Linear(M, C, rng=rng, dtype=dt)
        self.s_u = Scaled((M,), "s_u", C, dt)
        self.s_v = Scaled((M,), "s_v", C, dt)
        self.act, self.sqrt_d = act, math.sqrt(C)
        self.after_step()

    def forward(self, x):
        u = self.fc_u(x) * self.s_u()                   # (B, T, C) -> (B, T, M)
        nu = self.fc_v(x) * (self.s_v() * self.sqrt_d)  # (B, T, M), unit variance at init
        return self.proj(u * self.act(nu))              # (B, T, M) -> (B, T, C)

    def after_step(self):
        for layer, axis in ((self.fc_u, 0), (self.fc_v, 0), (self.proj, 1)):
            renormalise(layer.weight, axis)


class Block(Module):
    """One nGPT block around `attn`, a model.Attention built for this configuration (its
    qk_norm is a QKNorm): h_A = attention(h), h <- Norm(h + alpha_A o (Norm(h_A) - h)), then
    the MLP likewise with alpha_M. No norm layers. after_step() renormalises the attention's
    matrices (the MLP renormalises its own)."""

    def __init__(self, cfg, attn, act, rng):
        super().__init__()
        C, dt = cfg.n_embd, cfg.dtype
        self.attn = attn
        self.mlp = MLP(cfg, act, rng)
        self.alpha_attn = Scaled((C,), "alpha", C, dt)
        self.alpha_mlp = Scaled((C,), "alpha", C, dt)
        self.after_step()

    def forward(self, x, record=None, carry=None, cache=None):
        h = self.attn(x, record, carry, cache)          # (B, T, C), before normalisation
        if record is not None:
            record["attn_out"] = h.data
        x = update(x, h, self.alpha_attn())
        return update(x, self.mlp(x), self.alpha_mlp())

    def after_step(self):
        a = self.attn
        for layer, axis in ((a.q, 0), (a.k, 0), (a.v, 0), (a.proj, 1)):
            renormalise(layer.weight, axis)


class Embedding(TokenEmbedding):
    """The input embedding with unit rows. forward also normalises the rows it looks up: a
    no-op after after_step(), and it keeps h_0 on the sphere wherever the table is not (a
    gradient check's perturbed table), as the reference code's Norm(h) in every block does."""

    def __init__(self, n, dim, rng, dtype):
        super().__init__(n, dim, std=1.0, rng=rng, dtype=dtype)
        self.after_step()

    def forward(self, idx):
        return unit(super().forward(idx))               # (B, T) -> (B, T, C), unit rows

    def after_step(self):
        renormalise(self.weight, 1)


class Head(Module):
    """Logits z = s_z o (h W_z), W_z (C, V) with unit columns, s_z per token (init 1): at
    init every logit is a cosine, in [-1, 1]."""

    def __init__(self, C, V, rng, dtype):
        super().__init__()
        self.out = Linear(C, V, rng=rng, dtype=dtype)
        self.s_z = Scaled((V,), "s_z", C, dtype)
        self.after_step()

    def forward(self, x):
        return self.out(x) * self.s_z()                 # (B, T, C) -> (B, T, V)

    def after_step(self):
        renormalise(self.out.weight, 0)


class NGPT:
    """residual="ngpt" (beyond.EXTENSIONS): the parts model.GPT takes from it (embedding,
    block, head) and its walk at init for nanospa/predict.py (maps)."""
    kv_cache = True     # unit rows and per-token updates: the new positions alone, with the keys kept

    def __init__(self, cfg):
        self.branch_gain2 = 1.0

    @staticmethod
    def embedding(cfg, rng):
        return Embedding(cfg.vocab_size, cfg.n_embd, rng=rng, dtype=cfg.dtype)

    @staticmethod
    def block(cfg, plan, layer, act, rng, hooks=(), evaluate=None):
        attn = variant("attention", cfg.attention)(cfg, plan, layer, rng, evaluate)
        attn.attach(list(hooks) + [QKNormHook(cfg)])
        return Block(cfg, attn, act, rng)

    @staticmethod
    def head(cfg, rng):
        return Head(cfg.n_embd, cfg.vocab_size, rng=rng, dtype=cfg.dtype)

    @staticmethod
    def maps(cfg, plan, batch=None, softmax_samples=32):
        return NGPTMaps(cfg, plan, batch=batch, softmax_samples=softmax_samples)


class NGPTMaps(BlockMaps):
    """nGPT's block in the wide limit at init (signal/beyond/ngpt_maps.py): unit hidden states
    (kernels C / d), logits of the normalised kernel, the gated MLP, the normalised update.
    alpha: alpha_A = alpha_M (NGPT_ALPHA_INIT at init; a test may pass another)."""

    def __init__(self, cfg, plan, batch=None, softmax_samples=32, alpha=NGPT_ALPHA_INIT):
        if batch:
            raise ValueError("predict_kernels(batch=...) is for batch statistics; nGPT has none: "
                             "predict one sequence's kernel")
        super().__init__(cfg, plan, None, softmax_samples)
        self.d, self.m, self.alpha = cfg.n_embd, cfg.mlp_ratio, float(alpha)

    def embedding(self, Sigma_0):
        return ngpt_maps.embedding(Sigma_0, self.d)

    def logit_kernel(self, Sigma):
        return ngpt_maps.logit_kernel(Sigma)

    def mlp(self, Sigma):
        return ngpt_maps.mlp(Sigma, self.mlp_map, self.d, self.m)

    def branch_input(self, Sigma):
        return Sigma

    def combine(self, Sigma_x, Sigma_h):
        return ngpt_maps.update(Sigma_x, Sigma_h, self.alpha, self.d)

    def final(self, Sigma):
        return Sigma
