"""K-FAC: Kronecker-factored approximate curvature (Martens & Grosse 2015), the optimiser
of the DKS line. Equations, settings and the FLOPs it adds: docs/kfac.md.

Notation (W of shape (n_in, n_out), y = x W, rows r = every (sequence, position) of the
curvature pass, the expand approximation: positions flattened into the batch):

    A = mean_r x_r x_r^T          (n_in, n_in); a bias adds the homogeneous coordinate 1
    G = mean_r g_r g_r^T          (n_out, n_out); g_r = d l / d y_r, l the token losses'
                                  sum with targets drawn from the model (the true Fisher)
    F ~= A (x) G                  row-major vec(W): (A (x) G) vec(M) = vec(A M G)
    A = U_A diag(a) U_A^T,  G = U_G diag(c) U_G^T     refreshed every inv_interval steps
    direction D = U_A [ (U_A^T grad U_G) / den ] U_G^T,  den_ij =
        (a_i + pi sqrt(lambda)) (c_j + sqrt(lambda) / pi)   damping_mode="factored"
        a_i c_j + lambda                                    damping_mode="exact"
    pi = sqrt( (tr A / n_in) / (tr G / n_out) )

Every Linear of the model (the head included) is one K-FAC block; all other parameters
(embeddings, norm gains, SkipInit scalars, trainable biases B_l) take AdamW's update with
learning rate lr * adam_lr_ratio. The caller does, per step: backward of the training
loss (as for AdamW), ``update_curvature(x, y)`` (one extra forward and backward on a
slice of the batch, which leaves ``.grad`` alone), clipping, ``step()``.

The engine has no hook: the optimiser makes each of the model's Linears a _RegisteredLinear
(its class swapped in place: same parameters, same names) whose forward hands (x, x W) to
its _Capture. The capture records only inside a curvature pass (a thread-local flag), so
the training pass under K-FAC records nothing.

Not here: the learning-rate schedule and gradient clipping (optim.py, applied by the
caller exactly as for AdamW), the training loop (train.py), MPI (``allreduce`` is a hook).
"""
import math
import threading

import numpy as np

from .. import backend
from ..nn import Linear
from ..optim import _check_betas, adamw_step, check_lr
from ..run.threads import batch_rows, parallel_map, slice_bounds, threads
from ..tensor import Function, no_grad

FISHER_MODES = ("sampled", "empirical", "exact")
DAMPING_MODES = ("factored", "exact")
INVERSE_DTYPES = ("float64", "float32")
TINY_VG = 1e-300    # the KL clip's lr^2 sum d . g where it is <= 0 (then no clipping): never a division by 0
SETTINGS = {  # the constructor's checks: name -> (test, what a good value is)
    "lr": (lambda v: _finite(v) and v >= 0, "finite and >= 0"), "damping": (lambda v: _finite(v) and v > 0, "finite and > 0"),
    "ema": (lambda v: 0 <= v < 1, "in [0, 1)"), "momentum": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "inv_interval": (lambda v: isinstance(v, int) and v >= 1, "a positive integer"),
    "weight_decay": (lambda v: _finite(v) and v >= 0, "finite and >= 0"),
    "kl_clip": (lambda v: _finite(v) and v >= 0, "finite and >= 0 (0 = off)"),
    "stats_fraction": (lambda v: 0 < v <= 1, "in (0, 1]"), "adam_lr_ratio": (lambda v: _finite(v) and v >= 0, "finite and >= 0"),
    "fisher": (lambda v: v in FISHER_MODES, f"one of {FISHER_MODES}"),
    "inverse_dtype": (lambda v: v in INVERSE_DTYPES, f"one of {INVERSE_DTYPES}"),
    "damping_mode": (lambda v: v in DAMPING_MODES, f"one of {DAMPING_MODES}"),
}


def _finite(v):
    return not isinstance(v, bool) and isinstance(v, (int, float, np.floating, np.integer)) and math.isfinite(v)


