"""Float64 gradient checks by central differences, for tests and for users.

Both checks scalarise the output with a fixed random upstream gradient R,
f(x) = sum(out(x) * R), never ``out.sum()``: errors that cancel in a plain sum (a
transposed or sign-flipped backward on symmetric data) cannot hide.

    check_jacobian(fn, inputs)   every entry of every input: the full Jacobian-vector
                                 product R^T J against the backward pass. For single ops.
    check_directions(fn, params) a few random unit directions d over all parameters:
                                 (f(p + eps d) - f(p - eps d)) / 2 eps against <grad f, d>.
                                 For whole layers and models.

Each returns the largest relative error and raises AssertionError above ``rtol``.
Inputs must be float64: float32 differences cannot resolve 1e-6. Keep sample points
away from kinks (ReLU at 0, max at ties), where the derivative does not exist.
"""
import numpy as np

from . import backend
from .tensor import Tensor


def _scalarise(out, R):
    return float(backend.to_numpy((out.data * R).sum()))


def _check_float64(tensors):
    for t in tensors:
        if t.dtype != np.float64:
            raise ValueError(f"gradient checks need float64 inputs, got {t.dtype} for shape {t.shape}")


def relative_error(a, b):
    """|a - b| / max(|a|, |b|, tiny), elementwise max."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    scale = np.maximum(np.maximum(np.abs(a), np.abs(b)), 1e-12)
    return float(np.max(np.abs(a - b) / scale)) if a.size else 0.0


def check_jacobian(fn, inputs, eps=1e-6, rtol=1e-6, atol=1e-10, seed=0):
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
            up = _scalarise(fn(*inputs), R)
            flat[i] = orig - eps
            down = _scalarise(fn(*inputs), R)
            flat[i] = orig
            numeric.reshape(-1)[i] = (up - down) / (2 * eps)
        diff = np.abs(analytic - numeric)
        size = np.maximum(np.abs(analytic), np.abs(numeric))
        bad = diff > atol + rtol * size
        err = float(np.max(diff / np.maximum(size, atol / rtol))) if diff.size else 0.0
        worst = max(worst, err)
        if bad.any():
            i = np.unravel_index(np.argmax(np.abs(analytic - numeric)), t.shape)
            raise AssertionError(f"gradient check failed for input {k} of shape {t.shape}: at {i} "
                                 f"backward gives {analytic[i]:.10g}, central differences "
                                 f"{numeric[i]:.10g} (relative error {err:.3g} > {rtol})")
    return worst


def check_directions(fn, params, n_directions=3, eps=1e-6, rtol=1e-6, seed=0):
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
    floor = 0.01 * np.sqrt(sum(float((g * g).sum()) for g in grads))
    worst = 0.0
    for n in range(n_directions):
        ds = [rng.standard_normal(p.shape) for p in params]
        norm = np.sqrt(sum(float((d * d).sum()) for d in ds))
        ds = [d / norm for d in ds]
        originals = [p.data.copy() for p in params]
        for p, d in zip(params, ds):
            p.data += xp.asarray(eps * d)
        up = _scalarise(fn(), R)
        for p, o, d in zip(params, originals, ds):
            p.data = o - xp.asarray(eps * d)
        down = _scalarise(fn(), R)
        for p, o in zip(params, originals):
            p.data = o
        numeric = (up - down) / (2 * eps)
        analytic = sum(float((g * d).sum()) for g, d in zip(grads, ds))
        err = abs(numeric - analytic) / max(abs(numeric), abs(analytic), floor, 1e-12)
        worst = max(worst, err)
        if err > rtol:
            raise AssertionError(f"directional gradient check failed in direction {n}: backward gives "
                                 f"{analytic:.10g}, central differences {numeric:.10g} "
                                 f"(relative error {err:.3g} > {rtol})")
    return worst


def tensor64(a, requires_grad=True):
    """A float64 Tensor on the host from anything array-like (for building check inputs)."""
    return Tensor(np.asarray(a, dtype=np.float64), requires_grad=requires_grad)
