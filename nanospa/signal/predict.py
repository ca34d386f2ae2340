"""Predicted kernels of a whole model at initialisation, sublayer by sublayer (wide limit).

Implements the walk of docs/method.md §2.2 with the sublayer maps of maps.py (attention
§3.2, Value-SkipInit §4, MLP §10, residuals and norms) from the input kernel of inputs.py
(§11), and the diagnostics of §13. ``predict_kernels(config)`` follows the same block
structure as nanospa.model.GPT:

    embedding        Sigma_0 (inputs.input_kernel: repeated tokens, positional encodings)
    attention        Sigma -> A Sigma A^T, A = diag(D_l) softmax(B_l) (SPA, exact at init),
                     I (Value-SkipInit, exact), the uniform causal matrix (softmax with
                     zero_query, exact), or for softmax with random W^Q, W^K a mean-field
                     estimate (maps.softmax_attention_map); logit positions (ALiBi, RoPE,
                     the SPA prior: positions.py) enter both, per head where they differ
    MLP              maps.MLPMap: the C-map on correlations with the Q-map on the diagonal
    residual, norm   maps.BlockMaps (DeepNorm's alpha, beta included); nGPT: beyond/ngpt_maps.NGPTMaps
    RealFormer       carried logits: zero where W^Q = 0 (exact), else the layers' Gaussian
                     logits add (mean field, maps.softmax_attention_map's logit_kernels)

"Wide limit" means n_embd -> inf with the model's own initialisation (docs/method.md
§2.4): the predictions hold exactly there, and at finite width up to O(d^-1/2) fluctuations
(tests/test_signal_predict.py compares with width 1024). Not here: the kernel-budget
policies that choose the plan (budget.py), measured kernels of a real model
(nanospa/measure.py). The configuration is read by duck typing (GPTConfig's fields).

Notation (docs/method.md §1, §10)

    T            sequence length (config.block_size unless sigma_0 says otherwise)
    L            number of blocks
    Sigma        (T, T) kernel X X^T / d; its diagonal holds the q-values
    A_l          effective attention matrix of block l (T, T), lower triangular
    B_l, D_l     SPA bias and row rescaling: A_l = diag(D_l) softmax(B_l)
"""
from dataclasses import dataclass, field

import numpy as np

from .attn_bias import layer_bias, realise
from .budget import make_plan
from .inputs import input_kernel
from .kernels import kernel_stats, spa_kernel, uniform_causal_attention, value_skipinit_attention
from .beyond.ngpt_maps import NGPTMaps
from .maps import BlockMaps
from .beyond.norm_maps import batch_attention
from .beyond.positions import logit_bias, rope_frequencies

SUBLAYERS = ("attn_branch", "attn", "mlp_branch", "mlp")


# What each attention of GPTConfig is at initialisation: effective_attention computes it, and
# the predictions, the kernel budget, `python -m nanospa.signal` and the tests of the model's
# own trace at init all read it from there. A kind missing here is refused everywhere.
ATTENTION_AT_INIT = {
    "softmax": "uniform causal attention (W^Q = 0 or zero_query; method §3.4), or the softmax of the "
               "fixed logit bias with ALiBi or the SPA prior; with random W^Q a mean field",
    "value_skipinit": "the identity (alpha I + beta P with beta = 0; method §4)",
    "uspa": "A_l = diag(D_l) softmax(B_l), the plan's U-SPA matrix (method §6, §8)",
    "espa": "A_l = diag(D_l) softmax(B_l), the plan's E-SPA matrix (method §7, §8)",
}


