"""Causal attention by blocks, in O(B H T D) memory: Y = softmax(scale Q K^T + bias + causal
mask) V without any (T, T) matrix (docs/method.md §2.1, §8; the online softmax of the
FlashAttention papers, written with NumPy/CuPy array operations).

    BlockwiseAttention      the Function: forward and backward side by side, on raw xp arrays
    causal_attention(q, k, v, scale, block, bias=None, bias_block=None)   its Tensor spelling
    block_size(T, block)    the block size a call uses (block 0: chosen by T)
    evaluation(cfg)         model.Attention's evaluate by blocks (the seam: model.evaluation)
    check_config(cfg)       GPTConfig's check of attention_impl and attention_block

Forward, for each query block I (rows [i0, i1)) and the key blocks J <= I (blocks entirely
above the diagonal are skipped), with a running row maximum m, row sum l and output acc:

    S   = scale Q_I K_J^T + B[I, J]  (+ the causal mask on the diagonal block)
    m'  = max(m, rowmax S);   P = exp(S - m')
    l   = e^(m - m') l + rowsum P;   acc = e^(m - m') acc + P V_J;   m = m'
    Y_I = acc / l;   lse_I = m + log l      (the row log-sum-exp, saved for the backward)

The diagonal block goes first: each of its rows sees its own key, so m is finite from the
start (an SPA bias may be -inf off the diagonal: an identity layer), and a later block that
is all -inf for some row adds exact zeros to it.

Backward recomputes P = exp(S - lse) block by block, with Delta = rowsum(dY * Y):

    dV_J += P^T dY_I;   dP = dY_I V_J^T;   dS = P (dP - Delta_I)
    dQ_I += scale dS K_J;   dK_J += scale dS^T Q_I;   dB[I, J] += sum over batch, heads of dS

Saved: scale Q, K, V, Y and lse, O(B H T D) numbers; each step holds a few (B, H, bq, bk)
blocks. Called outside the worker threads with run/threads.threads() = k > 1, the query blocks (forward)
and the key blocks (backward) are split into k groups of equal work run on the worker
threads: the rows of Y and the columns of dK, dV are disjoint, dQ is summed from one partial
per group in group order, so results do not depend on thread timing; from a worker thread
(a slice of run/threads.sharded_backward) it runs serially.

The bias is a (T_max, T_max) array input (a trainable B_l, which gets its gradient;
T_max >= T), a function bias_block(i0, i1, j0, j1) returning that block of a constant bias
in q's dtype and module ((bq, bk), or (H, bq, bk) for one per head: SPA's fixed B_l,
generated from its O(T) parts by signal.attn_bias.bias_block, ALiBi's -m_h (i - j), or
their sum: model.py), both (a trainable B_l with ALiBi), or neither (plain softmax). D_l
and Value-SkipInit's alpha I + beta P act on the output outside this op (model.py).
Probabilities below sqrt(tiny) are flushed to 0, as in fused.Softmax: subnormal numbers
slow the products.

Not here: the dense reference (fused.Softmax on the full (T, T) scores, which model.py uses
at short T and for trace()), where the bias comes from (model.py, nanospa.signal).
"""
import numpy as np

from ..fused import causal_mask
from ..run.threads import balanced_groups, in_worker, parallel_map, threads
from ..tensor import Function, Tensor

AUTO_BLOCK = 256        # block 0: min(T, AUTO_BLOCK) rows and columns per block
IMPLS = ("auto", "dense", "blockwise")


def evaluation(cfg):
    """model.Attention's evaluate for attention by blocks (cfg.attention_impl "blockwise", or
    "auto" beyond model.DENSE_MAX_T): (q, k, v, scale, bias, carry, drop) -> (y, None), bias the
    attention's (stored, blocks) as in model.dense_attention. by_blocks tells SPA attention to
    keep B_l's O(T) parts instead of the (T, T) matrix. No dropout of P here (GPTConfig refuses
    dropout with attention by blocks)."""
    block = cfg.attention_block

    def evaluate(q, k, v, scale, bias, carry=None, drop=None):
        if getattr(drop, "p", 0.0):                  # GPTConfig refuses dropout here
            raise ValueError("attention by blocks has no (T, T) P to drop: dropout needs attention_impl='dense'")
        stored, blocks = bias
        fixed = None if blocks is None else (lambda i0, i1, j0, j1: blocks(i0, i1, j0, j1, q.dtype))
        trained = stored if isinstance(stored, Tensor) else (None if stored is None else Tensor(stored))
        return causal_attention(q, k, v, scale, block, trained, fixed), None

    evaluate.by_blocks = True
    evaluate.kv_cache = True    # generate's new rows: model.Attention evaluates them densely, one row of P
    return evaluate


def check_config(cfg):
    """ValueError naming a bad attention_impl or attention_block."""
    if cfg.attention_impl not in IMPLS:
        raise ValueError(f"GPTConfig.attention_impl={cfg.attention_impl!r} is not one of {list(IMPLS)}")
    b = cfg.attention_block
    if not isinstance(b, (int, np.integer)) or isinstance(b, bool) or b < 0:
        raise ValueError(f"GPTConfig.attention_block must be an integer >= 0 (0 = chosen by T), got {b!r}")


def block_size(T, block):
    """The block size of a call: `block` itself, or min(T, AUTO_BLOCK) for block 0."""
    return min(T, block or AUTO_BLOCK)


def _blocks(T, n):
    return [(i, min(i + n, T)) for i in range(0, T, n)]


def _workers(n_blocks):
    """Worker threads for one call: run/threads.threads() outside the workers (a batch of one
    sequence in train.py or the benchmark leaves the other cores idle otherwise), 1 on a
    worker (sharded_backward's slices already use them all)."""
    if in_worker():
        return 1
    return max(1, min(threads(), n_blocks))


