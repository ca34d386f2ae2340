"""Tied embeddings (GPTConfig.tie_embeddings=True, nanoGPT's weight tying; beyond the paper;
docs/method.md §2.6): the head is the token embedding's matrix, logits = (x / sqrt(C)) W_e^T,
one Parameter that both ends update. model.GPT looks TiedHead up by name when cfg ties.
"""
import math


class TiedHead:
    """The head x -> (x / sqrt(C)) W_e^T of the embedding `wte`: not a Module, so the model's
    parameters hold W_e once (at the embedding). The 1/sqrt(C) keeps the untied head's
    N(0, 1/C) scale at init: the logits' variance is q_L sigma_tok^2, not C times it."""

    def __init__(self, wte, n_embd):
        self.wte, self.scale = wte, 1.0 / math.sqrt(n_embd)

    def __call__(self, x):
        return (x * self.scale) @ self.wte.weight.T


def check_config(cfg):
    """GPTConfig.tie_embeddings: True or False (its combinations: schemes.check_config)."""
    if not isinstance(cfg.tie_embeddings, bool):
        raise ValueError(f"GPTConfig.tie_embeddings must be True or False, got {cfg.tie_embeddings!r}")
