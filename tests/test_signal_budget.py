"""Tests for nanospa/signal/budget.py: the kernel-budget policies through make_plan at
initialisation (docs/kernel_budget.md): the stated targets met, non-negative lower-triangular
A_l, the joint solve, the activation's arguments, the model constructing at every depth, and
the immutable Plan. The walks the policies run (qpreserve's D_l, mlp_aware's pre-image, the
two-sequence walk): tests/test_signal_walks.py."""
import dataclasses
import math

import numpy as np
import pytest

from nanospa import GPT, GPTConfig
from nanospa.signal import cholesky, kernels, dense_layer_bias, spa_schedule, walks
from nanospa.signal.budget import (BUDGETS, DEFAULT_BUDGET, ETA, INDEPENDENT_GAMMA_FINAL, JOINT_FINAL_CORR, ROOT_TOL,
                                   activation_spec, make_plan, max_eta)
from nanospa.signal.plan import Plan, split_activation
from nanospa.predict import attention_at_init, predict_kernels
from nanospa.signal.walks import network_stats, pair_walk


def cfg(**kw):
    base = dict(block_size=24, n_layer=16, n_head=2, n_embd=16, activation="tat_lrelu")  # eta = 0.9 needs L >= 13
    base.update(kw)
    return GPTConfig(**base)


def attention_matrices(c, plan):
    return [attention_at_init(c, plan, l, c.block_size)[0] for l in range(1, c.n_layer + 1)]


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("attention", ["espa", "uspa"])
def test_every_policy_gives_causal_non_negative_attention(budget, attention):
    act = "dks_lrelu" if budget == "mlp_aware" else "tat_lrelu"
    c = cfg(kernel_budget=budget, attention=attention, activation=act)
    plan = make_plan(c)
    assert plan.kind == attention and plan.n_layer == c.n_layer and plan.block_size == c.block_size
    assert len(plan.schedule) == c.n_layer + 1
    for l, A in enumerate(attention_matrices(c, plan), start=1):
        B, D = dense_layer_bias(plan, l)
        assert np.all(np.triu(A, 1) == 0) and A.min() >= 0
        assert np.all(D > 0) and np.all(np.isfinite(D))
        assert np.all(B[np.tril_indices(c.block_size)] <= 1e-12)          # row-normalised log A
        np.testing.assert_allclose(np.exp(B).sum(axis=1), 1.0, atol=1e-12)  # softmax(B) rows
        assert D[0] == pytest.approx(1.0) or budget in ("qpreserve", "joint_qpreserve")


def test_independent_is_the_reimplementations_recipe():
    c = cfg(kernel_budget="independent")
    plan = make_plan(c)
    assert plan.info["gamma_final"] == INDEPENDENT_GAMMA_FINAL and plan.info["eta"] == ETA
    assert plan.overrides is None                            # every A_l in closed form
    gammas = kernels.espa_gammas(c.n_layer, INDEPENDENT_GAMMA_FINAL)
    pred = predict_kernels(cfg(kernel_budget="independent", activation="linear"))
    for l in range(1, c.n_layer + 1):
        assert plan.schedule[l] == pytest.approx(gammas[l])
        np.testing.assert_allclose(pred.kernel(l), cholesky.espa_kernel(c.block_size, gammas[l]), atol=1e-12)
    with pytest.raises(ValueError, match="eta=0.95 is unreachable"):
        make_plan(cfg(kernel_budget="independent", n_layer=2, eta=0.95))


def joint_stats(c, plan):
    """network_stats of the plan's own targets (the solve's T: min(T, 64), extrapolated)."""
    name = "gamma_final" if c.attention == "espa" else "rho_final"
    K, X = pair_walk(c, plan.activation, spa_schedule(c.attention, c.n_layer, plan.info[name]),
                     "qpreserve" if "qpreserve" in c.kernel_budget else "spa")
    return network_stats(K, X, c.block_size)


