"""The kernels of a whole model at initialisation, predicted sublayer by sublayer in the wide
limit (docs/method.md §2.2, §13), from the same variant classes the model runs (model.py).

    predict_kernels(cfg, sigma_0=None, plan=None, softmax_samples=32, batch=None)
                        -> KernelPrediction: the kernel after every sublayer of every block
    attention_at_init(cfg, plan, l, T)  the matrix A_l block l applies at init (its kind's)
    BlockMaps           the maps one block applies at init: attention (the kind's at_init
                        matrix A_l, Sigma -> A Sigma A^T), MLP (signal.MLPMap), norm and residual
                        (their classes' at_init)
    predicted_kernels(cfg, plan, idx)   [Sigma_0, ..., Sigma_L], averaged over token rows
    attention_only_kernels(cfg, plan)   the attention-only network (method §3.2), for the table

The walk (method §2.2), from the input kernel Sigma_0 (the position scheme's at_init: T
distinct tokens give I for pos "none"):

    embedding        Sigma_0
    attention        Sigma -> A_l Sigma A_l^T with A_l = Attention kind.at_init (SPA: diag(D_l)
                     softmax(B_l), exact at init; Value-SkipInit: I; softmax with W^Q = 0: the
                     uniform causal matrix), or, with random W^Q, W^K, the softmax mean field
                     (signal.softmax_attention_map)
    MLP              signal.MLPMap: the C-map on correlations with the Q-map on the diagonal
    residual, norm   their classes' at_init: a^2 Sigma_x + b^2 Sigma_h; Sigma -> C

Dropout (GPTConfig.dropout) is left out: these are the kernels of the model in evaluation mode,
where dropout is the identity; docs/method.md §2.5 says what it does in training mode at init.

"Wide limit" means n_embd -> inf with the model's own initialisation (docs/method.md §2.4):
the predictions hold exactly there, and at finite width up to O(d^-1/2) fluctuations
(tests/test_predict.py holds every registered variant to a wide model's measured kernels).
Here, above model.py, because the variants live there; nanospa/signal/ holds the maps
themselves and never imports the model. Notation: T sequence length, L blocks, Sigma a
(T, T) kernel X X^T / d with the q-values on its diagonal, A_l the matrix of block l.
"""
from dataclasses import dataclass, field

import numpy as np

from . import signal
from .model import evaluation, variant

SUBLAYERS = ("attn_branch", "attn", "mlp_branch", "mlp")


class BlockMaps:
    """The wide-limit maps of one block of cfg at init, from its variants' at_init:

        sublayer(Sigma, f) -> (branch kernel, combined kernel): f(N(Sigma)) joined to Sigma
                              by the residual, N before (pre) or after it (post)
        attention(Sigma, l) the attention branch; mlp(Sigma) the MLP branch

    batch: None for the kernels of one sequence (BatchNorm in evaluation mode), or B for the
    (B T, B T) kernel of a whole batch (training mode: each sequence its own attention). An
    extension with other maps (nGPT) subclasses this."""

    def __init__(self, cfg, plan, batch=None, softmax_samples=32):
        self.cfg, self.plan, self.batch, self.samples = cfg, plan, batch, softmax_samples
        self.kind, self.pos = variant("attention", cfg.attention), variant("pos", cfg.pos)
        self.norm_kind = variant("norm", cfg.norm)
        self.residual = variant("residual", cfg.residual)(cfg)
        self.mlp_map = signal.MLPMap(plan.activation)
        self.carried = [] if getattr(evaluation(cfg), "carries_scores", False) else None   # RealFormer

    def embedding(self, Sigma_0):
        return Sigma_0

    def norm(self, Sigma):
        return Sigma if self.norm_kind is None else self.norm_kind.at_init(Sigma, self.cfg, self.batch)

    def attention(self, Sigma, l):
        T = Sigma.shape[0] // (self.batch or 1)
        A, bias = attention_at_init(self.cfg, self.plan, l, T)
        if A is None:                                                       # random W^Q, W^K
            h = self.mean_field(Sigma, l, bias)
        else:
            h = signal.attention_map(Sigma, A if not self.batch else np.kron(np.eye(self.batch), A))
        return self.residual.branch_gain2 ** 2 * h                          # DeepNorm: beta^4

    def mean_field(self, Sigma, l, bias):
        """The softmax mean field with random W^Q, W^K: Gaussian logits of the kernel
        logit_kernel(Sigma), plus the layers' before them where the scores are carried."""
        if self.batch:
            raise ValueError("predict_kernels(batch=...) needs a fixed attention matrix; softmax with random "
                             "queries has only a per-sequence mean field")
        K = self.logit_kernel(Sigma)
        if self.carried is not None:
            self.carried.append(K)
        return signal.softmax_attention_map(Sigma, self.samples, seed=l, bias=bias,
                                            logit_kernels=self.carried or [K],
                                            rope=self.pos.rotation_at_init(self.cfg))

    def logit_kernel(self, Sigma):
        """The kernel whose Gaussian logits random W^Q, W^K give: Sigma itself (nGPT: other)."""
        return Sigma

    def mlp(self, Sigma):
        g2 = self.residual.branch_gain2                                     # DeepNorm: beta^2 F(beta^2 Sigma)
        return self.mlp_map(Sigma) if g2 == 1.0 else g2 * self.mlp_map(g2 * Sigma)

    def branch_input(self, Sigma):
        return Sigma if self.cfg.norm_position == "post" else self.norm(Sigma)

    def combine(self, Sigma_x, Sigma_h):
        out = self.residual.at_init(Sigma_x, Sigma_h)
        return self.norm(out) if self.cfg.norm_position == "post" else out

    def sublayer(self, Sigma, f):
        h = f(self.branch_input(Sigma))
        return h, self.combine(Sigma, h)

    def final(self, Sigma):
        return self.norm(Sigma) if self.cfg.uses_final_norm else Sigma


