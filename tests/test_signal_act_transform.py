"""DKS and TAT solvers (nanospa/signal/act_transform.py, docs/activations.md §13): the
defining conditions, reference values, residual accounting, unreachable targets, bad
input, the ActivationTransform callable and its dtypes, and (when installed) agreement
with DeepMind's dks package; on a GPU, the callables on CuPy arrays.

The conditions are re-measured here with rules other than the solver's (finer
Gauss-Hermite, more Gauss-Legendre nodes) and, for smooth phi_hat, also from Hermite
coefficients of the callable alone, which checks the Price identities the solver uses.
"""
import math

import numpy as np
import pytest
from numpy.polynomial.hermite_e import hermegauss
from numpy.polynomial.legendre import leggauss

from nanospa.signal.act_transform import activation_transform, shaped_activation_names
from nanospa.signal.depth_targets import chain_c0
from nanospa.signal.activations import ACTIVATIONS, gelu
from nanospa.signal.local_maps import c_map
from nanospa.signal.gaussian_means import lrelu_beta

SMOOTH = ["gelu", "gelu_exact", "tanh", "sigmoid", "softplus", "swish"]
ALL = SMOOTH + ["elu", "leaky_relu"]
DEPTHS = [12, 36, 72]


# ------------------------------------------------------------------ test-side quadrature

_ZH, _WH = hermegauss(240)                 # finer than the solver's 160-node rule
_WH = _WH / math.sqrt(2.0 * math.pi)


def _rule(t):
    """1-D rule for E[g(z)]: 240-node Gauss-Hermite, or 200-node Gauss-Legendre pieces
    split at the kink -b/a (the solver uses 100 per piece)."""
    if not ACTIVATIONS[t.activation].kinked:
        return _ZH, _WH
    kink = -t.get("input_shift", 0.0) / t.get("input_scale", 1.0)
    x, w = leggauss(200)
    edges = [-12.0] + ([kink] if -12.0 < kink < 12.0 else []) + [12.0]
    Z = np.concatenate([(lo + hi) / 2 + (hi - lo) / 2 * x for lo, hi in zip(edges, edges[1:])])
    W = np.concatenate([(hi - lo) / 2 * w for lo, hi in zip(edges, edges[1:])])
    return Z, W * np.exp(-Z * Z / 2) / math.sqrt(2.0 * math.pi)


def _conditions(t):
    """Q(1), Q'(1), C(0), C'(1), C''(1) of phi_hat = t, using phi_hat' = s a phi'(a x + b)
    from the registry (checked against the engine and finite differences in test_activations.py)."""
    Z, W = _rule(t)
    a, b, s = t.get("input_scale", 1.0), t.get("input_shift", 0.0), t.get("output_scale", 1.0)
    kw = {"negative_slope": t["negative_slope"]} if "negative_slope" in t else {}
    base = ACTIVATIONS[t.activation]
    d1, d2 = base.d1(a * Z + b, np, **kw), base.d2(a * Z + b, np, **kw)
    f, f1, f2 = t(Z), s * a * d1, s * a * a * d2
    Q1 = W @ (f * f)
    return dict(Q1=Q1, Qslope=W @ (f * f1 * Z), C0=(W @ f) ** 2 / Q1,
                Cslope=(W @ (f1 * f1)) / Q1, Ccurv=(W @ (f2 * f2)) / Q1)


def _hermite_sums(t, n_nodes=320, N=120):
    """From phi_hat values only: h_n = E[phi_hat He_n]/sqrt(n!) and the Parseval tail;
    C(0) = h_0^2, C'(1) = sum n h_n^2, C''(1) = sum n (n-1) h_n^2 (with Q(1) = sum h_n^2)."""
    Z, W = hermegauss(n_nodes)
    W = W / math.sqrt(2.0 * math.pi)
    H = np.empty((N + 1, Z.size))
    H[0], H[1] = 1.0, Z
    for k in range(1, N):
        H[k + 1] = (Z * H[k] - math.sqrt(k) * H[k - 1]) / math.sqrt(k + 1)
    f = t(Z)
    h2 = (H @ (W * f)) ** 2
    n = np.arange(N + 1)
    return dict(tail=W @ (f * f) - h2.sum(), Q1=h2.sum(), C0=h2[0],
                Cslope=n @ h2, Ccurv=(n * (n - 1)) @ h2)