class _Tap(Function):
    """Identity forwards; backwards it adds the rows of dL/dy to the capture's G sum."""

    def forward(ctx, y, sums=None):
        ctx.sums = sums
        return y

    def backward(ctx, g):
        g2 = g.reshape(-1, g.shape[-1])                     # (..., n_out) -> (rows, n_out)
        ctx.sums.gg = g2.T @ g2 if ctx.sums.gg is None else ctx.sums.gg + g2.T @ g2
        return g


class _Sums:
    """One slice's sums for one Linear: x^T x, sum of x (for a bias), rows, g^T g."""
    __slots__ = ("xx", "xs", "rows", "gg")

    def __init__(self):
        self.xx = self.xs = self.gg = None
        self.rows = 0

    def add_input(self, x):
        xx, xs = x.T @ x, x.sum(axis=0)                     # (rows, n_in) -> (n_in, n_in), (n_in,)
        self.xx = xx if self.xx is None else self.xx + xx
        self.xs = xs if self.xs is None else self.xs + xs
        self.rows += x.shape[0]

    def add(self, other):
        for name in ("xx", "xs", "gg"):
            mine, theirs = getattr(self, name), getattr(other, name)
            setattr(self, name, theirs if mine is None else mine if theirs is None else mine + theirs)
        self.rows += other.rows


class _RegisteredLinear(Linear):
    """A Linear that a K-FAC optimiser registered (KFAC.__init__ sets its class and its
    ``capture``): nn.Linear's forward, with x W handed to the capture before the bias."""

    def forward(self, x):
        y = self.capture(x, x @ self.weight)  # (..., in) @ (in, out) -> (..., out)
        return y + self.bias if self.bias is not None else y


class _Capture:
    """What a registered Linear calls in forward (_RegisteredLinear.capture)."""
    __slots__ = ("local", "key")

    def __init__(self, local, key):
        self.local, self.key = local, key

    def __call__(self, x, y):
        stats = getattr(self.local, "stats", None)          # None outside a curvature pass
        if stats is None:
            return y
        sums = stats.setdefault(self.key, _Sums())
        sums.add_input(x.data.reshape(-1, x.shape[-1]))     # (B, T, n_in) -> (B T, n_in): expand
        return _Tap.apply(y, sums=sums)


class _Slot:
    """A batch factor in the shape World.allreduce_grads reduces: ``.grad`` (and ``.data``)."""
    __slots__ = ("data", "grad")

    def __init__(self, a):
        self.data = self.grad = a


class _Block:
    """One Linear: its parameter indices, the factors' moving sums, the eigendecompositions."""
    __slots__ = ("name", "w", "b", "A", "G", "evA", "UA", "evG", "UG")

    def __init__(self, name, w, b):
        self.name, self.w, self.b = name, w, b
        self.A = self.G = self.evA = self.UA = self.evG = self.UG = None


def linears(module, prefix=""):
    """(dotted name, Linear) of every Linear under ``module``, in parameter order."""
    for name, child in module.children():
        if isinstance(child, Linear):
            yield prefix + name, child
        yield from linears(child, prefix + name + ".")


def softmax_rows(z):
    """softmax over the last axis of a raw array (the model's predictive distribution)."""
    xp = backend.xp_of(z)
    e = xp.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def sample_targets(p, u):
    """Inverse-CDF draws, one per row of p (N, V): the first class k whose cumulative
    probability p_1 + ... + p_k exceeds u (N,), u uniform on [0, 1)."""
    xp = backend.xp_of(p)
    k = (xp.cumsum(p, axis=1) < u[:, None]).sum(axis=1)
    return xp.minimum(k, p.shape[1] - 1)                    # rounding: cumsum may end below 1


def output_gradients(p, k, weight=None):
    """Rows of d(-log p_k)/dz = p - e_k for logits z, times ``weight`` (N,) when given."""
    xp = backend.xp_of(p)
    g = p.copy()
    g[xp.arange(p.shape[0]), k] -= 1.0
    return g if weight is None else g * weight[:, None]


