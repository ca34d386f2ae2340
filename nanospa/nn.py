"""Modules: named parameters in a deterministic order, and the basic layers.

A Module keeps its parameters and sub-modules as attributes; ``named_parameters()`` walks
them in the order they were assigned (Python dicts keep insertion order), so parameter
lists, state dicts and optimiser states line up across runs, processes and devices.
Buffers (``register_buffer``) are non-trainable arrays that travel with the state dict
(SPA's fixed B_l and D_l). All random values are drawn on the host from the
numpy.random.Generator handed in, then moved to the current device by backend.asarray.

A Module is in training mode unless ``eval()`` (or ``with module.evaluating():``) says
otherwise; only dropout's sites (nanospa/beyond/dropout.py) and the layers whose statistics
come from the batch (nanospa/beyond/norms.py) read the flag.

Here: Parameter, Module, orthogonal (the Haar-random matrix of the SPA initialisation),
Linear, Embedding, LayerNorm, RMSNorm. Not here: dropout (beyond/dropout.py), DyT, the batch-statistics norms and GroupNorm (beyond/norms.py), the ops
these layers call (functions.py, shape_ops.py, fused.py), and the attention and MLP blocks
with their signal-propagation initialisation, which model.py writes over the default weights.
"""
import contextlib

import numpy as np

from . import backend
from .fused import LAYER_NORM_EPS, RMS_NORM_EPS, layer_norm, rms_norm
from .shape_ops import embedding
from .tensor import Tensor

DEFAULT_SEED = 0  # the generator a layer draws from when none is handed in: still reproducible


class Parameter(Tensor):
    """A trainable Tensor (requires_grad=True). ``no_decay`` keeps it out of weight decay."""
    __slots__ = ("no_decay",)

    def __init__(self, data, no_decay=False, dtype=None):
        super().__init__(backend.asarray(data, dtype=dtype), requires_grad=True)
        self.no_decay = no_decay


class Module:
    training = True  # the class default; train() / eval() set it on a module and all below it

    def __init__(self):
        object.__setattr__(self, "_buffers", {})

    def train(self, mode=True):
        """Training mode (mode=True) or evaluation mode on this module and every sub-module;
        returns self (which layers read the flag: the module docstring)."""
        object.__setattr__(self, "training", bool(mode))
        for _, child in self.children():
            child.train(mode)
        return self

    def eval(self):
        return self.train(False)

    @contextlib.contextmanager
    def evaluating(self):
        """Evaluation mode within the block, then the mode this module had before."""
        before = self.training
        self.eval()
        try:
            yield self
        finally:
            self.train(before)

    def register_buffer(self, name, array):
        self._buffers[name] = array
        object.__setattr__(self, name, array)

    def __setattr__(self, name, value):
        if name in self.__dict__.get("_buffers", {}):
            self._buffers[name] = value
        object.__setattr__(self, name, value)

    def children(self):
        for name, value in vars(self).items():
            if isinstance(value, Module):
                yield name, value
            elif isinstance(value, (list, tuple)):
                for i, v in enumerate(value):
                    if isinstance(v, Module):
                        yield f"{name}.{i}", v

    def modules(self):
        """This module and every sub-module, depth first, in the order they were assigned."""
        yield self
        for _, child in self.children():
            yield from child.modules()

    def named_parameters(self, prefix=""):
        for name, value in vars(self).items():
            if isinstance(value, Parameter):
                yield prefix + name, value
        for name, child in self.children():
            yield from child.named_parameters(prefix + name + ".")

    def named_buffers(self, prefix=""):
        for name, value in self._buffers.items():
            yield prefix + name, value
        for name, child in self.children():
            yield from child.named_buffers(prefix + name + ".")

    def parameters(self):
        return [p for _, p in self.named_parameters()]

    def zero_grad(self):
        for p in self.parameters():
            p.grad = None

    def state_dict(self):
        """{name: numpy.ndarray} of parameters then buffers, copied to the host."""
        d = {k: backend.to_numpy(p.data).copy() for k, p in self.named_parameters()}
        d.update({k: backend.to_numpy(b).copy() for k, b in self.named_buffers()})
        return d

    def load_state_dict(self, state):
        """Copy arrays into the parameters and buffers; every key, shape and dtype must match."""
        params = dict(self.named_parameters())
        buffers = dict(self.named_buffers())
        missing = [k for k in list(params) + list(buffers) if k not in state]
        unexpected = [k for k in state if k not in params and k not in buffers]
        if missing or unexpected:
            raise ValueError(f"state dict mismatch: missing keys {missing}, unexpected keys {unexpected}")
        for k, v in state.items():
            v = np.asarray(v) if not backend.is_device_array(v) else v
            target = params[k].data if k in params else buffers[k]
            if tuple(v.shape) != tuple(target.shape):
                raise ValueError(f"state dict key {k!r}: shape {tuple(v.shape)} does not match "
                                 f"the model's {tuple(target.shape)}")
            if v.dtype != target.dtype:
                raise ValueError(f"state dict key {k!r}: dtype {v.dtype} does not match the model's "
                                 f"{target.dtype}")
        for k, v in state.items():
            if k in params:
                params[k].data = backend.asarray(v)
            else:
                self._set_buffer(k, backend.asarray(v))

    def _set_buffer(self, dotted, value):
        *path, name = dotted.split(".")
        m = self
        for part in path:
            m = m[int(part)] if isinstance(m, (list, tuple)) else getattr(m, part)
        setattr(m, name, value)

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)