def _cases():
    for name in ALL:
        for method in ("dks", "tat"):
            for L in DEPTHS:
                if (name, method, L) == ("leaky_relu", "tat", 12):
                    continue                     # unreachable: tested in test_unreachable_*
                yield name, method, L


# -------------------------------------------------------------- defining conditions (§13)

@pytest.mark.parametrize("name,method,L", list(_cases()))
def test_defining_conditions(name, method, L):
    t = activation_transform(name, method, L)
    m = _conditions(t)
    assert abs(m["Q1"] - 1.0) < 1e-8                       # Q(1) = 1
    assert abs(m["Qslope"] - 1.0) < 1e-8                   # Q'(1) = 1
    if method == "dks":
        assert m["C0"] < 1e-10                             # C(0) = 0
        assert abs(m["Cslope"] / 1.5 ** (1.0 / L) - 1.0) < 1e-8
    elif name == "leaky_relu":
        c = 0.0
        for _ in range(L):                                 # chain C-map from 0
            c = float(c_map(t, c))
        assert abs(c - 0.9) < 1e-7                         # C_f(0) = eta
        assert abs(m["Cslope"] - 1.0) < 1e-8
    else:
        assert abs(m["Cslope"] - 1.0) < 1e-8               # C'(1) = 1
        assert abs(m["Ccurv"] - 0.3 / L) < 1e-8            # C''(1) = tau / L


@pytest.mark.parametrize("name", SMOOTH)
@pytest.mark.parametrize("method", ["dks", "tat"])
def test_price_identities_from_hermite_coefficients(name, method):
    # C(c) = sum h_n^2 c^n: conditions from values of phi_hat alone, no derivatives.
    L = 36
    t = activation_transform(name, method, L)
    h = _hermite_sums(t)
    assert h["tail"] < 1e-12                               # the series has converged
    assert abs(h["Q1"] - 1.0) < 1e-8
    if method == "dks":
        assert h["C0"] < 1e-10
        assert abs(h["Cslope"] / 1.5 ** (1.0 / L) - 1.0) < 1e-8
    else:
        assert abs(h["Cslope"] - 1.0) < 1e-8
        assert abs(h["Ccurv"] - 0.3 / L) < 1e-8


# --------------------------------------------------------------------- §11 reference values

def test_reference_values():
    t = activation_transform("leaky_relu", "tat", 36, eta=0.9)
    assert abs(t["negative_slope"] - 0.35112) < 1e-5        # §11 gives 5 digits
    assert abs(t["output_scale"] - 1.33435) < 1e-5
    assert t["output_scale"] == pytest.approx(math.sqrt(2 / (1 + t["negative_slope"] ** 2)), abs=1e-15)
    assert set(t) == {"negative_slope", "output_scale"}
    d = activation_transform("gelu", "dks", 36)
    assert d.local_targets["c_slope_1"] == pytest.approx(1.0113265851, abs=1e-10)
    assert set(d) == {"input_scale", "input_shift", "output_shift", "output_scale"}
    g = activation_transform("gelu", "tat", 36)
    assert g.local_targets["c_curv_1"] == pytest.approx(0.0083333, abs=1e-7)
    dl = activation_transform("leaky_relu", "dks", 36)
    assert set(dl) == {"negative_slope", "output_shift", "output_scale"}


# ------------------------------------------------------------------- residual accounting

