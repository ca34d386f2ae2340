"""The GPT-style decoder in every variant the paper compares, and its initialisation
(docs/method.md §2, §2.4, §4, §8).

    GPT(cfg, seed=0, plan=None)   embedding (+ positions) -> L blocks -> optional final norm -> head

A block is an attention sublayer then an MLP sublayer, each joined to its input by the
residual, with the norm N before it ("pre") or after ("post") (method §2.2):

    residual="none"        X' = f(N(X))                      (vanilla: no skips, and N none too)
    residual="standard"    X' = X + f(N(X))  pre,  N(X + f(X))  post       (Pre-LN, Post-LN)
    residual="normalised"  X' = a X + b f(N(X)),  a^2 + b^2 = 1 (b = residual_beta)

Attention (per head h; scale 1/sqrt(hs); B_l, D_l from the plan through nanospa.signal):

    softmax          P_h = softmax(scale Q_h K_h^T + causal mask)
    value_skipinit   A_h = alpha I + beta P_h        (alpha = 1, beta = 0 trainable)
    uspa / espa      A_h = diag(D_l) softmax(scale Q_h K_h^T + B_l + causal mask)

Dropout (an extension; method §2.5) has its sites at nanoGPT's places, the embedding, each P
and each sublayer's output: `identity` in a model without it; with p > 0, beyond/dropout.py's
attach puts a DropoutSite at each (its masks moved on by after_step).

Sampling (generate, and its KV cache: forward's `cache`, and kv_cache = True on each
variant that is exact with it, stated on each class, since a subclass that inherits it may
compute something else) is nanospa/sampling.py's, read second.

A variant is one class in one registry, its forward beside what it is at initialisation
(docs/adding_a_variant.md): ATTENTIONS (at_init: the matrix A_l a block applies), NORMS and
RESIDUALS (at_init: their kernel maps), POSITIONS (at_init: the input kernel Sigma_0). The
predictions at init (predict.py) walk the same classes, so a variant cannot run as one thing
and be predicted as another. A value the registries do not hold is an extension: variant()
looks it up in nanospa/beyond/, imported only then. The paper's variants load nothing from
beyond/ up to block_size DENSE_MAX_T; above it `evaluation` computes attention by blocks
(beyond/blockwise.py), and the tied head and dropout are loaded when their fields ask.

Initialisation, each in one visible line (method §2.4; [follow-up]: the paper's follow-up
choice, [choice]: nanospa's documented choice):

    W^V, W^O         independent random orthogonal matrices                 [follow-up]
    W^Q              0 for E-SPA, U-SPA, Value-SkipInit (softmax: zero_query) [follow-up]
    W^K, head        N(0, 1/d)                                              [choice]
    B_l, D_l         signal.layer_bias(plan, l): espa_bias / uspa_bias     (method §7, §8)
    alpha, beta      1 and 0 (Value-SkipInit), trainable                    [follow-up]
    MLP W_1, W_2     orthogonal times max(sqrt(fan_out / fan_in), 1)         [choice, DKS/TAT]
    phi_hat          signal.activation_transform(**plan.activation)         (docs/activations.md)
    embeddings       N(0, sigma_e^2) tokens, positions of variance POS_VARIANCE (method §11)

The numbers come from the plan, one plain value (signal.Plan; print(model.plan)): the SPA
schedule gamma_l or rho_l and the activation's targets. GPT(cfg) makes it with the kernel
budget (signal.make_plan, docs/kernel_budget.md: read it second); GPT(cfg, plan=...) takes
any. This file computes no signal-propagation maths: it stores what nanospa.signal computed,
cast to the model's dtype and device. All random draws come from the model's seeded
numpy.random.Generator, on the host, in a fixed order. Shapes: B batch, T time, C = n_embd,
H heads, hs = C / H head size, V vocabulary (D alone is SPA's D_l).
"""
import importlib
import math

import numpy as np

