"""nanospa/gradcheck.py: the checks, applied to a whole model through every fast path.
"""
import numpy as np

from nanospa import GPT, GPTConfig
from nanospa.gradcheck import check_directions


def tiny(**kw):
    base = dict(vocab_size=13, block_size=8, n_layer=2, n_head=2, n_embd=8, dtype="float64")
    base.update(kw)
    return GPTConfig(**base)


def _perturbed(cfg):
    model = GPT(cfg, seed=0)
    rng = np.random.default_rng(3)
    for p in model.parameters():  # move off init (W^Q = 0 there) so every path matters
        p.data = p.data + 0.3 * rng.standard_normal(p.shape)
    return model


def test_espa_model_gradients_through_all_fast_paths():
    """The reference architecture (E-SPA, TAT leaky ReLU: cached bias + mask, fused leaky
    ReLU, flattened matmuls) in float64, by random directions."""
    model = _perturbed(tiny(attention="espa", activation="tat_lrelu"))
    idx = np.random.default_rng(5).integers(0, 13, (2, 8))
    assert check_directions(lambda: model(idx, np.roll(idx, 1))[1], model.parameters(), n_directions=3) < 1e-6
