"""The differentiable primitives: one small Function per op, forward above backward.

Each forward/backward takes and returns raw arrays of one module, ``ctx.xp`` (NumPy or
CuPy). Backward returns one gradient per array input, in the shape of the *broadcast*
result; tensor.unbroadcast sums it back to each input's shape, so no op here thinks about
broadcasting. Constants are Python floats (never NumPy float64 scalars), so float32 stays
float32 under NumPy 2's promotion rules.

Fused ops (Softmax with scale, bias and causal mask; LogSoftmax; CrossEntropy; LayerNorm;
RMSNorm) compute their backward in closed form from what forward saved, which is both
faster and more accurate than chaining the elementary ops. The functional helpers at the
bottom (softmax, cross_entropy, layer_norm, ...) are the public spellings.
"""
import math

from . import backend
from .tensor import Function, Tensor

# ---------------------------------------------------------------- elementwise arithmetic


class Add(Function):
    def forward(ctx, a, b):
        return a + b

    def backward(ctx, g):
        return g, g


class Sub(Function):
    def forward(ctx, a, b):
        return a - b

    def backward(ctx, g):
        return g, -g


class Mul(Function):
    def forward(ctx, a, b):
        ctx.save(a, b)
        return a * b

    def backward(ctx, g):
        a, b = ctx.saved
        return g * b if ctx.needs_grad(0) else None, g * a if ctx.needs_grad(1) else None


class Div(Function):
    def forward(ctx, a, b):
        out = a / b
        ctx.save(b, out)
        return out

    def backward(ctx, g):
        b, out = ctx.saved
        ga = g / b
        return ga, -ga * out  # d(a/b)/db = -a/b^2 = -(1/b)(a/b)


class Neg(Function):
    def forward(ctx, a):
        return -a

    def backward(ctx, g):
        return -g


class Pow(Function):
    """x ** p for a constant Python number p."""

    def forward(ctx, x, p):
        ctx.save(x)
        ctx.p = p
        return x ** p

    def backward(ctx, g):
        (x,) = ctx.saved
        return g * (ctx.p * x ** (ctx.p - 1.0))


# ---------------------------------------------------------------- elementwise functions


class Exp(Function):
    def forward(ctx, x):
        y = ctx.xp.exp(x)
        ctx.save(y)
        return y

    def backward(ctx, g):
        return g * ctx.saved[0]


class Log(Function):
    def forward(ctx, x):
        ctx.save(x)
        return ctx.xp.log(x)

    def backward(ctx, g):
        return g / ctx.saved[0]


class Sqrt(Function):
    def forward(ctx, x):
        y = ctx.xp.sqrt(x)
        ctx.save(y)
        return y

    def backward(ctx, g):
        return g / (2.0 * ctx.saved[0])


class Tanh(Function):
    def forward(ctx, x):
        y = ctx.xp.tanh(x)
        ctx.save(y)
        return y

    def backward(ctx, g):
        y = ctx.saved[0]
        return g * (1.0 - y * y)


def _sigmoid(xp, x):
    # 0.5 * (1 + tanh(x/2)) is the logistic function without overflow for large |x|
    return 0.5 + 0.5 * xp.tanh(0.5 * x)


class Sigmoid(Function):
    def forward(ctx, x):
        y = _sigmoid(ctx.xp, x)
        ctx.save(y)
        return y

    def backward(ctx, g):
        y = ctx.saved[0]
        return g * y * (1.0 - y)


class LeakyReLU(Function):
    """max(x, 0) + slope * min(x, 0); slope = 0 is ReLU."""

    def forward(ctx, x, slope):
        pos = x > 0
        ctx.save(pos)
        ctx.slope = slope
        if slope == 0.0:
            return x * pos
        return ctx.xp.where(pos, x, x * slope)

    def backward(ctx, g):
        (pos,) = ctx.saved
        if ctx.slope == 0.0:
            return g * pos
        return ctx.xp.where(pos, g, g * ctx.slope)


_K = math.sqrt(2.0 / math.pi)
_INV_SQRT2 = 1.0 / math.sqrt(2.0)
_INV_SQRT2PI = 1.0 / math.sqrt(2.0 * math.pi)