@pytest.mark.parametrize("attention", ["espa", "uspa"])
@pytest.mark.parametrize("final_corr", [0.0, 0.2, 0.7])
@pytest.mark.parametrize("budget", ["joint", "joint_qpreserve"])
def test_joint_meets_both_targets(attention, final_corr, budget):
    """(i) the whole network's C_f(0) is TAT's eta_net; (ii) the input-dependent part of the
    last kernel has mean adjacent correlation rho*. The solve stops once |residual| < ROOT_TOL
    (1e-5) and says it reached it, and the walk recomputed here from the plan's own targets is
    the solve's deterministic walk: the same numbers, so ROOT_TOL itself is the bound (was
    1e-4)."""
    c = cfg(kernel_budget=budget, attention=attention, final_corr=final_corr)
    plan = make_plan(c)
    assert plan.info["final_corr_reached"] and plan.info["eta_net_reached"]
    c_f0, rho = joint_stats(c, plan)
    assert rho == plan.info["final_corr_achieved"] and c_f0 == plan.info["net_c_f0"]
    assert abs(rho - (final_corr or JOINT_FINAL_CORR)) < ROOT_TOL
    assert abs(c_f0 - ETA) < ROOT_TOL
    assert 0 < plan.info["eta"] < ETA       # attention amplifies the MLPs' C_f(0)


def test_joint_final_gamma_depends_on_T_and_L():
    """Not a constant: the solve runs for the actual T and L."""
    g = {(T, L): make_plan(cfg(block_size=T, n_layer=L)).info["gamma_final"] for T, L in
         [(8, 16), (48, 16), (48, 24)]}
    assert len({round(v, 6) for v in g.values()}) == 3
    assert all(0.1 < v < 5 for v in g.values())


def test_joint_honours_explicit_targets():
    plan = make_plan(cfg(eta=0.3))                       # eta given: only (ii) is solved
    assert plan.info["eta"] == 0.3 and plan.info["final_corr_reached"] and "eta_net_reached" not in plan.info
    assert abs(joint_stats(cfg(eta=0.3), plan)[1] - JOINT_FINAL_CORR) < ROOT_TOL   # as above (was 1e-4)
    plan = make_plan(cfg(gamma_final=0.05))              # gamma given: nothing to solve
    assert plan.info["gamma_final"] == 0.05 and "final_corr_reached" not in plan.info
    assert plan.schedule[-1] == 0.05


def test_linear_mlp_joint_is_the_espa_target_with_gamma_from_rho():
    """Without MLP nonlinearity nothing is common to all inputs (X_L = 0) and K_L is the E-SPA
    target, whose adjacent correlation is exp(-gamma_L) at every position: the solve's
    |exp(-gamma_L) - rho*| < ROOT_TOL gives |gamma_L + log rho*| < ROOT_TOL / rho* = 2.5e-5
    to first order (was rel=1e-4, i.e. 9e-5)."""
    plan = make_plan(cfg(activation="linear"))
    assert abs(plan.info["gamma_final"] + np.log(JOINT_FINAL_CORR)) < 1.01 * ROOT_TOL / JOINT_FINAL_CORR


@pytest.mark.parametrize("n_layer", [1, 2, 3])
def test_default_budget_constructs_at_small_depth(n_layer):
    """A short stack cannot reach large eta (max_eta); the joint eta is clamped below it."""
    model = GPT(GPTConfig(n_layer=n_layer, block_size=8, n_embd=16, n_head=2, activation="tat_lrelu"))
    eta = model.plan.info["eta"]
    assert model.plan.policy == DEFAULT_BUDGET == "joint"
    assert 0 < eta < max_eta(model.config) or math.isclose(eta, max_eta(model.config), rel_tol=1e-6)


def test_independent_q_grows_and_qpreserve_removes_it():
    c = cfg(kernel_budget="independent", block_size=64, n_layer=24)
    assert predict_kernels(c).q(24).max() > 3.0                 # method §10: q grows along positions
    assert predict_kernels(cfg(kernel_budget="qpreserve", block_size=64, n_layer=24)).q(24).max() \
        == pytest.approx(1.0, abs=1e-10)


def test_non_spa_attention_gets_only_an_activation_plan():
    for budget in BUDGETS:
        if budget == "mlp_aware":
            continue
        plan = make_plan(cfg(attention="softmax", kernel_budget=budget))
        assert plan.kind is None and plan.schedule is None and plan.overrides is None
        assert plan.activation["method"] == "tat"