from . import backend, fused, signal
from .functions import Shaped
from .nn import Embedding, LayerNorm, Linear, Module, Parameter, RMSNorm, orthogonal
from .tensor import Tensor, no_grad

DENSE_MAX_T = 256       # attention_impl "auto": the whole (T, T) matrix up to this block_size; beyond,
                        # attention by blocks (nanospa/beyond/blockwise.py)


def identity(x):
    """A dropout site of a model without dropout (beyond/dropout.attach fills them otherwise)."""
    return x


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


# ----------------------------------------------------------------------------- attention

def dense_attention(q, k, v, scale, bias, carry=None, drop=None):
    """softmax(scale Q K^T + bias + causal mask) V with the whole (B, H, T, T) matrix P ->
    (y, P). bias: (stored, blocks), a stored (T_max, T_max) B (an array, or a Parameter) and a
    function (i0, i1, j0, j1, dtype) -> a block of fixed logits made on demand (for attention
    by blocks, beyond/blockwise.py); either None. carry: what one block hands the next
    (RealFormer's scores, beyond/), unused here. drop: the attention's dropout site on P
    (identity without dropout), or None. With fewer
    queries than keys (generation's cache: n new rows, (B, H, n, hs), against the T keys and
    values kept) the queries are the last n positions, and P is their (B, H, n, T) rows."""
    T = k.shape[-2]
    P = fused.softmax(q @ k.transpose(0, 1, 3, 2), dense_bias(bias, T, q.dtype, q.shape[-2]), scale=scale,
                      causal=True)                                 # (B, H, n, T)
    return (P if drop is None else drop(P)) @ v, P                 # (B, H, n, hs)


dense_attention.kv_cache = True     # the new rows of P, exactly (sampling.kv_cache_refusal)


def dense_bias(bias, T, dtype, n=None):
    """The fixed logits of bias = (stored, blocks) for the last n (default all T) query
    positions of T over keys 0..T-1, (n, T) or per head (H, n, T); or None."""
    n = T if n is None else n
    stored, blocks = bias
    b = None if stored is None else stored[T - n:T, :T]
    if blocks is not None:
        made = Tensor(blocks(T - n, T, 0, T, dtype))
        b = made if b is None else b + made
    return b


