"""nanospa/experiments/causality.py: the future leakage dL_t / de_t' (t' > t) is exactly zero for every
per-token norm in both modes and for causal BatchNorm / PRepBN, clearly not zero for the
non-causal ones in training mode, and zero for them in evaluation mode (running statistics);
the measurement leaves the model as it found it."""
import numpy as np
import pytest

from nanospa import GPT, GPTConfig
from nanospa.experiments.causality import future_leakage, leakage_table, main

pytestmark = pytest.mark.filterwarnings("ignore:norm=.* with norm_causal=False")

RNG = np.random.default_rng(0)
TOKENS = RNG.integers(0, 32, size=(3, 9))
X, Y = TOKENS[:, :-1], TOKENS[:, 1:]


def model(norm, causal=False, **kw):
    cfg = GPTConfig(vocab_size=32, block_size=8, n_layer=2, n_head=2, n_embd=16, dtype="float64",
                    activation="gelu", residual="standard", pos="learned", norm=norm, norm_causal=causal,
                    prepbn_steps=2, **kw)
    m = GPT(cfg, seed=0)
    m(X, Y)                                   # one training-mode forward, then a step:
    m.after_step()                            # running statistics moved, PRepBN at lambda = 0.5
    return m


@pytest.mark.parametrize("norm", ["none", "layernorm", "rmsnorm", "dyt", "groupnorm"])
@pytest.mark.parametrize("position", ["pre", "post"])
def test_per_token_norms_have_no_future_leakage(norm, position):
    m = model(norm, norm_position=position)
    for training in (True, False):
        r = future_leakage(m, X, Y, training=training)
        assert r["future"] == 0.0 and r["past"] > 0.0


@pytest.mark.parametrize("norm", ["batchnorm", "prepbn"])
@pytest.mark.parametrize("position", ["pre", "post"])
def test_pooled_statistics_leak_in_training_and_not_in_evaluation(norm, position):
    """Through the batch mean and variance every position's loss depends on every other
    position, with a weight of order 1 / (B T) = 1/24 of the direct path here: far above the
    rounding of float64, so 'clearly nonzero' is asserted as > 1e-3 of the past gradient."""
    m = model(norm, norm_position=position)
    train = future_leakage(m, X, Y, training=True)
    assert train["future"] > 1e-3 * train["past"]
    assert future_leakage(m, X, Y, training=False)["future"] == 0.0


@pytest.mark.parametrize("norm", ["batchnorm", "prepbn"])
@pytest.mark.parametrize("position", ["pre", "post"])
def test_causal_statistics_do_not_leak(norm, position):
    m = model(norm, causal=True, norm_position=position)
    for training in (True, False):
        r = future_leakage(m, X, Y, training=training)
        assert r["future"] == 0.0 and r["past"] > 0.0


def test_prepbn_at_lambda_one_does_not_leak_yet():
    """At init lambda = 1: the BatchNorm term is multiplied by exactly 0, so its gradient is
    exactly 0 too; the leakage starts with the first step of the schedule."""
    m = GPT(GPTConfig(vocab_size=32, block_size=8, n_layer=2, n_head=2, n_embd=16, dtype="float64",
                      residual="standard", norm="prepbn", prepbn_steps=2), seed=0)
    assert future_leakage(m, X, Y)["future"] == 0.0
    m.after_step()
    assert future_leakage(m, X, Y)["future"] > 0.0


def test_the_measurement_leaves_the_model_as_it_was():
    m = model("batchnorm")
    m(X, Y)
    bn = m.blocks[0].norm1
    pending, state = list(bn.pending), m.state_dict()
    m.eval()
    future_leakage(m, X, Y, training=True)
    assert not m.training and bn.pending == pending and "embed" not in vars(m)
    assert all(p.grad is None for p in m.parameters())
    for k, v in m.state_dict().items():
        np.testing.assert_array_equal(v, state[k])


def test_table_and_command(capsys):
    rows = leakage_table(n_layer=1, n_embd=16, T=6, batch=2)
    leaks = {(n, c, mode): f for n, c, mode, f, _, _ in rows}
    assert leaks[("batchnorm", False, "train")] > 0 and leaks[("prepbn", False, "train")] > 0
    assert all(f == 0.0 for key, f in leaks.items() if key[1] or key[2] == "eval" or key[0] not in ("batchnorm", "prepbn"))
    main(["--n_layer=1", "--n_embd=16", "--T=6", "--batch=2"])
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["norm", "causal", "mode", "future", "past", "ratio"]
    assert len(out.splitlines()) == 1 + len(rows)
