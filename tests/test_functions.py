"""nanospa/functions.py: the elementwise primitives.

The Shaped fast path (TAT's leaky ReLU as one select and one product) against the
definition s (phi(a x + b) + o), with its full float64 Jacobian.
"""
import numpy as np
import pytest

from nanospa import Tensor
from nanospa import functions as F
from nanospa.gradcheck import check_jacobian


def normal(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


def away_from_zero(*shape):
    x = normal(*shape)
    return x + 0.2 * np.sign(x)  # finite differences (eps 1e-6) never cross the kink


@pytest.mark.parametrize("base,opts", [("leaky_relu", dict(a=0.7, s=1.3, o=0.2, slope=0.3)),
                                       ("relu", dict(a=2.5, s=-0.8, o=-0.1))])
def test_shaped_fast_path_is_the_shaped_activation(base, opts):
    """s (phi(a x) + o) for positively homogeneous phi, a > 0 (the fast path), against the
    definition, and its full Jacobian."""
    x = away_from_zero(4, 5)
    slope = opts.get("slope", 0.0)
    u = opts["a"] * x
    expected = opts["s"] * (np.where(u > 0, u, slope * u) + opts["o"])
    y = F.Shaped.apply(Tensor(x), base=base, **opts).data
    np.testing.assert_allclose(y, expected, rtol=1e-14)
    assert check_jacobian(lambda t: F.Shaped.apply(t, base=base, **opts),
                          [Tensor(x, requires_grad=True)], rtol=1e-6) < 1e-6


def test_shaped_generic_path_still_used_with_a_shift():
    """b != 0 takes the generic path (phi(a x + b) is not a phi(x)); same definition."""
    x = away_from_zero(3, 4)
    y = F.Shaped.apply(Tensor(x), base="leaky_relu", a=0.9, b=0.05, s=1.1, slope=0.2).data
    u = 0.9 * x + 0.05
    np.testing.assert_allclose(y, 1.1 * np.where(u > 0, u, 0.2 * u), rtol=1e-14)
