"""The fused primitives: several steps over a row in one op, with a closed-form backward.

Here: Softmax (with scale, additive bias and causal mask), CrossEntropy, LayerNorm and
RMSNorm, the causal mask they use, and their functional spellings (softmax,
cross_entropy, layer_norm, rms_norm). Each could be written as a
chain of the primitives in functions.py and shape_ops.py; as one op, forward subtracts
the row maximum (no overflow), saves only what its backward formula needs, and backward
computes that formula directly, which is faster, uses less memory and is more accurate
than back-propagating through the chain.

Not here: single elementwise ops (functions.py) and reductions, products and indexing
(shape_ops.py). Which bias attention adds (SPA's stored B_l) is model.py's business; this
file only adds what it is given, and the causal mask (cached per length and dtype).
"""
import math

from . import backend
from .tensor import Function, Tensor

LAYER_NORM_EPS = 1e-5  # added to the variance: keeps 1/sqrt(var + eps) finite (PyTorch's default)
RMS_NORM_EPS = 1e-6    # added to the mean square, likewise

_MASKS = {}


def causal_mask(xp, T, dtype, S=None):
    """Additive (T, S) mask of T queries at the last T of S positions (S = T: the square): 0
    where key j <= the query's position S - T + i, -inf after it (the entries a causal row
    cannot see; generation's cache asks for its new rows only). Cached per module, shape and
    dtype: every layer asks for the same one."""
    S = T if S is None else S
    key = (xp, T, S, xp.dtype(dtype).str)
    if key not in _MASKS:
        _MASKS[key] = xp.triu(xp.full((T, S), -math.inf, dtype=dtype), k=S - T + 1)
    return _MASKS[key]


class Softmax(Function):
    """y = softmax(scale * x + bias) along ``axis``; with ``causal=True`` (last two axes
    (T, S), queries at the last T of S positions: causal_mask) entries above the diagonal get
    probability 0. The bias is optional and
    broadcasts (SPA's (T, T) matrix B_l; the mask is added here when causal).
    Backward: gz = y (g - sum(g y)), gx = scale gz, gbias = gz (summed by unbroadcast).
    The elementwise steps run in place on one (..., T, T) buffer: memory, not arithmetic,
    is what a softmax costs."""

    def forward(ctx, x, *bias, axis=-1, scale=1.0, causal=False):
        xp = ctx.xp
        bias = bias[0] if bias else None
        if causal:
            mask = causal_mask(xp, x.shape[-2], x.dtype, x.shape[-1])
            bias = mask if bias is None else bias + mask
        z = xp.multiply(x, scale, dtype=x.dtype)                # z = scale x (+ bias), a new array
        if bias is not None:
            z += bias
        z -= z.max(axis=axis, keepdims=True)                    # z <- exp(z - max z), in place
        xp.exp(z, out=z)
        # z <- z / sum(z), in place; probabilities below sqrt(tiny) (1e-19 in float32) are set
        # to 0. They are below the rounding error of any row sum or product they enter, but
        # left in place they make subnormal numbers, and a CPU matrix product on subnormals
        # runs ~10x slower. E-SPA's bias B_l makes many such entries (exp of -100 and below).
        z *= 1.0 / z.sum(axis=axis, keepdims=True)
        z *= z >= xp.finfo(z.dtype).tiny ** 0.5
        ctx.save(z)
        ctx.axis, ctx.scale = axis, scale
        return z

    def backward(ctx, g):
        (y,) = ctx.saved
        gz = g * y
        s = gz.sum(axis=ctx.axis, keepdims=True)
        bias_grad = len(ctx.shapes) > 1 and ctx.needs_grad(1)
        if bias_grad:
            gz -= y * s                                          # gz = y (g - s) = gbias
            return (gz * ctx.scale if ctx.scale != 1.0 else gz), gz
        ctx.xp.subtract(g, s, out=gz)                            # gx = scale y (g - s), in gz
        gz *= y
        if ctx.scale != 1.0:
            gz *= ctx.scale
        return gz


