"""Every variant the configuration lists is implemented wherever variants are dispatched (the
model, its gradient, the predictions at init, `python -m nanospa.signal`'s table, and the
PyTorch yardstick, which implements it or refuses it by name), and a value added to a list
but to none of those places fails loudly, naming the value: docs/adding_a_variant.md.
"""
import warnings

import numpy as np
import pytest

from nanospa import GPT, config, signal
from nanospa.gradcheck import check_directions
from nanospa.signal import inputs
from nanospa.signal.table import layer_table

try:
    from nanospa.bench import yardstick
except ImportError:                       # no torch: the yardstick's part is skipped
    yardstick = None

IDX = np.array([[1, 4, 4, 0, 9, 2], [3, 3, 7, 10, 1, 5]])
TARGETS = np.roll(IDX, -1, axis=1)
# the canonical lists: config's, and the activation registry (config reads it)
AXES = {"attention": "ATTENTIONS", "residual": "RESIDUALS", "norm": "NORMS", "pos": "POSITIONS",
        "activation": "BASE_ACTIVATIONS"}
# settings a value needs beside it (each a contradiction GPTConfig names otherwise)
COMPANIONS = {"deepnorm": dict(norm="layernorm"),   # its norm_position and nGPT's attention: the only valid ones
              "spa_prior": dict(attention="softmax"), "groupnorm": dict(norm_groups=2),
              "batchnorm": dict(norm_causal=True), "prepbn": dict(norm_causal=True)}


def a_config(axis, value):
    kw = dict(vocab_size=11, block_size=6, n_layer=2, n_head=2, n_embd=8, dtype="float64", activation="gelu")
    kw.update({axis: value}, **COMPANIONS.get(value, {}))
    if axis == "norm" and value != "none":
        kw["residual"] = "standard"
    return config.GPTConfig(**kw)


def listed():
    return [(axis, v) for axis, name in AXES.items() for v in getattr(config, name)]


@pytest.mark.parametrize("axis, value", listed())
def test_every_listed_variant_is_implemented_everywhere(axis, value):
    cfg = a_config(axis, value)
    model = GPT(cfg, seed=0)
    rng = np.random.default_rng(1)
    for p in model.parameters():                          # off init: every path matters
        p.data = p.data + 0.2 * rng.standard_normal(p.shape)
    assert check_directions(lambda: model(IDX, TARGETS)[1], model.parameters(), n_directions=1) < 1e-6
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pred = signal.predict_kernels(cfg, softmax_samples=2)
    assert len(pred.layers) == cfg.n_layer and np.all(np.isfinite(pred.final))
    assert len(layer_table(cfg, predicted=[pred.sigma_0] + [layer["mlp"] for layer in pred.layers])) == cfg.n_layer + 1
    if yardstick is not None:
        try:
            yardstick.check(cfg)
        except ValueError as e:                           # refused by name: no silent other model
            assert repr(getattr(cfg, axis)) in str(e) or axis == "activation"
        else:
            yardstick.TorchGPT(model)


@pytest.mark.parametrize("axis", ["attention", "residual", "norm", "pos"])
def test_a_value_added_to_a_list_alone_fails_loudly(axis, monkeypatch):
    """A researcher's first step, the new name in the configuration's list, and nothing else:
    every place that dispatches on it raises, naming it, instead of treating it as another."""
    name = AXES[axis]
    monkeypatch.setattr(config, name, getattr(config, name) + ("novel",))
    if axis == "pos":
        monkeypatch.setattr(inputs, "POSITIONS", inputs.POSITIONS + ("novel",))
    cfg = a_config(axis, "novel")                          # the configuration accepts it now
    calls = {"model": lambda: GPT(cfg), "predictions": lambda: signal.predict_kernels(cfg, softmax_samples=2),
             "table": lambda: layer_table(cfg)}
    if yardstick is not None:
        calls["yardstick"] = lambda: yardstick.check(cfg)
    for where, call in calls.items():
        with pytest.raises(ValueError, match="novel"):
            call()
