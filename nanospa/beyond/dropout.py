"""Dropout (nanoGPT's, docs/method.md §2.5; beyond the paper): the sites a model with
GPTConfig.dropout > 0 gets at nanoGPT's places (attach, which model.GPT looks up by name;
model.py leaves `identity` there otherwise), the masks' generator they share (DropoutMasks),
and the op that applies a mask (Dropout; its spelling dropout). Each row draws its own masks from its index in the step's batch
(run/threads.batch_rows), so a step is the same however it is split.
"""
import math

import numpy as np

from .. import backend
from ..functions import scale_where
from ..model import DENSE_MAX_T, MLP, GPT, Attention, dense
from ..nn import Module
from ..run.threads import first_row
from ..tensor import Function, Tensor

def check_config(cfg):
    """GPTConfig.dropout: a rate in [0, 1), and attention with a (T, T) matrix to drop."""
    if not 0.0 <= cfg.dropout < 1.0:
        raise ValueError(f"GPTConfig.dropout must be in [0, 1) (0 = off), got {cfg.dropout}")
    if cfg.dropout and not dense(cfg):
        raise ValueError(f"GPTConfig.dropout={cfg.dropout} needs dense attention: attention by blocks "
                         f"(attention_impl={cfg.attention_impl!r}, block_size={cfg.block_size}) has no "
                         f"(T, T) matrix of probabilities to drop; set attention_impl='dense' "
                         f"(block_size <= {DENSE_MAX_T} is dense under 'auto')")


MASK_SALT = 0x64726F70          # "drop": the masks' key apart from the init's draws of the same seed
M32 = 0xFFFFFFFF


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


def attach(model, seed):
    """Put a DropoutSite at each of nanoGPT's places in `model` (the embedding, each attention's
    P and output, each MLP's output), numbered in module order, and give the model the masks
    they share (model.dropout_masks)."""
    cfg = model.config
    p, T, C = cfg.dropout, cfg.block_size, cfg.n_embd
    for m in list(model.modules()):
        if isinstance(m, GPT):
            m.drop = DropoutSite(p, (T, C))                       # the embedding
        elif isinstance(m, Attention):
            m.attn_drop = DropoutSite(p, (cfg.n_head, T, T))     # P
            m.resid_drop = DropoutSite(p, (T, C))                # the attention's output
        elif isinstance(m, MLP):
            m.drop = DropoutSite(p, (T, C))                      # the MLP's output
    masks = DropoutMasks(seed)
    for site, d in enumerate(m for m in model.modules() if isinstance(m, DropoutSite)):
        d.masks, d.site = masks, site
    model.dropout_masks = masks


class DropoutSite(Module):
    """Inverted dropout at one site of a model: in training mode each entry of x (B, ...) is
    kept with probability 1 - p and scaled by 1 / (1 - p), else set to 0 (the op Dropout
    below); in evaluation mode, or with p = 0, x itself. `full`: a row's shape at the full
    block_size. Its masks: the model's DropoutMasks, with the site's number (attach)."""

    def __init__(self, p, full):
        super().__init__()
        self.p, self.full, self.masks, self.site = float(p), tuple(full), None, None

    def forward(self, x):
        if not self.training or self.p == 0.0:
            return x
        if self.masks is None:
            raise RuntimeError("DropoutSite: no DropoutMasks (attach hands a model's own to each of its sites)")
        return self.masks.drop(x, self.site, self.p, self.full)


class DropoutMasks(Module):
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
      the next step new ones; a checkpoint keeps the state (run/checkpoint.py). A Module
      without parameters, so that the model's after_step reaches it."""

    def __init__(self, seed):
        super().__init__()
        self.key = [int(w) for w in np.random.SeedSequence([seed, MASK_SALT]).generate_state(2)]
        self.step = 0

    def after_step(self):
        """Once per optimiser step (GPT.after_step): the next step's masks."""
        self.step += 1

    def state(self):
        return dict(key=list(self.key), step=self.step)

    def load(self, state):
        self.key, self.step = [int(w) for w in state["key"]], int(state["step"])

    def drop(self, x, site, p, full):
        """x (a Tensor (B, ...)) through dropout at `site` with rate p (DropoutSite.forward)."""
        return dropout(x, self.keep(x.data, site, p, full), p)

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


class Dropout(Function):
    """Inverted dropout with a given mask: y = x keep / (1 - p) (keep: a boolean array of x's
    shape, True where an entry is kept; ``scale`` = 1 / (1 - p)). The mask is an input, not
    drawn here, so a gradient check holds it fixed (DropoutMasks draws it).
    Backward: g keep / (1 - p), the same factors."""

    def forward(ctx, x, keep, scale):
        ctx.save(keep)
        ctx.scale = scale
        return scale_where(x, keep, scale, 0.0)

    def backward(ctx, g):
        return scale_where(g, ctx.saved[0], ctx.scale, 0.0)


def dropout(x, keep, p):
    """x with the entries where keep is False set to 0 and the others scaled by 1 / (1 - p);
    keep: a boolean Tensor or array (a host mask is copied to x's device)."""
    keep = keep.data if isinstance(keep, Tensor) else keep
    return Dropout.apply(x, keep=backend.xp_of(x.data).asarray(keep), scale=1.0 / (1.0 - p))
