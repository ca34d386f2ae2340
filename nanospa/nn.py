"""Modules: named parameters in a deterministic order, and the basic layers.

A Module keeps its parameters and sub-modules as attributes; ``named_parameters()`` walks
them in the order they were assigned (Python dicts keep insertion order), so parameter
lists, state dicts and optimiser states line up across runs, processes and devices.
Buffers (``register_buffer``) are non-trainable arrays that travel with the state dict
(SPA's fixed B_l and D_l). All random values are drawn on the host from the
numpy.random.Generator handed in, then moved to the current device by backend.asarray.

A Module is in training mode unless ``eval()`` (or ``with module.evaluating():``) says
otherwise; only Dropout and the layers whose statistics come from the batch
(nanospa/beyond/norms.py) read the flag.

Here: Parameter, Module, orthogonal (the Haar-random matrix of the SPA initialisation),
Linear, Embedding, Dropout and the generator of its masks (DropoutMasks, batch_rows),
LayerNorm, RMSNorm. Not here: DyT, the batch-statistics norms and
GroupNorm (beyond/norms.py), the ops these layers call
(functions.py, shape_ops.py, fused.py), and the attention and MLP blocks with their
signal-propagation initialisation, which model.py writes over the default weights.
"""
import contextlib
import math
import threading

import numpy as np

from . import backend
from .functions import dropout
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
        returns self. Dropout drops only in training mode; BatchNorm and PRepBN use batch
        statistics in training mode and running statistics in evaluation mode; every other
        layer ignores the flag."""
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
    models overwrite ``weight`` with their own initialisation (see model.py). ``capture``
    is None unless a K-FAC optimiser registered the layer (kfac.KFAC): then forward hands
    it (x, y) and uses what it returns, y itself outside K-FAC's curvature pass."""

    def __init__(self, n_in, n_out, bias=False, rng=None, dtype="float32"):
        super().__init__()
        rng = rng if rng is not None else np.random.default_rng(DEFAULT_SEED)
        self.weight = Parameter(rng.standard_normal((n_in, n_out)) / np.sqrt(n_in), dtype=dtype)
        self.bias = Parameter(np.zeros(n_out), dtype=dtype, no_decay=True) if bias else None
        self.capture = None  # set only by a K-FAC optimiser (nanospa.beyond.kfac): sees x and dL/dy

    def forward(self, x):
        y = x @ self.weight  # (..., in) @ (in, out) -> (..., out)
        if self.capture is not None:  # the one cost on the AdamW path: this attribute check
            y = self.capture(x, y)
        return y + self.bias if self.bias is not None else y


class Embedding(Module):
    """Rows of an (n, dim) table, init N(0, std^2)."""

    def __init__(self, n, dim, std=1.0, rng=None, dtype="float32"):
        super().__init__()
        rng = rng if rng is not None else np.random.default_rng(DEFAULT_SEED)
        self.weight = Parameter(std * rng.standard_normal((n, dim)), dtype=dtype)

    def forward(self, idx):
        return embedding(self.weight, idx)  # (B, T) -> (B, T, C)


# ----------------------------------------------------------------------------- dropout

MASK_SALT = 0x64726F70          # "drop": the masks' key apart from the init's draws of the same seed
M32 = 0xFFFFFFFF
_rows = threading.local()


@contextlib.contextmanager
def batch_rows(first):
    """Within the block, a model call on this thread holds rows first, first + 1, ... of its
    step's batch, and draws those rows' dropout masks (DropoutMasks). The code that splits a
    step's batch says where each part starts: run/step.micro_batches (micro-batches, MPI
    ranks), run/threads.sliced_loss (slices on worker threads); 0 outside."""
    before, _rows.first = first_row(), int(first)
    try:
        yield
    finally:
        _rows.first = before


def first_row():
    """The index in its step's batch of the first row of a model call on this thread."""
    return getattr(_rows, "first", 0)


