"""The GPT-style decoder in every variant the paper compares, and its initialisation
(docs/method.md §2, §2.4, §4, §8).

    GPT     embedding (+ optional positions) -> L blocks -> optional final norm -> head

A block is an attention sublayer then an MLP sublayer, combined as ``residual`` and
``norm`` say:

    residual="none",   norm="none"   X' = MHA(X);                 X_out = MLP(X')   (vanilla)
    residual="none",   norm=N, pre   X' = MHA(N(X));              X_out = MLP(N(X'))
    residual="standard", N, pre      X' = X + MHA(N(X));          X_out = X' + MLP(N(X'))  (Pre-LN)
    residual="standard", N, post     X' = N(X + MHA(X));          X_out = N(X' + MLP(X'))  (Post-LN)
    residual="normalised"            X' = a X + b MHA(N(X)),  a^2 + b^2 = 1 (b = residual_beta)

Attention (per head h; B_l, D_l fixed by nanospa.signal):

    softmax          P_h = softmax(Q_h K_h^T / sqrt(D) + causal mask)
    value_skipinit   A_h = alpha I + beta P_h        (alpha = 1, beta = 0 trainable)
    uspa / espa      A_h = diag(D_l) softmax(Q_h K_h^T / sqrt(D) + B_l + causal mask)

Initialisation, each in one visible line (method §2.4; [follow-up]: the paper's follow-up
choice, [choice]: nanospa's documented choice):

    W^V, W^O         independent random orthogonal matrices                 [follow-up]
    W^Q              0 for E-SPA, U-SPA, Value-SkipInit (softmax: zero_query) [follow-up]
    W^K, head        N(0, 1/d)                                              [choice]
    B_l, D_l         signal.layer_bias(plan, l): espa_bias / uspa_bias     (method §7, §8)
    alpha, beta      1 and 0 (Value-SkipInit), trainable                    [follow-up]
    MLP W_1, W_2     orthogonal times max(sqrt(fan_out / fan_in), 1)         [choice, DKS/TAT]
    phi_hat          signal.activation_transform (DKS / TAT)                 (docs/activations.md)
    embeddings       N(0, sigma_e^2) tokens, positions of variance POS_VARIANCE (method §11)

Which gamma_L, eta and policy the numbers follow is the kernel budget's choice,
signal.make_plan (docs/kernel_budget.md). This file computes no signal-propagation maths:
it stores what nanospa.signal computed, cast to the model's dtype and device. All random
draws come from the model's seeded numpy.random.Generator, on the host, in a fixed order.

Beyond the paper (nanospa/beyond/, each reached by one ``if`` on the field that names it):
attention by blocks at long T (attention_impl), positions in the logits (pos=alibi, rope,
spa_prior), the norms DyT, BatchNorm, PRepBN, GroupNorm, DeepNorm and RealFormer
(residual=deepnorm, residual_attention) and nGPT (residual=ngpt). A value this file does not
know raises. Shapes: B batch, T time, C = n_embd, H heads, D = C / H head width, V vocabulary.
"""
import math

import numpy as np

from . import backend, fused, signal
from .beyond import blockwise, ngpt, norms, positions, schemes
from .functions import Shaped
from .nn import Embedding, LayerNorm, Linear, Module, Parameter, RMSNorm, orthogonal
from .tensor import Tensor, no_grad

MIN_TEMPERATURE = 1e-6  # generate(): temperature 0 means greedy; logits are divided by at least this
SPA = ("uspa", "espa")


def make_norm(cfg):
    if cfg.norm == "none":
        return None
    if cfg.norm == "layernorm":
        return LayerNorm(cfg.n_embd, dtype=cfg.dtype)
    if cfg.norm == "rmsnorm":
        return RMSNorm(cfg.n_embd, dtype=cfg.dtype)
    return norms.build(cfg)  # dyt | batchnorm | prepbn | groupnorm; raises for any other name


def weight(matrix, dtype):
    """A host float64 initial value as a device array of the model's dtype."""
    return backend.asarray(matrix, dtype=dtype)


class ShapedActivation:
    """phi_hat(x) = s (phi(a x + b) + o) of a solved signal.activation_transform: its PhiHat,
    signal's one definition of phi_hat, evaluated by one op (functions.Shaped)."""

    def __init__(self, t):
        self.base, self.method, self.params, self.phi_hat = t.activation, t.method, dict(t.params), t.phi_hat

    def __call__(self, x):
        return Shaped.apply(x, phi_hat=self.phi_hat)

    def __repr__(self):
        shown = ", ".join(f"{k}={v:.6g}" for k, v in self.params.items())
        return f"{self.method if self.method != 'none' else 'plain'} {self.base}({shown})"


