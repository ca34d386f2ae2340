"""One definition per activation (nanospa/signal/activations.py ACTIVATIONS), read by the
engine and by the float64 maths: for every entry, in float64, the engine's op gives phi,
its backward phi', the slope of its backward phi'', and those agree with central
differences of phi itself; the shaped op (functions.Shaped) is the float64 phi_hat
(signal.act_transform.ActivationTransform) and its derivative; float32 stays float32.
A planted wrong derivative is caught (the check has teeth).

Adding an activation: an entry in ACTIVATIONS (signal/activations.py), its name wherever
GPTConfig lists choices (it reads ACTIVATIONS), and, when PyTorch has it, a row in the
yardstick (bench/yardstick.py). Every test here picks it up by itself.
"""
import math

import numpy as np
import pytest

from nanospa import functions as F
from nanospa.config import BASE_ACTIVATIONS
from nanospa.signal import activations as ac
from nanospa.signal.act_transform import ActivationTransform
from nanospa.tensor import Tensor

# points away from the kink at 0; central differences with h = 1e-5 have truncation error
# ~h^2 |f'''| / 6 < 1e-10 and rounding ~1e-16 / h = 1e-11 on this range, so 1e-8 holds
# with two orders of margin on any CPU (no BLAS, no reduction: elementwise only)
X = np.array([-3.1, -1.7, -0.6, -0.05, 0.07, 0.4, 1.3, 2.9])
H, ATOL = 1e-5, 1e-8
OPTIONS = {"leaky_relu": {"negative_slope": 0.2}}


def engine(name, x, **kw):
    """(phi(x), phi'(x)) as the engine's Activation op computes them, in float64."""
    t = Tensor(x.copy(), requires_grad=True)
    y = F.Activation.apply(t, name=name, **kw)
    y.backward(np.ones_like(x))
    return y.data, t.grad


def check(name, kw):
    """Largest gaps, in float64, between the engine op, the registry and finite differences."""
    base = ac.ACTIVATIONS[name]
    y, g = engine(name, X, **kw)
    g_plus, g_minus = engine(name, X + H, **kw)[1], engine(name, X - H, **kw)[1]
    fd1 = (base.fn(X + H, **kw) - base.fn(X - H, **kw)) / (2 * H)
    return dict(value=np.abs(y - base.fn(X, **kw)).max(),           # the op is phi: exactly
                d1_op=np.abs(g - base.d1(X, np, **kw)).max(),        # its backward is phi': exactly
                d1_fd=np.abs(g - fd1).max(),                         # phi' is the slope of phi
                d2_fd=np.abs(base.d2(X, np, **kw) - (g_plus - g_minus) / (2 * H)).max())  # phi'' of the op's phi'


@pytest.mark.parametrize("name", sorted(ac.ACTIVATIONS))
def test_engine_op_and_float64_maths_are_one_definition(name):
    err = check(name, OPTIONS.get(name, {}))
    assert err["value"] == 0.0 and err["d1_op"] == 0.0, err
    assert err["d1_fd"] < ATOL and err["d2_fd"] < ATOL, err


def test_a_planted_wrong_derivative_is_caught(monkeypatch):
    """GELU's cubic coefficient moved by 1e-6 relative in phi' alone: the engine's backward
    no longer matches the slope of phi."""
    real = ac._d1_gelu
    monkeypatch.setattr(ac, "GELU_CUBIC_D1", ac.GELU_CUBIC_D1 * (1 + 1e-6))
    monkeypatch.setitem(ac.ACTIVATIONS, "gelu", ac.BaseActivation(ac.gelu, real, ac._d2_gelu, False))
    assert check("gelu", {})["d1_fd"] > ATOL


@pytest.mark.parametrize("name", sorted(ac.ACTIVATIONS))
def test_the_configuration_lists_the_registry(name):
    assert name in BASE_ACTIVATIONS
    assert set(BASE_ACTIVATIONS) == set(ac.ACTIVATIONS)


@pytest.mark.parametrize("name", sorted(ac.ACTIVATIONS))
def test_shaped_op_is_the_float64_phi_hat(name):
    """functions.Shaped(a, b, s, o) against ActivationTransform with the same parameters:
    values and derivative, on both of Shaped's paths (b = 0 takes the fast path for the
    positively homogeneous relu and leaky_relu)."""
    for shift in (0.0, 0.3):
        params = dict(input_scale=0.8, input_shift=shift, output_shift=-0.1, output_scale=1.3)
        kw = {}
        if name == "leaky_relu":
            params["negative_slope"] = kw["slope"] = 0.2
        t = ActivationTransform(name, "tat", 1, params)
        x = Tensor(X.copy(), requires_grad=True)
        y = F.Shaped.apply(x, base=name, a=0.8, b=shift, s=1.3, o=-0.1, **kw)
        y.backward(np.ones_like(X))
        np.testing.assert_allclose(y.data, t(X), rtol=1e-14, atol=1e-14)
        np.testing.assert_allclose(x.grad, t.derivative(X), rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("name", sorted(ac.ACTIVATIONS))
def test_float32_stays_float32(name):
    x32 = np.linspace(-3, 3, 7, dtype=np.float32)
    kw = OPTIONS.get(name, {})
    base = ac.ACTIVATIONS[name]
    assert base.fn(x32, **kw).dtype == np.float32
    assert base.d1(x32, np, **kw).dtype == np.float32 and base.d2(x32, np, **kw).dtype == np.float32
    t = Tensor(x32, requires_grad=True)
    y = F.Activation.apply(t, name=name, **kw)
    y.backward(np.ones_like(x32))
    assert y.dtype == np.float32 and t.grad.dtype == np.float32


def test_values_are_the_published_formulas():
    """The finite-difference checks cannot see a wrong constant that phi, phi' and phi''
    share (GELU's cubic coefficient), so each phi is held against its formula written out
    with its own literals."""
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
    np.testing.assert_array_equal(ac.tanh(x), np.tanh(x))
    np.testing.assert_array_equal(ac.linear(x), x)
    published = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    np.testing.assert_allclose(ac.gelu(x), published, rtol=1e-15, atol=1e-15)


def test_names_and_default_slope():
    x = np.array([-2.0, -0.5, 0.5])
    assert ac.base_name("gelu") == "gelu"
    with pytest.raises(ValueError, match="gelux"):
        ac.base_name("gelux")
    # the plain leaky ReLU defaults to LEAKY_RELU_SLOPE, the 0.01 of PyTorch's default
    assert ac.LEAKY_RELU_SLOPE == 0.01
    np.testing.assert_array_equal(ac.leaky_relu(x), np.where(x > 0, x, ac.LEAKY_RELU_SLOPE * x))
    np.testing.assert_array_equal(ac.ACTIVATIONS["leaky_relu"].d1(x, np), np.where(x > 0, 1.0, ac.LEAKY_RELU_SLOPE))
