"""signal.budget: each kernel-budget policy's invariant at initialisation (docs/kernel_budget.md):
the stated target met, q = 1 at every position, non-negative lower-triangular A_l, and the
model constructing at every depth."""
import math

import numpy as np
import pytest

from nanospa import GPT, GPTConfig
from nanospa.signal import kernels
from nanospa.signal.budget import (BUDGETS, INDEPENDENT_ETA, INDEPENDENT_GAMMA_FINAL, JOINT_FINAL_CORR,
                                   JOINT_NET_ETA, activation_plan, make_plan, max_eta, network_stats,
                                   pair_walk, schedule)
from nanospa.signal.predict import effective_attention, predict_kernels


def cfg(**kw):
    base = dict(block_size=24, n_layer=16, n_head=2, n_embd=16, activation="tat_lrelu")  # eta = 0.9 needs L >= 13
    base.update(kw)
    return GPTConfig(**base)


def attention_matrices(c, plan):
    return [effective_attention(c, plan, l, c.block_size) for l in range(1, c.n_layer + 1)]


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("attention", ["espa", "uspa"])
def test_every_policy_gives_causal_non_negative_attention(budget, attention):
    act = "dks_lrelu" if budget == "mlp_aware" else "tat_lrelu"
    c = cfg(kernel_budget=budget, attention=attention, activation=act)
    plan = make_plan(c)
    for layer, A in zip(plan.layers, attention_matrices(c, plan)):
        assert np.all(np.triu(A, 1) == 0) and A.min() >= 0
        assert np.all(layer["D"] > 0) and np.all(np.isfinite(layer["D"]))
        B = layer["B"]
        assert np.all(B[np.tril_indices(c.block_size)] <= 1e-12)          # row-normalised log A
        np.testing.assert_allclose(np.exp(B).sum(axis=1), 1.0, atol=1e-12)  # softmax(B) rows
        assert layer["D"][0] == pytest.approx(1.0) or budget in ("qpreserve", "joint_qpreserve")


def test_independent_is_the_reimplementations_recipe():
    c = cfg(kernel_budget="independent")
    plan = make_plan(c)
    assert plan.info["gamma_final"] == INDEPENDENT_GAMMA_FINAL and plan.info["eta"] == INDEPENDENT_ETA
    gammas = kernels.espa_gammas(c.n_layer, INDEPENDENT_GAMMA_FINAL)
    pred = predict_kernels(cfg(kernel_budget="independent", activation="linear"))
    for l, layer in enumerate(plan.layers, start=1):
        assert layer["gamma"] == pytest.approx(gammas[l])
        np.testing.assert_allclose(pred.kernel(l), kernels.espa_kernel(c.block_size, gammas[l]), atol=1e-12)
    with pytest.raises(ValueError, match="eta=0.95 is unreachable"):
        make_plan(cfg(kernel_budget="independent", n_layer=2, eta=0.95))


def joint_stats(c, plan):
    """network_stats of the plan's own targets (the solve's T: min(T, 64), extrapolated)."""
    name = "gamma_final" if c.attention == "espa" else "rho_final"
    K, X = pair_walk(c, plan.activation, schedule(c, plan.info[name]),
                     "qpreserve" if "qpreserve" in c.kernel_budget else "spa")
    return network_stats(K, X, c.block_size)


@pytest.mark.parametrize("attention", ["espa", "uspa"])
@pytest.mark.parametrize("final_corr", [0.0, 0.2, 0.7])
@pytest.mark.parametrize("budget", ["joint", "joint_qpreserve"])
def test_joint_meets_both_targets(attention, final_corr, budget):
    """(i) the whole network's C_f(0) is TAT's eta_net; (ii) the input-dependent part of the
    last kernel has mean adjacent correlation rho*. Solved to 1e-5; asserted to 1e-4."""
    c = cfg(kernel_budget=budget, attention=attention, final_corr=final_corr)
    plan = make_plan(c)
    assert plan.info["final_corr_reached"] and plan.info["eta_net_reached"]
    c_f0, rho = joint_stats(c, plan)
    assert rho == pytest.approx(final_corr or JOINT_FINAL_CORR, abs=1e-4)
    assert c_f0 == pytest.approx(JOINT_NET_ETA, abs=1e-4)
    assert 0 < plan.info["eta"] < INDEPENDENT_ETA       # attention amplifies the MLPs' C_f(0)


