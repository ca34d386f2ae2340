"""Per-layer targets from network-level ones (docs/activations.md §6, §7): what one shaped
activation must do so that a chain of L of them, or a normalised residual stack of L
blocks, meets DKS's zeta, TAT's tau, or TAT leaky ReLU's eta, maximised over subnetworks.

Not here: solving an activation's parameters for a per-layer target (act_transform.py),
the C-maps themselves (gaussian_means.py, local_maps.py).

Notation (docs/activations.md §1-§2, §6): L depth, beta C(0) of one TAT leaky-ReLU layer,
alpha_r, beta_r the weights of a normalised residual x -> alpha_r x + beta_r f(x).
"""
import numpy as np

from .gaussian_means import lrelu_cmap_beta

DEFAULT_TARGETS = {"zeta": 1.5, "eta": 0.9, "tau": 0.3}   # dks's defaults for zeta, eta, tau


def check_residual_beta(residual_beta):
    """None (a skipless chain) or beta_r in (0, 1) as a float; beta_r = 1 is accepted and is
    the chain (None). ValueError outside (0, 1]."""
    if residual_beta is None:
        return None
    rb = float(residual_beta)
    if not 0.0 < rb <= 1.0:
        raise ValueError(f"residual_beta must lie in (0, 1], got {residual_beta!r}")
    return None if rb == 1.0 else rb


def subnet_max(x0, r, L, rb):
    """dks's subnetwork maximum: chain of L local maps r, or the normalised residual stack
    x -> alpha_r^2 x + beta_r^2 r(x) (L blocks) together with one branch alone."""
    x = x0
    if rb is None:
        for _ in range(L):
            x = r(x)
        return x
    b2 = rb * rb
    for _ in range(L):
        x = (1.0 - b2) * x + b2 * r(x)
    return max(x, r(x0))


def chain_c0(beta, L, residual_beta=None):
    """C_f(0) maximised over subnetworks, for TAT leaky-ReLU layers of C(0) = beta (§5-§6).

    beta = lrelu_beta(negative_slope). Chain: C_beta^{oL}(0). Normalised residual: the max
    of one layer and L iterations of x -> alpha_r^2 x + beta_r^2 C_beta(x). Increasing in
    beta; beta = 1/pi (plain ReLU) gives the largest reachable eta.
    """
    return float(subnet_max(0.0, lambda x: float(lrelu_cmap_beta(x, beta)),
                             check_depth(L), check_residual_beta(residual_beta)))


def per_layer_targets(method, depth, zeta=DEFAULT_TARGETS["zeta"], tau=DEFAULT_TARGETS["tau"],
                      residual_beta=None):
    """Per-layer C'(1) (DKS) or C''(1) (TAT smooth) meeting the network target (§6).

    Chain: zeta^(1/L) and tau/L. Normalised residual: min(zeta, (zeta^(1/L) - alpha_r^2)/beta_r^2)
    and tau / max(1, L beta_r^2).
    """
    L, rb = check_depth(depth), check_residual_beta(residual_beta)
    b2 = 1.0 if rb is None else rb * rb
    if method == "dks":
        return min(zeta, (zeta ** (1.0 / L) - (1.0 - b2)) / b2) if rb else zeta ** (1.0 / L)
    if method == "tat":
        return tau / max(1.0, L * b2)
    raise ValueError(f"method must be 'dks' or 'tat', got {method!r}")


def check_depth(depth):
    """depth as an int >= 1, or ValueError."""
    if isinstance(depth, bool) or not isinstance(depth, (int, np.integer)) or depth < 1:
        raise ValueError(f"depth must be an integer >= 1, got {depth!r}")
    return int(depth)
