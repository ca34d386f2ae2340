"""Float64 gradient checks by central differences, for tests and for users.

Both checks scalarise the output with a fixed random upstream gradient R,
f(x) = sum(out(x) * R), never ``out.sum()``: errors that cancel in a plain sum (a
transposed or sign-flipped backward on symmetric data) cannot hide. The difference
f(x + eps) - f(x - eps) is summed from the difference of the two outputs, entry by entry.

    check_jacobian(fn, inputs)   every entry of every input: the full Jacobian-vector
                                 product R^T J against the backward pass. For single ops.
    check_directions(fn, params) a few random unit directions d over all parameters:
                                 (f(p + eps d) - f(p - eps d)) / 2 eps against <grad f, d>.
                                 For whole layers and models.

Each returns the largest relative error and raises AssertionError above ``rtol``.
Inputs must be float64: float32 differences cannot resolve 1e-6. Keep sample points
away from kinks (ReLU at 0, max at ties), where the derivative does not exist.

Not here: the ops being checked, or which ops and models are checked (tests/).
"""
import numpy as np

from . import backend
from .tensor import Tensor

EPS = 1e-6    # central-difference step: truncation error ~eps^2, float64 rounding ~1e-16/eps
RTOL = 1e-6   # the largest relative error a check accepts; both errors above lie far below it
ATOL = 1e-10  # check_jacobian: entries whose true value is ~0 are compared absolutely
DIRECTION_FLOOR = 0.01  # check_directions: errors measured against at least 1% of |grad|
TINY = 1e-12  # check_directions: a denominator that is never 0 (a zero gradient)


def _output(fn, *args):
    """fn's output array, copied: it may be a view of an input about to be perturbed."""
    return fn(*args).data.copy()


def _difference(up, down, R):
    """f(up) - f(down) for f(out) = sum(out * R), as sum((up - down) R): entries that the
    perturbation left unchanged cancel exactly, so a large output cannot drown a small
    gradient in the rounding error of its sum."""
    return float(backend.to_numpy(((up - down) * R).sum()))


def _check_float64(tensors):
    for t in tensors:
        if t.dtype != np.float64:
            raise ValueError(f"gradient checks need float64 inputs, got {t.dtype} for shape {t.shape}")


def check_jacobian(fn, inputs, eps=EPS, rtol=RTOL, atol=ATOL, seed=0):
    """Compare the backward pass of ``fn(*inputs)`` with central differences at every entry
    of every input that requires grad. ``atol`` absorbs entries whose true value is ~0."""
    _check_float64(inputs)
    out = fn(*inputs)
    rng = np.random.default_rng(seed)
    xp = backend.xp_of(out.data)
    R = xp.asarray(rng.standard_normal(out.shape))
    for t in inputs:
        t.grad = None
    out.backward(R)
    worst = 0.0
    for k, t in enumerate(inputs):
        if not t.requires_grad:
            continue
        analytic = backend.to_numpy(t.grad) if t.grad is not None else np.zeros(t.shape)
        numeric = np.zeros(t.shape)
        flat = t.data.reshape(-1)  # a view: perturb in place, then restore
        for i in range(flat.size):
            orig = float(flat[i])
            flat[i] = orig + eps
            up = _output(fn, *inputs)
            flat[i] = orig - eps
            down = _output(fn, *inputs)
            flat[i] = orig
            numeric.reshape(-1)[i] = _difference(up, down, R) / (2 * eps)
        diff = np.abs(analytic - numeric)
        size = np.maximum(np.abs(analytic), np.abs(numeric))
        bad = diff > atol + rtol * size
        relative = diff / np.maximum(size, atol / rtol)
        err = float(np.max(relative)) if diff.size else 0.0
        worst = max(worst, err)
        if bad.any():
            i = np.unravel_index(np.argmax(relative), t.shape)
            raise AssertionError(f"gradient check failed for input {k} of shape {t.shape}: at {i} "
                                 f"backward gives {analytic[i]:.10g}, central differences "
                                 f"{numeric[i]:.10g} (relative error {err:.3g} > {rtol})")
    return worst


def check_directions(fn, params, n_directions=3, eps=EPS, rtol=RTOL, seed=0):
    """Directional check for a scalar-valued or tensor-valued ``fn()`` of ``params``
    (a list of Tensors that require grad, e.g. ``model.parameters()``)."""
    _check_float64(params)
    rng = np.random.default_rng(seed)
    out = fn()
    xp = backend.xp_of(out.data)
    R = xp.asarray(rng.standard_normal(out.shape))
    for p in params:
        p.grad = None
    out.backward(R)
    grads = [backend.to_numpy(p.grad) if p.grad is not None else np.zeros(p.shape) for p in params]
    # A random direction can be nearly orthogonal to the gradient, making <grad, d> tiny and
    # its relative error meaningless; errors are measured against at least 1% of |grad|.
    floor = DIRECTION_FLOOR * np.sqrt(sum(float((g * g).sum()) for g in grads))
    worst = 0.0
    for n in range(n_directions):
        ds = [rng.standard_normal(p.shape) for p in params]
        norm = np.sqrt(sum(float((d * d).sum()) for d in ds))
        ds = [d / norm for d in ds]
        originals = [p.data.copy() for p in params]
        for p, d in zip(params, ds):
            p.data += xp.asarray(eps * d)
        up = _output(fn)
        for p, o, d in zip(params, originals, ds):
            p.data = o - xp.asarray(eps * d)
        down = _output(fn)
        for p, o in zip(params, originals):
            p.data = o
        numeric = _difference(up, down, R) / (2 * eps)
        analytic = sum(float((g * d).sum()) for g, d in zip(grads, ds))
        err = abs(numeric - analytic) / max(abs(numeric), abs(analytic), floor, TINY)
        worst = max(worst, err)
        if err > rtol:
            raise AssertionError(f"directional gradient check failed in direction {n}: backward gives "
                                 f"{analytic:.10g}, central differences {numeric:.10g} "
                                 f"(relative error {err:.3g} > {rtol})")
    return worst


def tensor64(a, requires_grad=True):
    """A float64 Tensor on the host from anything array-like (for building check inputs)."""
    return Tensor(np.asarray(a, dtype=np.float64), requires_grad=requires_grad)
