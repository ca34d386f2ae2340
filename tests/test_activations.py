"""One definition per activation (nanospa/signal/activations.py ACTIVATIONS) and one of the
shaped phi_hat (activations.PhiHat), read by the engine and by the float64 maths: for every
entry, in float64, the engine's op gives phi, its backward phi', the slope of its backward
phi'', and those agree with central differences of phi itself; for every activation and
every transform (untransformed, each DKS/TAT solution the model names, hand-set parameters
on both of Shaped's paths) the engine's functions.Shaped gives the phi_hat and phi_hat' that
the Q/C maps and the solvers evaluate, and phi_hat'' is the slope of phi_hat'; float32 stays
float32. A planted wrong derivative is caught (the checks have teeth), and a planted change
of PhiHat moves the engine and the float64 maps together (there is no second copy).

Adding an activation: an entry in ACTIVATIONS (signal/activations.py), its name wherever
GPTConfig lists choices (it reads ACTIVATIONS), and, when PyTorch has it, a row in the
yardstick (bench/yardstick.py). Every test here picks it up by itself.
"""
import math

import numpy as np
import pytest

from nanospa import functions as F
from nanospa.config import BASE_ACTIVATIONS
from nanospa.gradcheck import check_jacobian
from nanospa.more_ops import Activation
from nanospa.signal import act_transform, activations as ac, local_maps
from nanospa.signal.beyond import activations as bac
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
    y = Activation.apply(t, name=name, **kw)
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
    monkeypatch.setitem(ac.ACTIVATIONS.own, "gelu", ac.BaseActivation(ac.gelu, real, ac._d2_gelu, False))
    assert check("gelu", {})["d1_fd"] > ATOL


@pytest.mark.parametrize("name", sorted(ac.ACTIVATIONS))
def test_the_configuration_lists_the_registry(name):
    assert name in BASE_ACTIVATIONS
    assert set(BASE_ACTIVATIONS) == set(ac.ACTIVATIONS)


# ------------------------------------------------------------------- phi_hat, one definition

DEPTH = 24
# Shaped's fast path multiplies by scale_where's factor k_neg + (k_pos - k_neg) [x > 0], which
# may differ from s a in its last bits, then adds s o: a few ulps of the largest |phi_hat|
# (measured: 0.7 eps relative); 8 eps leaves room, and a planted 1e-12 in PhiHat.pieces is
# about 500 times more.
FAST_PATH_RTOL = 8 * np.finfo(np.float64).eps
# every transform: each base untransformed, each DKS/TAT solution the model names, and hand-set
# parameters with b = 0 (relu, leaky_relu: Shaped's fast path) and b != 0 (its generic path)
TRANSFORMS = ([("none", name) for name in sorted(ac.ACTIVATIONS)]
              + [("solved", name) for name in sorted(act_transform.shaped_activation_names)]
              + [(f"set_b{b}", name) for b in (0.0, 0.3) for name in sorted(ac.ACTIVATIONS)])


def transform(kind, name):
    """(what the Q/C maps evaluate, the PhiHat the engine is given) for one transform."""
    if kind == "none":
        t = act_transform.activation_transform(name, "none")
    elif kind == "solved":
        t = act_transform.activation_transform(*act_transform.shaped_activation_names[name], DEPTH)
    else:
        params = dict(input_scale=0.8, input_shift=float(kind[5:]), output_shift=-0.1, output_scale=1.3)
        if name == "leaky_relu":
            params["negative_slope"] = 0.2
        t = act_transform.ActivationTransform(name, "tat", 1, params)
    return local_maps._as_hat(t), t.phi_hat


def shaped_engine(h, x):
    """(phi_hat(x), phi_hat'(x)) as the engine's Shaped op computes them, in float64."""
    t = Tensor(x.copy(), requires_grad=True)
    y = F.Shaped.apply(t, phi_hat=h)
    y.backward(np.ones_like(x))
    return y.data, t.grad


def shaped_gaps(maps_h, engine_h):
    """Largest gaps, in float64, between the engine op, the float64 phi_hat and finite
    differences (relative to the largest |phi_hat|, |phi_hat'|, at least 1), at points away
    from the kink."""
    x = X if maps_h.kink is None else X[np.abs(X - maps_h.kink) > 10 * H]
    y, g = shaped_engine(engine_h, x)
    size, scale = max(1.0, float(np.abs(y).max())), max(1.0, float(np.abs(g).max()))
    fd1 = (maps_h(x + H) - maps_h(x - H)) / (2 * H)
    fd2 = (shaped_engine(engine_h, x + H)[1] - shaped_engine(engine_h, x - H)[1]) / (2 * H)
    return dict(value=np.abs(y - maps_h(x)).max() / size, d1_op=np.abs(g - maps_h.d1(x)).max() / scale,
                d1_fd=np.abs(g - fd1).max() / scale, d2_fd=np.abs(maps_h.d2(x) - fd2).max() / scale,
                dtypes={y.dtype, g.dtype, maps_h(x).dtype, maps_h.d1(x).dtype, maps_h.d2(x).dtype})