def test_normalised_residual_targets():
    L, rb = 24, 0.3
    b2 = rb * rb
    d = activation_transform("gelu", "dks", L, residual_beta=rb)
    s = _conditions(d)["Cslope"]
    assert s == pytest.approx(min(1.5, (1.5 ** (1 / L) - (1 - b2)) / b2), rel=1e-8)
    assert max(s, ((1 - b2) + b2 * s) ** L) == pytest.approx(1.5, rel=1e-8)   # max over subnets
    g = activation_transform("gelu", "tat", L, residual_beta=rb)
    k = _conditions(g)["Ccurv"]
    assert max(k, L * b2 * k) == pytest.approx(0.3, abs=1e-8)                # curvatures add
    lr = activation_transform("leaky_relu", "tat", 72, residual_beta=0.8)
    x = 0.0
    for _ in range(72):                                    # x -> alpha_r^2 x + beta_r^2 C(x)
        x = 0.36 * x + 0.64 * float(c_map(lr, x))
    assert max(x, float(c_map(lr, 0.0))) == pytest.approx(0.9, abs=1e-7)
    # branch weight 1 is the chain
    assert dict(activation_transform("gelu", "dks", L, residual_beta=1.0)) == \
        dict(activation_transform("gelu", "dks", L))


# ----------------------------------------------------------------- unreachable, bad input

def test_unreachable_tat_leaky_names_the_bound():
    top = chain_c0(1 / math.pi, 12)                        # plain ReLU chain: largest C_f(0)
    assert top < 0.9 <= chain_c0(1 / math.pi, 13)          # so 13 layers is the first depth
    with pytest.raises(ValueError, match=f"{top:.6f}"):
        activation_transform("leaky_relu", "tat", 12, eta=0.9)
    activation_transform("leaky_relu", "tat", 13, eta=0.9)
    top = chain_c0(1 / math.pi, 36, residual_beta=0.5)
    with pytest.raises(ValueError, match=f"{top:.6f}"):
        activation_transform("leaky_relu", "tat", 36, eta=0.9, residual_beta=0.5)


def test_unreachable_dks_leaky_names_the_bound():
    top = math.pi / (math.pi - 1)                          # C'(1) of the centred ReLU
    with pytest.raises(ValueError, match=f"{top:.6f}"):
        activation_transform("leaky_relu", "dks", 1, zeta=1.5)
    with pytest.raises(ValueError, match=f"{top ** 2:.6f}"):
        activation_transform("leaky_relu", "dks", 2, zeta=2.2)
    activation_transform("leaky_relu", "dks", 2, zeta=2.1)


@pytest.mark.parametrize("args,kw,bad", [
    (("gelu", "dks", 12), {"zeta": 1.0}, "zeta=1.0"),
    (("gelu", "tat", 12), {"tau": 0.0}, "tau=0.0"),
    (("leaky_relu", "tat", 36), {"eta": 1.0}, "eta=1.0"),
    (("gelu", "dks", 0), {}, "depth"),
    (("gelu", "dks", 2.5), {}, "depth"),
    (("gelux", "dks", 12), {}, "gelux"),
    (("gelu", "kfac", 12), {}, "kfac"),
    (("relu", "tat", 12), {}, "leaky_relu"),
    (("relu", "dks", 12), {}, "leaky_relu"),
    (("gelu", "dks", 12), {"residual_beta": 0.0}, "residual_beta"),
])
def test_bad_input_raises(args, kw, bad):
    with pytest.raises(ValueError, match=bad):
        activation_transform(*args, **kw)


# ------------------------------------------------------------------- callable, names, dtype

def test_sigmoid_is_a_transformed_tanh():
    # §10: the sigmoid solution is the tanh one mapped by (2a, 2b, (o - 1)/2, 2s)
    x = np.linspace(-4, 4, 33)
    for method in ("dks", "tat"):
        s, t = activation_transform("sigmoid", method, 24), activation_transform("tanh", method, 24)
        np.testing.assert_allclose(s(x), t(x), rtol=1e-12, atol=1e-12)