class GELU(Function):
    """approximate="tanh": 0.5 x (1 + tanh(k (x + 0.044715 x^3))), k = sqrt(2/pi);
    approximate="none": x Phi(x) with the normal CDF Phi (uses backend.erf)."""

    def forward(ctx, x, approximate="tanh"):
        xp = ctx.xp
        ctx.approximate = approximate
        if approximate == "tanh":
            t = xp.tanh(_K * (x + 0.044715 * x * x * x))
            ctx.save(x, t)
            return 0.5 * x * (1.0 + t)
        if approximate != "none":
            raise ValueError(f"approximate must be 'tanh' or 'none', got {approximate!r}")
        cdf = 0.5 * (1.0 + backend.erf(x * _INV_SQRT2))
        ctx.save(x, cdf)
        return x * cdf

    def backward(ctx, g):
        x, s = ctx.saved
        if ctx.approximate == "tanh":
            du = _K * (1.0 + 3.0 * 0.044715 * x * x)
            return g * (0.5 * (1.0 + s) + 0.5 * x * (1.0 - s * s) * du)
        pdf = _INV_SQRT2PI * ctx.xp.exp(-0.5 * x * x)
        return g * (s + x * pdf)


class Softplus(Function):
    """log(1 + e^x), computed as max(x, 0) + log1p(e^-|x|)."""

    def forward(ctx, x):
        xp = ctx.xp
        ctx.save(x)
        return xp.maximum(x, 0.0) + xp.log1p(xp.exp(-xp.abs(x)))

    def backward(ctx, g):
        return g * _sigmoid(ctx.xp, ctx.saved[0])


class ELU(Function):
    """x for x > 0, alpha (e^x - 1) otherwise."""

    def forward(ctx, x, alpha=1.0):
        xp = ctx.xp
        pos = x > 0
        em1 = xp.expm1(xp.minimum(x, 0.0))
        ctx.save(pos, em1)
        ctx.alpha = alpha
        return xp.where(pos, x, alpha * em1)

    def backward(ctx, g):
        pos, em1 = ctx.saved
        return ctx.xp.where(pos, g, g * (ctx.alpha * (em1 + 1.0)))


class Swish(Function):
    """x sigmoid(x) (SiLU)."""

    def forward(ctx, x):
        s = _sigmoid(ctx.xp, x)
        ctx.save(x, s)
        return x * s

    def backward(ctx, g):
        x, s = ctx.saved
        return g * (s * (1.0 + x * (1.0 - s)))


class Identity(Function):
    def forward(ctx, x):
        return x

    def backward(ctx, g):
        return g


BASE = {"relu": LeakyReLU, "leaky_relu": LeakyReLU, "gelu": GELU, "gelu_exact": GELU,
        "sigmoid": Sigmoid, "tanh": Tanh, "softplus": Softplus, "elu": ELU, "swish": Swish,
        "linear": Identity}


class Shaped(Function):
    """A shaped (DKS/TAT) activation in one op: y = s (phi(a x + b) + o), where phi is one of
    the base activations above (docs/activations.md §1). Backward: s a phi'(a x + b) g, by
    the base op's own backward."""

    def forward(ctx, x, base, a=1.0, b=0.0, s=1.0, o=0.0, slope=0.0):
        ctx.a, ctx.s = a, s
        if base in ("relu", "leaky_relu") and b == 0.0 and a > 0.0:
            # Fast path (TAT's leaky ReLU): phi is positively homogeneous, phi(a x) = a phi(x)
            # for a > 0, so y = s (phi(a x) + o) = x * (s a if x > 0 else s a slope) + s o, and
            # the backward is the same factor times g: one select and one product each way.
            k = s * a
            ctx.factors = (k, k * (slope if base == "leaky_relu" else 0.0))
            pos = x > 0
            ctx.save(pos)
            y = backend.scale_where(x, pos, *ctx.factors)
            if o != 0.0:
                y += s * o
            return y
        ctx.factors = None
        u = x * a if a != 1.0 else x
        if b != 0.0:
            u = u + b
        inner = ctx.inner = BASE[base]()
        inner.xp = ctx.xp
        options = {"slope": 0.0 if base == "relu" else slope} if inner.__class__ is LeakyReLU else {}
        if base == "gelu_exact":
            options["approximate"] = "none"
        y = inner.forward(u, **options)
        if o != 0.0:
            y = y + o
        return y * s if s != 1.0 else y

    def backward(ctx, g):
        if ctx.factors is not None:
            return backend.scale_where(g, ctx.saved[0], *ctx.factors)
        gs = g * (ctx.s * ctx.a) if ctx.s * ctx.a != 1.0 else g
        return ctx.inner.backward(gs)


