"""Every registered variant, the paper's and the extensions', measured against its own prediction:
a wide float64 model at initialisation runs its forward (model.trace), the predictions walk the
same variant classes' at_init maps (nanospa/predict.py), and the two must agree on every block's
kernels and, where the attention has a fixed matrix at init, on that matrix. Nothing compares two
declarations: what the model computes is held to what the predictions say it computes.

Then the same check with a variant a researcher adds (shaped attention, A = alpha I + beta P -
gamma C: docs/adding_a_variant.md's recipe), whole and with each of the five omissions that once
ran silently as another variant: the forward left out, the prediction registered without the
forward, and the three fall-throughs (no map at init, no effective matrix, the forward falling
back to softmax). Each is refused or fails the check.
"""
import warnings

import numpy as np
import pytest

from nanospa import GPT, GPTConfig, beyond, signal
from nanospa.measure import measured_kernels
from nanospa.model import ATTENTIONS, Attention, variant
from nanospa.predict import attention_at_init, predict_kernels

WIDTH = 512
TOL = 4.0 / np.sqrt(WIDTH)        # tests/test_predict.py's bound on a finite-width kernel entry (0.18)
Q_TOL = 0.3                       # q_meas / q_pred - 1 at depth 3, width 512 (test_predict.py's q_tol: 0.23)
# What each value needs beside it: the paper's defaults elsewhere, softmax with zero queries (an
# exact map at init: random queries have a mean field only), and the companions extensions ask for.
COMPANIONS = {("attention", "softmax"): dict(zero_query=True),
              ("residual", "deepnorm"): dict(norm="layernorm"),
              ("residual", "ngpt"): dict(attention="softmax", activation="swish"),
              ("pos", "alibi"): dict(attention="softmax", zero_query=True),
              ("pos", "rope"): dict(attention="softmax", zero_query=True),
              ("pos", "spa_prior"): dict(attention="softmax", zero_query=True),
              ("norm", "groupnorm"): dict(norm_groups=2)}


def registered():
    return [(field, value) for field in ("attention", "residual", "norm", "pos") for value in beyond.values(field)]


def wide(field, value, **kw):
    base = dict(vocab_size=64, block_size=8, n_layer=3, n_head=4, n_embd=WIDTH, dtype="float64", mlp_ratio=1,
                activation="gelu")
    base.update({field: value}, **COMPANIONS.get((field, value), {}))
    if field == "norm" and value != "none":
        base["residual"] = "standard"
    base.update(kw)
    return GPTConfig(**base)


def check(cfg, model=None, samples=32):
    """The largest differences between the model at init and its prediction: normalised kernels
    of every block's attention branch and output, their q-values (a softmax branch with random
    queries is a mean field over heads: there only the block output's), and each attention's
    matrix at init (trace, head by head) where the kind has a fixed one. -> (c, q, attention)."""
    model = model or GPT(cfg, seed=0)
    model.eval()                                                 # BatchNorm: running statistics, as predicted
    idx = np.stack([np.random.default_rng(b).permutation(cfg.vocab_size)[:cfg.block_size] for b in range(4)])
    meas = measured_kernels(model, idx)
    pred = predict_kernels(cfg, plan=model.plan, softmax_samples=samples)
    C = signal.normalised_kernel
    c_err = q_err = a_err = 0.0
    for l in range(1, cfg.n_layer + 1):
        A = attention_at_init(cfg, model.plan, l, cfg.block_size)[0]
        for P, M in ((pred.kernel(l, "attn_branch"), meas["attn_branch"][l - 1]), (pred.kernel(l), meas["hidden"][l])):
            c_err = max(c_err, np.abs(C(P) - C(M)).max())
            if A is not None or M is meas["hidden"][l]:        # a mean-field branch's q: not one matrix's
                q_err = max(q_err, np.abs(np.diag(M) / np.diag(P) - 1.0).max())
        if A is not None:
            traced = model.trace(idx[:1]).attention[l - 1][0]    # (H, T, T)
            a_err = max(a_err, np.abs(traced - np.broadcast_to(A, traced.shape)).max())
    return c_err, q_err, a_err


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:norm=")
@pytest.mark.parametrize("field, value", registered(), ids=lambda x: str(x))
def test_every_registered_variant_is_what_it_predicts(field, value):
    """For every value of every registry: measured at width 512 against predicted, within the
    finite-width bounds of tests/test_predict.py; the fixed attention matrices to rounding."""
    cfg = wide(field, value)
    c_err, q_err, a_err = check(cfg, samples=256 if cfg.residual == "ngpt" else 32)
    bound = TOL * (1.5 if cfg.residual == "ngpt" else 1.0)      # nGPT: a mean field of random queries
    assert c_err < bound and q_err < Q_TOL and a_err < 1e-12, (c_err, q_err, a_err)


