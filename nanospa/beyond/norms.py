"""The norms beyond LayerNorm and RMSNorm (docs/norms.md): DyT (dynamic tanh), BatchNorm
with running statistics and an optional causal (prefix) form, RepBN and PRepBN (SLAB, Guo et
al. 2024), and GroupNorm. Shapes: x (B, T, C); a statistic is per channel.

    BatchNormOp   one fused op: y = (x - mu) r w + b, r = (var + eps)^-1/2, where mu and var
                  are the batch statistics of each window (all B T tokens, or causal: the
                  B (t + 1) tokens at positions <= t), with the closed-form backward through
                  them, or fixed (running statistics: backward g w r)
    batch_stats   those windows' statistics of a raw array
    BatchNorm     batch statistics in training mode, running ones in evaluation mode
    PRepBN        lambda LN(x) + (1 - lambda) (BN(x) + eta x), lambda 1 -> 0 over prepbn_steps
    GroupNorm     per token, over G groups of C / G channels: fused.layer_norm on a (B, T, G,
                  C / G) view, then a gain and bias per channel (G = 1 is LayerNorm)
    DyT           w tanh(a x) + b with a learnable scalar a (Zhu et al. 2025)
    DyTNorm, BatchNorms, GroupNorms   the registry rows (beyond.EXTENSIONS): model.Norm kinds
    check_config(cfg)   GPTConfig's check of the fields of these norms

Running statistics move once per optimiser step (after_step), not per forward: the
training forwards of a step record their (count, mean, var); after_step averages them,
weighted by count, in the order of the batch's slices (run/threads.current_slice, not by which
worker thread finished first), and updates running <- (1 - momentum) running + momentum
average, on the device, with nothing read back. With threads
(run/threads.sharded_backward) or MPI ranks each slice normalises by its own batch statistics,
as per-device BatchNorm does: the loss depends on how the batch is split, deterministically.
Under MPI every rank keeps its own running statistics (rank 0's are checkpointed).

Not here: LayerNorm, RMSNorm (nn.py); the train / eval flag (nn.Module.train); the
kernel maps at init (signal/beyond/norm_maps.py); the future-leakage measurement (experiments/causality.py).
"""
import math
import warnings

import numpy as np

from .. import backend
from ..fused import LAYER_NORM_EPS, layer_norm
from ..more_ops import activation
from ..model import Norm
from ..nn import LayerNorm, Module, Parameter
from ..run.threads import current_slice
from ..signal.beyond.norm_maps import BATCH_NORM_EPS, DYT_ALPHA
from ..signal.kernels import kernel_matrix
from ..tensor import Function, Tensor

BATCH_NORMS = ("batchnorm", "prepbn")  # statistics over the batch and positions
BN_MOMENTUM = 0.1  # running <- 0.9 running + 0.1 batch statistic per step (PyTorch's default)
NON_CAUSAL = ("norm={norm!r} with norm_causal=False: its training-mode statistics pool every "
              "position of a sequence, so a causal LM sees the future while training (docs/norms.md); "
              "norm_causal=True pools positions <= t only")


def _window_sum(a, causal):
    """Sums of a (B, T, C) over each statistic's window: (1, T, C), the batch and positions
    <= t (causal), or (1, 1, C), every token."""
    s = a.sum(axis=0, keepdims=True)
    return s.cumsum(axis=1) if causal else s.sum(axis=1, keepdims=True)


def _window_adjoint(s, causal):
    """The adjoint of _window_sum: at each position the sum of s over the windows holding it
    (causal: over t >= position, a reversed cumulative sum); broadcast over the batch."""
    return s[:, ::-1].cumsum(axis=1)[:, ::-1] if causal else s


def _users_sum(a, causal):
    """Sums of a (B, T, C) over the tokens each statistic normalises: per position (causal)
    or all."""
    return a.sum(axis=0, keepdims=True) if causal else a.sum(axis=(0, 1), keepdims=True)