@pytest.mark.parametrize("attention", ["espa", "uspa"])
@pytest.mark.parametrize("residual", ["standard", "normalised"])
def test_joint_with_skips_gives_the_attention_target_rho_star(attention, residual):
    """Skips keep the block outputs near the input kernel, which no gamma_L can move to rho*
    (the solver would run to its bound); the last SPA target takes rho* itself."""
    c = cfg(attention=attention, residual=residual)
    plan = make_plan(c)
    target = walks.spa_kernel(attention, 4, plan.schedule[-1])
    assert target[0, 1] == pytest.approx(JOINT_FINAL_CORR, rel=1e-12)
    assert plan.info["joint_mode"].startswith("residual")


def test_activation_spec_and_split_activation():
    assert split_activation("tat_lrelu") == ("leaky_relu", "tat")
    assert split_activation("dks_gelu") == ("gelu", "dks")
    assert split_activation("gelu") == ("gelu", None)
    assert activation_spec(cfg(activation="gelu")) == dict(activation="gelu", method=None)
    assert activation_spec(cfg(activation="tat_lrelu"), 0.5) == dict(
        activation="leaky_relu", method="tat", depth=16, eta=0.5)
    assert activation_spec(cfg(activation="dks_gelu", zeta=1.3)) == dict(
        activation="gelu", method="dks", depth=16, zeta=1.3)
    assert activation_spec(cfg(activation="tat_gelu", residual="normalised", shaping_depth=4)) == dict(
        activation="gelu", method="tat", depth=4, tau=0.3, residual_beta=0.1)
    with pytest.raises(ValueError, match="unreachable"):
        activation_spec(cfg(activation="tat_lrelu", n_layer=2), 0.95)
    # the plan's activation is the spec, its params the solved transform's
    plan = make_plan(cfg(kernel_budget="independent"))
    assert dict(plan.activation) == activation_spec(cfg(), ETA)
    assert set(plan.params) == {"output_scale", "negative_slope"}
    assert all(isinstance(v, float) for v in plan.params.values())


def test_plan_is_immutable():
    """Frozen fields, read-only arrays, read-only mappings (info and activation, nested ones
    included), and copies of what it was built from."""
    plan = make_plan(cfg(kernel_budget="mlp_aware", activation="dks_lrelu", gamma_final=0.05, n_layer=4))
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.policy = "independent"
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.schedule = (0.0,)
    with pytest.raises(TypeError):
        plan.schedule[1] = 0.3                                  # a tuple
    B, D = plan.overrides[0]
    with pytest.raises(ValueError, match="read-only"):
        B[1, 0] = 0.0
    with pytest.raises(ValueError, match="read-only"):
        D[:] = 1.0
    with pytest.raises(TypeError):
        plan.overrides[0] = None
    with pytest.raises(TypeError):
        plan.info["gamma_final"] = 1.0
    with pytest.raises(TypeError):
        plan.info["mlp_aware"][0]["realised"] = False          # nested entries too
    with pytest.raises(TypeError):
        del plan.info["policy"]
    with pytest.raises(TypeError):
        plan.activation["depth"] = 3
    # built from mutable values, it keeps read-only copies of them
    B0, D0 = np.zeros((2, 2)), np.ones(2)
    info = {"a": [1, 2]}
    own = Plan(policy="x", kind="espa", n_layer=1, block_size=2, schedule=[np.inf, 0.1],
               overrides=[(B0, D0)], info=info)
    B0[0, 0], info["a"].append(3), info.update(b=1)
    assert own.overrides[0][0][0, 0] == 0.0 and own.info["a"] == (1, 2) and "b" not in own.info
    assert isinstance(own.schedule, tuple) and own.activation == {}


def test_the_plan_says_when_it_clamps_eta():
    """At depth 4 the default budget's eta = 0.9 is out of reach: eta is clamped to max_eta and
    the solved 'TAT leaky ReLU' is a ReLU, and the plan says so in words; at depth 16 it is met
    and the plan has no note; an explicit eta is never a clamp."""
    shallow = make_plan(cfg(n_layer=4))
    assert shallow.info["eta_clamped_to_max"] and len(shallow.notes) == 1
    assert "a ReLU" in shallow.notes[0] and f"{shallow.info['eta']:.4g}" in shallow.notes[0]
    assert shallow.params["negative_slope"] < 1e-6 and "note: eta clamped" in str(shallow)
    assert make_plan(cfg(n_layer=16)).notes == ()
    assert make_plan(cfg(n_layer=4, eta=0.5)).notes == ()
