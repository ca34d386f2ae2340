"""Tensor, Function and reverse-mode differentiation.

A Tensor wraps a NumPy or CuPy array (``.data``), its gradient (``.grad``, a raw array or
None) and, when it was made by an op under autograd, the Function node that made it
(``._ctx``). Each differentiable op is a small Function subclass whose ``forward`` and
``backward`` sit side by side and work on raw arrays of whichever module holds them
(``ctx.xp``): elementwise ops in functions.py, shape-changing ops in shape_ops.py, fused
row-wise ops in fused.py. First-order only.

Not here: any op's arithmetic (those three files), devices (backend.py), layers (nn.py).

The graph is made of Function nodes, not of Tensors: a Function keeps, per input, the
Function that made it, or the input itself when it is a leaf that requires grad (a
parameter), or None (a constant). So an intermediate array stays alive only while user code
holds its Tensor or some op saved it for its backward (the scores of an attention layer,
for one, are freed as soon as the softmax has been computed from them).

What happens in ``loss.backward()``:
  1. an iterative depth-first walk (an explicit stack, no recursion limit) puts every node
     that needs a gradient in topological order; parents are kept in tuples, so the order
     is deterministic;
  2. nodes are visited from the output back; each op's backward returns one gradient per
     input, ``unbroadcast`` (the only place that undoes broadcasting) sums it back to the
     input's shape, and gradients of a tensor used more than once are added;
  3. leaves (parameters) accumulate into ``.grad``; each visited Function drops its saved
     arrays and parents, so the graph is freed as soon as it is used. A gradient that
     reaches a freed node (a second ``loss.backward()``, or a second loss that shares the
     first one's forward) is an error, never a silently partial gradient: sum the losses
     and call backward once.

Operator sugar (``+ - * / ** @``, indexing, ``.sum()``, ``.reshape()`` ...) is written out
below in terms of the Functions, one line each: no registration by reflection. It imports
functions.py and shape_ops.py at the bottom of this file, the one import cycle of the
engine (they need Function and Tensor from here); the fused ops have no sugar.
"""
import contextlib

import numpy as np

from . import backend

_grad_enabled = True


@contextlib.contextmanager
def no_grad():
    """Within this block ops record no graph (evaluation, optimiser updates)."""
    global _grad_enabled
    prev, _grad_enabled = _grad_enabled, False
    try:
        yield
    finally:
        _grad_enabled = prev


def unbroadcast(g, shape):
    """Sum a gradient of a broadcast result back to the input's ``shape``."""
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    if lead > 0:
        g = g.sum(axis=tuple(range(lead)))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    if axes:
        g = g.sum(axis=axes, keepdims=True)
    return g


class Function:
    """Base of every differentiable op. Subclasses define

        forward(ctx, *arrays, **options) -> array
        backward(ctx, g) -> one gradient (array or None) per array input

    ``ctx`` is the Function instance: ``ctx.xp`` is numpy or cupy, ``ctx.save(...)`` keeps
    what backward needs in ``ctx.saved``.
    """

    def save(ctx, *arrays):
        ctx.saved = arrays

    @classmethod
    def apply(cls, *inputs, **options):
        ref = next((t for t in inputs if isinstance(t, Tensor)), None)
        if ref is None:
            raise TypeError(f"{cls.__name__}: needs at least one Tensor input")
        arrays = [t.data if isinstance(t, Tensor) else _constant(t, ref.data) for t in inputs]
        ctx = cls()
        ctx.xp = backend.xp_of(*arrays)
        try:
            out = ctx.forward(*arrays, **options)
        except ValueError as e:  # shape mismatches and the like: name the op and the shapes
            shapes = ", ".join(str(tuple(getattr(a, "shape", ()))) for a in arrays)
            raise ValueError(f"{cls.__name__}: {e} (input shapes {shapes})") from None
        needs = _grad_enabled and any(t.requires_grad for t in inputs if isinstance(t, Tensor))
        result = Tensor(out, requires_grad=needs)
        if needs:
            # per input: the Function that made it, the leaf itself, or None (a constant)
            ctx.parents = tuple((t._ctx if t._ctx is not None else (t if t.requires_grad else None))
                                if isinstance(t, Tensor) else None for t in inputs)
            ctx.shapes = tuple(getattr(a, "shape", ()) for a in arrays)
            result._ctx = ctx
        return result

    def needs_grad(ctx, i):
        """Whether input ``i`` wants a gradient: a backward may skip the work (return None)
        for constants such as SPA's fixed buffers. Only valid inside ``backward``."""
        return ctx.parents[i] is not None

    def __repr__(self):
        return f"<{type(self).__name__}>"