def batch_stats(x, causal):
    """(shift, mean, var, n) of a raw (B, T, C) array: mean and var of x - shift over each
    window, n its token count. shift is position 0's batch mean (every window holds it): it
    keeps the one-pass variance E[(x - s)^2] - E[x - s]^2 from cancelling when a channel's
    mean is large, and it changes nothing else (var does not depend on it)."""
    xp = backend.xp_of(x)
    B, T, _ = x.shape
    shift = x[:, :1].mean(axis=0, keepdims=True)                         # (1, 1, C)
    xs = x - shift
    n = B * xp.arange(1, T + 1, dtype=x.dtype)[None, :, None] if causal else float(B * T)
    mean = _window_sum(xs, causal) / n
    var = xp.maximum(_window_sum(xs * xs, causal) / n - mean * mean, 0.0)  # rounding can go below 0
    return shift, mean, var, n


class BatchNormOp(Function):
    """y = (x - shift - mean) r w + b with r = (var + eps)^-1/2, statistics per window (see
    batch_stats). Backward, with gh = g w, xh = (x - shift - mean) r and per statistic k:
    a_k = r_k sum(gh) / n_k, c_k = r_k^2 sum(gh xh) / n_k over the tokens k normalises,

        gx = gh r - W*(a - mean c) - (x - shift) W*(c)       (W*: _window_adjoint)

    which is LayerNorm's r (gh - mean(gh) - xh mean(gh xh)) over the batch when there is one
    window. fixed=True (running statistics, which do not depend on x): gx = gh r."""

    def forward(ctx, x, w, b, shift, mean, var, n=1.0, causal=False, fixed=False, eps=BATCH_NORM_EPS):
        xs = x - shift
        r = 1.0 / ctx.xp.sqrt(var + eps)
        ctx.save(xs, mean, r, w)
        ctx.n, ctx.causal, ctx.fixed = n, causal, fixed
        return (xs - mean) * r * w + b

    def backward(ctx, g):
        xs, mean, r, w = ctx.saved
        xh = (xs - mean) * r
        gh = g * w
        gw, gb = (g * xh).sum(axis=(0, 1)), g.sum(axis=(0, 1))
        if ctx.fixed:
            return gh * r, gw, gb
        a = r * _users_sum(gh, ctx.causal) / ctx.n
        c = r * r * _users_sum(gh * xh, ctx.causal) / ctx.n
        gx = gh * r - _window_adjoint(a - mean * c, ctx.causal) - xs * _window_adjoint(c, ctx.causal)
        return gx, gw, gb


class BatchNorm(Module):
    """Per channel over the batch and positions (causal: positions <= t), gain 1 and bias 0
    at init, neither weight-decayed. Running statistics: buffers running_mean, running_var
    ((1, C), or (block_size, C) per position when causal), initially 0 and 1, folded in once
    per optimiser step by after_step (module docstring); used in evaluation mode."""

    def __init__(self, dim, causal=False, block_size=1, momentum=BN_MOMENTUM, eps=BATCH_NORM_EPS,
                 dtype="float32"):
        super().__init__()
        self.causal, self.momentum, self.eps = causal, momentum, eps
        self.weight = Parameter(np.ones(dim), dtype=dtype, no_decay=True)
        self.bias = Parameter(np.zeros(dim), dtype=dtype, no_decay=True)
        rows = block_size if causal else 1
        self.register_buffer("running_mean", backend.asarray(np.zeros((rows, dim)), dtype=dtype))
        self.register_buffer("running_var", backend.asarray(np.ones((rows, dim)), dtype=dtype))
        self.pending = []           # (slice, tokens, mean, var) of this step's training forwards

    def forward(self, x):
        if self.training:
            shift, mean, var, n = batch_stats(x.data, self.causal)
            self.pending.append((current_slice(), x.shape[0] * x.shape[1], shift + mean, var))   # thread-safe
            return BatchNormOp.apply(x, self.weight, self.bias, shift=shift, mean=mean, var=var, n=n,
                                     causal=self.causal, eps=self.eps)
        rows = slice(0, x.shape[1]) if self.causal else slice(0, 1)
        return BatchNormOp.apply(x, self.weight, self.bias, shift=self.running_mean[None, rows], mean=0.0,
                                 var=self.running_var[None, rows], fixed=True, eps=self.eps)

    def after_step(self):
        """Fold the pending batch statistics into the running ones, one momentum update per
        window length: their token-weighted mean, summed in the order of the batch's slices
        (each slice's own forwards in the order they ran)."""
        pending, self.pending = self.pending, []
        pending.sort(key=lambda e: (e[2].shape[1], e[0]))            # stable: a slice keeps its order
        for T in sorted({e[2].shape[1] for e in pending}):
            group = [e for e in pending if e[2].shape[1] == T]
            total = float(sum(e[1] for e in group))
            mean = sum(e[2][0] * (e[1] / total) for e in group)          # (T, C) or (1, C)
            var = sum(e[3][0] * (e[1] / total) for e in group)
            m = self.momentum
            rm, rv = self.running_mean.copy(), self.running_var.copy()
            rm[:T], rv[:T] = rm[:T] * (1.0 - m) + mean * m, rv[:T] * (1.0 - m) + var * m
            self.running_mean, self.running_var = rm, rv


