"""Tied embeddings (GPTConfig.tie_embeddings, nanoGPT's weight tying): the head is the token
embedding's matrix, logits = (x / sqrt(C)) W_e^T, one Parameter that both uses update; the
scale keeps the untied head's N(0, token variance / C) entries at init (docs/method.md §2.6)."""
import math

import numpy as np
import pytest

from conftest import perturbed_model, tiny_config
from nanospa import GPT, GPTConfig
from nanospa.beyond.optimizers import mup_lr_scales
from nanospa.gradcheck import check_directions

IDX = np.random.default_rng(0).integers(0, 13, (3, 8))
TARGETS = np.roll(IDX, -1, axis=1)


def test_a_tied_model_has_one_matrix_for_both_ends():
    untied, tied = GPT(tiny_config(), seed=0), GPT(tiny_config(tie_embeddings=True), seed=0)
    assert not [name for name, _ in tied.named_parameters() if name.startswith("head")]
    assert untied.num_params() - tied.num_params() == 13 * 8          # the head's V x C
    assert sum(p is tied.wte.weight for p in tied.parameters()) == 1


def test_the_tied_logits_are_the_untied_model_with_its_head_set_to_the_scaled_embedding():
    """Same seed: the blocks are drawn before the head, so the two models differ in the head
    alone; the untied head set to W_e^T / sqrt(C) gives the tied logits."""
    tied = perturbed_model(tiny_config(tie_embeddings=True))
    untied = perturbed_model(tiny_config())
    for (a, b) in zip(tied.parameters(), [p for p in untied.parameters() if p is not untied.head.weight]):
        a.data = b.data.copy()                                          # the same body in both
    W = tied.wte.weight.data                                            # (V, C); the head's weight is (C, V)
    assert untied.head.weight.shape == W.T.shape
    untied.head.weight.data = W.T / math.sqrt(8)
    np.testing.assert_allclose(tied(IDX)[0].data, untied(IDX)[0].data, rtol=1e-12, atol=1e-12)


def test_the_embeddings_gradient_is_the_sum_of_both_uses_and_passes_its_check():
    model = perturbed_model(tiny_config(tie_embeddings=True))
    assert check_directions(lambda: model(IDX, TARGETS)[1], model.parameters(), n_directions=3) < 1e-6
    _, loss = model(IDX, TARGETS)
    loss.backward()
    both = model.wte.weight.grad
    unused = np.setdiff1d(np.arange(13), IDX)                           # tokens never in the input
    assert unused.size and np.abs(both[unused]).max() > 0              # reached through the head only


def test_logits_at_init_have_the_untied_heads_scale():
    """At width 256 the logits' variance over entries is about the final features' q times
    the token variance, as with the untied head N(0, 1/C): within 10%, not C times it."""
    kw = dict(vocab_size=64, block_size=16, n_layer=2, n_head=4, n_embd=256, dtype="float64")
    idx = np.random.default_rng(1).integers(0, 64, (4, 16))
    for tie in (False, True):
        model = GPT(GPTConfig(tie_embeddings=tie, **kw), seed=0)
        model.eval()
        var = model(idx)[0].data.var()
        assert 0.2 < var < 5.0, (tie, var)


def test_refused_where_it_would_mean_something_else():
    with pytest.raises(ValueError, match="tie_embeddings must be True or False"):
        GPTConfig(tie_embeddings="yes")
    with pytest.raises(ValueError, match="tie_embeddings.*residual='ngpt'"):
        GPTConfig(tie_embeddings=True, residual="ngpt", activation="swish", pos="none")
    with pytest.raises(ValueError, match="mup_base_width=32 with tie_embeddings=True"):
        mup_lr_scales(GPT(tiny_config(tie_embeddings=True)), 32)
