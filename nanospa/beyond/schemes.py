"""The residual schemes beyond the paper's, as far as they touch the paper's own modules
(docs/residuals.md): which combinations GPTConfig accepts, DeepNorm's initial gain and
RealFormer's carried attention scores.

    check_config(cfg)           the combination rules (ValueError naming the field)
    residual_weights(cfg)       (a, b) of a block's x -> a x + b f(x)
    deepnorm_init(block, N)     W^V, W^O, W_1, W_2 of one block times beta = (8N)^(-1/4)
    carry_scores(carry, S)      RealFormer: S_l = Q_l K_l^T / sqrt(d_k) + S_{l-1}

    residual="deepnorm"         x_{l+1} = N(alpha x_l + G_l(x_l)), alpha = (2N)^(1/4)  (Post-LN)
    residual_attention=True     softmax(S_l + B_l + mask): the content scores carried, B_l fresh
    residual="ngpt"             nanospa/beyond/ngpt.py (its own block, embedding and head)

Not here: nGPT's modules (ngpt.py), the constants (signal/residuals.py), the wide-limit
maps (signal/maps.py), the block itself (model.py).
"""
import math

from ..signal import split_activation
from ..signal.beyond.residuals import deepnorm_alpha, deepnorm_beta

DEEPNORM_NORMS = ("layernorm", "rmsnorm")
ADDITIVE_POSITIONS = ("learned", "sinusoidal")   # nGPT: a sum of two unit vectors leaves the sphere


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
    if cfg.residual_attention and cfg.attention_impl == "blockwise":
        _refuse("attention_impl", cfg.attention_impl, "with residual_attention=True: the carried "
                                                      "scores are (B, H, T, T), use 'dense' or 'auto'")


def residual_weights(cfg):
    """(a, b) of x -> a x + b f(x): normalised (sqrt(1 - beta_r^2), beta_r), deepnorm
    (alpha, 1), otherwise (1, 1) (a standard residual; unused without one)."""
    if cfg.residual == "normalised":
        return math.sqrt(1.0 - cfg.residual_beta ** 2), float(cfg.residual_beta)
    if cfg.residual == "deepnorm":
        return deepnorm_alpha(cfg.n_layer), 1.0
    return 1.0, 1.0


def deepnorm_init(block, n_layer):
    """Scale the value, output-projection and MLP weights of `block` by beta = (8N)^(-1/4)
    (DeepNet's decoder-only constant; W^Q, W^K keep theirs): after the block drew them,
    so every random draw is the Post-LN model's."""
    beta = deepnorm_beta(n_layer)
    for layer in (block.attn.v, block.attn.proj, block.mlp.fc, block.mlp.proj):
        layer.weight.data = layer.weight.data * beta


def carry_scores(carry, scores):
    """RealFormer: S_l = scores + S_{l-1} (scores = Q_l K_l^T / sqrt(d_k), (B, H, T, T)),
    kept in `carry` (a dict that one forward pass hands from block to block) for layer l+1.
    The carried Tensor stays in the graph, so gradients flow through it to earlier layers."""
    previous = carry.get("scores")
    if previous is not None:
        scores = scores + previous
    carry["scores"] = scores
    return scores
