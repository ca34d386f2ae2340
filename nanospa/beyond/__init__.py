"""nanospa.beyond: schemes and optimisers beyond the paper. Nothing here is needed to read or
run the paper's model: model.py's registries hold the paper's variants, and a configuration
value they do not hold is looked up here (model.variant), the first time this package loads.

Each extension plugs into one seam, as one class that states its forward and what it is at
initialisation (docs/adding_a_variant.md), and one row of EXTENSIONS:

    seam (model.py)          extensions
    position scheme          alibi, rope, spa_prior: positions.py (hooks on the logits)
    norm                     dyt, batchnorm, prepbn, groupnorm: norms.py
    residual                 deepnorm: schemes.py; ngpt: ngpt.py (its own block, embedding, head)
    evaluation (of softmax)  by blocks at long T: blockwise.py; RealFormer's carried scores: schemes.py
    dropout                  nanoGPT's dropout (its sites, their masks' generator and op): dropout.py
    the head                 tied embeddings (the head is W_e^T / sqrt(C)): tied.py
    optimiser                K-FAC: kfac.py; Muon: muon.py; muP's rates: optimizers.py

    variant(field, name)     an extension's class, imported on demand
    values(field)            every value of a field: the paper's, then the extensions'
    evaluation(cfg)          the attention evaluation cfg asks for
    resolve_auto(cfg), configure(cfg)   GPTConfig's calls when a field names an extension: its
                             "auto" values, then the checks of the extensions' values and fields
"""
import importlib

EXTENSIONS = {  # field -> value -> "module:Class"
    "attention": {},
    "pos": {"alibi": "positions:ALiBi", "rope": "positions:RoPE", "spa_prior": "positions:SPAPrior"},
    "norm": {"dyt": "norms:DyTNorm", "batchnorm": "norms:BatchNorms", "prepbn": "norms:BatchNorms",
             "groupnorm": "norms:GroupNorms"},
    "residual": {"deepnorm": "schemes:DeepNorm", "ngpt": "ngpt:NGPT"},
}


def _load(path):
    module, name = path.split(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def variant(field, name, known=()):
    """The class of the extension GPTConfig.<field> = name; ValueError naming the value and
    every allowed one (`known`: the paper's, model.py's) when there is none."""
    path = EXTENSIONS[field].get(name)
    if path is None:
        raise ValueError(f"GPTConfig.{field}={name!r} is not one of {list(known) + list(EXTENSIONS[field])}")
    return _load(path)


def values(field):
    """Every value GPTConfig.<field> (attention, residual, norm or pos) takes: the paper's (model.py's
    registries), then the extensions' (EXTENSIONS)."""
    from ..model import REGISTRIES
    return tuple(REGISTRIES[field]) + tuple(EXTENSIONS[field])


def evaluation(cfg):
    """Attention by blocks (blockwise.py) or with RealFormer's carried scores (schemes.py)."""
    if cfg.residual_attention:
        return _load("schemes:carried_scores_attention")
    return _load("blockwise:evaluation")(cfg)


def resolve_auto(cfg):
    """The "auto" values an extension decides (nGPT's attention, DeepNorm's norm position)."""
    from . import schemes
    schemes.resolve_auto(cfg)


def configure(cfg):
    """The checks of cfg's extension values and fields (ValueError naming the field)."""
    from ..model import REGISTRIES
    from . import blockwise, dropout, norms, positions, schemes, tied
    for field, known in REGISTRIES.items():
        value = getattr(cfg, field)
        if value not in known and value != "auto":
            variant(field, value, tuple(known))
    tied.check_config(cfg)
    norms.check_config(cfg)
    schemes.check_config(cfg)
    blockwise.check_config(cfg)
    dropout.check_config(cfg)
    positions.check_config(cfg)
