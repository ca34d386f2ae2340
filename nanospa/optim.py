"""Optimisers, gradient clipping and the learning-rate schedule.

Updates change ``param.data`` in place, after backward has freed the graph, so no array
saved for a backward pass is ever modified. Optimiser state lives on the parameters'
device and has the parameters' dtype; ``state_dict`` brings it to the host for checkpoints.

Here: AdamW (its update in place, adamw_update),
global-norm clipping, the warm-up + cosine schedule. Not here: which parameters decay
(each Parameter's ``no_decay``, set where it is made) and the training loop (train.py).
"""
import math

import numpy as np

from . import backend

CLIP_EPS = 1e-6  # as torch.nn.utils.clip_grad_norm_: the clipped norm lands just below max_norm


class Optimizer:
    def __init__(self, params, lr):
        self.params = list(params)
        if not self.params:
            raise ValueError(f"{type(self).__name__}: an empty parameter list (nothing to optimise)")
        check_lr(lr)
        self._lr = lr
        self.t = 0

    lr = property(lambda self: self._lr, lambda self, value: setattr(self, "_lr", check_lr(value)),
                  doc="The learning rate; setting it checks it (finite and >= 0), as every step uses it.")

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    def state_dict(self):
        out = {"t": np.asarray(self.t)}
        for name, arrays in self._state().items():
            for i, a in enumerate(arrays):
                if a is not None:
                    out[f"{name}.{i}"] = backend.to_numpy(a).copy()
        return out

    def load_state_dict(self, state):
        self.t = int(state["t"])
        for name, arrays in self._state().items():
            for i in range(len(arrays)):
                key = f"{name}.{i}"
                if key in state:
                    if tuple(state[key].shape) != tuple(self.params[i].data.shape):
                        raise ValueError(f"optimiser state {key!r}: shape {tuple(state[key].shape)} does "
                                         f"not match parameter {i} of shape {self.params[i].shape}")
                    arrays[i] = backend.asarray(state[key], dtype=self.params[i].dtype)

    def _state(self):
        return {}