class Where(Function):
    """cond ? a : b, with a boolean array ``cond`` that is not differentiated."""

    def forward(ctx, a, b, cond):
        ctx.save(cond)
        return ctx.xp.where(cond, a, b)

    def backward(ctx, g):
        (cond,) = ctx.saved
        zero = ctx.xp.zeros((), dtype=g.dtype)
        return ctx.xp.where(cond, g, zero), ctx.xp.where(cond, zero, g)


# ---------------------------------------------------------------- reductions


def _expand(g, shape, axis, keepdims):
    """Give a reduced gradient back its reduced axes (as length 1) so it broadcasts to shape."""
    if keepdims:
        return g
    if axis is None:
        return g.reshape((1,) * len(shape))
    kept = list(g.shape)
    for a in sorted(a % len(shape) for a in ((axis,) if isinstance(axis, int) else axis)):
        kept.insert(a, 1)
    return g.reshape(kept)


class Sum(Function):
    def forward(ctx, x, axis=None, keepdims=False):
        ctx.args = (x.shape, axis, keepdims)
        return x.sum(axis=axis, keepdims=keepdims)

    def backward(ctx, g):
        shape, axis, keepdims = ctx.args
        return ctx.xp.broadcast_to(_expand(g, shape, axis, keepdims), shape)


class Mean(Function):
    def forward(ctx, x, axis=None, keepdims=False):
        out = x.mean(axis=axis, keepdims=keepdims)
        ctx.args = (x.shape, axis, keepdims)
        ctx.n = x.size // max(out.size, 1)
        return out

    def backward(ctx, g):
        shape, axis, keepdims = ctx.args
        return ctx.xp.broadcast_to(_expand(g, shape, axis, keepdims) * (1.0 / ctx.n), shape)


class Max(Function):
    """Maximum over axes; ties share the gradient equally."""

    def forward(ctx, x, axis=None, keepdims=False):
        out = x.max(axis=axis, keepdims=keepdims)
        ctx.args = (x.shape, axis, keepdims)
        ctx.save(x, out)
        return out

    def backward(ctx, g):
        x, out = ctx.saved
        shape, axis, keepdims = ctx.args
        hit = x == _expand(out, shape, axis, keepdims)
        count = hit.sum(axis=axis, keepdims=True).astype(g.dtype)
        return hit * (_expand(g, shape, axis, keepdims) / count)


# ---------------------------------------------------------------- linear algebra and shapes


def _rows(x):
    """(..., n) -> (N, n): a batch of rows as one matrix (a view when x is contiguous)."""
    return x.reshape(-1, x.shape[-1])


class MatMul(Function):
    """Batched, broadcasting a @ b. A batch times a 2-D weight, x (..., n) @ W (n, m), is
    computed as one (N, n) @ (n, m) product forwards and backwards: one large BLAS call
    instead of one per batch entry (each call of a threaded BLAS synchronises its threads),
    and no (batch, n, m) temporary to sum for the weight's gradient."""

    def forward(ctx, a, b):
        ctx.save(a, b)
        if b.ndim == 2 and a.ndim > 2:
            return (_rows(a) @ b).reshape(a.shape[:-1] + b.shape[-1:])
        return a @ b

    def backward(ctx, g):
        a, b = ctx.saved
        xp = ctx.xp
        if b.ndim == 2 and a.ndim > 2:  # x (..., n) @ W (n, m)
            ga = (_rows(g) @ b.T).reshape(a.shape) if ctx.needs_grad(0) else None
            gb = _rows(a).T @ _rows(g) if ctx.needs_grad(1) else None
            return ga, gb
        if a.ndim == 1 or b.ndim == 1:  # vectors: promote, differentiate, squeeze
            a2 = a[None, :] if a.ndim == 1 else a
            b2 = b[:, None] if b.ndim == 1 else b
            g2 = xp.expand_dims(g, -2) if a.ndim == 1 else g
            g2 = xp.expand_dims(g2, -1) if b.ndim == 1 else g2
            ga = g2 @ xp.swapaxes(b2, -1, -2)
            gb = xp.swapaxes(a2, -1, -2) @ g2
            ga = ga[..., 0, :] if a.ndim == 1 else ga
            gb = gb[..., :, 0] if b.ndim == 1 else gb
            return ga, gb
        ga = g @ xp.swapaxes(b, -1, -2) if ctx.needs_grad(0) else None
        gb = xp.swapaxes(a, -1, -2) @ g if ctx.needs_grad(1) else None
        return ga, gb