class CrossEntropy(Function):
    """Mean over tokens of -log softmax(logits)[target]. logits (N, V), targets (N,) integers.
    Backward: (softmax(logits) - onehot(target)) / N."""

    def forward(ctx, logits, targets):
        xp = ctx.xp
        N = logits.shape[0]
        if targets.shape != (N,):
            raise ValueError(f"targets of shape {tuple(targets.shape)} do not match logits of shape "
                             f"{tuple(logits.shape)}")
        z = logits - logits.max(axis=1, keepdims=True)
        lse = xp.log(xp.exp(z).sum(axis=1))
        nll = lse - z[xp.arange(N), targets]
        ctx.save(z, lse, targets)
        return (nll.sum() / N).astype(logits.dtype)

    def backward(ctx, g):
        z, lse, targets = ctx.saved
        p = z - lse[:, None]
        ctx.xp.exp(p, out=p)  # softmax, reusing z's shape without a second (N, V) buffer
        p[ctx.xp.arange(p.shape[0]), targets] -= 1.0
        p *= g * (1.0 / p.shape[0])
        return p


class LayerNorm(Function):
    """y = (x - mean) / sqrt(var + eps) * w + b over the last axis.
    Backward with xh = normalised x, gh = g w: gx = rstd (gh - mean(gh) - xh mean(gh xh))."""

    def forward(ctx, x, w, b, eps=LAYER_NORM_EPS):
        mu = x.mean(axis=-1, keepdims=True)
        xc = x - mu
        var = (xc * xc).mean(axis=-1, keepdims=True)
        rstd = 1.0 / ctx.xp.sqrt(var + eps)
        xh = xc * rstd
        ctx.save(xh, rstd, w)
        return xh * w + b

    def backward(ctx, g):
        xh, rstd, w = ctx.saved
        C = xh.shape[-1]
        gh = g * w
        gx = gh - gh.mean(axis=-1, keepdims=True) - xh * (gh * xh).mean(axis=-1, keepdims=True)
        gx *= rstd
        g2 = g.reshape(-1, C)
        return gx, (g2 * xh.reshape(-1, C)).sum(axis=0), g2.sum(axis=0)


class RMSNorm(Function):
    """y = x / sqrt(mean(x^2) + eps) * w over the last axis.
    Backward with xh = x rstd, gh = g w: gx = rstd (gh - xh mean(gh xh))."""

    def forward(ctx, x, w, eps=RMS_NORM_EPS):
        rstd = 1.0 / ctx.xp.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)
        xh = x * rstd
        ctx.save(xh, rstd, w)
        return xh * w

    def backward(ctx, g):
        xh, rstd, w = ctx.saved
        C = xh.shape[-1]
        gh = g * w
        gx = (gh - xh * (gh * xh).mean(axis=-1, keepdims=True)) * rstd
        return gx, (g.reshape(-1, C) * xh.reshape(-1, C)).sum(axis=0)


# ---------------------------------------------------------------- functional spellings


def softmax(x, bias=None, axis=-1, scale=1.0, causal=False):
    args = (x,) if bias is None else (x, bias)
    return Softmax.apply(*args, axis=axis, scale=float(scale), causal=causal)


def cross_entropy(logits, targets):
    """Mean cross-entropy; logits (..., V) and integer targets (...) are flattened."""
    t = targets.data if isinstance(targets, Tensor) else targets
    xp = backend.xp_of(logits.data)
    t = xp.asarray(t).reshape(-1)
    V = logits.shape[-1]
    return CrossEntropy.apply(logits.reshape(-1, V), targets=t)


def layer_norm(x, w, b, eps=LAYER_NORM_EPS):
    return LayerNorm.apply(x, w, b, eps=eps)


def rms_norm(x, w, eps=RMS_NORM_EPS):
    return RMSNorm.apply(x, w, eps=eps)
