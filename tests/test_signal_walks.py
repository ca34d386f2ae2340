"""Tests for nanospa/signal/walks.py and signal/beyond/policies.py: the kernel walks the budget policies run at init
(docs/kernel_budget.md): the one-sequence walk (the schedule's closed form, qpreserve's D_l,
mlp_aware's pre-image), the walk of two sequences with no token in common against a wide
network, the network statistics the joint policy solves on, and split_bias."""
import numpy as np
import pytest

from nanospa import GPT, GPTConfig
from nanospa.signal import cholesky, kernels, dense_layer_bias, make_plan, realise, spa_matrix, spa_schedule
from nanospa.signal.budget import activation_spec
from nanospa.predict import predict_kernels
from nanospa.signal import budget
from nanospa.signal.beyond import policies as walks
from nanospa.signal.beyond.policies import extend_overrides, split_bias, walk
from nanospa.signal.walks import JOINT_SOLVE_T, adjacent_mean, network_stats, pair_walk

pytestmark = pytest.mark.slow       # the full suite only: python -m pytest -m 'not slow' skips it

EPS = np.finfo(np.float64).eps


def cfg(**kw):
    base = dict(block_size=24, n_layer=16, n_head=2, n_embd=16, activation="tat_lrelu")  # eta = 0.9 needs L >= 13
    base.update(kw)
    return GPTConfig(**base)


# ------------------------------------------------------------------ one sequence

def test_spa_walk_is_the_prediction_of_the_closed_form_plan():
    """d_rule "spa": every A_l is the schedule's closed form (no overrides) and K_L is what
    predict_kernels gives the same plan."""
    c = cfg(kernel_budget="independent", n_layer=6, eta=0.5)
    plan = make_plan(c)
    overrides, K, report = walk(c, plan.activation, plan.schedule)
    assert overrides == [None] * 6 and report == []
    np.testing.assert_allclose(K, predict_kernels(c, plan=plan).kernel(6), rtol=1e-14, atol=0)
    # from another input kernel
    S0 = cholesky.espa_kernel(24, 1.0)
    _, K0, _ = walk(c, plan.activation, plan.schedule, sigma_0=S0)
    np.testing.assert_allclose(K0, predict_kernels(c, sigma_0=S0, plan=plan).kernel(6), rtol=1e-14, atol=0)


@pytest.mark.parametrize("budget", ["qpreserve", "joint_qpreserve"])
@pytest.mark.parametrize("extra", [dict(), dict(activation="dks_gelu"), dict(attention="uspa"),
                                   dict(block_size=64, n_layer=24)])
def test_qpreserve_gives_q_one_after_every_attention_sublayer(budget, extra):
    c = cfg(kernel_budget=budget, **extra)
    pred = predict_kernels(c)
    for l in range(1, c.n_layer + 1):
        # q = h_ii D_i^2 with D_i^2 = 1 / h_ii, h = P S P^T computed along the walk and again
        # in predict: two length-T sums, relative rounding <= 2 T eps = 2.8e-14 at T = 64
        # (observed 3.3e-15; was 1e-10)
        np.testing.assert_allclose(pred.q(l, "attn"), 1.0, rtol=0, atol=2 * 64 * EPS)
    plan = make_plan(c)
    same = dict(extra, kernel_budget="independent", eta=plan.info.get("eta", 0.0))   # same targets
    same.update(rho_final=plan.info["rho_final"]) if c.attention == "uspa" else \
        same.update(gamma_final=plan.info["gamma_final"])
    ref = make_plan(cfg(**same))
    for l in range(1, c.n_layer + 1):                                  # only D differs
        np.testing.assert_array_equal(dense_layer_bias(plan, l)[0], dense_layer_bias(ref, l)[0])


@pytest.mark.parametrize("activation", ["dks_lrelu", "dks_gelu", "linear"])
def test_mlp_aware_meets_the_target_after_every_mlp(activation):
    """With a DKS activation (C(c) <= c) the pre-image F^-1(Sigma_l) is positive definite and
    A_l >= 0 at every layer: the block outputs are exactly the E-SPA targets."""
    c = cfg(kernel_budget="mlp_aware", activation=activation, gamma_final=0.05)
    plan = make_plan(c)
    assert plan.info["mlp_aware_realised"] == tuple(range(1, c.n_layer + 1))
    assert all(o is not None for o in plan.overrides)
    pred = predict_kernels(c, plan=plan)
    for l in range(1, c.n_layer + 1):
        # each layer solves triangular systems with kernels of condition number ~40 (gamma
        # 0.05, T = 24): eps * cond = 1e-14 per layer, 16 layers: 1e-12 (observed 3.4e-15;
        # was 1e-8)
        np.testing.assert_allclose(pred.kernel(l), pred.kernel(l, "target"), rtol=0, atol=1e-12)