class Attention(Module):
    """Multi-head causal attention of one block. ``bias`` is (parts, D_l) from
    signal.layer_bias for SPA attention (or pos="spa_prior"'s B_l, whose D_l is not used),
    else None. The dense path keeps B = tril(B_l) as a (T, T) buffer (a Parameter with
    train_bias) and D_l as a (T,) buffer; the blockwise path (nanospa/beyond/blockwise.py,
    long T) keeps B_l's O(T) parts and generates each block when it needs it."""

    def __init__(self, cfg, bias, rng):
        super().__init__()
        C, H, dt = cfg.n_embd, cfg.n_head, cfg.dtype
        if cfg.attention not in ("softmax", "value_skipinit") + SPA:
            raise ValueError(f"Attention: unknown attention {cfg.attention!r}")
        self.n_head, self.kind, self.dtype = H, cfg.attention, dt
        self.q = Linear(C, C, bias=cfg.bias, rng=rng, dtype=dt)      # each Linear draws N(0, 1/C)
        self.k = Linear(C, C, bias=cfg.bias, rng=rng, dtype=dt)
        self.v = Linear(C, C, bias=cfg.bias, rng=rng, dtype=dt)
        self.proj = Linear(C, C, bias=cfg.bias, rng=rng, dtype=dt)
        self.v.weight.data = weight(orthogonal(rng, C, C), dt)       # W^V orthogonal
        self.proj.weight.data = weight(orthogonal(rng, C, C), dt)    # W^O orthogonal
        if cfg.attention != "softmax" or cfg.zero_query:
            self.q.weight.data = weight(np.zeros((C, C)), dt)        # W^Q = 0: A_l set by B_l, D_l
        if cfg.attention == "value_skipinit":
            shape = (H, 1, 1) if cfg.skipinit_per_head else (1,)
            self.alpha = Parameter(np.ones(shape), no_decay=True, dtype=dt)
            self.beta = Parameter(np.zeros(shape), no_decay=True, dtype=dt)
        self.B = self.bias_parts = None
        self.impl = blockwise.implementation(cfg)                   # "dense" or "blockwise"
        self.block = cfg.attention_block
        self.alibi, self.rope = positions.alibi_slopes(cfg), positions.rope_tables(cfg)  # docs/positions.md
        self.qk_norm = ngpt.QKNorm(cfg) if cfg.residual == "ngpt" else None  # nGPT: unit q, k per head
        if bias is not None:
            parts, D = bias                                          # A_l = diag(D_l) softmax(B_l)
            T = cfg.block_size
            if cfg.train_bias:                                       # finite above the diagonal
                self.B = Parameter(np.tril(signal.bias_block(parts, 0, T, 0, T)), no_decay=True, dtype=dt)
            elif self.impl == "dense":
                self.register_buffer("B", weight(np.tril(signal.bias_block(parts, 0, T, 0, T)), dt))
            else:
                self.bias_parts = positions.on_device(parts)        # O(T) arrays, copied once
            if cfg.attention in SPA:                                 # the prior's D_l is not used
                self.register_buffer("D", weight(D, dt))

    def forward(self, x, record=None, carry=None):
        B, T, C = x.shape
        H, D = self.n_head, C // self.n_head
        q = self.q(x).reshape(B, T, H, D).transpose(0, 2, 1, 3)  # (B, T, C) -> (B, H, T, D)
        k = self.k(x).reshape(B, T, H, D).transpose(0, 2, 1, 3)
        v = self.v(x).reshape(B, T, H, D).transpose(0, 2, 1, 3)
        scale = 1.0 / math.sqrt(D)
        if self.rope is not None:
            q, k = positions.rope(q, *self.rope), positions.rope(k, *self.rope)  # rotated by position
        if self.qk_norm is not None:                                # nGPT: logits sqrt(D) q_hat . k_hat
            q, k, scale = self.qk_norm(q), self.qk_norm(k), self.qk_norm.scale(D)
        if self.impl == "blockwise" and record is None:             # (B, H, T, D), no (T, T) matrix
            trained = self.B if isinstance(self.B, Parameter) else None
            fixed = self.generated_bias if self.bias_parts is not None or self.alibi is not None else None
            y = blockwise.causal_attention(q, k, v, scale, self.block, trained, fixed)
        else:
            scores = q @ k.transpose(0, 1, 3, 2)                    # (B, H, T, T)
            if carry is not None:                                   # RealFormer: + S_{l-1}; B_l added fresh
                scores, scale = schemes.carry_scores(carry, scores * scale), 1.0
            P = fused.softmax(scores, self.logit_bias(T), scale=scale, causal=True)  # (B, H, T, T)
            y = P @ v                                               # (B, H, T, D)
        if self.kind in SPA:
            y = signal.rescale(y, self.D)                           # row i scaled by D_l[i]
        elif self.kind == "value_skipinit":
            y = v * self.alpha + y * self.beta                       # (alpha I + beta P) V
        if record is not None:
            record["attention"] = self.effective_attention(P.data, T)
        y = y.transpose(0, 2, 1, 3).reshape(B, T, C)                # (B, H, T, D) -> (B, T, C)
        return self.proj(y)

    def logit_bias(self, T):
        """What the dense softmax adds to the scaled logits at T positions (the causal mask
        is the softmax's): B_l[:T, :T] as stored, or generated from the O(T) parts, plus
        ALiBi's -m_h (i - j) per head; None for neither."""
        if self.bias_parts is not None or (self.alibi is not None and self.B is None):
            return Tensor(self.generated_bias(0, T, 0, T))
        if self.B is None:
            return None
        return self.B[:T, :T] if self.alibi is None else self.B[:T, :T] + Tensor(self.generated_bias(0, T, 0, T))

    def generated_bias(self, i0, i1, j0, j1):
        """B_l[i0:i1, j0:j1] from the O(T) parts (signal.bias_block: float64, rounded once to
        the model's dtype), plus ALiBi's -m_h (i - j) per head when set, made on the model's
        device from parts kept there."""
        return positions.fixed_bias(self.bias_parts, self.alibi, i0, i1, j0, j1, self.dtype)

    def effective_attention(self, P, T):
        """The matrix that multiplies the values: diag(D) P (SPA), alpha I + beta P, or P."""
        xp = backend.xp_of(P)
        if self.kind in SPA:
            return signal.rescale(P, self.D)
        if self.kind == "value_skipinit":
            return self.alpha.data * xp.eye(T, dtype=P.dtype) + self.beta.data * P
        return P