class PRepBN(Module):
    """Progressive re-parameterised BatchNorm (SLAB): y = lambda LN(x) + (1 - lambda) RepBN(x),
    RepBN(x) = BN(x) + eta x with a trainable scalar eta (init eta0: SLAB's 1; not weight-decayed), and
    lambda = 1 - min(s, steps) / steps after s optimiser steps (0 when steps = 0). s is the
    buffer steps_done, advanced by after_step, so a checkpoint holds the schedule. The same
    mixture is used in both modes (evaluation: BN's running statistics); at lambda = 1 the
    evaluation skips BN, at lambda = 0 both modes skip LN (either term is then exactly 0)."""

    def __init__(self, dim, steps, causal=False, block_size=1, eps=LAYER_NORM_EPS, dtype="float32", eta0=1.0):
        super().__init__()
        self.steps = steps
        self.ln = LayerNorm(dim, eps=eps, dtype=dtype)
        self.bn = BatchNorm(dim, causal=causal, block_size=block_size, dtype=dtype)
        self.eta = Parameter(np.full(1, float(eta0)), dtype=dtype, no_decay=True)
        self.register_buffer("steps_done", np.zeros(1, dtype=np.int64))
        object.__setattr__(self, "_done", 0)

    def __setattr__(self, name, value):
        if name == "steps_done":               # set here, or loaded from a checkpoint: kept on the
            object.__setattr__(self, "_done", int(backend.to_numpy(value)[0]))   # host too (one read)
        super().__setattr__(name, value)

    @property
    def lam(self):
        s = self._done                          # the host's copy: no device read per forward
        return 1.0 - min(s, self.steps) / self.steps if self.steps else 0.0

    def forward(self, x):
        lam = self.lam
        if lam == 1.0 and not self.training:
            return self.ln(x)
        rep = self.bn(x) + x * self.eta
        if lam == 0.0:
            return rep
        return self.ln(x) * lam + rep * (1.0 - lam)

    def after_step(self):
        xp = backend.xp_of(self.steps_done)
        object.__setattr__(self, "_done", self._done + 1)
        self._buffers["steps_done"] = xp.full(1, self._done, dtype=np.int64)   # made where it lives
        object.__setattr__(self, "steps_done", self._buffers["steps_done"])