def _flush(p, xp):
    """Entries below sqrt(tiny) set to 0 in place (see the module docstring)."""
    p *= p >= xp.finfo(p.dtype).tiny ** 0.5
    return p


class BlockwiseAttention(Function):

    def _scores(ctx, qs, k, bias, bias_block, i0, i1, j0, j1):
        """S = (scale Q)_I K_J^T + B[I, J] (+ mask on the diagonal block), a new array."""
        s = qs[..., i0:i1, :] @ k[..., j0:j1, :].swapaxes(-1, -2)          # (B, H, bq, bk)
        if bias is not None:
            s += bias[i0:i1, j0:j1]
        if bias_block is not None:                                         # (bq, bk) or per head (H, bq, bk)
            s += bias_block(i0, i1, j0, j1)
        if i0 == j0:                                                       # the diagonal block
            s += causal_mask(ctx.xp, i1 - i0, s.dtype)
        return s

    def forward(ctx, q, k, v, *bias, scale, block=0, bias_block=None):
        xp = ctx.xp
        bias = bias[0] if bias else None
        T = q.shape[-2]
        n = block_size(T, block)
        qs = q * q.dtype.type(scale)                                       # (B, H, T, D)
        y = xp.empty_like(qs)
        lse = xp.empty(q.shape[:-1], dtype=q.dtype)                        # (B, H, T)
        rows = _blocks(T, n)

        def run(group):                        # query blocks of one worker: disjoint rows of y, lse
            for a in group:
                i0, i1 = rows[a]
                m = l = acc = None
                for j0, j1 in [(i0, i1)] + rows[:a]:                       # diagonal block first
                    s = ctx._scores(qs, k, bias, bias_block, i0, i1, j0, j1)
                    m_new = s.max(axis=-1)                                 # (B, H, bq)
                    if m is not None:
                        xp.maximum(m_new, m, out=m_new)
                    s -= m_new[..., None]
                    p = _flush(xp.exp(s, out=s), xp)
                    if m is None:
                        l, acc = p.sum(axis=-1), p @ v[..., j0:j1, :]
                    else:
                        alpha = xp.exp(m - m_new)                          # (B, H, bq), <= 1
                        l = l * alpha + p.sum(axis=-1)
                        acc *= alpha[..., None]
                        acc += p @ v[..., j0:j1, :]
                    m = m_new
                y[..., i0:i1, :] = acc / l[..., None]
                lse[..., i0:i1] = m + xp.log(l)

        costs = [a + 1 for a in range(len(rows))]                          # row block a sees a + 1 blocks
        parallel_map(run, balanced_groups(costs, _workers(len(rows))))
        ctx.save(qs, k, v, y, lse, bias)
        ctx.scale, ctx.block, ctx.bias_block = scale, n, bias_block
        return y

    def backward(ctx, g):
        xp = ctx.xp
        qs, k, v, y, lse, bias = ctx.saved
        T, n = qs.shape[-2], ctx.block
        delta = (g * y).sum(axis=-1)                                       # (B, H, T)
        dk, dv = xp.zeros(k.shape, qs.dtype), xp.zeros(v.shape, qs.dtype)
        dbias = xp.zeros_like(bias) if bias is not None and ctx.needs_grad(3) else None
        cols = _blocks(T, n)

        def run(group):                        # key blocks of one worker: disjoint dK_J, dV_J, dB;
            dq = xp.zeros_like(qs)             # dQ gets a partial sum per worker
            for b in group:
                j0, j1 = cols[b]
                for i0, i1 in cols[b:]:                                    # I >= J
                    g_i = g[..., i0:i1, :]
                    s = ctx._scores(qs, k, bias, ctx.bias_block, i0, i1, j0, j1)
                    s -= lse[..., i0:i1, None]
                    p = _flush(xp.exp(s, out=s), xp)                       # P[I, J]
                    dv[..., j0:j1, :] += p.swapaxes(-1, -2) @ g_i
                    ds = g_i @ v[..., j0:j1, :].swapaxes(-1, -2)           # dP
                    ds -= delta[..., i0:i1, None]
                    ds *= p                                                # dS = P (dP - Delta)
                    dq[..., i0:i1, :] += ds @ k[..., j0:j1, :]
                    dk[..., j0:j1, :] += ds.swapaxes(-1, -2) @ qs[..., i0:i1, :]
                    if dbias is not None:
                        dbias[i0:i1, j0:j1] += ds.sum(axis=tuple(range(ds.ndim - 2)))
            return dq

        costs = [len(cols) - b for b in range(len(cols))]                  # key block b, len(cols) - b rows
        parts = parallel_map(run, balanced_groups(costs, _workers(len(cols))))
        dq = parts[0]
        for part in parts[1:]:                                             # in worker order:
            dq += part                                                     # no timing dependence
        dq *= qs.dtype.type(ctx.scale)                                     # dk used scale Q already
        return (dq, dk, dv) + ((dbias,) if bias is not None else ())


def causal_attention(q, k, v, scale, block=0, bias=None, bias_block=None):
    """softmax(scale q k^T + bias + bias_block + causal mask) v by blocks (BlockwiseAttention):
    q, k, v Tensors (..., T, D); bias an optional Tensor (T_max, T_max), T_max >= T; bias_block
    an optional function (i0, i1, j0, j1) -> that block of a constant bias, (bq, bk) or one per
    head (H, bq, bk); either, both or neither; block the query/key block size (0: chosen by T).
    -> (..., T, D)."""
    args = (q, k, v) if bias is None else (q, k, v, bias)
    return BlockwiseAttention.apply(*args, scale=float(scale), block=int(block), bias_block=bias_block)