def test_shaped_names_all_solve_and_keep_float32():
    x64 = np.linspace(-3, 3, 13)
    x32 = x64.astype(np.float32)
    for name, (base, method) in shaped_activation_names.items():
        t = activation_transform(base, method, 24)
        assert (t.activation, t.method) == (base, method)
        assert all(type(v) is float for v in t.values())   # Python floats: no promotion
        y32 = t(x32)
        assert y32.dtype == np.float32 and t.derivative(x32).dtype == np.float32
        np.testing.assert_allclose(y32, t(x64), rtol=1e-5, atol=1e-5 * np.abs(t(x64)).max())
        assert t.phi_hat(x64).dtype == np.float64 and t.phi_hat.d2(x32).dtype == np.float32
    for required in ("dks_gelu", "tat_lrelu", "tat_gelu"):
        assert required in shaped_activation_names


def test_derivative_method_matches_finite_differences():
    x = np.array([-2.0, -0.7, 0.3, 1.9])
    for t in (activation_transform("gelu", "tat", 36), activation_transform("elu", "dks", 12),
              activation_transform("leaky_relu", "dks", 12)):
        fd = (t(x + 1e-6) - t(x - 1e-6)) / 2e-6
        np.testing.assert_allclose(t.derivative(x), fd, rtol=1e-7)


def test_method_none_and_plain_names():
    x = np.linspace(-2, 2, 9)
    t = activation_transform("gelu", None)
    assert len(t) == 0 and t.method == "none"
    np.testing.assert_array_equal(t(x), gelu(x))
    p = activation_transform("relu", None)
    np.testing.assert_array_equal(p(x), np.maximum(x, 0))
    assert activation_transform("tanh", "none", 12).params == {}


def test_transform_params_are_read_only_and_cached():
    t = activation_transform("gelu", "dks", 12)
    with pytest.raises(TypeError):
        t.params["input_scale"] = 1.0
    assert activation_transform("gelu", "dks", 12) is t


# ----------------------------------------------------------------- optional: dks package

def test_agrees_with_dks_package():
    D = pytest.importorskip("dks.base.activation_transform")

    def chain(L):
        def subnet_max_func(x, r_fn):
            for _ in range(L):
                x = r_fn(x)
            return x
        return subnet_max_func

    # same start order and the same root: parameters agree to dks's solver tolerance
    # (hybr xtol ~1.5e-8 relative, 100,000-node quadrature); 1e-6 as in §5.
    cases = [("leaky_relu", "TAT", 36), ("gelu", "DKS", 12), ("gelu", "TAT", 12),
             ("tanh", "DKS", 12)]
    for name, method, L in cases:
        ref = D._get_activations_params([name], method=method, subnet_max_func=chain(L))[name]
        ours = activation_transform(name, method.lower(), L)
        for k, v in ref.items():
            if k == "input_shift" and name == "leaky_relu":
                continue
            assert ours[k] == pytest.approx(float(v), rel=1e-6, abs=1e-6), (name, method, k)


def test_callables_on_cupy_match_numpy():
    # runs only where CuPy sees a GPU: the same operator-only code on device arrays
    from nanospa import backend
    if not backend.cuda_available():
        pytest.skip("CuPy with a GPU not available")
    x = np.linspace(-4, 4, 257, dtype=np.float32)
    xd = backend.use("cuda").asarray(x)                   # a CuPy array
    for name in shaped_activation_names:
        t = activation_transform(*shaped_activation_names[name], 24)
        for f in (t, t.derivative):
            y = f(xd)
            assert y.dtype == np.float32
            ref = f(x)
            # float32 rounding on both sides: a few ulps of the largest value
            np.testing.assert_allclose(backend.to_numpy(y), ref, rtol=0, atol=1e-6 * np.abs(ref).max())
