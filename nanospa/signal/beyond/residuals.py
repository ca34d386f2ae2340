"""The constants of the residual schemes beyond the paper's (docs/residuals.md), defined once
for the model (nanospa/beyond/schemes.py, nanospa/beyond/ngpt.py) and for the wide-limit maps (maps.py).

    deepnorm_alpha(N), deepnorm_beta(N)   DeepNet's decoder-only constants (Wang et al. 2022)
    NGPT_*                                nGPT's published initial values and scales
                                          (Loshchilov et al. 2024, "nGPT: normalized transformer")
    ngpt_scale(name, d)                   the scale s_scale of one nGPT vector at width d
    ngpt_value(name)                      its initial (used) value s_init

Not here: the modules that use them (nanospa/beyond/ngpt.py, nanospa/beyond/schemes.py) and the kernel
maps (walks.py: WalkMaps for DeepNorm; ngpt_maps.py for nGPT). Plain Python floats.

Notation: N = n_layer (decoder-only DeepNet: N decoder layers, no encoder), d = n_embd.
"""
import math

# nGPT's learnable vectors are stored at s_scale and used as stored * (s_init / s_scale)
# (the paper's "init/scale" trick: Adam's step is then s_init / s_scale times larger in the
# used value). (s_init, s_scale) per vector; "1/sqrt(d)" is evaluated by ngpt_scale.
NGPT_INITS = {
    "alpha": (0.05, "1/sqrt(d)"),   # eigen learning rates alpha_A, alpha_M (per dimension, d)
    "s_qk": (1.0, "1/sqrt(d)"),     # q, k scaling (per head dimension, d in all)
    "s_u": (1.0, 1.0),              # MLP hidden u scaling (mlp_ratio * d)
    "s_v": (1.0, 1.0),              # MLP hidden nu scaling (mlp_ratio * d); nu also times sqrt(d)
    "s_z": (1.0, "1/sqrt(d)"),      # logit scaling (vocab_size)
}
NGPT_ALPHA_INIT = NGPT_INITS["alpha"][0]   # 0.05: alpha_A = alpha_M at init


def deepnorm_alpha(N):
    """DeepNorm's residual weight alpha = (2N)^(1/4): x_{l+1} = LN(alpha x_l + G(x_l))."""
    return (2.0 * N) ** 0.25


def deepnorm_beta(N):
    """DeepNorm's initial gain beta = (8N)^(-1/4) of W^V, W^O and the MLP weights."""
    return (8.0 * N) ** -0.25


def ngpt_scale(name, d):
    """s_scale of nGPT's vector `name` (a key of NGPT_INITS) at width d."""
    scale = NGPT_INITS[name][1]
    return 1.0 / math.sqrt(d) if scale == "1/sqrt(d)" else float(scale)


def ngpt_value(name):
    """s_init, the value nGPT's vector `name` is used with at initialisation."""
    return float(NGPT_INITS[name][0])


def residual_weights(cfg):
    """plan.residual_weights for DeepNorm: (alpha, 1, beta^2), x_{l+1} = N(alpha x_l + f_beta(x_l))
    with f's weights W^V, W^O, W_1, W_2 scaled by beta (ValueError naming any other residual:
    nGPT's update has its own maps, beyond/ngpt_maps.py)."""
    if cfg.residual == "deepnorm":
        return deepnorm_alpha(cfg.n_layer), 1.0, deepnorm_beta(cfg.n_layer) ** 2
    raise ValueError(f"no block map for residual {cfg.residual!r} here")