def effective_attention(cfg, plan, layer, T):
    """A_l of block `layer` (1-based) at init, (T, T) or, with ALiBi, one per head (H, T, T);
    None for softmax with random queries (then the kernel map is maps.softmax_attention_map).
    With W^Q = 0 the logits are the fixed bias alone (positions.logit_bias: SPA's B_l or
    the prior's, plus ALiBi), so A_l = diag(D_l) softmax(bias), D_l = 1 without SPA; RoPE
    rotates zero queries and changes nothing."""
    if cfg.attention not in ATTENTION_AT_INIT:
        raise ValueError(f"attention {cfg.attention!r} is not in signal/predict.py's ATTENTION_AT_INIT: "
                         "nothing says what it is at initialisation (docs/adding_a_variant.md)")
    bias = logit_bias(cfg, plan, layer, T)
    if cfg.attention in ("uspa", "espa"):
        return realise(bias, layer_bias(plan, layer, T)[1])
    if cfg.attention == "value_skipinit":
        return value_skipinit_attention(T)                    # alpha I + beta P at init: I
    if cfg.zero_query:
        return uniform_causal_attention(T) if bias is None else realise(bias, np.ones(T))
    return None


def plan_targets(plan, T):
    """The attention-only SPA targets Sigma_1..Sigma_L the plan's schedule aims at (None
    entries for non-SPA attention)."""
    L = plan.n_layer
    if plan.kind is None:
        return [None] * L
    return [spa_kernel(plan.kind, T, plan.schedule[l]) for l in range(1, L + 1)]


@dataclass
class KernelPrediction:
    """predict_kernels' result. sigma_0: (T, T) input kernel; layers: one dict per block
    l = 1..L with the kernels (T, T) after each sublayer:

        attn_branch   the attention sublayer's output before any residual (model.trace's attn_out)
        attn          after the attention sublayer (residual, post-norm included)
        mlp_branch    the MLP's output before any residual
        mlp           the block output (model.trace's hidden[l])
        target        the attention-only SPA target Sigma_l (unit diagonal), or None
        A             the effective attention matrix used (None: softmax mean field)

    final: the kernel the head sees (after the final norm, if any)."""
    config: object
    sigma_0: np.ndarray
    layers: list = field(default_factory=list)
    final: np.ndarray = None
    notes: list = field(default_factory=list)

    @property
    def T(self):
        return self.sigma_0.shape[0]

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
        """kernels.kernel_stats of one predicted kernel."""
        return kernel_stats(self.kernel(layer, sublayer))

    def rows(self, sublayers=("attn", "mlp")):
        """One dict per (layer, sublayer): layer, sublayer, the kernel statistics and, for
        SPA models, the attention-only target's mean off-diagonal and adjacent mean."""
        out = [dict(layer=0, sublayer="input", **kernel_stats(self.sigma_0))]
        for l, rec in enumerate(self.layers, start=1):
            for s in sublayers:
                row = dict(layer=l, sublayer=s, **kernel_stats(rec[s]))
                if rec["target"] is not None:
                    t = kernel_stats(rec["target"])
                    row.update(target_mean_offdiag=t["mean_offdiag"], target_adjacent=t["adjacent_mean"])
                out.append(row)
        return out

    def table(self, sublayers=("attn", "mlp"), every=1):
        """A plain-text table of rows(), every `every`-th layer (and the last)."""
        L = len(self.layers)
        head = (f"{'layer':>5} {'sub':>5} {'q_min':>8} {'q_mean':>8} {'q_max':>8} "
                f"{'C_mean':>7} {'C_min':>7} {'C_adj':>7} {'first-last':>10} {'target':>7}")
        lines = [head]
        for row in self.rows(sublayers):
            l = row["layer"]
            if l not in (0, L) and (l % every):
                continue
            tgt = row.get("target_mean_offdiag")
            lines.append(f"{l:>5} {row['sublayer'][:5]:>5} {row['q_min']:8.3f} {row['q_mean']:8.3f} "
                         f"{row['q_max']:8.3f} {row['mean_offdiag']:7.4f} {row['min_entry']:7.4f} "
                         f"{row['adjacent_mean']:7.4f} {row['first_to_last']:10.4f} "
                         + (f"{tgt:7.4f}" if tgt is not None else f"{'-':>7}"))
        return "\n".join(lines)