class MLP(Module):
    def __init__(self, cfg, act, rng):
        super().__init__()
        C, M, dt = cfg.n_embd, cfg.mlp_ratio * cfg.n_embd, cfg.dtype
        self.fc = Linear(C, M, bias=cfg.bias, rng=rng, dtype=dt)
        self.proj = Linear(M, C, bias=cfg.bias, rng=rng, dtype=dt)
        self.act = act                                              # phi_hat(x) = s (phi(a x + b) + o)
        # orthogonal, scaled so that a wide layer keeps q: the DKS/TAT condition W W^T = I
        self.fc.weight.data = weight(orthogonal(rng, C, M, max(math.sqrt(M / C), 1.0)), dt)
        self.proj.weight.data = weight(orthogonal(rng, M, C, max(math.sqrt(C / M), 1.0)), dt)

    def forward(self, x):
        return self.proj(self.act(self.fc(x)))  # (B, T, C) -> (B, T, 4C) -> (B, T, C)


class Block(Module):
    def __init__(self, cfg, bias, act, rng):
        super().__init__()
        if cfg.residual not in ("none", "standard", "normalised", "deepnorm"):
            raise ValueError(f"Block: unknown residual {cfg.residual!r}")
        self.residual, self.position = cfg.residual, cfg.norm_position
        self.attn = Attention(cfg, bias, rng)
        self.mlp = MLP(cfg, act, rng)
        self.norm1, self.norm2 = make_norm(cfg), make_norm(cfg)
        self.a, self.b = schemes.residual_weights(cfg)       # a x + b f(x): normalised, deepnorm
        if cfg.residual == "deepnorm":
            schemes.deepnorm_init(self, cfg.n_layer)          # W^V, W^O, W_1, W_2 times beta

    def sublayer(self, x, f, norm, record=None, key=None):
        h = f(norm(x)) if norm is not None and self.position == "pre" else f(x)
        if record is not None and key:
            record[key] = h.data
        if self.residual == "standard":
            h = x + h
        elif self.residual in ("normalised", "deepnorm"):
            h = x * self.a + h * self.b
        if norm is not None and self.position == "post":
            h = norm(h)
        return h

    def forward(self, x, record=None, carry=None):
        x = self.sublayer(x, lambda u: self.attn(u, record, carry), self.norm1, record, "attn_out")
        return self.sublayer(x, self.mlp, self.norm2)


