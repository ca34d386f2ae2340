"""Base activations (nanospa/signal/activations.py): values against their definitions,
(phi', phi'') against finite differences, dtypes kept, names and aliases.

The Q/C maps are tested in test_signal_qc_maps.py, the DKS/TAT solvers in
test_signal_act_transform.py.
"""
import math

import numpy as np
import pytest

from nanospa.signal import activations as ac


@pytest.mark.parametrize("name", sorted(ac.ACTIVATIONS))
def test_derivative_table_matches_finite_differences(name):
    # points away from the kink at 0; central differences with h = 1e-5 have truncation
    # ~h^2 |phi'''| / 6 < 1e-10 and rounding ~1e-16 / h = 1e-11, so 1e-8 is safe.
    x = np.array([-3.1, -1.7, -0.6, -0.05, 0.07, 0.4, 1.3, 2.9])
    base, h = ac.ACTIVATIONS[name], 1e-5
    d1, d2 = base.d12(x, np)
    fd1 = (base.fn(x + h) - base.fn(x - h)) / (2 * h)
    fd2 = (base.d12(x + h, np)[0] - base.d12(x - h, np)[0]) / (2 * h)
    np.testing.assert_allclose(d1, fd1, rtol=0, atol=1e-8)
    np.testing.assert_allclose(d2, fd2, rtol=0, atol=1e-8)


def test_base_activation_values():
    x = np.array([-2.0, -0.5, 0.0, 0.5, 2.0])
    sig = 1.0 / (1.0 + np.exp(-x))
    erf = np.array([math.erf(v / math.sqrt(2.0)) for v in x])
    np.testing.assert_allclose(ac.sigmoid(x), sig, rtol=1e-15, atol=1e-15)
    np.testing.assert_allclose(ac.softplus(x), np.log1p(np.exp(x)), rtol=1e-15, atol=1e-15)
    np.testing.assert_allclose(ac.swish(x), x * sig, rtol=1e-15, atol=1e-15)
    np.testing.assert_allclose(ac.elu(x), np.where(x > 0, x, np.exp(x) - 1), atol=1e-15)
    np.testing.assert_allclose(ac.gelu_exact(x), 0.5 * x * (1 + erf), atol=1e-15)
    np.testing.assert_array_equal(ac.leaky_relu(x, 0.2), np.where(x > 0, x, 0.2 * x))
    np.testing.assert_array_equal(ac.relu(x), np.maximum(x, 0))
    # the tanh approximation differs from x Phi(x) by at most ~5e-4 on this range
    assert 0 < np.abs(ac.gelu(x) - ac.gelu_exact(x)).max() < 1e-3
    # ... and is the published formula (GPT-2, dks), written out with its own literals:
    # the finite-difference test above cannot see a wrong GELU_CUBIC, since phi, phi' and
    # phi'' all derive from it
    published = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    np.testing.assert_allclose(ac.gelu(x), published, rtol=1e-15, atol=1e-15)


@pytest.mark.parametrize("name", sorted(ac.ACTIVATIONS))
def test_base_activations_keep_float32(name):
    x32 = np.linspace(-3, 3, 7, dtype=np.float32)
    assert ac.ACTIVATIONS[name].fn(x32).dtype == np.float32
    assert all(d.dtype == np.float32 for d in ac.ACTIVATIONS[name].d12(x32, np))


def test_names_aliases_and_default_slope():
    x = np.array([-2.0, -0.5, 0.5])
    assert {ac.base_name(a) for a in ac.ALIASES} <= set(ac.ACTIVATIONS)
    assert ac.base_name("silu") == "swish" and ac.base_name("gelu") == "gelu"
    with pytest.raises(ValueError, match="gelux"):
        ac.base_name("gelux")
    # the plain leaky ReLU and its derivative default to LEAKY_RELU_SLOPE, the 0.01 the
    # model has always used for a plain leaky_relu (PyTorch's default)
    assert ac.LEAKY_RELU_SLOPE == 0.01
    np.testing.assert_array_equal(ac.leaky_relu(x), np.where(x > 0, x, ac.LEAKY_RELU_SLOPE * x))
    d1, _ = ac.ACTIVATIONS["leaky_relu"].d12(x, np)
    np.testing.assert_array_equal(d1, np.where(x > 0, 1.0, ac.LEAKY_RELU_SLOPE))
