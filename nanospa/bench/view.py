"""A nanospa GPT as the PyTorch yardstick reads it (yardstick.export_nanospa): its parameters,
and a state dict in which every SPA block has its dense tril(B_l), also a blockwise block
that keeps only B_l's O(T) parts. Apart from yardstick.py because it needs no torch."""
from collections.abc import Mapping

import numpy as np

from ..backend import to_numpy
from ..model import dense_bias
from ..tensor import Tensor


def _fixed_logits(attn, T):
    """An attention's fixed logits at T positions (its kind's and its hooks' that add logits:
    E-SPA's prior, ALiBi), made as the model makes them; None without any."""
    bias = attn.logit_bias()
    for hook in attn.hooks:
        if hasattr(hook, "bias"):
            bias = hook.bias(bias)
    made = dense_bias(bias, T, attn.dtype)
    return made.data if isinstance(made, Tensor) else made


class _DenseBiasState(Mapping):
    """model.state_dict() plus, for every block that keeps B_l only as its O(T) parts (attention
    by blocks), its dense tril(B_l) under the dense model's key blocks.i.attn.B, in the model's
    dtype (made where the model is, by its own generated_bias, and brought to the host).
    Generated when asked for, one layer at a time, so PyTorch's peak memory counts its own
    (T, T) biases but no second copy of them."""

    def __init__(self, model):
        self.state = model.state_dict()
        T, dt = model.config.block_size, model.config.dtype
        self.made = {f"blocks.{i}.attn.B": (lambda a=b.attn: np.tril(to_numpy(_fixed_logits(a, T))))
                     for i, b in enumerate(model.blocks) if f"blocks.{i}.attn.B" not in self.state
                     and _fixed_logits(b.attn, 1) is not None}

    def __getitem__(self, key):
        return self.made[key]() if key in self.made else self.state[key]

    def __iter__(self):
        return iter([*self.state, *self.made])

    def __len__(self):
        return len(self.state) + len(self.made)


class DenseView:
    """A nanospa GPT as export_nanospa reads it: config, activation, parameters, and a state
    dict with the dense B_l of every SPA block (_DenseBiasState)."""

    def __init__(self, model):
        self.model, self.config, self.activation = model, model.config, model.activation

    def named_parameters(self):
        return self.model.named_parameters()

    def state_dict(self):
        return _DenseBiasState(self.model)