class Trace:
    """What ``GPT.trace`` returns: host arrays, one entry per layer (see GPT.trace)."""

    def __init__(self):
        self.hidden, self.attn_out, self.attention = [], [], []


class GPT(Module):
    def __init__(self, cfg, seed=0):
        super().__init__()
        self.config = cfg
        rng = np.random.default_rng(seed)  # all init drawn on the host: same weights on CPU and GPU
        self.plan = signal.make_plan(cfg)  # the kernel budget: schedule, activation targets (float64)
        act = ShapedActivation(signal.activation_transform(**self.plan.activation))   # phi_hat: DKS / TAT
        bias_plan = self.plan if cfg.attention in SPA else self.plan.prior            # prior: pos="spa_prior"
        biases = [signal.layer_bias(bias_plan, l) if bias_plan is not None else None  # (B_l parts, D_l)
                  for l in range(1, cfg.n_layer + 1)]
        C, dt = cfg.n_embd, cfg.dtype
        if cfg.residual == "ngpt":                       # nGPT's own embedding, blocks, head (beyond/ngpt.py)
            self.wte = ngpt.Embedding(cfg.vocab_size, C, rng=rng, dtype=dt)
        else:
            self.wte = Embedding(cfg.vocab_size, C, std=math.sqrt(signal.token_variance(cfg.pos)), rng=rng, dtype=dt)
        self.wpe = None
        if cfg.pos == "learned":
            self.wpe = Embedding(cfg.block_size, C, std=math.sqrt(signal.POS_VARIANCE), rng=rng, dtype=dt)
        elif cfg.pos == "sinusoidal":
            self.register_buffer("pe", weight(signal.sinusoidal_encoding(cfg.block_size, C), dt))
        elif cfg.pos not in ("none", "alibi", "rope", "spa_prior"):   # the last three: in Attention
            raise ValueError(f"GPT: unknown pos {cfg.pos!r}")
        if cfg.residual == "ngpt":
            self.blocks = [ngpt.Block(cfg, Attention(cfg, bias, rng), act, rng) for bias in biases]
            self.head = ngpt.Head(C, cfg.vocab_size, rng=rng, dtype=dt)
        else:
            self.blocks = [Block(cfg, bias, act, rng) for bias in biases]
            self.head = Linear(C, cfg.vocab_size, bias=False, rng=rng, dtype=dt)  # N(0, 1/C)
        self.ln_f = make_norm(cfg) if cfg.uses_final_norm else None

    @property
    def activation(self):
        """The MLPs' shaped activation (shared by every block)."""
        return self.blocks[0].mlp.act

    def embed(self, idx):
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.config.block_size}")
        x = self.wte(idx)                                   # (B, T) -> (B, T, C)
        if self.wpe is not None:
            x = x + self.wpe.weight[:T]                     # + (T, C): rows 0..T-1, no index array
        elif self.config.pos == "sinusoidal":
            x = x + Tensor(self.pe[:T])
        return x

    def forward(self, idx, targets=None, record=None):
        idx, targets = _token_ids(idx, targets, self.config.vocab_size)   # on the model's device
        x = self.embed(idx)
        if record is not None:
            record.hidden.append(backend.to_numpy(x.data))
        carry = {} if self.config.residual_attention else None   # RealFormer's scores, block to block
        for block in self.blocks:
            layer = {} if record is not None else None
            x = block(x, layer, carry)
            if record is not None:
                record.hidden.append(backend.to_numpy(x.data))
                record.attn_out.append(backend.to_numpy(layer["attn_out"]))
                record.attention.append(backend.to_numpy(layer["attention"]))
        if self.ln_f is not None:
            x = self.ln_f(x)
        logits = self.head(x)                               # (B, T, V)
        loss = None if targets is None else fused.cross_entropy(logits, targets)
        return logits, loss

    def trace(self, idx):
        """Run without autograd and keep, per block, the block output (``hidden``; [0] is the
        embedding output), the attention sublayer's output before any residual (``attn_out``)
        and the effective attention matrices (``attention``, (B, H, T, T))."""
        tr = Trace()
        with no_grad():
            self.forward(idx, record=tr)
        return tr

    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, rng=None):
        """Sample ``max_new_tokens`` continuations of idx (B, T) with the last block_size tokens
        as context, in evaluation mode (the mode before is restored). Returns a host int64
        array (B, T + max_new_tokens)."""
        if not (isinstance(max_new_tokens, (int, np.integer)) and max_new_tokens >= 0):
            raise ValueError(f"generate: max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
        if not (math.isfinite(temperature) and temperature >= 0):
            raise ValueError(f"generate: temperature must be finite and >= 0, got {temperature!r}")
        if top_k is not None and not (isinstance(top_k, (int, np.integer)) and top_k >= 1):
            raise ValueError(f"generate: top_k must be None or an integer >= 1, got {top_k!r}")
        rng = rng if rng is not None else np.random.default_rng(0)
        out = np.asarray(backend.to_numpy(idx), dtype=np.int64)
        with no_grad(), self.evaluating():                  # BatchNorm, PRepBN: running statistics
            for _ in range(max_new_tokens):
                logits, _ = self(out[:, -self.config.block_size:])
                z = backend.to_numpy(logits.data[:, -1, :]).astype(np.float64) / max(temperature, MIN_TEMPERATURE)
                if top_k is not None:
                    kth = np.sort(z, axis=-1)[:, -min(top_k, z.shape[-1])][:, None]
                    z = np.where(z < kth, -np.inf, z)
                p = np.exp(z - z.max(axis=-1, keepdims=True))
                p /= p.sum(axis=-1, keepdims=True)
                nxt = np.array([rng.choice(p.shape[-1], p=row) for row in p])
                out = np.concatenate([out, nxt[:, None]], axis=1)
        return out

    def num_params(self):
        return sum(p.size for p in self.parameters())

    def after_step(self):
        """Call once after every optimiser step (train.py and the experiments do): each module
        with an ``after_step`` method runs it, in module order. The seam for schemes whose
        state moves with training rather than with gradients (renormalised weights, scheduled
        mixing coefficients); a model of the paper's variants has none and this does nothing."""
        def walk(m):
            if m is not self and hasattr(m, "after_step"):
                m.after_step()
            for _, child in m.children():
                walk(child)
        walk(self)


def _as_index(idx, name, vocab_size):
    """idx as a (B, T) integer array of the model's device, every id in [0, vocab_size): a
    padding id such as -1 would otherwise be read as the last token (nanospa has no ignore
    index), and an empty batch would give a loss of 0."""
    return backend.asarray(_checked_ids(idx, name, vocab_size))


def _token_ids(idx, targets, vocab_size):
    """forward's idx and targets (or None), each checked as _as_index checks it and of one
    shape, on the model's device. Two host arrays cross to the device as one copy (stacked):
    a training step's only host-to-device copy."""
    idx = _checked_ids(idx, "idx", vocab_size)
    if targets is None:
        return backend.asarray(idx), None
    targets = _checked_ids(targets, "targets", vocab_size)
    if targets.shape != idx.shape:
        raise ValueError(f"targets of shape {tuple(targets.shape)} should match idx's {tuple(idx.shape)}")
    if not backend.is_device_array(idx) and not backend.is_device_array(targets):
        both = backend.asarray(np.stack([idx, targets]))   # (2, B, T): one copy
        return both[0], both[1]
    return backend.asarray(idx), backend.asarray(targets)


def _checked_ids(idx, name, vocab_size):
    """idx (a Tensor, a host or a device array) as an array where it is, or ValueError naming
    the problem. The range of a device array is read back once (its minimum and maximum
    together); a host array's costs nothing."""
    idx = idx.data if isinstance(idx, Tensor) else idx
    if not backend.is_device_array(idx):
        idx = np.asarray(idx)
    if idx.dtype.kind not in "iu":
        raise ValueError(f"{name}: token ids must be integers, got dtype {idx.dtype}")
    if idx.ndim != 2 or 0 in idx.shape:
        raise ValueError(f"{name}: expected a (batch, time) array of token ids with both sizes at least 1, "
                         f"got shape {tuple(idx.shape)}" + (" (add a batch axis: idx[None])" if idx.ndim == 1 else ""))
    xp = backend.xp_of(idx)
    low, high = (int(v) for v in backend.to_numpy(xp.stack([idx.min(), idx.max()])))
    if low < 0 or high >= vocab_size:
        raise ValueError(f"{name}: token ids must lie in [0, vocab_size={vocab_size}), got {low}..{high}"
                         + (" (nanospa has no padding id: crop or mask the batch instead)" if low < 0 else ""))
    return idx