def attention_at_init(cfg, plan, layer, T):
    """(A_l, bias): the matrix block `layer` (1-based) applies at init, (T, T) or one per head
    (H, T, T), from its attention kind's at_init with the position scheme's fixed logits
    (ALiBi, E-SPA's prior: `bias`, None for the paper's schemes); A_l None for softmax with
    random W^Q, W^K (the mean field)."""
    bias = variant("pos", cfg.pos).logit_bias_at_init(cfg, plan, layer, T)
    return variant("attention", cfg.attention).at_init(cfg, plan, layer, T, bias), bias


@dataclass
class KernelPrediction:
    """predict_kernels' result. sigma_0: (T, T) input kernel; layers: one dict per block
    l = 1..L with the kernels (T, T) after each sublayer:

        attn_branch   the attention sublayer's output before any residual (model.trace's attn_out)
        attn          after the attention sublayer (residual, post-norm included)
        mlp_branch    the MLP's output before any residual
        mlp           the block output (model.trace's hidden[l])
        target        the attention-only SPA target Sigma_l (unit diagonal), or None
        A             the attention matrix at init (attention_at_init; None: the mean field)

    final: the kernel the head sees (after the final norm, if any)."""
    config: object
    sigma_0: np.ndarray
    layers: list = field(default_factory=list)
    final: np.ndarray = None
    notes: list = field(default_factory=list)

    def kernel(self, layer, sublayer="mlp"):
        """The predicted kernel after `sublayer` of block `layer` (1-based; 0 = input)."""
        if layer == 0:
            return self.sigma_0
        if sublayer not in SUBLAYERS + ("target",):
            raise ValueError(f"sublayer={sublayer!r} is not one of {list(SUBLAYERS) + ['target']}")
        return self.layers[layer - 1][sublayer]

    def q(self, layer, sublayer="mlp"):
        """q-value of every position, (T,)."""
        return np.diagonal(self.kernel(layer, sublayer)).copy()

    def stats(self, layer, sublayer="mlp"):
        """signal.kernel_stats of one predicted kernel."""
        return signal.kernel_stats(self.kernel(layer, sublayer))


