"""nanospa/functions.py: the elementwise primitives (and beyond/dropout.py's op, an elementwise
one too).

Every op against float64 central differences (full Jacobian, random upstream gradient),
float32 in -> float32 out (values and gradients), the Shaped fast path (TAT's leaky ReLU
as one select and one product) against the definition s (phi(a x + b) + o), and the
leaky-ReLU slope as a required argument. (Shaped against signal's float64 phi_hat, for every
activation and transform: tests/test_activations.py.)
"""
import numpy as np
import pytest

from conftest import assert_full_jacobian, assert_keeps_float32
from nanospa import Tensor
from nanospa import functions as F
from nanospa.beyond.dropout import dropout
from nanospa.gradcheck import check_jacobian
from nanospa.more_ops import Activation
from nanospa.signal.activations import PhiHat

R = np.random.default_rng(0)


def normal(*shape):
    return R.standard_normal(shape)


def away_from_zero(*shape):
    """Values with |x| in [0.2, 2]: central differences never straddle a kink at 0."""
    return np.sign(R.standard_normal(shape)) * R.uniform(0.2, 2.0, shape)


def positive(*shape):
    return R.uniform(0.5, 2.0, shape)


KEEP = R.uniform(size=(2, 3, 4)) > 0.3     # a fixed dropout mask: the op is checked with it held


def act(name, **kw):
    """more_ops.Activation of ACTIVATIONS[name]."""
    return lambda t: Activation.apply(t, name=name, **kw)


def shaped(t, base, **kw):
    """functions.Shaped of PhiHat(base, **kw) on the Tensor t."""
    return F.Shaped.apply(t, phi_hat=PhiHat(base, **kw))


# name -> (function of Tensors, input arrays)
OPS = {
    "add_broadcast": (lambda a, b: a + b, [normal(2, 3, 4), normal(3, 1)]),
    "sub_broadcast": (lambda a, b: a - b, [normal(4), normal(2, 3, 4)]),
    "mul_broadcast": (lambda a, b: a * b, [normal(2, 3, 4), normal(1, 3, 1)]),
    "div": (lambda a, b: a / b, [normal(3, 4), positive(3, 4)]),
    "neg": (lambda a: -a, [normal(3, 4)]),
    "pow": (lambda a: a ** 2.5, [positive(3, 4)]),
    "rsub_scalar": (lambda a: 2.0 - a * 3.0, [normal(3, 4)]),
    "rdiv_scalar": (lambda a: 1.5 / a, [positive(3, 4)]),
    "tanh": (act("tanh"), [normal(3, 4)]),
    "sigmoid": (act("sigmoid"), [normal(3, 4) * 3]),
    "relu": (act("relu"), [away_from_zero(3, 4)]),
    "leaky_relu": (act("leaky_relu", negative_slope=0.2), [away_from_zero(3, 4)]),
    "gelu_tanh": (act("gelu"), [normal(3, 4) * 2]),
    "gelu_exact": (act("gelu_exact"), [normal(3, 4) * 2]),
    "softplus": (act("softplus"), [normal(3, 4) * 3]),
    "elu": (act("elu"), [away_from_zero(3, 4)]),
    "swish": (act("swish"), [normal(3, 4) * 2]),
    "dropout": (lambda a: dropout(a, KEEP, 0.3), [normal(2, 3, 4)]),
    "shaped_lrelu": (lambda a: shaped(a, "leaky_relu", s=1.3, negative_slope=0.35), [away_from_zero(3, 4)]),
    "shaped_lrelu_shifted": (lambda a: shaped(a, "leaky_relu", a=0.9, b=0.05, s=1.1, negative_slope=0.2),
                             [away_from_zero(3, 4)]),
    "shaped_gelu": (lambda a: shaped(a, "gelu", a=0.8, b=0.3, s=1.7, o=-0.2), [normal(3, 4)]),
    "shaped_gelu_exact": (lambda a: shaped(a, "gelu_exact", a=1.1, s=0.9), [normal(3, 4)]),
    "shaped_tanh": (lambda a: shaped(a, "tanh", a=0.5, b=-0.1, s=2.0, o=0.1), [normal(3, 4)]),
    "shaped_sigmoid": (lambda a: shaped(a, "sigmoid", a=1.5, s=3.0, o=-0.5), [normal(3, 4)]),
    "shaped_relu": (lambda a: shaped(a, "relu", s=1.4), [away_from_zero(3, 4)]),
    "shaped_linear": (lambda a: shaped(a, "linear", a=0.6, b=0.2, s=1.5, o=-0.3), [normal(3, 4)]),
    "shaped_softplus_elu_swish": (lambda a: shaped(a, "softplus", a=0.7) + shaped(a, "elu", s=1.2, b=0.05)
                                  + shaped(a, "swish", a=1.3, o=0.2), [away_from_zero(3, 4)]),
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_op_full_jacobian(name):
    assert_full_jacobian(*OPS[name])


@pytest.mark.parametrize("name", sorted(OPS))
def test_op_float32_in_float32_out(name):
    assert_keeps_float32(name, *OPS[name])


@pytest.mark.parametrize("base,opts", [("leaky_relu", dict(a=0.7, s=1.3, o=0.2, negative_slope=0.3)),
                                       ("relu", dict(a=2.5, s=-0.8, o=-0.1))])
def test_shaped_fast_path_is_the_shaped_activation(base, opts):
    """s (phi(a x) + o) for positively homogeneous phi, a > 0 (the fast path), against the
    definition, and its full Jacobian."""
    x = away_from_zero(4, 5)
    slope = opts.get("negative_slope", 0.0)
    u = opts["a"] * x
    expected = opts["s"] * (np.where(u > 0, u, slope * u) + opts["o"])
    assert PhiHat(base, **opts).homogeneous
    y = shaped(Tensor(x), base, **opts).data
    np.testing.assert_allclose(y, expected, rtol=1e-14)
    assert check_jacobian(lambda t: shaped(t, base, **opts), [Tensor(x, requires_grad=True)], rtol=1e-6) < 1e-6


def test_shaped_generic_path_still_used_with_a_shift():
    """b != 0 takes the generic path (phi(a x + b) is not a phi(x)); same definition."""
    x = away_from_zero(3, 4)
    assert not PhiHat("leaky_relu", a=0.9, b=0.05, negative_slope=0.2).homogeneous
    y = shaped(Tensor(x), "leaky_relu", a=0.9, b=0.05, s=1.1, negative_slope=0.2).data
    u = 0.9 * x + 0.05
    np.testing.assert_allclose(y, 1.1 * np.where(u > 0, u, 0.2 * u), rtol=1e-14)


def test_leaky_relu_slope_is_required():
    """The slope is a model choice (nanospa.signal defines the plain one): no default."""
    x = Tensor(away_from_zero(3))
    with pytest.raises(ValueError, match="a slope is needed for 'leaky_relu' and only there"):
        shaped(x, "leaky_relu", s=1.3)
    with pytest.raises(ValueError, match="a slope is needed for 'leaky_relu' and only there"):
        shaped(x, "tanh", negative_slope=0.2)
