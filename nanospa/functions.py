"""The elementwise primitives: one small Function per op, forward above backward.

Here: arithmetic (Add, Sub, Mul, Div, Neg, Pow), activations (Exp, Log, Sqrt, Tanh,
Sigmoid, LeakyReLU, GELU, Softplus, ELU, Swish, Identity), the shaped activation of
DKS/TAT in one op (Shaped), and selection (Where; the functional spellings where and
masked_fill). Each output entry depends only on the same entry of each (broadcast)
input, so each backward is a product with a local derivative.

Not here: ops that change shape (reductions, matmul, reshape, indexing, embedding:
shape_ops.py) and the fused multi-step ops with closed-form backwards (softmax,
cross-entropy, norms: fused.py). The split is along what a backward has to undo:
nothing but the local derivative here, the shape change there, a whole row's
normalisation in fused.py.

Each forward/backward takes and returns raw arrays of one module, ``ctx.xp`` (NumPy or
CuPy). Backward returns one gradient per array input, in the shape of the *broadcast*
result; tensor.unbroadcast sums it back to each input's shape, so no op here thinks about
broadcasting. Constants are Python floats (never NumPy float64 scalars), so float32 stays
float32 under NumPy 2's promotion rules.
"""
import math

from . import backend
from .tensor import Function, Tensor

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


# ---------------------------------------------------------------- activations


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
    """max(x, 0) + slope * min(x, 0); slope = 0 is ReLU. The slope has no default: a leaky
    ReLU's slope is a model choice (nanospa.signal's LEAKY_RELU_SLOPE for the plain one)."""

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


SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)  # k of the tanh approximation of GELU
GELU_CUBIC = 0.044715                      # the cubic coefficient of that approximation
INV_SQRT_2 = 1.0 / math.sqrt(2.0)          # Phi(x) = (1 + erf(x / sqrt 2)) / 2
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)  # the normal density's constant


class GELU(Function):
    """approximate="tanh": 0.5 x (1 + tanh(k (x + GELU_CUBIC x^3))), k = sqrt(2/pi)
    (Hendrycks & Gimpel's approximation, as in GPT-2); approximate="none": x Phi(x) with
    the normal CDF Phi (uses backend.erf)."""

    def forward(ctx, x, approximate="tanh"):
        xp = ctx.xp
        ctx.approximate = approximate
        if approximate == "tanh":
            t = xp.tanh(SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x))
            ctx.save(x, t)
            return 0.5 * x * (1.0 + t)
        if approximate != "none":
            raise ValueError(f"approximate must be 'tanh' or 'none', got {approximate!r}")
        cdf = 0.5 * (1.0 + backend.erf(x * INV_SQRT_2))
        ctx.save(x, cdf)
        return x * cdf

    def backward(ctx, g):
        x, s = ctx.saved
        if ctx.approximate == "tanh":
            du = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_CUBIC * x * x)  # d/dx of k (x + c x^3)
            return g * (0.5 * (1.0 + s) + 0.5 * x * (1.0 - s * s) * du)
        pdf = INV_SQRT_2PI * ctx.xp.exp(-0.5 * x * x)
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
    """x for x > 0, alpha (e^x - 1) otherwise (alpha = 1 is the ELU of Clevert et al.)."""

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
    """x (the "linear" base activation of Shaped)."""

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
    the base op's own backward. ``slope`` is required with base="leaky_relu" and refused
    with any other base ("relu" is the leaky ReLU of slope 0)."""

    def forward(ctx, x, base, a=1.0, b=0.0, s=1.0, o=0.0, slope=None):
        if (slope is None) == (base == "leaky_relu"):
            raise ValueError(f"Shaped: slope={slope!r} with base {base!r} (a slope is needed "
                             "for 'leaky_relu' and only there)")
        if base == "relu":
            slope = 0.0
        ctx.a, ctx.s = a, s
        if base in ("relu", "leaky_relu") and b == 0.0 and a > 0.0:
            # Fast path (TAT's leaky ReLU): phi is positively homogeneous, phi(a x) = a phi(x)
            # for a > 0, so y = s (phi(a x) + o) = x * (s a if x > 0 else s a slope) + s o, and
            # the backward is the same factor times g: one select and one product each way.
            k = s * a
            ctx.factors = (k, k * slope)
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
        options = {}
        if slope is not None:
            options["slope"] = slope
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


# ---------------------------------------------------------------- selection


class Where(Function):
    """cond ? a : b, with a boolean array ``cond`` that is not differentiated."""

    def forward(ctx, a, b, cond):
        ctx.save(cond)
        return ctx.xp.where(cond, a, b)

    def backward(ctx, g):
        (cond,) = ctx.saved
        zero = ctx.xp.zeros((), dtype=g.dtype)
        return ctx.xp.where(cond, g, zero), ctx.xp.where(cond, zero, g)


def where(cond, a, b):
    cond = cond.data if isinstance(cond, Tensor) else cond
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        raise TypeError("where: a or b must be a Tensor")
    return Where.apply(a, b, cond=cond)


def masked_fill(x, mask, value):
    """x with entries where ``mask`` is True replaced by the constant ``value``."""
    return Where.apply(float(value), x, cond=mask.data if isinstance(mask, Tensor) else mask)
