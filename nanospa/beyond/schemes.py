"""The residual schemes beyond the paper's (docs/residuals.md): DeepNorm, RealFormer's carried
attention scores, and the combination rules of every scheme here and in ngpt.py.

    DeepNorm            residual="deepnorm": x_{l+1} = N(alpha x_l + G_l(x_l)), alpha = (2N)^(1/4)
                        (Post-LN), with G's W^V, W^O, W_1, W_2 times beta = (8N)^(-1/4) at init;
                        a model.Residual whose (a, b) = (alpha, 1) and branch gain beta^2 come from
                        signal/beyond/residuals.py (its kernel map at init is model.Residual's)
    carried_scores_attention   residual_attention=True (RealFormer): softmax(S_l + B_l + mask)
                        with S_l = Q_l K_l^T / sqrt(d_k) + S_{l-1}, the content scores carried
                        from block to block, B_l fresh; its map at init adds the carried layers'
                        logits (predict.BlockMaps, carries_scores)
    resolve_auto(cfg), check_config(cfg)   the "auto" values these schemes choose, and the
                        combinations GPTConfig accepts (ValueError naming the field)

    residual="ngpt"     nanospa/beyond/ngpt.py (its own block, embedding and head)

Not here: nGPT's modules (ngpt.py), the constants (signal/beyond/residuals.py), the paper's
residuals (model.Residual).
"""
from .. import fused
from ..model import Residual, dense_bias
from ..signal import split_activation
from ..signal.beyond.residuals import deepnorm_beta

DEEPNORM_NORMS = ("layernorm", "rmsnorm")
ADDITIVE_POSITIONS = ("learned", "sinusoidal")   # nGPT: a sum of two unit vectors leaves the sphere


class DeepNorm(Residual):
    """DeepNet's residual (Wang et al. 2022, decoder-only constants): x' = alpha x + f(x) before
    the post-norm, and the block's W^V, W^O, W_1, W_2 times beta = (8N)^(-1/4) after the block
    drew them (so every random draw is the Post-LN model's; W^Q, W^K keep theirs)."""
    kv_cache = True     # token by token, as model.Residual

    def __init__(self, cfg):
        super().__init__(cfg)
        self.beta = deepnorm_beta(cfg.n_layer)

    def init_block(self, block):
        for layer in (block.attn.v, block.attn.proj, block.mlp.fc, block.mlp.proj):
            layer.weight.data = layer.weight.data * self.beta


def carry_scores(carry, scores):
    """RealFormer: S_l = scores + S_{l-1} (scores = Q_l K_l^T / sqrt(d_k), (B, H, T, T)),
    kept in `carry` (a dict that one forward pass hands from block to block) for layer l+1.
    The carried Tensor stays in the graph, so gradients flow through it to earlier layers."""
    previous = carry.get("scores")
    if previous is not None:
        scores = scores + previous
    carry["scores"] = scores
    return scores


def carried_scores_attention(q, k, v, scale, bias, carry=None, drop=None):
    """model.dense_attention with RealFormer's carried scores: softmax(S_l + B_l + mask) V
    (drop: the attention's dropout on P, as there; the scores carried are never dropped). With
    fewer queries than keys (generation's cache) the scores carried are the new rows'."""
    scores = q @ k.transpose(0, 1, 3, 2) * scale                    # (B, H, T, T)
    if carry is not None:
        scores = carry_scores(carry, scores)
    P = fused.softmax(scores, dense_bias(bias, k.shape[-2], q.dtype, q.shape[-2]), scale=1.0, causal=True)
    return (P if drop is None else drop(P)) @ v, P


carried_scores_attention.carries_scores = True      # predict.BlockMaps: the layers' logits add
carried_scores_attention.kv_cache = True    # row i of S_l needs q_i of each layer and the keys kept


def resolve_auto(cfg):
    """The "auto" values these schemes decide: nGPT's attention is softmax (with unit q, k);
    DeepNorm is Post-LN."""
    if cfg.attention == "auto" and cfg.residual == "ngpt":
        cfg.attention = "softmax"
    if cfg.norm_position == "auto" and cfg.residual == "deepnorm":
        cfg.norm_position = "post"


def _refuse(field, value, why):
    raise ValueError(f"GPTConfig.{field}={value!r} {why}")


def check_config(cfg):
    """Raise ValueError for a combination of the residual schemes that makes no sense."""
    if not isinstance(cfg.residual_attention, bool):
        _refuse("residual_attention", cfg.residual_attention, "must be True or False")
    if cfg.residual == "deepnorm":
        if cfg.norm not in DEEPNORM_NORMS:
            _refuse("norm", cfg.norm, f"is not one of {list(DEEPNORM_NORMS)}: residual='deepnorm' is "
                                      "x_(l+1) = N(alpha x_l + G(x_l)) with N a LayerNorm or RMSNorm")
        if cfg.norm_position != "post":
            _refuse("norm_position", cfg.norm_position, "is not 'post': residual='deepnorm' is Post-LN by "
                                                        "definition, set norm_position='post'")
    if cfg.residual == "ngpt":
        if cfg.norm != "none":
            _refuse("norm", cfg.norm, "is not 'none': residual='ngpt' has no norm layers (every hidden "
                                      "state is normalised to the unit sphere instead)")
        if cfg.attention != "softmax":
            _refuse("attention", cfg.attention, "is not 'softmax': residual='ngpt' is defined for softmax "
                                                "attention with normalised q, k (SPA's B_l, D_l and "
                                                "Value-SkipInit assume un-normalised kernels)")
        if cfg.zero_query:
            _refuse("zero_query", cfg.zero_query, "with residual='ngpt': q is normalised, W^Q = 0 has no "
                                                  "direction")
        if split_activation(cfg.activation)[1] is not None:
            _refuse("activation", cfg.activation, "with residual='ngpt': the MLP gate takes a plain "
                                                  "activation (the paper's is 'swish'); DKS/TAT shaping "
                                                  "is for un-normalised MLP chains")
        if cfg.bias:
            _refuse("bias", cfg.bias, "with residual='ngpt': its weight matrices are normalised and "
                                      "have no bias vectors")
        if cfg.pos in ADDITIVE_POSITIONS:
            _refuse("pos", cfg.pos, f"with residual='ngpt': added positions ({list(ADDITIVE_POSITIONS)}) "
                                    "take the embedding off the unit sphere; use pos='none'")
        if cfg.final_norm == "yes":
            _refuse("final_norm", cfg.final_norm, "with residual='ngpt': there are no norm layers")
        if cfg.tie_embeddings:
            _refuse("tie_embeddings", cfg.tie_embeddings, "with residual='ngpt': nGPT's head is its own (W_z with "
                                                          "per-token scales s_z, as its reference code keeps it); "
                                                          "tying it to the embedding is not implemented")
        if cfg.dropout:
            _refuse("dropout", cfg.dropout, "with residual='ngpt': nGPT normalises every branch to the unit "
                                            "sphere, which undoes inverted dropout's 1 / (1 - p); use dropout=0")
    if cfg.residual_attention and cfg.attention_impl == "blockwise":
        _refuse("attention_impl", cfg.attention_impl, "with residual_attention=True: the carried "
                                                      "scores are (B, H, T, T), use 'dense' or 'auto'")