def test_joint_final_gamma_depends_on_T_and_L():
    """Not a constant: the solve runs for the actual T and L."""
    g = {(T, L): make_plan(cfg(block_size=T, n_layer=L)).info["gamma_final"] for T, L in
         [(8, 16), (48, 16), (48, 24)]}
    assert len({round(v, 6) for v in g.values()}) == 3
    assert all(0.1 < v < 5 for v in g.values())


def test_joint_honours_explicit_targets():
    plan = make_plan(cfg(eta=0.3))                       # eta given: only (ii) is solved
    assert plan.info["eta"] == 0.3 and plan.info["final_corr_reached"] and "eta_net_reached" not in plan.info
    assert joint_stats(cfg(eta=0.3), plan)[1] == pytest.approx(JOINT_FINAL_CORR, abs=1e-4)
    plan = make_plan(cfg(gamma_final=0.05))              # gamma given: nothing to solve
    assert plan.info["gamma_final"] == 0.05 and "final_corr_reached" not in plan.info


def test_linear_mlp_joint_is_the_espa_target_with_gamma_from_rho():
    """Without MLP nonlinearity nothing is common to all inputs: rho* = exp(-gamma_L)."""
    plan = make_plan(cfg(activation="linear"))
    assert plan.info["gamma_final"] == pytest.approx(-np.log(JOINT_FINAL_CORR), rel=1e-4)


def test_pair_walk_matches_two_sequences_in_a_wide_network():
    """The cross kernel X between two sequences with no token in common, measured at width
    1024. Correlations (C_f(0), the normalised kernel) fluctuate by O(d^-1/2) (4 d^-1/2 = 0.125
    as in test_signal_predict); X and K themselves drift like q-values, by a random walk of
    relative standard deviation sqrt(2 L / (m d)) over the L MLPs (3 of those: 0.32 here;
    measured 0.18-0.24)."""
    c = cfg(block_size=12, n_layer=6, n_embd=1024, n_head=4, dtype="float64", mlp_ratio=1, vocab_size=64)
    model = GPT(c, seed=0)
    H = model.trace(np.arange(24).reshape(2, 12)).hidden[-1]          # rows a, b: disjoint tokens
    K, X = kernels.kernel_matrix(H[0]), H[0] @ H[1].T / c.n_embd
    K_pred, X_pred = pair_walk(c, model.plan.activation_spec, schedule(c, model.plan.info["gamma_final"]))
    scale = np.sqrt(np.outer(np.diag(K_pred), np.diag(K_pred)))
    drift = 3 * np.sqrt(2 * c.n_layer / (c.mlp_ratio * c.n_embd))
    assert np.abs((X - X_pred) / scale).max() < drift and np.abs((K - K_pred) / scale).max() < drift
    corr = 4 / np.sqrt(c.n_embd)
    assert np.abs(kernels.normalised_kernel(K) - kernels.normalised_kernel(K_pred)).max() < corr
    assert np.mean(np.diag(X) / np.diag(K)) == pytest.approx(network_stats(K_pred, X_pred)[0], abs=corr)


@pytest.mark.parametrize("n_layer", [1, 2, 3])
def test_default_budget_constructs_at_small_depth(n_layer):
    """A short stack cannot reach large eta (max_eta); the joint eta is clamped below it."""
    model = GPT(GPTConfig(n_layer=n_layer, block_size=8, n_embd=16, n_head=2, activation="tat_lrelu"))
    eta = model.plan.info["eta"]
    assert 0 < eta < max_eta(model.config) or math.isclose(eta, max_eta(model.config), rel_tol=1e-6)


@pytest.mark.parametrize("budget", ["qpreserve", "joint_qpreserve"])
@pytest.mark.parametrize("extra", [dict(), dict(activation="dks_gelu"), dict(attention="uspa"),
                                   dict(block_size=64, n_layer=24)])