def orthogonal(rng, n_in, n_out, scale=1.0):
    """A random (semi-)orthogonal (n_in, n_out) matrix times ``scale``, from the QR of a
    Gaussian matrix with the signs fixed so the distribution is uniform (Haar)."""
    a = rng.standard_normal((max(n_in, n_out), min(n_in, n_out)))
    q, r = np.linalg.qr(a)
    q = q * np.sign(np.diag(r))
    # C order: a Fortran-ordered weight would take a different BLAS path than the same weight
    # reloaded from a checkpoint, and a resumed run would drift in the last bits.
    return np.ascontiguousarray(scale * (q if n_in >= n_out else q.T))


class Linear(Module):
    """y = x W (+ b), W of shape (in, out), no bias by default. Default init N(0, 1/in);
    models overwrite ``weight`` with their own initialisation (see model.py). (A K-FAC
    optimiser swaps in its own forward: beyond/kfac.py _RegisteredLinear.)"""

    def __init__(self, n_in, n_out, bias=False, rng=None, dtype="float32"):
        super().__init__()
        rng = rng if rng is not None else np.random.default_rng(DEFAULT_SEED)
        self.weight = Parameter(rng.standard_normal((n_in, n_out)) / np.sqrt(n_in), dtype=dtype)
        self.bias = Parameter(np.zeros(n_out), dtype=dtype, no_decay=True) if bias else None

    def forward(self, x):
        y = x @ self.weight  # (..., in) @ (in, out) -> (..., out)
        return y + self.bias if self.bias is not None else y


class Embedding(Module):
    """Rows of an (n, dim) table, init N(0, std^2)."""

    def __init__(self, n, dim, std=1.0, rng=None, dtype="float32"):
        super().__init__()
        rng = rng if rng is not None else np.random.default_rng(DEFAULT_SEED)
        self.weight = Parameter(std * rng.standard_normal((n, dim)), dtype=dtype)

    def forward(self, idx):
        return embedding(self.weight, idx)  # (B, T) -> (B, T, C)


class LayerNorm(Module):
    """fused.LayerNorm with a gain (init 1) and a bias (init 0), neither weight-decayed."""

    def __init__(self, dim, eps=LAYER_NORM_EPS, dtype="float32"):
        super().__init__()
        self.eps = eps
        self.weight = Parameter(np.ones(dim), dtype=dtype, no_decay=True)
        self.bias = Parameter(np.zeros(dim), dtype=dtype, no_decay=True)

    def forward(self, x):
        return layer_norm(x, self.weight, self.bias, self.eps)


class RMSNorm(Module):
    """fused.RMSNorm with a gain (init 1), not weight-decayed."""

    def __init__(self, dim, eps=RMS_NORM_EPS, dtype="float32"):
        super().__init__()
        self.eps = eps
        self.weight = Parameter(np.ones(dim), dtype=dtype, no_decay=True)

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)