class Attention(Module):
    """Multi-head causal attention, softmax kind (method §3): P = softmax(scale Q K^T + causal
    mask). At init with W^Q = 0 (zero_query) every logit is 0 and P is uniform over j <= i
    (method §3.4); with random W^Q, W^K the predictions use the softmax mean field.

    The other kinds subclass it, each changing what it says it changes: logit_bias(T) (the
    fixed logits), output(y, v, start) (from P V to the sublayer's output), effective(P) (the
    matrix that multiplies the values, for model.trace) and at_init (that matrix at
    initialisation, float64, or None for the mean field; `bias` there: a position scheme's
    fixed logits). Its hooks (attach) are extensions acting on the queries, keys and logits
    (nanospa/beyond/: RoPE, ALiBi, E-SPA's prior, nGPT's unit q and k), `evaluate` how the
    softmax is computed (dense_attention, or by blocks at long T); the paper's variants have
    no hooks.

    With a KVCache forward takes the new positions start.. only, and kv_cache = True says a
    kind computes their rows exactly (nanospa/sampling.py says how)."""
    kv_cache = True     # the new rows of softmax(scale Q K^T + mask) V, from the keys and values kept

    @staticmethod
    def words(cfg):
        """What the kind is at init, in words (python -m nanospa.signal prints it)."""
        return ("uniform causal attention (W^Q = 0 or zero_query; method §3.4), or the softmax of the "
                "fixed logit bias with ALiBi or the SPA prior; with random W^Q a mean field")

    def __init__(self, cfg, plan, layer, rng, evaluate=dense_attention):
        super().__init__()
        C, H, dt = cfg.n_embd, cfg.n_head, cfg.dtype
        self.n_head, self.dtype = H, dt
        self.q = Linear(C, C, bias=cfg.bias, rng=rng, dtype=dt)      # each Linear draws N(0, 1/C)
        self.k = Linear(C, C, bias=cfg.bias, rng=rng, dtype=dt)
        self.v = Linear(C, C, bias=cfg.bias, rng=rng, dtype=dt)
        self.proj = Linear(C, C, bias=cfg.bias, rng=rng, dtype=dt)
        self.v.weight.data = weight(orthogonal(rng, C, C), dt)       # W^V orthogonal
        self.proj.weight.data = weight(orthogonal(rng, C, C), dt)    # W^O orthogonal
        if cfg.attention != "softmax" or cfg.zero_query:
            self.q.weight.data = weight(np.zeros((C, C)), dt)        # W^Q = 0: A_l set by B_l, D_l
        self.evaluate, self.hooks = evaluate, []
        self.attn_drop = self.resid_drop = identity      # dropout's sites: on P and on the output

    def attach(self, hooks):
        """Extensions on the queries, keys and logits (beyond/), each adding its parameters."""
        for hook in hooks:
            hook.attach(self)
            self.hooks.append(hook)

    def forward(self, x, record=None, carry=None, cache=None):
        B, T, C = x.shape
        H, hs = self.n_head, C // self.n_head
        start = 0 if cache is None else cache.length             # the position of x's first row
        q = self.q(x).reshape(B, T, H, hs).transpose(0, 2, 1, 3)  # (B, T, C) -> (B, H, T, hs)
        k = self.k(x).reshape(B, T, H, hs).transpose(0, 2, 1, 3)
        v = self.v(x).reshape(B, T, H, hs).transpose(0, 2, 1, 3)
        scale, bias = 1.0 / math.sqrt(hs), self.logit_bias()
        for hook in self.hooks:                                  # extensions only
            q, k, scale, bias = hook.logits(q, k, scale, bias, start)
        keys, values = (k, v) if cache is None else cache.append(k, v)   # (B, H, start + T, hs)
        by_blocks = getattr(self.evaluate, "by_blocks", False)   # no (T, T) P to record, or new rows
        evaluate = dense_attention if (record is not None or start) and by_blocks else self.evaluate
        y, P = evaluate(q, keys, values, scale, bias, carry, self.attn_drop)
        y = self.output(y, v, start)                             # (B, H, T, hs)
        if record is not None:
            record["attention"] = self.effective(P.data)         # P undropped
        return self.resid_drop(self.proj(y.transpose(0, 2, 1, 3).reshape(B, T, C)))   # (B, H, T, hs) -> (B, T, C)

    def logit_bias(self):
        return None, None

    def output(self, y, v, start=0):
        return y

    def effective(self, P):
        return P

    @staticmethod
    def at_init(cfg, plan, layer, T, bias=None):
        if not cfg.zero_query:
            return None
        return signal.uniform_causal_attention(T) if bias is None else signal.realise(bias, np.ones(T))


class ValueSkipInit(Attention):
    """A = alpha I + beta P (method §4): alpha = 1 and beta = 0 at init, trainable (per layer,
    or per head with skipinit_per_head); at init the identity, whatever P is."""
    kv_cache = True     # the new rows of I V are the new values v

    @staticmethod
    def words(cfg):
        return "the identity (alpha I + beta P with beta = 0; method §4)"

    def __init__(self, cfg, plan, layer, rng, evaluate=dense_attention):
        super().__init__(cfg, plan, layer, rng, evaluate)
        shape = (cfg.n_head, 1, 1) if cfg.skipinit_per_head else (1,)
        self.alpha = Parameter(np.ones(shape), no_decay=True, dtype=cfg.dtype)
        self.beta = Parameter(np.zeros(shape), no_decay=True, dtype=cfg.dtype)

    def output(self, y, v, start=0):
        return v * self.alpha + y * self.beta                    # (alpha I + beta P) V

    def effective(self, P):
        return self.alpha.data * backend.xp_of(P).eye(P.shape[-1], dtype=P.dtype) + self.beta.data * P

    @staticmethod
    def at_init(cfg, plan, layer, T, bias=None):
        return signal.value_skipinit_attention(T)


