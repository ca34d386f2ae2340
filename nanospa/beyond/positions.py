"""Positions inside attention, the model's side (docs/positions.md): the position schemes
pos="rope", "alibi" and "spa_prior", each a model.Position (registered in beyond.EXTENSIONS)
with a hook per block on its queries, keys or logits and what it is at initialisation.

    RoPE, RopeHook       queries and keys rotated by position (the Function Rope: y = R_t x,
                         forward above backward; rope(x, cos, sin) its Tensor spelling); at init
                         the mean field's rotation (rotation_at_init)
    ALiBi, AlibiHook     -m_h (i - j) added to head h's logits, block by block on the device, in
                         float64 with any other fixed logits and rounded once; at init that bias
    SPAPrior, PriorHook  E-SPA's B_l of another model added to softmax's logits, stored as a
                         buffer attn.B (or by blocks); at init that B_l

RoPE (RoFormer's convention, interleaved pairs): at position t, each pair (x[2k], x[2k+1])
of a head's query or key is rotated by the angle t theta_k, theta_k = 10000^(-2k/D):

    y[2k]   = x[2k] cos(t theta_k) - x[2k+1] sin(t theta_k)
    y[2k+1] = x[2k] sin(t theta_k) + x[2k+1] cos(t theta_k)

It is linear and orthogonal, so its backward is the inverse rotation (sin -> -sin), and
q_i . k_j depends on i and j only through j - i. The numbers (slopes, frequencies, the
prior's plan) come from nanospa.signal.beyond.positions; here they are only cast and applied.
Not here: learned and sinusoidal positions (added to the embedding: model.Position), the
SPA biases themselves (nanospa.signal.attn_bias), the attention op (model.py, fused.py).
"""
import functools

import numpy as np

from .. import backend
from .. import signal
from ..model import Position


class LogitPosition(Position):
    """The schemes here add nothing to the embedding: Sigma_0 is the kernel without positions."""

    def build(self, model, rng):
        pass

    def embed(self, model, x, T, start=0):
        return x

    @staticmethod
    def at_init(cfg, T=None, tokens=None):
        return signal.input_kernel(tokens, T, pos="none")
from ..nn import Parameter
from ..signal.attn_bias import bias_block, layer_bias
from ..signal.cholesky import dense_layer_bias
from ..signal.beyond.positions import alibi_bias, rope_angles, rope_frequencies
from ..signal.beyond.positions import alibi_slopes as signal_alibi_slopes
from ..tensor import Function


def _rotate(xp, x, cos, sin, sign):
    """R_t x (sign 1) or R_t^T x (sign -1) over the last two axes (T, D); cos, sin (T_max, D/2)."""
    T = x.shape[-2]
    c, s = cos[:T], sin[:T]                                     # (T, D/2)
    x1, x2 = x[..., 0::2], x[..., 1::2]                         # (..., T, D/2) each
    y = xp.empty_like(x)
    if sign > 0:
        y[..., 0::2] = x1 * c - x2 * s
        y[..., 1::2] = x1 * s + x2 * c
    else:
        y[..., 0::2] = x1 * c + x2 * s
        y[..., 1::2] = x2 * c - x1 * s
    return y


class Rope(Function):
    """y = R_t x for x (..., T, D): the rotation of the module docstring, position t on
    axis -2. cos, sin: (T_max, D/2) tables in x's dtype and module (options, not inputs).
    Backward: gx = R_t^T g, the inverse rotation."""

    def forward(ctx, x, cos, sin):
        ctx.cos, ctx.sin = cos, sin
        return _rotate(ctx.xp, x, cos, sin, 1)

    def backward(ctx, g):
        return _rotate(ctx.xp, g, ctx.cos, ctx.sin, -1)


def rope(x, cos, sin):
    """RoPE on a Tensor x (..., T, D) -> (..., T, D)."""
    return Rope.apply(x, cos=cos, sin=sin)


@functools.lru_cache(maxsize=None)
def _tables(T, D, dtype, xp):
    angles = rope_angles(T, D)                                  # (T, D/2) float64
    return backend.asarray(np.cos(angles), dtype=dtype), backend.asarray(np.sin(angles), dtype=dtype)