def test_qpreserve_gives_q_one_after_every_attention_sublayer(budget, extra):
    c = cfg(kernel_budget=budget, **extra)
    pred = predict_kernels(c)
    for l in range(1, c.n_layer + 1):
        np.testing.assert_allclose(pred.q(l, "attn"), 1.0, atol=1e-10)
    plan = make_plan(c)
    same = dict(extra, kernel_budget="independent", eta=plan.info.get("eta", 0.0))   # same targets
    same.update(rho_final=plan.info["rho_final"]) if c.attention == "uspa" else \
        same.update(gamma_final=plan.info["gamma_final"])
    for mine, theirs in zip(plan.layers, make_plan(cfg(**same)).layers):   # only D differs
        np.testing.assert_array_equal(mine["B"], theirs["B"])


def test_independent_q_grows_and_qpreserve_removes_it():
    c = cfg(kernel_budget="independent", block_size=64, n_layer=24)
    assert predict_kernels(c).q(24).max() > 3.0                 # method §10: q grows along positions
    assert predict_kernels(cfg(kernel_budget="qpreserve", block_size=64, n_layer=24)).q(24).max() \
        == pytest.approx(1.0, abs=1e-10)


@pytest.mark.parametrize("activation", ["dks_lrelu", "dks_gelu", "linear"])
def test_mlp_aware_meets_the_target_after_every_mlp(activation):
    """With a DKS activation (C(c) <= c) the pre-image F^-1(Sigma_l) is positive definite and
    A_l >= 0 at every layer: the block outputs are exactly the E-SPA targets."""
    c = cfg(kernel_budget="mlp_aware", activation=activation, gamma_final=0.05)
    plan = make_plan(c)
    assert plan.info["mlp_aware_realised"] == list(range(1, c.n_layer + 1))
    pred = predict_kernels(c, plan=plan)
    for l in range(1, c.n_layer + 1):
        np.testing.assert_allclose(pred.kernel(l), pred.kernel(l, "target"), atol=1e-8)


def test_mlp_aware_reports_where_the_pre_image_is_not_realisable():
    """TAT leaky ReLU has C(0) > 0: correlations below C(0) have a negative pre-image, which
    no non-negative A_l reaches. Those layers fall back to the independent A_l."""
    c = cfg(kernel_budget="mlp_aware")
    plan = make_plan(c)
    report = plan.info["mlp_aware"]
    assert len(report) == c.n_layer and plan.info["mlp_aware_realised"] == []
    assert all(e["reason"] in ("pre-image not positive definite", "negative entries in A_l") for e in report)
    ref = make_plan(cfg(kernel_budget="independent"))
    for mine, theirs in zip(plan.layers, ref.layers):
        np.testing.assert_array_equal(mine["B"], theirs["B"])
        np.testing.assert_array_equal(mine["D"], theirs["D"])


def test_mlp_aware_rejects_what_it_cannot_invert():
    with pytest.raises(ValueError, match="residual='none'"):
        make_plan(cfg(kernel_budget="mlp_aware", residual="normalised"))
    with pytest.raises(ValueError, match="Q\\(1\\) = 1"):
        make_plan(cfg(kernel_budget="mlp_aware", activation="gelu"))


def test_non_spa_attention_gets_only_an_activation_plan():
    for budget in BUDGETS:
        if budget == "mlp_aware":
            continue
        plan = make_plan(cfg(attention="softmax", kernel_budget=budget))
        assert plan.layers is None and plan.activation["method"] == "tat"


@pytest.mark.parametrize("attention", ["espa", "uspa"])
@pytest.mark.parametrize("residual", ["standard", "normalised"])
def test_joint_with_skips_gives_the_attention_target_rho_star(attention, residual):
    """Skips keep the block outputs near the input kernel, which no gamma_L can move to rho*
    (the solver would run to its bound); the last SPA target takes rho* itself."""
    c = cfg(attention=attention, residual=residual)
    plan = make_plan(c)
    last = plan.layers[-1]["gamma"] if attention == "espa" else plan.layers[-1]["rho"]
    target = kernels.espa_kernel(4, last) if attention == "espa" else kernels.uspa_kernel(4, last)
    assert target[0, 1] == pytest.approx(JOINT_FINAL_CORR, rel=1e-12)
    assert plan.info["joint_mode"].startswith("residual")