@pytest.mark.parametrize("kind, name", TRANSFORMS, ids=[f"{k}-{n}" for k, n in TRANSFORMS])
def test_engine_op_and_float64_maps_evaluate_one_phi_hat(kind, name):
    """functions.Shaped and the Q/C maps (and solvers) read the same PhiHat, and evaluate the same
    phi_hat and phi_hat' in float64: exactly on the engine's generic path; on its fast path
    (scale_where's factor may differ from s a in the last bit) to 1e-15 relative. phi_hat' is the
    slope of phi_hat and phi_hat'' the slope of the engine's phi_hat'."""
    maps_h, engine_h = transform(kind, name)
    assert maps_h is engine_h                            # one value, not two equal ones
    err = shaped_gaps(maps_h, engine_h)
    assert err.pop("dtypes") == {np.dtype(np.float64)}
    if engine_h.homogeneous:
        assert err["value"] < FAST_PATH_RTOL and err["d1_op"] < FAST_PATH_RTOL, err
    else:
        assert err["value"] == 0.0 and err["d1_op"] == 0.0, err
    assert err["d1_fd"] < ATOL and err["d2_fd"] < ATOL, err


def test_a_planted_change_of_phi_hat_moves_engine_and_maps_together(monkeypatch):
    """PhiHat.pre (u = a x + b) moved by 1e-6 relative: the engine's op, the Q-map's quadrature
    and the solvers' per-layer quantities all move, and stay equal to each other."""
    h = act_transform.activation_transform("gelu", "dks", DEPTH).phi_hat
    x = np.linspace(-2.0, 2.0, 9)
    before = (shaped_engine(h, x)[0], local_maps.q_map(h, 1.5), act_transform._local("gelu", h.a, h.b, h.o)["Cslope"])
    real = ac.PhiHat.pre
    monkeypatch.setattr(ac.PhiHat, "pre", lambda self, x: real(self, x) * (1 + 1e-6))
    after = (shaped_engine(h, x)[0], local_maps.q_map(h, 1.5), act_transform._local("gelu", h.a, h.b, h.o)["Cslope"])
    assert np.abs(after[0] - before[0]).max() > 1e-7                  # the engine moved
    assert abs(after[1] - before[1]) > 1e-7 and abs(after[2] - before[2]) > 1e-7   # the maps moved
    err = shaped_gaps(h, h)
    assert err["value"] == 0.0 and err["d1_op"] == 0.0               # and still agree


def test_a_planted_wrong_phi_hat_derivative_is_caught(monkeypatch):
    """PhiHat.grad (s a phi'(a x + b)) off by 1e-5 relative: the engine's gradient check fails,
    and so does the float64 slope check. On the fast path, PhiHat.pieces off by 1e-12 relative
    is caught against the float64 phi_hat."""
    h = ac.PhiHat("gelu", a=0.8, b=0.3, s=1.3, o=-0.1)
    x = np.linspace(-2.0, 2.0, 9)
    assert check_jacobian(lambda t: F.Shaped.apply(t, phi_hat=h), [Tensor(x.copy(), requires_grad=True)]) < 1e-6
    real = ac.PhiHat.grad
    monkeypatch.setattr(ac.PhiHat, "grad", lambda self, u, g=None, xp=None: real(self, u, g, xp) * (1 + 1e-5))
    with pytest.raises(AssertionError, match="gradient check failed"):
        check_jacobian(lambda t: F.Shaped.apply(t, phi_hat=h), [Tensor(x.copy(), requires_grad=True)])
    assert shaped_gaps(h, h)["d1_fd"] > ATOL
    monkeypatch.undo()
    lrelu = ac.PhiHat("leaky_relu", a=0.8, s=1.3, o=-0.1, negative_slope=0.2)
    assert shaped_gaps(lrelu, lrelu)["value"] < FAST_PATH_RTOL
    k_pos, k_neg, offset = lrelu.pieces
    monkeypatch.setattr(ac.PhiHat, "pieces", property(lambda self: (k_pos * (1 + 1e-12), k_neg, offset)))
    assert shaped_gaps(lrelu, lrelu)["value"] > 100 * FAST_PATH_RTOL


@pytest.mark.parametrize("name", sorted(ac.ACTIVATIONS))
def test_float32_stays_float32(name):
    x32 = np.linspace(-3, 3, 7, dtype=np.float32)
    kw = OPTIONS.get(name, {})
    base = ac.ACTIVATIONS[name]
    assert base.fn(x32, **kw).dtype == np.float32
    assert base.d1(x32, np, **kw).dtype == np.float32 and base.d2(x32, np, **kw).dtype == np.float32
    t = Tensor(x32, requires_grad=True)
    y = Activation.apply(t, name=name, **kw)
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
    np.testing.assert_allclose(bac.softplus(x), np.log1p(np.exp(x)), rtol=1e-15, atol=1e-15)
    np.testing.assert_allclose(bac.swish(x), x * sig, rtol=1e-15, atol=1e-15)
    np.testing.assert_allclose(bac.elu(x), np.where(x > 0, x, np.exp(x) - 1), atol=1e-15)
    np.testing.assert_allclose(bac.gelu_exact(x), 0.5 * x * (1 + erf), atol=1e-15)
    np.testing.assert_array_equal(ac.leaky_relu(x, 0.2), np.where(x > 0, x, 0.2 * x))
    np.testing.assert_array_equal(ac.relu(x), np.maximum(x, 0))
    np.testing.assert_array_equal(bac.tanh(x), np.tanh(x))
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