def predict_kernels(config, sigma_0=None, plan=None, softmax_samples=32, batch=None, maps=None):
    """Predicted (wide-limit) kernels of GPT(config) at initialisation after every sublayer.

    config: a GPTConfig (read by duck typing). sigma_0: the input kernel (T, T),
    T <= block_size; default the distinct-token kernel input_kernel(T=block_size,
    pos=config.pos, ...), which is I for pos "none"/"learned". plan: make_plan(config)
    unless given (pass it to avoid rebuilding). softmax_samples: Monte Carlo samples for
    softmax attention with random queries (0 = uniform causal attention, the zero-query
    map). Returns a KernelPrediction. Exact at init for SPA (W^Q = 0), Value-SkipInit and
    zero-query softmax in the wide limit; softmax with random queries is a mean-field
    estimate (its notes say so). batch=B: sigma_0 is the (B T, B T) kernel of a whole batch
    (inputs.batch_input_kernel) and every kernel of the result is too; attention acts on
    each sequence (norm_maps.batch_attention) and BatchNorm / PRepBN use batch statistics
    (norm_maps); without it they use their initial running statistics (evaluation mode).
    maps: the sublayer maps (default block_maps(config, plan.activation, batch): BlockMaps,
    or NGPTMaps for nGPT, whose kernels have q = 1 / n_embd)."""
    if plan is None:
        plan = make_plan(config)
    if sigma_0 is None:
        sigma_0 = input_kernel(T=config.block_size, pos=config.pos, n_embd=config.n_embd)
    sigma_0 = np.asarray(sigma_0, dtype=np.float64)
    B = batch or 1
    T = sigma_0.shape[0] // B
    if sigma_0.shape != (B * T, B * T) or T > config.block_size:
        raise ValueError(f"sigma_0 must be (T, T) with T <= block_size={config.block_size} (times batch={B}), "
                         f"got shape {sigma_0.shape}")
    if batch and config.attention == "softmax" and not config.zero_query:
        raise ValueError("predict_kernels(batch=...) needs a fixed attention matrix; softmax with random "
                         "queries has only a per-sequence mean field")
    maps = block_maps(config, plan.activation, batch=batch) if maps is None else maps
    sigma_0 = maps.embedding(sigma_0)
    pred = KernelPrediction(config=config, sigma_0=sigma_0)
    if config.attention == "softmax" and not config.zero_query:
        pred.notes.append("softmax attention with random W^Q, W^K: mean-field estimate "
                          f"E[P Sigma P^T] from {softmax_samples} Gaussian-logit samples"
                          if softmax_samples > 0 else
                          "softmax attention with random W^Q, W^K: approximated by uniform "
                          "causal attention")
    carried = [] if getattr(config, "residual_attention", False) else None   # RealFormer's logits
    if carried is not None:
        pred.notes.append("residual_attention: the carried scores are zero at init where W^Q = 0; "
                          "with random W^Q, W^K the layers' independent Gaussian logits add")
    targets = plan_targets(plan, T)
    rope = rope_frequencies(config.n_embd // config.n_head) if config.pos == "rope" else None
    S = sigma_0
    for l in range(1, config.n_layer + 1):
        A = effective_attention(config, plan, l, T)
        bias = logit_bias(config, plan, l, T) if A is None else None          # ALiBi, the SPA prior
        A_all = batch_attention(A, B) if batch and A is not None else A     # (B T, B T): each sequence its own
        f_att = lambda X, A=A_all, l=l, bias=bias: maps.attention(X, A, softmax_samples, seed=l, carried=carried,
                                                                  bias=bias, rope=rope)
        h_att, S = maps.sublayer(S, f_att)
        h_mlp, S_out = maps.sublayer(S, maps.mlp)
        pred.layers.append(dict(attn_branch=h_att, attn=S, mlp_branch=h_mlp, mlp=S_out,
                                target=targets[l - 1], A=A))
        S = S_out
    pred.final = maps.final(S)
    return pred


def block_maps(cfg, activation, batch=None):
    """The sublayer maps of cfg: NGPTMaps for residual="ngpt", else BlockMaps (batch: see
    BlockMaps; nGPT has no batch statistics, so it takes kernels of one sequence only)."""
    if cfg.residual == "ngpt":
        if batch:
            raise ValueError("predict_kernels(batch=...) is for batch statistics; nGPT has none: "
                             "predict one sequence's kernel")
        return NGPTMaps(cfg, activation)
    return BlockMaps(cfg, activation, batch=batch)