class SPA(Attention):
    """U-SPA and E-SPA: A_l = diag(D_l) softmax(scale Q K^T + B_l + causal mask) (method §6-§8),
    B_l and D_l of block l from the plan (signal.layer_bias). W^Q = 0 at init, so A_l =
    diag(D_l) softmax(B_l): the plan's matrix, exactly. B = tril(B_l) is a (T, T) buffer (a
    Parameter with train_bias) and D_l a (T,) buffer; where attention is evaluated by blocks
    (above DENSE_MAX_T: beyond/blockwise.py), B_l stays as its O(T) parts and each block is
    made on the device on demand."""
    kv_cache = True     # the new rows of B_l (dense_bias: sliced, or made from the O(T) parts) and of D_l

    @staticmethod
    def words(cfg):
        return {"uspa": "A_l = diag(D_l) softmax(B_l), the plan's U-SPA matrix (method §6, §8)",
                "espa": "A_l = diag(D_l) softmax(B_l), the plan's E-SPA matrix (method §7, §8)"}[cfg.attention]

    def __init__(self, cfg, plan, layer, rng, evaluate=dense_attention):
        parts, D = signal.layer_bias(plan, layer)                  # B_l's O(T) parts, and D_l
        super().__init__(cfg, plan, layer, rng, evaluate)
        T, dt = cfg.block_size, cfg.dtype
        self.B, self.parts = None, None
        # A stored B_l is tril(B): 0, not -inf, above the diagonal (the causal mask adds the -inf),
        # so that the buffer, or the trained parameter, holds finite numbers.
        if cfg.train_bias:                                          # never decayed (method §8)
            self.B = Parameter(np.tril(signal.bias_block(parts, 0, T, 0, T)), no_decay=True, dtype=dt)
        elif getattr(evaluate, "by_blocks", False):
            self.parts = {k: backend.asarray(v) if isinstance(v, np.ndarray) else v for k, v in parts.items()}
        else:
            self.register_buffer("B", weight(np.tril(signal.bias_block(parts, 0, T, 0, T)), dt))
        self.register_buffer("D", weight(D, dt))

    def logit_bias(self):
        if self.parts is None:
            return self.B, None
        xp = backend.xp_of(self.D)                               # the parts are where D_l is
        return None, lambda i0, i1, j0, j1, dtype: signal.bias_block(self.parts, i0, i1, j0, j1, dtype, xp=xp)

    def output(self, y, v, start=0):
        return signal.rescale(y, self.D[start:])                   # row i scaled by D_l[start + i]

    def effective(self, P):
        return signal.rescale(P, self.D)

    @staticmethod
    def at_init(cfg, plan, layer, T, bias=None):
        B, D = signal.dense_layer_bias(plan, layer, T)
        return signal.realise(B if bias is None else B + bias, D)


ATTENTIONS = {"softmax": Attention, "value_skipinit": ValueSkipInit, "uspa": SPA, "espa": SPA}


def check_kind(cls):
    """cls itself, or ValueError when an attention kind says half of what it is: a kind that
    changes what softmax attention computes (logit_bias or output) must also say what it is at
    init (at_init) and what matrix it applies (effective), and the other way round."""
    own = {name for name in ("logit_bias", "output", "effective", "at_init")
           if getattr(cls, name) is not getattr(Attention, name)}
    if own and not ({"effective", "at_init"} <= own and own & {"logit_bias", "output"}):
        raise ValueError(f"attention kind {cls.__name__} is half a variant: it defines {sorted(own)} of "
                         "logit_bias or output (its forward), and effective and at_init (what it is at init) "
                         "(docs/adding_a_variant.md)")
    return cls