def mix32(x):
    """lowbias32 (C. Wellons' integer hash, a bijection of 32-bit words): a uint32 array in
    place (its products wrap), or a Python int."""
    if isinstance(x, int):
        x ^= x >> 16
        x = x * 0x7FEB352D & M32
        x ^= x >> 15
        x = x * 0x846CA68B & M32
        return x ^ x >> 16
    x ^= x >> 16
    x *= 0x7FEB352D
    x ^= x >> 15
    x *= 0x846CA68B
    x ^= x >> 16
    return x


class DropoutMasks:
    """The dropout masks of one model: a counter-based generator (Salmon et al. 2011, "Parallel
    random numbers: as easy as 1, 2, 3"; JAX's design). Entry e of row r at site s in step n
    is kept iff

        h = mix(mix(e ^ a_r) ^ b_r) < (1 - p) 2^32,   a_r = mix(mix(r ^ c_a)), b_r likewise,

    mix = mix32 and (c_a, c_b) mixed from the key (two words) with n and s, so that:
    - a mask is a function of (key, n, s, r, e) alone: a row's masks are the same whatever
      else is in the call (r: its index in the step's batch, batch_rows), so a step split
      into worker threads' slices, micro-batches or MPI ranks is the step of one call, and a
      prefix of a sequence sees the masks of the whole one (e counts over block_size);
    - the CPU and a GPU draw the same masks: uint32 arithmetic on the model's device, from
      nothing but the row indices made there (no host copy, no read);
    - the state is (key, step): step advances once per optimiser step (GPT.after_step), so
      every forward of a step (its slices, a K-FAC curvature pass) sees that step's masks and
      the next step new ones; a checkpoint keeps the state (run/checkpoint.py)."""

    def __init__(self, seed):
        self.key = [int(w) for w in np.random.SeedSequence([seed, MASK_SALT]).generate_state(2)]
        self.step = 0

    def state(self):
        return dict(key=list(self.key), step=self.step)

    def load(self, state):
        self.key, self.step = [int(w) for w in state["key"]], int(state["step"])

    def keep(self, x, site, p, full):
        """The boolean mask (True: kept) of x (B, ...), the rows first_row() on, at `site`;
        `full`: a row's shape at the full length (x.shape[1:] <= full, entry by entry)."""
        xp, rest = backend.xp_of(x), x.shape[1:]
        c_a, c_b = (mix32(mix32(k ^ self.step & M32) ^ site) for k in self.key)   # Python ints
        rows = xp.arange(first_row(), first_row() + x.shape[0], dtype=xp.uint32)   # made on the device
        wide = (-1,) + (1,) * len(rest)
        a, b = (mix32(mix32(rows ^ c)).reshape(wide) for c in (c_a, c_b))         # (B, 1, ...)
        strides = [math.prod(full[k + 1:]) & M32 for k in range(len(full))]         # C order, a full row
        e = sum(xp.arange(n, dtype=xp.uint32).reshape((-1,) + (1,) * (len(rest) - k - 1)) * s
                for k, (n, s) in enumerate(zip(rest, strides)))                   # entry numbers (...)
        h = mix32(e ^ a)                                                             # (B, ...)
        h ^= b
        return mix32(h) < min(round((1.0 - p) * 2 ** 32), M32)


class Dropout(Module):
    """Inverted dropout at one site of a model: in training mode each entry of x (B, ...) is
    kept with probability 1 - p and scaled by 1 / (1 - p), else set to 0 (functions.dropout);
    in evaluation mode, or with p = 0, x itself. `full`: a row's shape at the full block_size.
    The masks come from the model's DropoutMasks, which the model hands to each of its sites
    with the site's number (model.GPT: `masks`, `site`)."""

    def __init__(self, p, full):
        super().__init__()
        self.p, self.full, self.masks, self.site = float(p), tuple(full), None, None

    def forward(self, x):
        if not self.training or self.p == 0.0:
            return x
        if self.masks is None:
            raise RuntimeError("Dropout: no DropoutMasks (a model hands its own to each of its Dropout sites)")
        return dropout(x, self.masks.keep(x.data, self.site, self.p, self.full), self.p)


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
