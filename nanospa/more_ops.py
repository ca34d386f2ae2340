"""Ops the model does not call, kept for your own equations: exp, log, sqrt, max, where,
concatenate, split and any activation by name. Not on the first reading pass (the model does
not import this file; beyond/norms.py's DyT does); gradient-checked like the engine's own ops
(tests/test_more_ops.py).

    from nanospa.more_ops import exp, log, where
    y = where(mask, exp(x), log(x * x + 1.0))

Each is a Function in the engine's style (forward above backward, on ctx.xp: NumPy or CuPy),
spelled as a plain function of Tensors.
"""
from . import backend
from .shape_ops import _expand
from .signal.activations import ACTIVATIONS
from .tensor import Function, Tensor


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


class Where(Function):
    """cond ? a : b, with a boolean array ``cond`` that is not differentiated."""

    def forward(ctx, a, b, cond):
        ctx.save(cond)
        return ctx.xp.where(cond, a, b)

    def backward(ctx, g):
        (cond,) = ctx.saved
        zero = ctx.xp.zeros((), dtype=g.dtype)
        return ctx.xp.where(cond, g, zero), ctx.xp.where(cond, zero, g)


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


def exp(x):
    return Exp.apply(x)


def log(x):
    return Log.apply(x)


def sqrt(x):
    return Sqrt.apply(x)


def max(x, axis=None, keepdims=False):    # noqa: A001 (the NumPy name, in this module only)
    return Max.apply(x, axis=axis, keepdims=keepdims)


def where(cond, a, b):
    """a where cond (a boolean Tensor or array; a host mask is copied to the device), else b."""
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        raise TypeError("where: a or b must be a Tensor")
    like = a if isinstance(a, Tensor) else b
    cond = cond.data if isinstance(cond, Tensor) else cond
    return Where.apply(a, b, cond=backend.xp_of(like.data).asarray(cond))


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


class Activation(Function):
    """y = phi(x) for ``name`` in signal.activations.ACTIVATIONS (relu, leaky_relu, gelu,
    gelu_exact, tanh, sigmoid, softplus, elu, swish, linear), the one definition of phi that
    the DKS/TAT maths read too; ``kw`` its options (a leaky ReLU's negative_slope). Backward:
    phi'(x) g. The model's phi_hat is functions.Shaped."""

    def forward(ctx, x, name, **kw):
        ctx.act, ctx.kw = ACTIVATIONS[name], kw
        ctx.save(x)
        return ctx.act.fn(x, xp=ctx.xp, **kw)

    def backward(ctx, g):
        return g * ctx.act.d1(ctx.saved[0], ctx.xp, **ctx.kw)


def activation(x, name, **params):
    """phi(x) for any activation of signal.activations.ACTIVATIONS by name (e.g. "tanh", "gelu",
    "leaky_relu" with negative_slope=...)."""
    return Activation.apply(x, name=name, **params)