class MLP(Module):
    def __init__(self, cfg, act, rng):
        super().__init__()
        C, M, dt = cfg.n_embd, cfg.mlp_ratio * cfg.n_embd, cfg.dtype
        self.fc = Linear(C, M, bias=cfg.bias, rng=rng, dtype=dt)
        self.proj = Linear(M, C, bias=cfg.bias, rng=rng, dtype=dt)
        self.act = act                                              # phi_hat(x) = s (phi(a x + b) + o)
        self.drop = identity                                        # dropout's site
        # orthogonal, scaled so that a wide layer keeps q: the DKS/TAT condition W_1 W_1^T = (M / C) I
        self.fc.weight.data = weight(orthogonal(rng, C, M, max(math.sqrt(M / C), 1.0)), dt)
        self.proj.weight.data = weight(orthogonal(rng, M, C, max(math.sqrt(C / M), 1.0)), dt)

    def forward(self, x):
        return self.drop(self.proj(self.act(self.fc(x))))  # (B, T, C) -> (B, T, 4C) -> (B, T, C)


# ----------------------------------------------------------------------------- norms, residuals

class Norm:
    """The paper's norms, LayerNorm and RMSNorm (nn.py): build(cfg) makes the layer; at_init,
    its kernel map, rescales every token to q = 1 (Sigma -> C; signal.maps.norm_kernel)."""
    kv_cache = True     # token by token: the new positions' rows alone

    @staticmethod
    def build(cfg):
        return (LayerNorm if cfg.norm == "layernorm" else RMSNorm)(cfg.n_embd, dtype=cfg.dtype)

    @staticmethod
    def at_init(Sigma, cfg, batch=None):
        return signal.maps.norm_kernel(cfg, Sigma, batch)


NORMS = {"none": None, "layernorm": Norm, "rmsnorm": Norm}


class Residual:
    """How a sublayer's output h joins its input x: x' = a x + b h (method §2.2), (a, b) from
    signal.plan.residual_weights: none (0, 1), standard (1, 1), normalised (sqrt(1 - beta^2),
    beta). at_init: the kernel a^2 Sigma_x + b^2 Sigma_h; branch_gain2 the kernel gain of a
    branch's weights (1; DeepNorm's beta^2 in beyond/)."""
    kv_cache = True     # token by token

    def __init__(self, cfg):
        self.a, self.b, self.branch_gain2 = signal.plan.residual_weights(cfg)

    def __call__(self, x, h):
        if self.a == 0.0:
            return h
        return x + h if (self.a, self.b) == (1.0, 1.0) else x * self.a + h * self.b

    def at_init(self, Sigma_x, Sigma_h):
        return signal.maps.residual_kernel(self.a, self.b, Sigma_x, Sigma_h)

    def init_block(self, block):
        """Change a built block's weights (DeepNorm's gains, in beyond/); nothing here."""


RESIDUALS = {"none": Residual, "standard": Residual, "normalised": Residual}


class Block(Module):
    """An attention sublayer, then an MLP sublayer, each x -> residual(x, f(N(x))) (pre) or
    N(residual(x, f(x))) (post)."""

    def __init__(self, cfg, plan, layer, act, rng, hooks=(), evaluate=dense_attention):
        super().__init__()
        self.attn = variant("attention", cfg.attention)(cfg, plan, layer, rng, evaluate)
        self.attn.attach(hooks)
        self.mlp = MLP(cfg, act, rng)
        norm = variant("norm", cfg.norm)
        self.norm1, self.norm2 = (norm.build(cfg), norm.build(cfg)) if norm else (None, None)
        self.post = cfg.norm_position == "post"
        self.residual = variant("residual", cfg.residual)(cfg)
        self.residual.init_block(self)

    def sublayer(self, x, f, norm, record=None, key=None):
        h = f(norm(x) if norm is not None and not self.post else x)
        if record is not None and key:
            record[key] = h.data
        h = self.residual(x, h)
        return norm(h) if norm is not None and self.post else h

    def forward(self, x, record=None, carry=None, cache=None):
        x = self.sublayer(x, lambda u: self.attn(u, record, carry, cache), self.norm1, record, "attn_out")
        return self.sublayer(x, self.mlp, self.norm2)


# ----------------------------------------------------------------------------- positions