def predict_kernels(cfg, sigma_0=None, plan=None, softmax_samples=32, batch=None, maps=None):
    """Predicted (wide-limit) kernels of GPT(cfg, plan=plan) at init after every sublayer.

    sigma_0: the input kernel (T, T), T <= block_size; default the position scheme's kernel
    of T = block_size distinct tokens (I for pos "none" and "learned"). plan: the model's
    (default signal.make_plan(cfg)). softmax_samples: Monte Carlo samples of the softmax mean
    field for random queries (0: the uniform causal matrix). batch=B: sigma_0 is the
    (B T, B T) kernel of a whole batch and so is every kernel of the result (BatchNorm's
    training-mode statistics). Exact at init in the wide limit for SPA (W^Q = 0),
    Value-SkipInit and zero-query softmax; softmax with random queries is a mean field (the
    result's notes say so). maps: the block's maps (default its residual variant's: BlockMaps,
    or an extension's own, as nGPT's)."""
    plan = signal.make_plan(cfg) if plan is None else plan
    if maps is None:
        make = getattr(variant("residual", cfg.residual), "maps", BlockMaps)
        maps = make(cfg, plan, batch=batch, softmax_samples=softmax_samples)
    if sigma_0 is None:
        sigma_0 = variant("pos", cfg.pos).at_init(cfg, T=cfg.block_size)
    sigma_0 = np.asarray(sigma_0, dtype=np.float64)
    B = batch or 1
    T = sigma_0.shape[0] // B
    if sigma_0.shape != (B * T, B * T) or T > cfg.block_size:
        raise ValueError(f"sigma_0 must be (T, T) with T <= block_size={cfg.block_size} (times batch={B}), "
                         f"got shape {sigma_0.shape}")
    S = maps.embedding(sigma_0)
    pred = KernelPrediction(config=cfg, sigma_0=S)
    if attention_at_init(cfg, plan, 1, T)[0] is None:
        pred.notes.append("softmax attention with random W^Q, W^K: mean-field estimate E[P Sigma P^T] from "
                          f"{softmax_samples} Gaussian-logit samples" if softmax_samples > 0 else
                          "softmax attention with random W^Q, W^K: approximated by uniform causal attention")
    if maps.carried is not None:
        pred.notes.append("residual_attention: the carried scores are zero at init where W^Q = 0; with random "
                          "W^Q, W^K the layers' independent Gaussian logits add")
    for l in range(1, cfg.n_layer + 1):
        h_att, S = maps.sublayer(S, lambda X, l=l: maps.attention(X, l))
        h_mlp, S_out = maps.sublayer(S, maps.mlp)
        target = None if plan.kind is None else signal.spa_kernel(plan.kind, T, plan.schedule[l])
        pred.layers.append(dict(attn_branch=h_att, attn=S, mlp_branch=h_mlp, mlp=S_out, target=target,
                                A=attention_at_init(cfg, plan, l, T)[0]))
        S = S_out
    pred.final = maps.final(S)
    return pred


def predicted_kernels(cfg, plan=None, idx=None):
    """[Sigma_0, ..., Sigma_L] of the whole model (block outputs) predicted by
    predict_kernels, averaged over the rows of idx (each row's own input kernel); idx None
    means distinct tokens."""
    plan = signal.make_plan(cfg) if plan is None else plan
    if idx is None or all(len(set(row.tolist())) == len(row) for row in idx):
        pred = predict_kernels(cfg, plan=plan)            # every row has the distinct-token Sigma_0
        return [pred.kernel(l) for l in range(cfg.n_layer + 1)]
    total = None
    for row in idx:
        S0 = variant("pos", cfg.pos).at_init(cfg, tokens=row)
        pred = predict_kernels(cfg, sigma_0=S0, plan=plan)
        ks = [pred.kernel(l) for l in range(cfg.n_layer + 1)]
        total = ks if total is None else [a + b for a, b in zip(total, ks)]
    return [k / len(idx) for k in total]


def attention_only_kernels(cfg, plan=None, T=None):
    """[Sigma_0 = I, Sigma_1, ..., Sigma_L] of the attention-only network (method §3.2),
    Sigma_l = A_l Sigma_{l-1} A_l^T with each block's matrix at init (its kind's at_init, and
    the zero-query picture of method §3.4 for softmax with random queries)."""
    T = T or cfg.block_size
    plan = signal.make_plan(cfg) if plan is None else plan
    out = [np.eye(T)]
    for l in range(1, cfg.n_layer + 1):
        A, bias = attention_at_init(cfg, plan, l, T)
        if A is None:                                      # random queries: the zero-query picture
            A = signal.uniform_causal_attention(T) if bias is None else signal.realise(bias, np.ones(T))
        out.append(signal.attention_map(out[-1], A))
    return out
