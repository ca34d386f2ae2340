"""Positions inside attention, the model's side (docs/positions.md): RoPE's rotation of
queries and keys as one op, and the fixed logit biases of ALiBi (and ALiBi added to a
stored B_l) as the blocks model.Attention's dense and blockwise paths ask for.

    Rope                 the Function: y = R_t x, forward above backward, on raw xp arrays
    rope(x, cos, sin)    its Tensor spelling; rope_tables(cfg) the (cos, sin) it needs
    alibi_slopes(cfg)    ALiBi's slopes m_h for pos="alibi" (on the current device), else None
    fixed_bias(parts, slopes, i0, i1, j0, j1, dtype)
                         block [i0:i1, j0:j1] of SPA's (or the prior's) B_l from its O(T) parts,
                         plus -m_h (i - j) per head: (n, w), or (H, n, w) with ALiBi

RoPE (RoFormer's convention, interleaved pairs): at position t, each pair (x[2k], x[2k+1])
of a head's query or key is rotated by the angle t theta_k, theta_k = 10000^(-2k/D):

    y[2k]   = x[2k] cos(t theta_k) - x[2k+1] sin(t theta_k)
    y[2k+1] = x[2k] sin(t theta_k) + x[2k+1] cos(t theta_k)

It is linear and orthogonal, so its backward is the inverse rotation (sin -> -sin), and
q_i . k_j depends on i and j only through j - i. The numbers (slopes, frequencies, the
prior's plan) come from nanospa.signal.beyond.positions; here they are only cast and applied.
Not here: learned and sinusoidal positions (added to the embedding: model.GPT.embed), the
SPA biases themselves (nanospa.signal.attn_bias), the attention op (attention.py, fused.py).
"""
import functools

import numpy as np

from .. import backend
from ..signal.attn_bias import bias_block
from ..signal.beyond.positions import alibi_bias, rope_angles
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


def rope_tables(cfg):
    """(cos, sin) of the angles t theta_k, (block_size, D/2) in the model's dtype on the
    current device, for pos="rope" (shared by every layer and model of the same shape);
    else None."""
    if cfg.pos != "rope":
        return None
    return _tables(cfg.block_size, cfg.n_embd // cfg.n_head, cfg.dtype, backend.xp())


def alibi_slopes(cfg):
    """ALiBi's slopes (n_head,) float64 on the current device for pos="alibi", else None."""
    return backend.asarray(signal_alibi_slopes(cfg.n_head)) if cfg.pos == "alibi" else None


def fixed_bias(parts, slopes, i0, i1, j0, j1, dtype):
    """The constant logit bias of block [i0:i1, j0:j1] as an array of `dtype`, made where
    the parts and slopes are (on a GPU, on it: nothing is copied per block): B_l from its
    O(T) parts (bias_block, -inf above the diagonal; parts None: none), plus ALiBi's
    -m_h (i - j) when slopes is given, which makes it (H, n, w). Computed in float64 and
    rounded once; without slopes exactly bias_block(parts, ..., dtype)."""
    arrays = [v for v in (parts or {}).values() if hasattr(v, "shape")] + ([] if slopes is None else [slopes])
    xp = backend.xp_of(*arrays)
    if slopes is None:
        return bias_block(parts, i0, i1, j0, j1, dtype, xp=xp)
    alibi = alibi_bias(slopes, i0, i1, j0, j1, xp=xp)          # (H, n, w) float64
    if parts is not None:
        alibi = alibi + bias_block(parts, i0, i1, j0, j1, xp=xp)
    return alibi.astype(dtype, copy=False)


def on_device(parts):
    """A layer's bias parts (signal.layer_bias's dict of float64 arrays) with each array on
    the current device, once, when the model is built: the blocks are then made there."""
    return None if parts is None else {k: backend.asarray(v) if isinstance(v, np.ndarray) else v
                                       for k, v in parts.items()}
