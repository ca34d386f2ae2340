"""The width study (nanospa/experiments/scaling.py) and muP's width rule for AdamW
(beyond/optimizers.py mup_lr_scales): the rule is exactly plain AdamW at the base width and
halves the Linear weights' rate at twice the width; the analysis's interpolated best rate,
divergence edge and fitted exponent on known inputs."""
import math

import numpy as np
import pytest

from nanospa import GPT, GPTConfig
from nanospa.beyond.optimizers import OPTIMIZER_DEFAULTS, check_optimizer, make_optimizer, mup_lr_scales
from nanospa.experiments import scaling

IDX = np.arange(16).reshape(2, 8) % 11


def trained(width, mup_base, steps=3):
    model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=width, dtype="float64"), seed=0)
    s = dict(OPTIMIZER_DEFAULTS, learning_rate=1e-2, beta1=0.9, beta2=0.95, weight_decay=0.1,
             mup_base_width=mup_base)
    opt = make_optimizer(s, model)
    for _ in range(steps):
        model(IDX, np.roll(IDX, -1, axis=1))[1].backward()
        opt.step()
        opt.zero_grad()
    return model


def test_the_mup_rule_is_plain_adamw_at_the_base_width():
    plain, rule = trained(16, 0), trained(16, 16)
    for (name, p), (_, q) in zip(plain.named_parameters(), rule.named_parameters()):
        np.testing.assert_array_equal(p.data, q.data, err_msg=name)


def test_the_mup_rule_scales_the_linear_weights_alone():
    model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=32), seed=0)
    scales = dict(zip((n for n, _ in model.named_parameters()), mup_lr_scales(model, 16)))
    assert scales["wte.weight"] == 1.0 and scales["head.weight"] == 0.5
    assert all(v == 0.5 for k, v in scales.items() if k.endswith((".q.weight", ".proj.weight", ".fc.weight")))
    assert mup_lr_scales(model, 0) is None
    plain = trained(32, 0)
    rule = trained(32, 16)
    moved = {n: np.abs(p.data - q.data).max() for (n, p), (_, q) in zip(plain.named_parameters(), rule.named_parameters())}
    assert moved["blocks.0.mlp.fc.weight"] > 0


@pytest.mark.parametrize("bad, words", [(dict(mup_base_width=-1), "mup_base_width must be"),
                                        (dict(mup_base_width=64, optimizer="kfac"), "scales AdamW's rates")])
def test_bad_mup_settings_are_refused(bad, words):
    with pytest.raises(ValueError, match=words):
        check_optimizer(dict(OPTIMIZER_DEFAULTS, **bad))


def test_best_rate_is_the_parabola_vertex_in_log_rate():
    lrs = [1e-4, 1e-3, 1e-2]
    # loss = (log10 lr + 3.2)^2: the vertex at 10^-3.2, between the grid's best and its neighbour
    losses = {lr: (math.log10(lr) + 3.2) ** 2 for lr in lrs}
    logb, how = scaling.best_log_rate(lrs, losses)
    assert how == "interpolated" and logb == pytest.approx(-3.2, abs=1e-9)
    assert scaling.best_log_rate(lrs, {**losses, 1e-4: math.inf, 1e-3: 0.5})[1] == "a neighbour diverged"
    assert scaling.best_log_rate(lrs, {1e-4: 1.0, 1e-3: 2.0, 1e-2: 3.0}) == (-4.0, "at the grid's edge")
    assert scaling.best_log_rate(lrs, {lr: math.inf for lr in lrs})[0] is None


def test_edge_is_the_largest_rate_every_seed_trains_at():
    unigram = 3.3
    run = lambda lr, seed, loss, div=False: dict(lr=lr, seed=seed, final_train=loss, diverged=div)  # noqa: E731
    runs = [run(1e-3, 0, 2.0), run(1e-3, 1, 2.1), run(3e-3, 0, 2.2), run(3e-3, 1, 3.25),   # 3e-3: one seed stalls
            run(1e-2, 0, math.nan, True), run(1e-2, 1, math.nan, True)]
    assert scaling.edge(runs, [1e-3, 3e-3, 1e-2], unigram) == (1e-3, True)
    assert scaling.edge(runs[:2], [1e-3], unigram) == (1e-3, False)             # the grid's top trains


def test_fit_exponent_recovers_a_power_law():
    pts = [(w, math.log10(3e-4 * (w / 64) ** -1.0) + noise) for w, noise in
           [(64, 0.01), (64, -0.01), (128, 0.02), (128, -0.02), (256, 0.0), (256, 0.01)]]
    b, se, a = scaling.fit_exponent(pts)
    assert b == pytest.approx(-1.0, abs=0.05) and 0 < se < 0.1
