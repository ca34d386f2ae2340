"""Per-layer targets from network-level ones (nanospa/signal/depth_targets.py,
docs/activations.md §6): the chain and normalised-residual formulas, the subnetwork
maximum and bad input."""
import pytest

from nanospa.signal.depth_targets import (DEFAULT_TARGETS, chain_c0, check_depth, check_residual_beta,
                                          per_layer_targets, subnet_max)
from nanospa.signal.gaussian_means import lrelu_beta, lrelu_cmap_beta


def test_chain_c0_of_one_layer_is_beta():
    assert chain_c0(lrelu_beta(0.3), 1) == pytest.approx(float(lrelu_beta(0.3)), abs=1e-15)


def test_chain_c0_iterates_the_c_map():
    beta, x = float(lrelu_beta(0.2)), 0.0
    for _ in range(5):
        x = float(lrelu_cmap_beta(x, beta))
    assert chain_c0(beta, 5) == pytest.approx(x, abs=1e-15)


def test_per_layer_targets_of_a_chain_and_a_normalised_residual():
    L, zeta, tau, rb = 12, 1.5, 0.3, 0.3
    assert per_layer_targets("dks", L, zeta=zeta) == pytest.approx(zeta ** (1 / L), rel=1e-15)
    assert per_layer_targets("tat", L, tau=tau) == pytest.approx(tau / L, rel=1e-15)
    b2 = rb * rb
    assert per_layer_targets("dks", L, zeta=zeta, residual_beta=rb) == \
        pytest.approx(min(zeta, (zeta ** (1 / L) - (1 - b2)) / b2), rel=1e-15)
    assert per_layer_targets("tat", L, tau=tau, residual_beta=rb) == pytest.approx(tau / max(1, L * b2), rel=1e-15)
    assert per_layer_targets("dks", L) == per_layer_targets("dks", L, zeta=DEFAULT_TARGETS["zeta"])


def test_subnet_max_takes_the_larger_of_the_stack_and_one_branch():
    double = lambda x: 2 * x
    assert subnet_max(1.0, double, 3, None) == 8.0                    # a chain: r applied L times
    assert subnet_max(1.0, double, 1, 0.5) == max(0.75 + 0.25 * 2, 2)  # one branch alone is larger


def test_bad_input():
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="depth"):
            check_depth(bad)
    for bad in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="residual_beta"):
            check_residual_beta(bad)
    assert check_residual_beta(1.0) is None and check_residual_beta(None) is None
    with pytest.raises(ValueError, match="method"):
        per_layer_targets("bad", 3)
