"""Dense attention by groups of heads on the worker threads: one sequence uses every core.

A batch is shared among threads by slices (threads.sliced_loss); a batch smaller than the
thread count, one long sequence most of all, leaves threads idle, and attention, the largest
part of a long sequence's step, runs on one core. Its heads are independent:

    y_h = softmax(scale Q_h K_h^T + B + mask) V_h        for each head h (and row of the batch),

so the heads can be computed in groups, one group per worker thread, forward and backward,
with the engine's own ops (model.dense_attention's three: the product, fused.softmax, the
product) on each group's slice. Each group's numbers are those of its heads in the whole
call: the same BLAS calls per (row, head) matrix, the same row-wise softmax. So the values
and gradients are bit for bit those of dense_attention on one thread (tests/test_heads.py,
at 1 to 4 threads), and a call means what it meant.

    share_heads(model)          each dense attention of the model evaluates by heads
    by_heads(q, k, v, ...)      the evaluation (model.Attention's `evaluate` seam)
    HeadGroups                  the op: forward and backward of each group on a thread

train.py and the benchmark call share_heads when their threads outnumber a step's
sequences; a plain loop can too (README, "One sequence on every core"). It falls back to
dense_attention, unchanged, where splitting would change a number or has nothing to split:
one thread, groups too small to pay (MIN_GROUP_LOGITS), inside a worker (the batch is
already split), dropout on P in training (its
masks are numbered over all heads), a trained bias B (its gradient sums over the heads),
and generation's cache or a recorded trace (forward asks dense_attention for those, as for
attention by blocks: by_blocks below).
"""
from .. import fused
from ..model import Attention, dense_attention, dense_bias
from ..tensor import Function, Tensor
from . import threads

# The least logits a group of heads computes, (heads per group) x T x T, for the split to pay:
# below it the threads' round trips and their turns at Python's GIL cost more than a second
# core saves (docs/performance.md, "One sequence on every core", measured on 2 cores).
MIN_GROUP_LOGITS = 2 ** 19


def share_heads(model):
    """Make each attention of `model` that evaluates densely (model.dense_attention) evaluate
    by groups of heads; returns how many it changed. The model's parameters, buffers and
    numbers are unchanged."""
    changed = 0
    for m in model.modules():
        if isinstance(m, Attention) and m.evaluate is dense_attention:
            m.evaluate = by_heads
            changed += 1
    return changed


def by_heads(q, k, v, scale, bias, carry=None, drop=None):
    """model.dense_attention's (y, P), by groups of heads on the worker threads (HeadGroups);
    P is None (nothing records it: forward asks dense_attention for a trace). Falls back to
    dense_attention itself where a split would change a number (the module docstring)."""
    B, H, n, _ = q.shape
    T = k.shape[-2]
    groups = min(threads.threads(), H)
    dropping = getattr(drop, "p", 0.0) > 0.0 and drop.training     # a DropoutSite in training
    b = dense_bias(bias, T, q.dtype, n)
    small = (H // max(groups, 1)) * n * T < MIN_GROUP_LOGITS
    if groups < 2 or small or threads.in_worker() or dropping or n != T or (isinstance(b, Tensor) and b.requires_grad):
        return dense_attention(q, k, v, scale, bias, carry, drop)
    b = b.data if isinstance(b, Tensor) else b
    return HeadGroups.apply(q, k, v, bias=b, scale=scale, groups=groups), None


by_heads.by_blocks = True      # like attention by blocks: no P to record, no cached rows (model.Attention.forward)


class HeadGroups(Function):
    """y = softmax(scale Q K^T + B + causal mask) V for q, k, v (B, H, T, hs), the heads in
    `groups` contiguous groups, each group's forward and backward on a worker thread through
    the engine's ops (so exactly model.dense_attention's numbers). bias: None, a (T, T) array
    shared by the heads, or (H, T, T) one per head; not differentiated."""

    def forward(ctx, q, k, v, bias=None, scale=1.0, groups=2):
        H = q.shape[1]
        bounds = threads.slice_bounds(H, groups)
        ctx.bounds, ctx.shapes_in = bounds, (q.shape, k.shape, v.shape)

        def run(g):
            h = slice(bounds[g], bounds[g + 1])
            qs, ks, vs = (Tensor(a[:, h], requires_grad=True) for a in (q, k, v))
            b = None if bias is None else (bias[h] if bias.ndim == 3 else bias)
            P = fused.softmax(qs @ ks.transpose(0, 1, 3, 2), b, scale=scale, causal=True)
            return qs, ks, vs, P @ vs                              # as model.dense_attention

        ctx.parts = threads.parallel_map(run, range(groups))
        y = ctx.xp.empty(q.shape[:-1] + v.shape[-1:], dtype=q.dtype)
        for g, part in enumerate(ctx.parts):
            y[:, bounds[g]:bounds[g + 1]] = part[3].data
        return y

    def backward(ctx, g):
        bounds = ctx.bounds

        def run(i):
            qs, ks, vs, y = ctx.parts[i]
            grads = {}
            y.backward(g[:, bounds[i]:bounds[i + 1]], grads)       # this group's graph, freed as it goes
            return [grads.get(t) for t in (qs, ks, vs)]

        per_group = threads.parallel_map(run, range(len(bounds) - 1))
        ctx.parts = None
        out = []
        for j in range(3):
            full = ctx.xp.empty(ctx.shapes_in[j], dtype=g.dtype)
            for i, grads in enumerate(per_group):
                full[:, bounds[i]:bounds[i + 1]] = grads[j]
            out.append(full)
        return tuple(out)