class GroupNorm(Module):
    """Per token over `groups` groups of dim / groups channels: each group normalised to mean
    0 and variance 1 (fused.layer_norm on the grouped view, gain 1 and bias 0), then a gain
    (init 1) and a bias (init 0) per channel, neither weight-decayed."""

    def __init__(self, dim, groups, eps=LAYER_NORM_EPS, dtype="float32"):
        super().__init__()
        if dim % groups:
            raise ValueError(f"GroupNorm: dim={dim} is not divisible by groups={groups}")
        self.groups, self.eps = groups, eps
        self.weight = Parameter(np.ones(dim), dtype=dtype, no_decay=True)
        self.bias = Parameter(np.zeros(dim), dtype=dtype, no_decay=True)
        m = dim // groups
        self.unit = (Tensor(backend.asarray(np.ones(m), dtype=dtype)), Tensor(backend.asarray(np.zeros(m), dtype=dtype)))

    def forward(self, x):
        B, T, C = x.shape
        h = layer_norm(x.reshape(B, T, self.groups, C // self.groups), *self.unit, self.eps)
        return h.reshape(B, T, C) * self.weight + self.bias


class DyT(Module):
    """Dynamic tanh, a normalisation-free replacement for LayerNorm: w * tanh(a x) + b with a
    learnable scalar a. Its initial value ``alpha`` has no default: it is a model choice
    (nanospa.signal's DYT_ALPHA, which the signal-propagation predictions also use)."""

    def __init__(self, dim, alpha, dtype="float32"):
        super().__init__()
        self.alpha = Parameter(np.full((1,), alpha), dtype=dtype, no_decay=True)
        self.weight = Parameter(np.ones(dim), dtype=dtype, no_decay=True)
        self.bias = Parameter(np.zeros(dim), dtype=dtype, no_decay=True)

    def forward(self, x):
        return activation(x * self.alpha, "tanh") * self.weight + self.bias


def check_config(cfg):
    """ValueError naming a bad norm_groups, prepbn_steps, prepbn_eta or norm_causal of a
    GPTConfig (docs/norms.md)."""
    for name, low in (("norm_groups", 1), ("prepbn_steps", 0)):
        value = getattr(cfg, name)
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < low:
            raise ValueError(f"GPTConfig.{name} must be an integer >= {low}, got {value!r}")
    if not (isinstance(cfg.prepbn_eta, (int, float, np.floating, np.integer)) and math.isfinite(cfg.prepbn_eta)):
        raise ValueError(f"GPTConfig.prepbn_eta must be a finite number, got {cfg.prepbn_eta!r}")
    if cfg.norm == "groupnorm" and cfg.n_embd % cfg.norm_groups:
        raise ValueError(f"GPTConfig.norm_groups={cfg.norm_groups} does not divide n_embd={cfg.n_embd}")
    if not isinstance(cfg.norm_causal, (bool, np.bool_)):
        raise ValueError(f"GPTConfig.norm_causal must be True or False, got {cfg.norm_causal!r}")
    if cfg.norm_causal and cfg.norm not in BATCH_NORMS:
        raise ValueError(f"GPTConfig.norm_causal=True applies to norm in {list(BATCH_NORMS)}, "
                         f"not norm={cfg.norm!r}")


# The registry rows (beyond.EXTENSIONS): each a model.Norm whose build makes the layer; its
# at_init, the kernel map, is model.Norm's (signal.maps.norm_kernel, which reads these norms'
# maps in signal/beyond/norm_maps.py).

class DyTNorm(Norm):
    kv_cache = True     # token by token

    @staticmethod
    def build(cfg):
        return DyT(cfg.n_embd, alpha=DYT_ALPHA, dtype=cfg.dtype)


class GroupNorms(Norm):
    kv_cache = True     # token by token

    @staticmethod
    def build(cfg):
        return GroupNorm(cfg.n_embd, cfg.norm_groups, dtype=cfg.dtype)


class BatchNorms(Norm):
    """norm="batchnorm" and "prepbn"."""

    @staticmethod
    def kv_cache(cfg):
        """generate's cache: token by token with running statistics over all positions; with
        norm_causal they are per position (running_mean row t), which the norm, called on the
        new rows alone, cannot tell."""
        return True if not cfg.norm_causal else (
            f"norm={cfg.norm!r} with norm_causal=True normalises position t by its own running statistics, "
            "and a norm called on the new positions alone does not know t")

    @staticmethod
    def build(cfg):
        if not cfg.norm_causal:
            warnings.warn(NON_CAUSAL.format(norm=cfg.norm))   # shown once per process (one source line)
        options = dict(causal=cfg.norm_causal, block_size=cfg.block_size, dtype=cfg.dtype)
        if cfg.norm == "batchnorm":
            return BatchNorm(cfg.n_embd, **options)
        return PRepBN(cfg.n_embd, cfg.prepbn_steps, eta0=cfg.prepbn_eta, **options)


def measured_batch_kernels(model, idx):
    """Kernels of all B T tokens of idx at once, (B T, B T) in sequence-major order: as
    measured_kernels, without averaging over sequences, so that the entries between
    sequences are kept (predict_kernels(batch=B), signal/beyond/norm_maps.py; measure.measured_kernels
    averages over them). The model's mode
    decides BatchNorm's statistics."""
    tr = model.trace(idx)
    flat = lambda h: h.reshape(1, -1, h.shape[-1])                   # (B, T, d) -> (1, B T, d)
    return dict(hidden=[kernel_matrix(flat(h), mean=True) for h in tr.hidden],
                attn_branch=[kernel_matrix(flat(h), mean=True) for h in tr.attn_out])