class AdamW(Optimizer):
    """Adam with bias correction and decoupled weight decay (Loshchilov & Hutter):
        m <- b1 m + (1-b1) g;   v <- b2 v + (1-b2) g^2
        p <- p - lr * ( m / (1-b1^t) / (sqrt(v / (1-b2^t)) + eps) + wd * p )
    Parameters marked ``no_decay`` (norm gains, biases, SPA biases) get no weight decay.
    The defaults of betas and eps are Kingma & Ba's."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        super().__init__(params, lr)
        self.b1, self.b2 = _check_betas(betas)
        if not (eps > 0 and math.isfinite(eps)):
            raise ValueError(f"AdamW: eps must be finite and > 0, got {eps!r}")
        if not (weight_decay >= 0 and math.isfinite(weight_decay)):
            raise ValueError(f"AdamW: weight_decay must be finite and >= 0, got {weight_decay!r}")
        self.eps, self.weight_decay = eps, weight_decay
        self.m = [None] * len(self.params)
        self.v = [None] * len(self.params)

    def _state(self):
        return {"m": self.m, "v": self.v}

    def step(self):
        self.t += 1
        adamw_step(self, range(len(self.params)), self.lr, self.eps)


def adamw_step(opt, indices, lrs, eps):
    """AdamW's step t = opt.t on opt.params[i] for i in indices, each at rate lrs[i] (a list
    over all of opt.params, or one rate for all), with opt's moments m, v (made on first use),
    betas b1, b2 and weight_decay: AdamW itself (with muP's rates: beyond/optimizers.py), and
    the fallback of K-FAC and Muon for the parameters they do not precondition."""
    c1, c2 = 1.0 - opt.b1 ** opt.t, 1.0 - opt.b2 ** opt.t
    for i in indices:
        p = opt.params[i]
        if p.grad is None:
            continue
        if opt.m[i] is None:
            xp = backend.xp_of(p.data)
            opt.m[i], opt.v[i] = xp.zeros_like(p.data), xp.zeros_like(p.data)
        lr = lrs[i] if isinstance(lrs, list) else lrs
        decay = 1.0 - lr * opt.weight_decay if not getattr(p, "no_decay", False) else 1.0
        adamw_update(p.data, p.grad, opt.m[i], opt.v[i], opt.b1, opt.b2, lr / c1, eps, 1.0 / c2, decay)


def adamw_update(p, g, m, v, b1, b2, step_size, eps, inv_c2, decay):
    """One AdamW update of one parameter, all arrays in place, one scratch array:
        m <- b1 m + (1 - b1) g;   v <- b2 v + (1 - b2) g^2
        p <- decay p - step_size m / (sqrt(v inv_c2) + eps)
    with step_size = lr / (1 - b1^t), inv_c2 = 1 / (1 - b2^t), decay = 1 - lr wd (or 1)."""
    xp = backend.xp_of(p)
    tmp = xp.multiply(g, 1.0 - b1, dtype=p.dtype)
    m *= b1
    m += tmp
    xp.multiply(g, g, out=tmp)
    tmp *= 1.0 - b2
    v *= b2
    v += tmp
    xp.sqrt(v, out=tmp)
    tmp *= inv_c2 ** 0.5                            # sqrt(v inv_c2)
    tmp += eps
    xp.divide(m, tmp, out=tmp)
    tmp *= step_size
    if decay != 1.0:
        p *= decay
    p -= tmp
    return p


def check_lr(lr):
    """lr itself, or ValueError unless it is a finite number >= 0 (a NaN rate would turn every
    parameter into NaN in one step)."""
    if isinstance(lr, bool) or not isinstance(lr, (int, float, np.floating, np.integer)) or not (
            math.isfinite(lr) and lr >= 0):
        raise ValueError(f"learning rate must be a finite number >= 0, got {lr!r}")
    return lr


def _check_betas(betas):
    try:
        b1, b2 = betas
    except (TypeError, ValueError):
        raise ValueError(f"betas must be a pair (beta1, beta2), got {betas!r}") from None
    for name, b in (("beta1", b1), ("beta2", b2)):
        if isinstance(b, bool) or not isinstance(b, (int, float, np.floating, np.integer)) or not 0 <= b < 1:
            raise ValueError(f"betas: {name} must be in [0, 1), got {b!r}")
    return b1, b2


def global_grad_norm(params):
    """sqrt of the sum of squared gradients over all parameters, as a 0-d float64 array of the
    gradients' module: on a GPU it stays there, so that reading it (float(norm)) is one device
    sync for the whole model. Each parameter's sum of squares is taken in its own dtype, and the
    sums are added in parameter order in float64."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return np.zeros((), dtype=np.float64)
    xp = backend.xp_of(*grads)
    sums = xp.stack([(g * g).sum().astype(xp.float64) for g in grads])   # (n_params,)
    return xp.sqrt(xp.cumsum(sums)[-1])        # cumsum: added one by one, in order


def clip_grad_norm(params, max_norm):
    """Scale all gradients by min(1, max_norm / global norm) (max_norm > 0; 0: no clipping).
    Returns the norm before clipping, a 0-d float64 array (global_grad_norm): the scale is
    computed where the gradients are, so that nothing is read back to the host here."""
    norm = global_grad_norm(params)
    if max_norm > 0:
        xp = backend.xp_of(norm)
        clip = (norm > max_norm) & xp.isfinite(norm)
        scale = xp.where(clip, max_norm / (norm + CLIP_EPS), 1.0)     # exactly 1: no change
        for p in params:
            if p.grad is not None:
                p.grad = p.grad * scale.astype(p.grad.dtype)   # not in place: one array can be several leaves' grad
    return norm


def cosine_lr(it, max_lr, warmup_iters, decay_iters, min_lr):
    """Linear warm-up to max_lr over warmup_iters (step it gets max_lr (it + 1) /
    (warmup_iters + 1), as nanoGPT's), then cosine decay to min_lr at decay_iters, then min_lr."""
    if it < warmup_iters:
        return max_lr * (it + 1) / (warmup_iters + 1)
    if it >= decay_iters:
        return min_lr
    ratio = (it - warmup_iters) / max(1, decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (max_lr - min_lr)