def test_mlp_aware_reports_where_the_pre_image_is_not_realisable():
    """TAT leaky ReLU has C(0) > 0: correlations below C(0) have a negative pre-image, which
    no non-negative A_l reaches. Those layers fall back to the independent A_l."""
    c = cfg(kernel_budget="mlp_aware")
    plan = make_plan(c)
    report = plan.info["mlp_aware"]
    assert len(report) == c.n_layer and plan.info["mlp_aware_realised"] == ()
    assert all(e["reason"] in ("pre-image not positive definite", "negative entries in A_l") for e in report)
    assert [e["layer"] for e in report] == list(range(1, c.n_layer + 1))
    ref = make_plan(cfg(kernel_budget="independent"))
    for l in range(1, c.n_layer + 1):
        for mine, theirs in zip(dense_layer_bias(plan, l), dense_layer_bias(ref, l)):
            np.testing.assert_array_equal(mine, theirs)


def test_mlp_aware_rejects_what_it_cannot_invert():
    with pytest.raises(ValueError, match="residual='none'"):
        make_plan(cfg(kernel_budget="mlp_aware", residual="normalised"))
    with pytest.raises(ValueError, match="Q\\(1\\) = 1"):
        make_plan(cfg(kernel_budget="mlp_aware", activation="gelu"))
    # walk itself refuses too (it is callable without make_plan)
    c = cfg(residual="standard")
    values = spa_schedule("espa", c.n_layer, 0.05)
    with pytest.raises(ValueError, match="residual='none'"):
        walk(c, activation_spec(c, 0.5), values, mlp_aware=True)


def test_split_bias_realises_the_matrix():
    """A = diag(D) softmax(B) for a non-negative lower-triangular A with exact zeros."""
    A = spa_matrix("espa", 12, 0.3, 0.9)
    A[5, 1] = 0.0
    B, D = split_bias(A)
    assert np.isneginf(B[5, 1]) and np.all(np.isneginf(B[np.triu_indices(12, 1)]))
    np.testing.assert_allclose(D, A.sum(axis=1), rtol=1e-15)
    np.testing.assert_allclose(realise(B, D), A, rtol=1e-14, atol=0)
    with pytest.raises(ValueError, match="negative entry"):
        split_bias(-np.eye(3))


# ------------------------------------------------------------------ two sequences

def test_pair_walk_blocks_and_linear_case():
    """Each sequence alone follows the one-sequence walk (attention is per sequence, the MLP
    entrywise); without MLP nonlinearity nothing is common to the two, X = 0 exactly."""
    c = cfg(kernel_budget="independent", n_layer=5, eta=0.5, block_size=10)
    plan = make_plan(c)
    K, X = pair_walk(c, plan.activation, plan.schedule)
    _, K1, _ = walk(c, plan.activation, plan.schedule)
    np.testing.assert_allclose(K, K1, rtol=1e-14, atol=0)
    assert X.shape == (10, 10) and X.min() > 0                   # TAT leaky ReLU: C(0) > 0
    lin = cfg(kernel_budget="independent", n_layer=5, activation="linear", block_size=10)
    Kl, Xl = pair_walk(lin, activation_spec(lin), make_plan(lin).schedule)
    np.testing.assert_array_equal(Xl, 0.0)
    np.testing.assert_allclose(Kl, cholesky.espa_kernel(10, make_plan(lin).schedule[-1]), atol=1e-13)
    # default T: the solve's min(T, JOINT_SOLVE_T)
    big = cfg(kernel_budget="independent", n_layer=2, eta=0.3, block_size=JOINT_SOLVE_T + 8)
    assert pair_walk(big, make_plan(big).activation, make_plan(big).schedule)[0].shape == (JOINT_SOLVE_T,) * 2


def test_pair_walk_matches_two_sequences_in_a_wide_network():
    """The cross kernel X between two sequences with no token in common, measured at width
    1024. Correlations (C_f(0), the normalised kernel) fluctuate by O(d^-1/2) (4 d^-1/2 = 0.125
    as in test_predict); X and K themselves drift like q-values, by a random walk of
    relative standard deviation sqrt(2 L / (m d)) over the L MLPs (3 of those: 0.32 here;
    measured 0.18-0.24)."""
    c = cfg(block_size=12, n_layer=6, n_embd=1024, n_head=4, dtype="float64", mlp_ratio=1, vocab_size=64)
    model = GPT(c, seed=0)
    H = model.trace(np.arange(24).reshape(2, 12)).hidden[-1]          # rows a, b: disjoint tokens
    K, X = kernels.kernel_matrix(H[0]), H[0] @ H[1].T / c.n_embd
    K_pred, X_pred = pair_walk(c, model.plan.activation, model.plan.schedule)
    scale = np.sqrt(np.outer(np.diag(K_pred), np.diag(K_pred)))
    drift = 3 * np.sqrt(2 * c.n_layer / (c.mlp_ratio * c.n_embd))
    assert np.abs((X - X_pred) / scale).max() < drift and np.abs((K - K_pred) / scale).max() < drift
    corr = 4 / np.sqrt(c.n_embd)
    assert np.abs(kernels.normalised_kernel(K) - kernels.normalised_kernel(K_pred)).max() < corr
    assert np.mean(np.diag(X) / np.diag(K)) == pytest.approx(network_stats(K_pred, X_pred)[0], abs=corr)