class Reshape(Function):
    def forward(ctx, x, shape):
        ctx.in_shape = x.shape
        return x.reshape(shape)

    def backward(ctx, g):
        return g.reshape(ctx.in_shape)


class Transpose(Function):
    """Permute axes (all reversed when ``axes`` is None)."""

    def forward(ctx, x, axes=None):
        ctx.axes = axes
        return x.transpose(axes)

    def backward(ctx, g):
        if ctx.axes is None:
            return g.transpose()
        inverse = [0] * len(ctx.axes)
        for i, a in enumerate(ctx.axes):
            inverse[a] = i
        return g.transpose(inverse)


def _is_advanced(index):
    parts = index if isinstance(index, tuple) else (index,)
    return any(not (isinstance(p, (int, slice)) or p is None or p is Ellipsis) for p in parts)


class GetItem(Function):
    """x[index] for basic slicing and integer-array (fancy) indexing."""

    def forward(ctx, x, index):
        if isinstance(index, Tensor):
            index = index.data
        ctx.index = index
        ctx.in_shape, ctx.dtype = x.shape, x.dtype
        return x[index]

    def backward(ctx, g):
        gx = ctx.xp.zeros(ctx.in_shape, dtype=g.dtype)
        if _is_advanced(ctx.index):
            backend.scatter_add(gx, ctx.index, g)  # repeated indices must add up
        else:
            gx[ctx.index] = g
        return gx


class Concatenate(Function):
    def forward(ctx, *xs, axis=0):
        ctx.axis = axis
        ctx.sizes = [x.shape[axis] for x in xs]
        return ctx.xp.concatenate(xs, axis=axis)

    def backward(ctx, g):
        bounds, total = [], 0
        for n in ctx.sizes[:-1]:
            total += n
            bounds.append(total)
        return tuple(ctx.xp.split(g, bounds, axis=ctx.axis))


class Embedding(Function):
    """out[..., :] = W[idx[...], :]; the backward scatter-adds rows (repeated tokens sum)."""

    def forward(ctx, W, idx):
        ctx.idx, ctx.shape = idx, W.shape
        return W[idx]

    def backward(ctx, g):
        gW = ctx.xp.zeros(ctx.shape, dtype=g.dtype)
        backend.scatter_add(gW, ctx.idx.reshape(-1), g.reshape(-1, ctx.shape[1]))
        return gW


# ---------------------------------------------------------------- fused numerically stable ops

_MASKS = {}


def causal_mask(xp, T, dtype):
    """Additive (T, T) mask: 0 on and below the diagonal, -inf above it (the entries a causal
    row cannot see). Cached per module, length and dtype: every layer asks for the same one."""
    key = (xp.__name__, T, xp.dtype(dtype).str)
    if key not in _MASKS:
        _MASKS[key] = xp.triu(xp.full((T, T), -math.inf, dtype=dtype), k=1)
    return _MASKS[key]


class Softmax(Function):
    """y = softmax(scale * x + bias) along ``axis``; with ``causal=True`` (last two axes
    (T, T)) entries above the diagonal get probability 0. The bias is optional and
    broadcasts (SPA's (T, T) matrix B_l, or B_l with the causal mask already added, as
    model.py passes it). Backward: gz = y (g - sum(g y)), gx = scale gz, gbias = gz (summed
    by unbroadcast). The elementwise steps are backend kernels: a few in-place NumPy passes
    on the CPU, one fused pass each on the GPU."""

    def forward(ctx, x, *bias, axis=-1, scale=1.0, causal=False):
        xp = ctx.xp
        bias = bias[0] if bias else None
        if causal:
            mask = causal_mask(xp, x.shape[-1], x.dtype)
            bias = mask if bias is None else bias + mask
        z = backend.scale_add(x, scale, bias)                   # z = scale x + bias, a new array
        backend.exp_sub(z, z.max(axis=axis, keepdims=True))     # z <- exp(z - max z), in place
        # z <- z / sum(z), in place; probabilities below sqrt(tiny) (1e-19 in float32) are set
        # to 0. They are below the rounding error of any row sum or product they enter, but
        # left in place they make subnormal numbers, and a CPU matrix product on subnormals
        # runs ~10x slower. E-SPA's bias B_l makes many such entries (exp of -100 and below).
        backend.div_flush(z, z.sum(axis=axis, keepdims=True), xp.finfo(z.dtype).tiny ** 0.5)
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
        return backend.softmax_grad(y, g, s, ctx.scale, out=gz)  # gx = scale y (g - s)