def pi_correction(evA, evG):
    """pi = sqrt((tr A / n_A) / (tr G / n_G)) from the eigenvalues; 1 when a trace is 0."""
    xp = backend.xp_of(evA)
    ma, mg = evA.mean(), evG.mean()
    ok = (ma > 0) & (mg > 0)
    return xp.where(ok, xp.sqrt(xp.where(ok, ma / xp.where(ok, mg, 1), 1)), 1).astype(evA.dtype)


def damped_solve(M, evA, UA, evG, UG, damping, mode):
    """(A (x) G + damping)^-1 vec(M) in the eigenbases of A and G, M (n_A, n_G); the damping
    is factored and pi-corrected, or exact (see the module docstring)."""
    R = UA.T @ M @ UG                                       # (n_A, n_G) in the eigenbasis
    if mode == "factored":
        pi, r = pi_correction(evA, evG), math.sqrt(damping)
        den = (evA + pi * r)[:, None] * (evG + r / pi)[None, :]
    else:
        den = evA[:, None] * evG[None, :] + damping
    return UA @ (R / den) @ UG.T


class KFAC:
    """K-FAC for a Module whose ``forward(idx)`` gives logits (or (logits, loss)).
    Settings (docs/kfac.md): lr, damping lambda, ema (the factors' decay), inv_interval
    (steps between eigendecompositions), momentum, weight_decay (decoupled, not on no_decay
    parameters), kl_clip (0 = off), fisher (sampled | empirical | exact), stats_fraction
    (share of the batch's sequences in the curvature pass), inverse_dtype (of eigh),
    damping_mode (factored | exact), adam_betas, adam_eps, adam_lr_ratio (the fallback's
    lr / lr), seed (of the sampled targets: give each rank its own), allreduce: a function
    that replaces each ``.grad`` of a list of objects by its mean over ranks (the signature
    of nanospa.run.distributed's World.allreduce_grads), applied to the batch factors."""

    def __init__(self, model, lr=0.03, damping=1e-2, ema=0.95, inv_interval=10, momentum=0.5,
                 weight_decay=0.0, kl_clip=1e-3, fisher="sampled", stats_fraction=0.25,
                 inverse_dtype="float64", damping_mode="factored", adam_betas=(0.9, 0.999),
                 adam_eps=1e-8, adam_lr_ratio=0.05, seed=0, logits_fn=None, allreduce=None):
        values = dict(lr=lr, damping=damping, ema=ema, inv_interval=inv_interval, momentum=momentum,
                      weight_decay=weight_decay, kl_clip=kl_clip, fisher=fisher,
                      stats_fraction=stats_fraction, inverse_dtype=inverse_dtype,
                      damping_mode=damping_mode, adam_lr_ratio=adam_lr_ratio)
        bad = [f"{k} must be {SETTINGS[k][1]}, got {v!r}" for k, v in values.items() if not SETTINGS[k][0](v)]
        if bad:
            raise ValueError("K-FAC: " + "; ".join(bad))
        for k, v in values.items():
            setattr(self, k, v)
        if not (_finite(adam_eps) and adam_eps > 0):
            raise ValueError(f"K-FAC: adam_eps must be finite and > 0, got {adam_eps!r}")
        (self.b1, self.b2), self.adam_eps, self.seed, self.allreduce = _check_betas(adam_betas), adam_eps, seed, allreduce
        self.logits_fn = logits_fn or (lambda idx: _first(model(idx)))
        self.params = model.parameters()
        if not self.params:
            raise ValueError("K-FAC: the model has no parameters")
        index = {id(p): i for i, p in enumerate(self.params)}
        self._local = threading.local()
        self.blocks = []
        for name, layer in linears(model):
            b = index[id(layer.bias)] if layer.bias is not None else None
            self.blocks.append(_Block(name, index[id(layer.weight)], b))
            if type(layer) not in (Linear, _RegisteredLinear):   # a subclass's own forward would be lost
                raise TypeError(f"K-FAC: {name} is a {type(layer).__name__}, not an nn.Linear")
            layer.__class__ = _RegisteredLinear
            layer.capture = _Capture(self._local, len(self.blocks) - 1)  # the newest K-FAC owns it
        in_blocks = {i for blk in self.blocks for i in (blk.w, blk.b) if i is not None}
        self.fallback = [i for i in range(len(self.params)) if i not in in_blocks]
        self.t = 0          # steps taken
        self.updates = 0    # curvature updates folded into the moving averages
        self.mom = [None] * len(self.params)                # K-FAC blocks' momentum
        self.m = [None] * len(self.params)                  # the fallback's Adam moments
        self.v = [None] * len(self.params)

    lr = property(lambda self: self._lr, lambda self, value: setattr(self, "_lr", check_lr(value)),
                  doc="The learning rate; setting it checks it (finite and >= 0).")

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    # ---- curvature -------------------------------------------------------------------
    def update_curvature(self, idx, targets=None, rank=0, size=1, max_rows=None):
        """One curvature pass on the first stats_fraction of the batch's m sequences: forward,
        output gradients of the sampled (or given, or every) targets, backward into the
        captures only; then the moving averages of A and G. ``.grad`` is left alone.

        idx (and targets) is the whole batch, the same on every one of `size` ranks; this rank
        takes its share of the m sequences (run/threads.slice_bounds), in slices on the worker
        threads of at most max_rows sequences each (a micro-batch's share under gradient
        accumulation), added in slice order. The sampled targets' uniforms are drawn for the m
        sequences from (seed, step) alone, and each rank contributes its sums over the global
        row count (the factors' mean over ranks is then the m sequences' mean): the statistics
        are the same, to the rounding of their sums, whatever the number of ranks, threads or
        micro-batches, and a resumed run draws what the uninterrupted one drew."""
        n = len(idx)
        m = max(1, int(round(n * self.stats_fraction)))
        if m < size:
            raise ValueError(f"K-FAC: the curvature pass has {m} sequences for {size} ranks; raise "
                             "kfac_stats_fraction or batch_size")
        if self.fisher == "empirical" and targets is None:
            raise ValueError("K-FAC fisher='empirical' needs the batch's targets")
        u = np.random.default_rng([self.seed, self.t]).random(m * int(np.prod(idx.shape[1:])))
        u = backend.asarray(u)                               # drawn on the host (the same on every device): one copy
        lo_r, hi_r = slice_bounds(m, size)[rank:rank + 2]
        rows = hi_r - lo_r
        k = max(1, min(rows, max(threads(), -(-rows // max_rows) if max_rows else 1)))
        bounds = [lo_r + b for b in slice_bounds(rows, k)]
        self._share = (m, size)

        def run(s):
            lo, hi = bounds[s], bounds[s + 1]
            self._local.stats = stats = {}
            try:
                with batch_rows(lo):              # rows lo.. of the batch: the training pass's dropout masks
                    self._pass(idx[lo:hi], None if targets is None else targets[lo:hi], u, lo, hi)
            finally:
                self._local.stats = None
            return stats

        total = {}
        for stats in parallel_map(run, range(k)):   # slice order
            for key, sums in stats.items():
                total.setdefault(key, _Sums()).add(sums)
        batch = []
        for key, blk in enumerate(self.blocks):
            sums = total.get(key)
            if sums is None or sums.gg is None:
                raise RuntimeError(f"K-FAC: Linear {blk.name} took no part in the curvature pass "
                                   "(unused, or its hook belongs to another K-FAC optimiser)")
            batch += [_Slot(f) for f in self._batch_factors(sums, blk.b is not None, rows, *self._share)]
        if self.allreduce is not None:                      # data parallel: the mean over ranks
            self.allreduce(batch)
        for blk, A, G in zip(self.blocks, batch[0::2], batch[1::2]):    # moving sums, from 0
            blk.A = A.grad * (1 - self.ema) + (0 if blk.A is None else blk.A * self.ema)
            blk.G = G.grad * (1 - self.ema) + (0 if blk.G is None else blk.G * self.ema)
        self.updates += 1

    def _pass(self, idx, targets, u, lo, hi):
        """Forward one slice, then backward the output gradients of its targets (rows of
        d l / d z for the logits z) into the captures; the leaves' gradients are dropped."""
        weight = None
        if self.fisher == "exact":                          # every class k: one tile each
            stats, self._local.stats = self._local.stats, None
            with no_grad():                                  # (only to learn V; records nothing)
                V = self.logits_fn(idx).shape[-1]
            self._local.stats = stats
            idx = backend.xp_of(idx).concatenate([idx] * V, axis=0)  # (b, T) -> (V b, T)
        logits = self.logits_fn(idx)                        # (b, T, V) (exact: (V b, T, V))
        V = logits.shape[-1]
        z = logits.data.reshape(-1, V)                      # rows = (sequence, position)
        xp = backend.xp_of(z)
        p = softmax_rows(z)
        if self.fisher == "exact":                          # tile k: sqrt(V p_k) (p - e_k)
            k = xp.repeat(xp.arange(V), z.shape[0] // V)
            weight = xp.sqrt(V * p[xp.arange(z.shape[0]), k])
        elif self.fisher == "sampled":
            per_seq = z.shape[0] // (hi - lo)               # the slice's tokens in u's order
            k = sample_targets(p, u[lo * per_seq:hi * per_seq].astype(p.dtype))
        else:
            k = xp.asarray(targets).reshape(-1)
        dz = output_gradients(p, k, weight)
        logits.backward(dz.reshape(logits.shape), leaf_grads={})

    @staticmethod
    def _batch_factors(sums, with_bias, seqs=None, m=None, size=1):
        """A = mean of x x^T (with the homogeneous 1 for a bias), G = mean of g g^T, over the m
        sequences' rows: this rank's sums over the rows of all m (of which it holds `seqs`),
        times `size`, so that the mean over the ranks is the mean over all rows."""
        xp = backend.xp_of(sums.xx)
        xx = sums.xx
        if with_bias:
            n = xp.full((1,), sums.rows, dtype=xx.dtype)     # made on the device, not copied
            xx = xp.concatenate([xp.concatenate([xx, sums.xs[:, None]], axis=1),
                                 xp.concatenate([sums.xs, n])[None, :]], axis=0)
        rows = sums.rows if seqs is None or size == 1 else sums.rows // seqs * m / size   # per-rank share of all
        return xx / rows, sums.gg / rows

    def factors(self, i):
        """Block i's bias-corrected moving averages (A, G): A / (1 - ema^updates)."""
        blk, c = self.blocks[i], 1.0 - self.ema ** self.updates
        return blk.A / c, blk.G / c

    def refresh_inverses(self):
        """Eigendecompositions of every block's A and G in inverse_dtype (eigenvalues below
        0 from rounding set to 0), kept in the parameters' dtype."""
        for i, blk in enumerate(self.blocks):
            dtype = self.params[blk.w].dtype
            for name, F in zip(("A", "G"), self.factors(i)):
                xp = backend.xp_of(F)
                ev, U = xp.linalg.eigh(F.astype(self.inverse_dtype))
                setattr(blk, "ev" + name, xp.maximum(ev, 0).astype(dtype))
                setattr(blk, "U" + name, xp.ascontiguousarray(U.astype(dtype)))

    # ---- the update ------------------------------------------------------------------
    def precondition(self):
        """{parameter index: direction} for the K-FAC blocks from the current gradients and
        the last eigendecompositions: (A (x) G + damping)^-1 grad (a bias as A's last row)."""
        out = {}
        for blk in self.blocks:
            gw = self.params[blk.w].grad
            if gw is None:
                continue
            xp = backend.xp_of(gw)
            gb = self.params[blk.b].grad if blk.b is not None else None
            M = gw if blk.b is None else xp.concatenate([gw, (gb if gb is not None else 0 * gw[:1])
                                                          .reshape(1, -1)], axis=0)
            D = damped_solve(M, blk.evA, blk.UA, blk.evG, blk.UG, self.damping, self.damping_mode)
            out[blk.w] = D[:gw.shape[0]]
            if blk.b is not None and gb is not None:
                out[blk.b] = D[-1]
        return out

    def step(self):
        if self.updates == 0:
            raise RuntimeError("K-FAC step before any curvature: call update_curvature(x, y) first")
        if self.t % self.inv_interval == 0 or self.blocks and self.blocks[0].UA is None:
            self.refresh_inverses()
        self.t += 1
        directions = self.precondition()
        nu = None
        if self.kl_clip > 0 and directions:                 # Ba et al. 2017: lr^2 sum d . g
            xp = backend.xp_of(*directions.values())        # on the device: nothing read back
            vg = xp.cumsum(xp.stack([(d * self.params[i].grad).sum().astype(xp.float64)
                                     for i, d in directions.items()]))[-1] * self.lr ** 2   # summed in order
            nu = xp.where(vg > 0, xp.minimum(1.0, xp.sqrt(self.kl_clip / xp.maximum(vg, TINY_VG))), 1.0)
        for i, d in directions.items():
            p = self.params[i]
            d = d * nu.astype(d.dtype) if nu is not None else d
            self.mom[i] = d if self.mom[i] is None else self.mom[i] * self.momentum + d
            if self.weight_decay and not getattr(p, "no_decay", False):
                p.data *= 1.0 - self.lr * self.weight_decay
            p.data -= self.lr * self.mom[i]
        adamw_step(self, self.fallback, self.lr * self.adam_lr_ratio, self.adam_eps)   # Adam for the rest

    # ---- checkpoints -----------------------------------------------------------------
    STATE = ("A", "G", "evA", "UA", "evG", "UG")

    def state_dict(self):
        """{name: host array}: t, updates, per block i the factors' moving sums A.i, G.i and
        the eigendecompositions evA.i, UA.i, evG.i, UG.i; per parameter j the momentum mom.j
        or the fallback's m.j, v.j. Keys as AdamW's, so train.py's npz checkpoint stores it."""
        out = {"t": np.asarray(self.t), "kfac.updates": np.asarray(self.updates)}
        for i, blk in enumerate(self.blocks):
            out.update({f"kfac.{name}.{i}": backend.to_numpy(getattr(blk, name)).copy()
                        for name in self.STATE if getattr(blk, name) is not None})
        for name in ("mom", "m", "v"):
            out.update({f"kfac.{name}.{j}": backend.to_numpy(a).copy()
                        for j, a in enumerate(getattr(self, name)) if a is not None})
        return out

    def load_state_dict(self, state):
        if "kfac.updates" not in state:
            raise ValueError("optimiser state is not K-FAC's (no kfac.updates): resume with the "
                             "optimiser that wrote the checkpoint")
        known = {"t", "kfac.updates"}

        def take(key, shape):
            known.add(key)
            if key in state and tuple(state[key].shape) != tuple(shape):
                raise ValueError(f"K-FAC state {key!r}: shape {tuple(state[key].shape)}, expected {tuple(shape)}")
            return backend.asarray(state[key]) if key in state else None

        for i, blk in enumerate(self.blocks):
            w = self.params[blk.w]
            n_in, n_out = w.shape[0] + (blk.b is not None), w.shape[1]
            shapes = dict(A=(n_in, n_in), G=(n_out, n_out), evA=(n_in,), UA=(n_in, n_in),
                          evG=(n_out,), UG=(n_out, n_out))
            for name in self.STATE:
                setattr(blk, name, take(f"kfac.{name}.{i}", shapes[name]))
        for name in ("mom", "m", "v"):
            getattr(self, name)[:] = [take(f"kfac.{name}.{j}", p.shape) for j, p in enumerate(self.params)]
        unexpected = sorted(set(state) - known)
        if unexpected:
            raise ValueError(f"K-FAC state has keys this model does not: {unexpected[:5]}")
        self.t, self.updates = int(state["t"]), int(state["kfac.updates"])


def _first(out):
    return out[0] if isinstance(out, tuple) else out