class RoPE(LogitPosition):
    """pos="rope": every block's queries and keys rotated by position (RopeHook); at init the
    softmax mean field's logits rotate too (signal.softmax_attention_map's rope), and with
    W^Q = 0 RoPE changes nothing."""
    kv_cache = True     # the new queries and keys rotated at their own positions (RopeHook's start)

    def build(self, model, rng):
        cfg = self.cfg   # (cos, sin) (block_size, D/2), shared by every layer and model of the same shape
        self.tables = _tables(cfg.block_size, cfg.n_embd // cfg.n_head, cfg.dtype, backend.xp())

    def hooks(self, layer):
        return [RopeHook(*self.tables)]

    @staticmethod
    def rotation_at_init(cfg):
        return rope_frequencies(cfg.n_embd // cfg.n_head)


class RopeHook:
    def __init__(self, cos, sin):
        self.cos, self.sin = cos, sin

    def attach(self, attn):
        pass

    def logits(self, q, k, scale, bias, start=0):
        """q, k (B, H, T, D) of positions start.. rotated at those positions."""
        cos, sin = self.cos[start:], self.sin[start:]
        return rope(q, cos, sin), rope(k, cos, sin), scale, bias


class ALiBi(LogitPosition):
    """pos="alibi": -m_h (i - j) added to head h's scaled logits (AlibiHook; with the slopes on
    the model's device, each block of the bias made there), nothing added to the embedding."""
    kv_cache = True     # the new rows of -m_h (i - j), made for them (model.dense_bias)

    def build(self, model, rng):
        self.slopes = backend.asarray(signal_alibi_slopes(self.cfg.n_head))   # (H,) float64

    def hooks(self, layer):
        return [AlibiHook(self.slopes)]

    @staticmethod
    def logit_bias_at_init(cfg, plan, layer, T):
        return alibi_bias(signal_alibi_slopes(cfg.n_head), 0, T, 0, T)


class AlibiHook:
    """Adds -m_h (i - j) to the fixed logits' blocks: computed in float64 with whatever blocks
    there were (SPA's B_l by blocks) and rounded once; (H, n, w), one bias per head."""

    def __init__(self, slopes):
        self.slopes = slopes

    def attach(self, attn):
        pass

    def logits(self, q, k, scale, bias, start=0):
        return q, k, scale, self.bias(bias)

    def bias(self, bias):
        stored, inner = bias
        xp = backend.xp_of(self.slopes)

        def blocks(i0, i1, j0, j1, dtype):
            made = alibi_bias(self.slopes, i0, i1, j0, j1, xp=xp)        # (H, n, w) float64
            if inner is not None:
                made = made + inner(i0, i1, j0, j1, np.float64)
            return made.astype(dtype, copy=False)
        return stored, blocks


class SPAPrior(LogitPosition):
    """pos="spa_prior" (softmax or Value-SkipInit attention): E-SPA's B_l of the model
    positions.spa_prior_config describes added to every block's logits (PriorHook), without
    its D_l; the plan's prior (signal.make_plan) holds that model's plan."""
    kv_cache = True     # the new rows of the prior's B_l, as SPA's (model.dense_bias)

    def hooks(self, layer):
        return [PriorHook(self.cfg, self.plan.prior, layer)]

    @staticmethod
    def logit_bias_at_init(cfg, plan, layer, T):
        return dense_layer_bias(plan.prior, layer, T)[0]


class PriorHook:
    """The prior's B_l on the attention it attaches to: attn.B, a (T, T) buffer (a Parameter
    with train_bias), or its O(T) parts attn.parts where attention is evaluated by blocks."""

    def __init__(self, cfg, prior, layer):
        self.cfg, self.prior, self.layer = cfg, prior, layer

    def attach(self, attn):
        cfg, T = self.cfg, self.cfg.block_size
        parts, _ = layer_bias(self.prior, self.layer)
        self.attn, attn.parts = attn, None
        if cfg.train_bias:
            attn.B = Parameter(np.tril(bias_block(parts, 0, T, 0, T)), no_decay=True, dtype=cfg.dtype)
        elif getattr(attn.evaluate, "by_blocks", False):
            attn.parts = {k: backend.asarray(v) if isinstance(v, np.ndarray) else v for k, v in parts.items()}
        else:
            attn.register_buffer("B", backend.asarray(np.tril(bias_block(parts, 0, T, 0, T)), dtype=cfg.dtype))

    def logits(self, q, k, scale, bias, start=0):
        return q, k, scale, self.bias(bias)

    def bias(self, bias):
        parts = self.attn.parts
        if parts is None:
            return self.attn.B, bias[1]
        xp = backend.xp_of(*(v for v in parts.values() if hasattr(v, "shape")))
        return bias[0], lambda i0, i1, j0, j1, dtype: bias_block(parts, i0, i1, j0, j1, dtype, xp=xp)


def check_config(cfg):
    """ValueError naming a position scheme's field that cannot work: RoPE needs an even head
    width; E-SPA's prior needs attention without a B_l of its own and T >= 2."""
    if cfg.pos == "rope" and cfg.n_embd // cfg.n_head % 2:
        raise ValueError(f"GPTConfig.pos='rope' rotates pairs of coordinates: the head width n_embd / n_head = "
                         f"{cfg.n_embd // cfg.n_head} must be even")
    if cfg.pos == "spa_prior" and cfg.attention in ("uspa", "espa"):
        raise ValueError(f"GPTConfig.pos='spa_prior' gives attention without SPA E-SPA's bias B_l; "
                         f"attention={cfg.attention!r} has its own: use pos='none' there, or attention in "
                         f"['softmax', 'value_skipinit']")
    if cfg.pos == "spa_prior" and cfg.block_size < 2:
        raise ValueError(f"GPTConfig.block_size={cfg.block_size} is too small for pos='spa_prior': SPA shapes the "
                         "correlations between positions, so it needs block_size >= 2")