class Position:
    """Positions added to the token embedding (method §11): none, learned (an Embedding wpe of
    variance POS_VARIANCE) or sinusoidal (a fixed buffer pe of that variance). build adds them
    to the model; at_init is the input kernel Sigma_0 of T distinct tokens
    (signal.input_kernel). Schemes acting on the logits instead (ALiBi, RoPE, E-SPA's prior)
    are extensions (beyond/positions.py) with hooks and logits at init of their own. embed's
    start: the position of x's first row (generation's cache feeds the new positions only)."""
    kv_cache = True     # rows start.. of wpe or pe

    def __init__(self, cfg, plan):
        self.cfg, self.plan = cfg, plan

    def build(self, model, rng):
        cfg = self.cfg
        if cfg.pos == "learned":
            model.wpe = Embedding(cfg.block_size, cfg.n_embd, std=math.sqrt(signal.POS_VARIANCE), rng=rng,
                                  dtype=cfg.dtype)
        elif cfg.pos == "sinusoidal":
            model.register_buffer("pe", weight(signal.sinusoidal_encoding(cfg.block_size, cfg.n_embd), cfg.dtype))

    def embed(self, model, x, T, start=0):
        if self.cfg.pos == "learned":
            return x + model.wpe.weight[start:start + T]     # + (T, C): rows start.., no index array
        return x + Tensor(model.pe[start:start + T]) if self.cfg.pos == "sinusoidal" else x

    def hooks(self, layer):
        """What the scheme does to block `layer`'s logits: nothing, for positions added."""
        return []

    @staticmethod
    def at_init(cfg, T=None, tokens=None):
        """Sigma_0 of T distinct tokens, or of the sequence `tokens`."""
        return signal.input_kernel(tokens, T, pos=cfg.pos, n_embd=cfg.n_embd)

    @staticmethod
    def logit_bias_at_init(cfg, plan, layer, T):
        return None

    @staticmethod
    def rotation_at_init(cfg):
        return None


POSITIONS = {"none": Position, "learned": Position, "sinusoidal": Position}
REGISTRIES = {"attention": ATTENTIONS, "norm": NORMS, "residual": RESIDUALS, "pos": POSITIONS}


def variant(field, name):
    """The class of GPTConfig.<field> = name: from the registries above, else an extension of
    nanospa/beyond/, imported by name only then; ValueError naming the value and the allowed
    ones when neither holds it."""
    registry = REGISTRIES[field]
    if name not in registry:
        return importlib.import_module("nanospa.beyond").variant(field, name, known=tuple(registry))
    return check_kind(registry[name]) if field == "attention" else registry[name]


def dense(cfg):
    """Whether cfg's attention forms the whole (T, T) matrix P (attention_impl "dense", or "auto"
    up to DENSE_MAX_T), rather than working by blocks."""
    return cfg.attention_impl == "dense" or (cfg.attention_impl == "auto" and cfg.block_size <= DENSE_MAX_T)


def evaluation(cfg):
    """How attention's softmax is computed: dense_attention, or an extension's where cfg asks
    for attention by blocks (attention_impl, or "auto" beyond DENSE_MAX_T) or RealFormer's
    carried scores (residual_attention)."""
    if dense(cfg) and not cfg.residual_attention:
        return dense_attention
    return importlib.import_module("nanospa.beyond").evaluation(cfg)


# ----------------------------------------------------------------------------- the model

class Trace:
    """What ``GPT.trace`` returns: host arrays, one entry per layer (see GPT.trace)."""

    def __init__(self):
        self.hidden, self.attn_out, self.attention = [], [], []