# ----------------------------------------------------------------------------- a new variant

class Shaped(Attention):
    """Shaped attention (Noci et al. 2023): A = alpha I + beta P - gamma C with C the uniform
    causal matrix; alpha = 1, beta = gamma = 0.5 at init, W^Q = 0, so A = I at init."""

    def __init__(self, cfg, plan, layer, rng, evaluate=None):
        super().__init__(cfg, plan, layer, rng, **({} if evaluate is None else dict(evaluate=evaluate)))
        T = cfg.block_size
        self.register_buffer("C", signal.uniform_causal_attention(T))
        self.alpha, self.beta = 1.0, 0.5

    def output(self, y, v, start=0):
        from nanospa.tensor import Tensor
        T = v.shape[-2]
        Cv = Tensor(self.C[:T, :T]) @ v
        return v * self.alpha + y * self.beta - Cv * self.beta

    def effective(self, P):
        T = P.shape[-1]
        return self.alpha * np.eye(T) + self.beta * P - self.beta * self.C[:T, :T]

    @staticmethod
    def at_init(cfg, plan, layer, T, bias=None):
        return np.eye(T)                                    # P = C at init (W^Q = 0): alpha I


def _register(monkeypatch, cls):
    monkeypatch.setitem(ATTENTIONS, "shaped", cls)


def _shaped_config():
    return wide("attention", "shaped", activation="tat_lrelu", eta=0.5, kernel_budget="independent")


def test_a_new_variant_added_whole_is_what_it_predicts(monkeypatch):
    _register(monkeypatch, Shaped)
    c_err, q_err, a_err = check(_shaped_config())
    assert c_err < TOL and q_err < Q_TOL and a_err < 1e-12


def _without(name):
    """Shaped with one of its methods removed: it inherits softmax's."""
    return type("HalfShaped", (Shaped,), {name: getattr(Attention, name)})


@pytest.mark.parametrize("omission", ["forward", "prediction_without_forward", "no_map_at_init",
                                      "no_effective_matrix", "forward_falls_back"])
def test_each_omission_of_a_half_added_variant_fails(monkeypatch, omission):
    """The five ways a variant once ran as another with every test green. Each now fails: the
    registry refuses a class that says half of what it is, and the check above catches the
    forward and the map disagreeing however the class was written."""
    half = {"forward": _without("output"),                              # the model's branch forgotten
            "prediction_without_forward": _without("output"),           # at_init registered, no forward
            "no_map_at_init": _without("at_init"),                      # predict falls back to softmax's
            "no_effective_matrix": _without("effective"),               # the trace reports P
            # written whole, but the forward falls back to softmax's: only the measurement sees it
            "forward_falls_back": type("FallsBack", (Shaped,), {"output": lambda self, y, v, start=0: y})}[omission]
    _register(monkeypatch, half)
    if omission != "forward_falls_back":
        with pytest.raises(ValueError, match="half"):
            variant("attention", "shaped")
    monkeypatch.setattr("nanospa.model.check_kind", lambda cls: cls)   # and without the registry's refusal:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        c_err, q_err, a_err = check(_shaped_config())
    assert c_err > TOL or a_err > 1e-6, (c_err, q_err, a_err)


def test_the_paper_registries_hold_whole_variants():
    for field, registry in (("attention", ATTENTIONS),):
        for name, cls in registry.items():
            assert variant(field, name) is cls
