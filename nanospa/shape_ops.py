"""The primitives that change shape: reductions, matrix products, rearrangements, gathers.

Here: Sum, Mean (reduce axes), MatMul (contracts an axis), Reshape and Transpose (rearrange
entries), GetItem and Embedding (select entries), and the functional spelling embedding.
Each backward maps the output's gradient back to the input's shape: a reduction broadcasts
it back over the reduced axes, a product multiplies by the other factor transposed, a
rearrangement applies the inverse rearrangement, a gather scatter-adds (repeated indices
sum, via backend.scatter_add).

Not here: elementwise ops, whose backward is a local derivative (functions.py), and the
fused row-wise ops with closed-form backwards (softmax, cross-entropy, norms: fused.py).

As in functions.py, forward and backward take and return raw arrays of ``ctx.xp``.
"""
from . import backend
from .tensor import Function, Tensor

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
        ctx.n = x.size // max(out.size, 1)  # entries averaged into each output entry
        return out

    def backward(ctx, g):
        shape, axis, keepdims = ctx.args
        return ctx.xp.broadcast_to(_expand(g, shape, axis, keepdims) * (1.0 / ctx.n), shape)


# ---------------------------------------------------------------- matrix product


def _rows(x):
    """(..., n) -> (N, n): a batch of rows as one matrix (a view when x is contiguous)."""
    return x.reshape(-1, x.shape[-1])


class MatMul(Function):
    """Batched, broadcasting a @ b of operands of 2 or more axes (a vector is refused). A
    batch times a 2-D weight, x (..., n) @ W (n, m), is computed as one (N, n) @ (n, m)
    product forwards and backwards: one large BLAS call instead of one per batch entry (each
    call of a threaded BLAS synchronises its threads), and no (batch, n, m) temporary to sum
    for the weight's gradient."""

    def forward(ctx, a, b):
        if a.ndim < 2 or b.ndim < 2:
            raise ValueError("a vector operand: reshape it to (1, n) or (n, 1)")
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
        ga = g @ xp.swapaxes(b, -1, -2) if ctx.needs_grad(0) else None
        gb = xp.swapaxes(a, -1, -2) @ g if ctx.needs_grad(1) else None
        return ga, gb


# ---------------------------------------------------------------- rearrangements


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


# ---------------------------------------------------------------- selection


def _is_advanced(index):
    """Whether an index uses integer arrays (fancy indexing), which may repeat entries."""
    parts = index if isinstance(index, tuple) else (index,)
    return any(not (isinstance(p, (int, slice)) or p is None or p is Ellipsis) for p in parts)


class GetItem(Function):
    """x[index] for basic slicing and integer-array (fancy) indexing."""

    def forward(ctx, x, index):
        if isinstance(index, Tensor):
            index = index.data
        ctx.index, ctx.in_shape = index, x.shape
        return x[index]

    def backward(ctx, g):
        gx = ctx.xp.zeros(ctx.in_shape, dtype=g.dtype)
        if _is_advanced(ctx.index):
            backend.scatter_add(gx, ctx.index, g)  # repeated indices must add up
        else:
            gx[ctx.index] = g
        return gx


class Embedding(Function):
    """out[..., :] = W[idx[...], :]; the backward scatter-adds rows (repeated tokens sum)."""

    def forward(ctx, W, idx):
        ctx.idx, ctx.shape = idx, W.shape
        return W[idx]

    def backward(ctx, g):
        gW = ctx.xp.zeros(ctx.shape, dtype=g.dtype)
        backend.scatter_add(gW, ctx.idx.reshape(-1), g.reshape(-1, ctx.shape[1]))
        return gW


# ---------------------------------------------------------------- functional spelling


def embedding(W, idx):
    """Rows of W at integer indices idx (a Tensor or an array; not differentiated)."""
    idx = idx.data if isinstance(idx, Tensor) else idx
    return Embedding.apply(W, idx=backend.xp_of(W.data).asarray(idx))