def _constant(value, like):
    """A non-Tensor operand of an op. A Python number stays a Python number: NumPy and CuPy
    apply it in ``like``'s dtype (a "weak" scalar: float32 stays float32) and on a GPU as a
    kernel argument, with no copy to the device; a NumPy scalar becomes one (NumPy 2 would
    promote float32 by a float64 scalar). Arrays are moved to ``like``'s module, floating ones
    cast to ``like``'s dtype."""
    if isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, np.generic) and value.dtype.kind in "fiub":
        return value.item()
    xp = backend.xp_of(like)
    value = xp.asarray(value)
    if like.dtype.kind == "f" and value.dtype.kind in "fiub" and value.dtype != like.dtype:
        value = value.astype(like.dtype)
    return value


class Tensor:
    __slots__ = ("data", "grad", "requires_grad", "_ctx", "__weakref__")
    __array_priority__ = 1000  # above ndarray's 0, so that ndarray * Tensor calls Tensor.__rmul__

    def __init__(self, data, requires_grad=False):
        if isinstance(data, Tensor):
            data = data.data
        if not (isinstance(data, np.ndarray) or backend.is_device_array(data)):
            data = np.asarray(data)
        self.data = data
        self.grad = None
        self.requires_grad = bool(requires_grad)
        self._ctx = None

    # ---- information --------------------------------------------------------------
    shape = property(lambda self: tuple(self.data.shape))
    dtype = property(lambda self: self.data.dtype)
    ndim = property(lambda self: self.data.ndim)
    size = property(lambda self: int(self.data.size))

    def __len__(self):
        return self.data.shape[0]

    def __repr__(self):
        kind = "cuda" if backend.is_device_array(self.data) else "cpu"
        g = ", requires_grad=True" if self.requires_grad else ""
        return f"Tensor(shape={self.shape}, dtype={self.dtype}, device={kind}{g})"

    def numpy(self):
        return backend.to_numpy(self.data)

    def item(self):
        """The value of a one-element tensor as a Python number (a device sync on GPU)."""
        return self.numpy().item()

    # ---- differentiation ----------------------------------------------------------
    def backward(self, grad=None, leaf_grads=None):
        """Back-propagate from this tensor; leaves accumulate into ``.grad``, or, when a dict
        ``leaf_grads`` is given, their gradients are stored there ({leaf: array}) and
        ``.grad`` is left alone (run/threads.py's SlicedLoss.backward adds them up in a fixed order)."""
        if not self.requires_grad:
            raise RuntimeError(f"backward through a tensor of shape {self.shape} that does not "
                               "require grad (no parameter with requires_grad=True reached it)")
        xp = backend.xp_of(self.data)
        if grad is None:
            if self.data.size != 1:
                raise RuntimeError(f"backward on a non-scalar output of shape {self.shape} needs "
                                   "an explicit gradient of the same shape")
            grad = xp.ones_like(self.data)
        else:
            if isinstance(grad, (int, float)):              # a weight: made on the device, not copied
                grad = xp.full((), grad, dtype=self.dtype)
            grad = grad.data if isinstance(grad, Tensor) else xp.asarray(grad, dtype=self.dtype)
            if grad.shape != self.data.shape:
                raise ValueError(f"backward: gradient shape {tuple(grad.shape)} does not match "
                                 f"output shape {self.shape}")
        root = self._ctx if self._ctx is not None else self
        if root is not self and root.parents is None:
            raise RuntimeError(FREED)
        grads = {id(root): grad}
        owned = set()  # keys whose gradient is a sum this loop allocated: safe to add into in place
        for node in reversed(_topological_order(root)):
            g = grads.pop(id(node), None)
            owned.discard(id(node))
            if isinstance(node, Tensor):  # a leaf: accumulate
                if g is not None and leaf_grads is not None:
                    leaf_grads[node] = g
                elif g is not None:
                    node.grad = g if node.grad is None else node.grad + g
                continue
            parents = node.parents
            if parents is None:  # freed by an earlier backward
                if g is None:
                    continue
                raise RuntimeError(FREED)
            parent_grads = node.backward(g) if g is not None else ()
            node.parents = node.saved = None  # free the graph as we go
            if not isinstance(parent_grads, tuple):
                parent_grads = (parent_grads,)
            for p, shape, pg in zip(parents, node.shapes, parent_grads):
                if pg is None or p is None:
                    continue
                pg = unbroadcast(pg, shape)
                if pg.shape != shape:
                    raise RuntimeError(f"{type(node).__name__}.backward returned a gradient of shape "
                                       f"{tuple(pg.shape)} for an input of shape {tuple(shape)}")
                key = id(p)
                if key not in grads:
                    grads[key] = pg  # may be a view or shared with another input: never written to
                elif key in owned:
                    grads[key] += pg
                else:
                    grads[key] = grads[key] + pg
                    owned.add(key)

    # ---- operator sugar: each a one-line call of a Function ---------------------------
    def __add__(self, o): return F.Add.apply(self, o)
    def __radd__(self, o): return F.Add.apply(o, self)
    def __sub__(self, o): return F.Sub.apply(self, o)
    def __rsub__(self, o): return F.Sub.apply(o, self)
    def __mul__(self, o): return F.Mul.apply(self, o)
    def __rmul__(self, o): return F.Mul.apply(o, self)
    def __truediv__(self, o): return F.Div.apply(self, o)
    def __rtruediv__(self, o): return F.Div.apply(o, self)
    def __neg__(self): return F.Neg.apply(self)
    def __pow__(self, p): return F.Pow.apply(self, p=float(p))
    def __matmul__(self, o): return S.MatMul.apply(self, o)
    def __rmatmul__(self, o): return S.MatMul.apply(o, self)
    def __getitem__(self, index): return S.GetItem.apply(self, index=index)

    def sum(self, axis=None, keepdims=False): return S.Sum.apply(self, axis=axis, keepdims=keepdims)
    def mean(self, axis=None, keepdims=False): return S.Mean.apply(self, axis=axis, keepdims=keepdims)
    def reshape(self, *shape): return S.Reshape.apply(self, shape=_shape_arg(shape))
    def transpose(self, *axes): return S.Transpose.apply(self, axes=_shape_arg(axes) or None)
    T = property(lambda self: S.Transpose.apply(self, axes=None))


FREED = ("backward reached a part of the graph that an earlier backward freed (a second backward "
         "from the same loss, or two losses sharing one forward): add the losses and call "
         "backward once, e.g. (loss + aux).backward()")


def _shape_arg(args):
    """reshape(2, 3) and reshape((2, 3)) alike."""
    return tuple(args[0]) if len(args) == 1 and isinstance(args[0], (tuple, list)) else tuple(args)


def _topological_order(root):
    """Graph nodes (Functions, and leaf Tensors that require grad), parents before children.
    Iterative (explicit stack)."""
    order, seen, stack = [], set(), [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        parents = getattr(node, "parents", None) if not isinstance(node, Tensor) else None
        for p in reversed(parents or ()):
            if p is not None and id(p) not in seen:
                stack.append((p, False))
    return order


from . import functions as F  # noqa: E402  (both need Tensor and Function defined above)
from . import shape_ops as S  # noqa: E402