class LogSoftmax(Function):
    def forward(ctx, x, axis=-1):
        xp = ctx.xp
        m = x.max(axis=axis, keepdims=True)
        out = x - m
        out -= xp.log(xp.exp(out).sum(axis=axis, keepdims=True))
        ctx.save(out)
        ctx.axis = axis
        return out

    def backward(ctx, g):
        (out,) = ctx.saved
        return g - ctx.xp.exp(out) * g.sum(axis=ctx.axis, keepdims=True)


class CrossEntropy(Function):
    """Mean over tokens of -log softmax(logits)[target]; targets equal to ``ignore_index``
    are left out of the mean. logits (N, V), targets (N,) integers.
    Backward: (softmax(logits) - onehot(target)) / n_valid on the kept rows."""

    def forward(ctx, logits, targets, ignore_index=None):
        xp = ctx.xp
        N = logits.shape[0]
        if targets.shape != (N,):
            raise ValueError(f"targets of shape {tuple(targets.shape)} do not match logits of shape "
                             f"{tuple(logits.shape)}")
        valid = None if ignore_index is None else targets != ignore_index
        safe = targets if valid is None else xp.where(valid, targets, 0)
        z = logits - logits.max(axis=1, keepdims=True)
        lse = xp.log(xp.exp(z).sum(axis=1))
        nll = lse - z[xp.arange(N), safe]
        n = N if valid is None else int(valid.sum())
        if valid is not None:
            nll = nll * valid
        ctx.save(z, lse, safe, valid)
        ctx.n = max(n, 1)
        return (nll.sum() / ctx.n).astype(logits.dtype)

    def backward(ctx, g):
        z, lse, safe, valid = ctx.saved
        xp = ctx.xp
        p = z - lse[:, None]
        xp.exp(p, out=p)  # softmax, reusing z's shape without a second (N, V) buffer
        p[xp.arange(p.shape[0]), safe] -= 1.0
        if valid is not None:
            p *= valid[:, None]
        p *= g * (1.0 / ctx.n)
        return p


class LayerNorm(Function):
    """y = (x - mean) / sqrt(var + eps) * w + b over the last axis.
    Backward with xh = normalised x, gh = g w: gx = rstd (gh - mean(gh) - xh mean(gh xh))."""

    def forward(ctx, x, w, b, eps=1e-5):
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

    def forward(ctx, x, w, eps=1e-6):
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


def log_softmax(x, axis=-1):
    return LogSoftmax.apply(x, axis=axis)


def cross_entropy(logits, targets, ignore_index=None):
    """Mean cross-entropy; logits (..., V) and integer targets (...) are flattened."""
    t = targets.data if isinstance(targets, Tensor) else targets
    xp = backend.xp_of(logits.data)
    t = xp.asarray(t).reshape(-1)
    V = logits.shape[-1]
    return CrossEntropy.apply(logits.reshape(-1, V), ignore_index=ignore_index, targets=t)


def layer_norm(x, w, b, eps=1e-5):
    return LayerNorm.apply(x, w, b, eps=eps)


def rms_norm(x, w, eps=1e-6):
    return RMSNorm.apply(x, w, eps=eps)


def embedding(W, idx):
    idx = idx.data if isinstance(idx, Tensor) else idx
    return Embedding.apply(W, idx=backend.xp_of(W.data).asarray(idx))


def concatenate(tensors, axis=0):
    return Concatenate.apply(*tensors, axis=axis)


def split(x, sizes, axis=0):
    """Split into pieces of the given sizes (or into ``sizes`` equal pieces if an int)."""
    n = x.shape[axis]
    if isinstance(sizes, int):
        if n % sizes:
            raise ValueError(f"split: axis {axis} of length {n} does not divide into {sizes} parts")
        sizes = [n // sizes] * sizes
    if sum(sizes) != n:
        raise ValueError(f"split: sizes {list(sizes)} do not add up to {n} (axis {axis} of {x.shape})")
    out, start = [], 0
    for s in sizes:
        index = [slice(None)] * x.ndim
        index[axis] = slice(start, start + s)
        out.append(x[tuple(index)])
        start += s
    return out


def where(cond, a, b):
    cond = cond.data if isinstance(cond, Tensor) else cond
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        raise TypeError("where: a or b must be a Tensor")
    return Where.apply(a, b, cond=cond)


def masked_fill(x, mask, value):
    """x with entries where ``mask`` is True replaced by the constant ``value``."""
    return Where.apply(float(value), x, cond=mask.data if isinstance(mask, Tensor) else mask)
