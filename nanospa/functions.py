"""The elementwise primitives: one small Function per op, forward above backward.

Here: arithmetic (Add, Sub, Mul, Div, Neg, Pow) and the shaped activation of DKS/TAT in one
op (Shaped: signal.activations.PhiHat, the one definition of phi_hat, which the DKS/TAT maths
evaluate too; a plain phi by name is more_ops.activation). Each output entry depends only on
the same entry of each (broadcast) input, so each backward is a product with a local
derivative.

Not here: ops that change shape (reductions, matmul, reshape, indexing, embedding:
shape_ops.py) and the fused multi-step ops with closed-form backwards (softmax,
cross-entropy, norms: fused.py), and the dropout op (beyond/dropout.py). The split is along what a backward has to undo:
nothing but the local derivative here, the shape change there, a whole row's
normalisation in fused.py.

Each forward/backward takes and returns raw arrays of one module, ``ctx.xp`` (NumPy or
CuPy). Backward returns one gradient per array input, in the shape of the *broadcast*
result; tensor.unbroadcast sums it back to each input's shape, so no op here thinks about
broadcasting. Constants are Python floats (never NumPy float64 scalars), so float32 stays
float32 under NumPy 2's promotion rules.
"""
from .tensor import Function

# ---------------------------------------------------------------- arithmetic


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
        return ga, -ga * out if ctx.needs_grad(1) else None  # d(a/b)/db = -a/b^2 = -(1/b)(a/b)


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


# ---------------------------------------------------------------- the shaped activation


def scale_where(x, cond, k_true, k_false):
    """x * (k_true where cond else k_false), a new array of x's dtype (Python float factors):
    factor = k_false + (k_true - k_false) cond is four cheap passes, where np.where with
    scalar branches is about 8x slower. The factor for cond may differ from k_true in the last
    bit; forward and backward use the same factors, so gradients stay exact."""
    out = cond.astype(x.dtype)
    out *= k_true - k_false
    out += k_false
    out *= x
    return out


class Shaped(Function):
    """y = phi_hat(x) for a signal.activations.PhiHat ``phi_hat``, the one definition of the
    shaped (DKS/TAT) activation s (phi(a x + b) + o) that the float64 maths evaluate too
    (docs/activations.md §1). Forward: u = phi_hat.pre(x) is saved, y = phi_hat.post(u).
    Backward: phi_hat.grad(u, g) = s a phi'(u) g."""

    def forward(ctx, x, phi_hat):
        ctx.h = phi_hat
        if phi_hat.homogeneous:
            # Fast path (TAT's leaky ReLU): phi is positively homogeneous, so phi_hat(x) is
            # x * (s a if x > 0 else s a alpha) + s o (PhiHat.pieces), and the backward is the
            # same factor times g: one select and one product each way.
            k_pos, k_neg, offset = phi_hat.pieces
            ctx.factors = (k_pos, k_neg)
            pos = x > 0
            ctx.save(pos)
            y = scale_where(x, pos, k_pos, k_neg)
            if phi_hat.o != 0.0:
                y += offset
            return y
        ctx.factors = None
        u = phi_hat.pre(x)
        ctx.save(u)
        return phi_hat.post(u, ctx.xp)

    def backward(ctx, g):
        if ctx.factors is not None:
            return scale_where(g, ctx.saved[0], *ctx.factors)
        return ctx.h.grad(ctx.saved[0], g, ctx.xp)