class GPT(Module):
    def __init__(self, cfg, seed=0, plan=None):
        super().__init__()
        self.config = cfg
        rng = np.random.default_rng(seed)  # all init drawn on the host: same weights on CPU and GPU
        self.plan = signal.make_plan(cfg) if plan is None else plan   # schedule, activation (float64)
        act = ShapedActivation(signal.activation_transform(**self.plan.activation))   # phi_hat: DKS / TAT
        C, dt = cfg.n_embd, cfg.dtype
        scheme = variant("residual", cfg.residual)                    # nGPT brings its own parts
        self.wte = scheme.embedding(cfg, rng) if hasattr(scheme, "embedding") else \
            Embedding(cfg.vocab_size, C, std=math.sqrt(signal.token_variance(cfg.pos)), rng=rng, dtype=dt)
        self.position = variant("pos", cfg.pos)(cfg, self.plan)
        self.wpe = None
        self.position.build(self, rng)
        self.drop = identity                                          # dropout's site: the embedding
        make_block, evaluate = getattr(scheme, "block", Block), evaluation(cfg)
        self.blocks = [make_block(cfg, self.plan, l, act, rng, self.position.hooks(l), evaluate)
                       for l in range(1, cfg.n_layer + 1)]
        if cfg.tie_embeddings:          # logits (x / sqrt(C)) W_e^T: beyond/tied.py, by name
            self.head = importlib.import_module("nanospa.beyond.tied").TiedHead(self.wte, C)
        else:
            self.head = scheme.head(cfg, rng) if hasattr(scheme, "head") else \
                Linear(C, cfg.vocab_size, bias=False, rng=rng, dtype=dt)  # N(0, 1/C)
        norm = variant("norm", cfg.norm)
        self.ln_f = norm.build(cfg) if norm and cfg.uses_final_norm else None
        self.dropout_masks = None                                     # every dropout site's masks, if any
        if cfg.dropout:                                               # beyond/dropout.py, by name
            importlib.import_module("nanospa.beyond.dropout").attach(self, seed)

    @property
    def activation(self):
        """The MLPs' shaped activation (shared by every block)."""
        return self.blocks[0].mlp.act

    def embed(self, idx, start=0):
        """The first block's input: token embeddings plus the positions start.. (B, T) -> (B, T, C)."""
        T = idx.shape[1]
        if start + T > self.config.block_size:
            raise ValueError(f"sequence length {start + T} exceeds block_size {self.config.block_size}")
        return self.position.embed(self, self.wte(idx), T, start)

    def forward(self, idx, targets=None, record=None, cache=None):
        """Logits (B, T, V) of idx (B, T), and the loss with targets. cache: a list of one
        sampling.KVCache per block (generate's), holding `length` positions: idx are then the next
        positions (length..), and the logits theirs, computed against the keys and values kept."""
        idx, targets = _token_ids(idx, targets, self.config.vocab_size)   # on the model's device
        start = 0 if cache is None else cache[0].length    # the position of idx's first token
        x = self.drop(self.embed(idx, start))               # (B, T) -> (B, T, C)
        if record is not None:
            record.hidden.append(backend.to_numpy(x.data))
        carry = {}                                          # what one block hands the next (RealFormer)
        for l, block in enumerate(self.blocks):
            layer = {} if record is not None else None
            x = block(x, layer, carry, None if cache is None else cache[l])
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

    def num_params(self):
        return sum(p.size for p in self.parameters())

    def after_step(self):
        """Call once after every optimiser step (train.py and the experiments do): each module
        with an ``after_step`` method runs it, in module order. The seam for schemes whose
        state moves with training rather than with gradients (renormalised weights, scheduled
        mixing coefficients, dropout's masks); a model of the paper's variants has none."""
        for m in self.modules():
            if m is not self and hasattr(m, "after_step"):
                m.after_step()


def _token_ids(idx, targets, vocab_size):
    """forward's idx and targets (or None), each checked (_checked_ids) and of one shape, on
    the model's device. Two host arrays cross to the device as one copy (stacked):
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
    """idx (a Tensor, a host or a device array) as a (B, T) integer array where it is, every id
    in [0, vocab_size), or ValueError naming the problem: a padding id such as -1 would
    otherwise be read as the last token (nanospa has no ignore index), and an empty batch
    would give a loss of 0. The range of a device array is read back once (its minimum and maximum
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