def test_network_stats_and_adjacent_mean():
    T = 6
    K = 2.0 * cholesky.espa_kernel(T, 0.5)
    # X a constant 0.5 of each q: c_f0 = 0.5; R = K - X = 2 E - 1 1^T, normalised: (2 e^{-g} - 1) / (2 - 1)
    X = np.ones((T, T))
    c_f0, rho = network_stats(K, X)
    assert c_f0 == pytest.approx(0.5, rel=1e-15)
    assert rho == pytest.approx(2 * np.exp(-0.5) - 1, rel=1e-14)
    assert network_stats(K, np.zeros((T, T))) == pytest.approx((0.0, np.exp(-0.5)), rel=1e-14)
    # nothing input-dependent left: collapsed, rho = 1
    assert network_stats(K, K)[1] == 1.0
    assert adjacent_mean(K) == pytest.approx(np.exp(-0.5), rel=1e-14)
    # extrapolation to T_full positions: the last computed value fills the rest
    v = np.diagonal(kernels.normalised_kernel(K + np.diag(np.arange(T))), 1)
    ext = adjacent_mean(K + np.diag(np.arange(T)), T_full=20)
    assert ext == pytest.approx((v.sum() + (19 - v.size) * v[-1]) / 19, rel=1e-14)
    X2 = np.diag(np.linspace(0.1, 0.6, T))
    assert network_stats(K, X2, T_full=10)[0] == pytest.approx(
        (np.sum(np.diag(X2) / 2.0) + 4 * 0.6 / 2.0) / 10, rel=1e-14)


# ------------------------------------------------------------------ windows of positions


def _window_error(c, schedule, activation, T_w):
    """Largest relative error of qpreserve's D_l found at T_w positions and extended with its
    last value, against the walk at the full T."""
    full, _, _ = walk(c, activation, schedule, "qpreserve")
    part, _, _ = walk(c, activation, schedule, "qpreserve", T=T_w)
    ext = extend_overrides(part, c.block_size)
    return max(float(np.max(np.abs(e[1] / f[1] - 1.0))) for e, f in zip(ext, full))


def test_qpreserve_window_error_against_the_full_walk():
    """qpreserve's D_l on a window of T_w positions, extended by its last value, against the
    walk at the full T = 400 (L = 16, gamma_L = 0.05): the error falls like e^{-gamma_L T_w}
    (observed 7e-4 at T_w = 80, 4 decay lengths; 2e-6 at qpreserve_walk_T's 200, 10 decay
    lengths); with the joint schedule (gamma_L ~ 0.6) the minimal window is exact to
    rounding (observed 7e-16); U-SPA is not stationary and walks at the full T."""
    c = cfg(block_size=400, n_layer=16, kernel_budget="qpreserve", eta=0.5, gamma_final=0.05)
    plan = make_plan(cfg(block_size=64, n_layer=16, kernel_budget="independent", eta=0.5, gamma_final=0.05))
    T_w = walks.qpreserve_walk_T("espa", 400, 0.05)
    assert T_w == 200
    short, chosen = (_window_error(c, plan.schedule, plan.activation, w) for w in (80, T_w))
    assert 1e-4 < short < 2e-3 and chosen < 1e-5
    joint = make_plan(cfg(block_size=64, n_layer=16, kernel_budget="joint"))
    assert walks.qpreserve_walk_T("espa", 400, joint.schedule[-1]) == walks.WALK_MIN_T
    assert _window_error(cfg(**{**c.to_dict(), "kernel_budget": "joint_qpreserve"}), joint.schedule,
                         joint.activation, walks.WALK_MIN_T) < 1e-14
    assert walks.qpreserve_walk_T("uspa", 400, 0.8) == 400


def test_make_plan_walks_qpreserve_on_a_window():
    """Where the window is shorter than T, make_plan's qpreserve walk runs on it and extends
    D_l (info walk_T); mlp_aware walks at the full T (its A_l has no closed form)."""
    c = cfg(block_size=96, n_layer=4, kernel_budget="qpreserve", eta=0.5, gamma_final=0.2)
    plan = make_plan(c)
    assert plan.info["walk_T"] == 64
    part, _, _ = walk(c, plan.activation, plan.schedule, "qpreserve", T=64)
    for (B, D), (_, D64) in zip(plan.overrides, part):
        assert B is None and D.shape == (96,)
        np.testing.assert_array_equal(D[:64], D64)
        assert np.all(D[64:] == D64[-1])
    aware = make_plan(cfg(block_size=96, n_layer=4, kernel_budget="mlp_aware", activation="dks_gelu",
                          gamma_final=0.2))
    assert "walk_T" not in aware.info and aware.overrides[0][0].shape == (96, 96)
    with pytest.raises(ValueError, match="cannot be extended"):
        extend_overrides([(np.zeros((2, 2)), np.ones(2))], 4)
