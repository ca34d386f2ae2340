"""Shaped activations (docs/activations.md §13): DKS/TAT defining conditions, Q/C maps
against closed forms, finer rules and Monte Carlo, reference values, unreachable targets,
dtypes, and (when installed) agreement with DeepMind's dks package.

The conditions are re-measured here with rules other than the solver's (finer
Gauss-Hermite, more Gauss-Legendre nodes) and, for smooth phi_hat, also from Hermite
coefficients of the callable alone, which checks the Price identities the solver uses.
"""
import math

import numpy as np
import pytest
from numpy.polynomial.hermite_e import hermegauss
from numpy.polynomial.legendre import leggauss

from nanospa.signal import act_transform as at
from nanospa.signal.act_transform import (
    activation_transform, alpha_of_beta, c_map, chain_c0, local_cmap, lrelu_beta,
    lrelu_cmap, q_map, shaped_activation, shaped_activation_names)

SMOOTH = ["gelu", "gelu_exact", "tanh", "sigmoid", "softplus", "swish"]
ALL = SMOOTH + ["elu", "leaky_relu"]
DEPTHS = [12, 36, 72]
C_POINTS = np.array([0.0, 0.25, 0.5, 0.75, 0.9, 0.99])

# ------------------------------------------------------------------ test-side quadrature

_ZH, _WH = hermegauss(240)                 # finer than the solver's 160-node rule
_WH = _WH / math.sqrt(2.0 * math.pi)


def _rule(t):
    """1-D rule for E[g(z)]: 240-node Gauss-Hermite, or 200-node Gauss-Legendre pieces
    split at the kink -b/a (the solver uses 100 per piece)."""
    if not at.ACTIVATIONS[t.activation].kinked:
        return _ZH, _WH
    kink = -t.get("input_shift", 0.0) / t.get("input_scale", 1.0)
    x, w = leggauss(200)
    edges = [-12.0] + ([kink] if -12.0 < kink < 12.0 else []) + [12.0]
    Z = np.concatenate([(lo + hi) / 2 + (hi - lo) / 2 * x for lo, hi in zip(edges, edges[1:])])
    W = np.concatenate([(hi - lo) / 2 * w for lo, hi in zip(edges, edges[1:])])
    return Z, W * np.exp(-Z * Z / 2) / math.sqrt(2.0 * math.pi)


def _conditions(t):
    """Q(1), Q'(1), C(0), C'(1), C''(1) of phi_hat = t, using phi_hat' = s a phi'(a x + b)
    from the derivative table (itself checked against finite differences below)."""
    Z, W = _rule(t)
    a, b, s = t.get("input_scale", 1.0), t.get("input_shift", 0.0), t.get("output_scale", 1.0)
    kw = {"negative_slope": t["negative_slope"]} if "negative_slope" in t else {}
    d1, d2 = at.ACTIVATIONS[t.activation].d12(a * Z + b, np, **kw)
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


# --------------------------------------------------------------------------- base maps

@pytest.mark.parametrize("name", sorted(at.ACTIVATIONS))
def test_derivative_table_matches_finite_differences(name):
    # points away from the kink at 0; central differences with h = 1e-5 have truncation
    # ~h^2 |phi'''| / 6 < 1e-10 and rounding ~1e-16 / h = 1e-11, so 1e-8 is safe.
    x = np.array([-3.1, -1.7, -0.6, -0.05, 0.07, 0.4, 1.3, 2.9])
    base, h = at.ACTIVATIONS[name], 1e-5
    d1, d2 = base.d12(x, np)
    fd1 = (base.fn(x + h) - base.fn(x - h)) / (2 * h)
    fd2 = (base.d12(x + h, np)[0] - base.d12(x - h, np)[0]) / (2 * h)
    np.testing.assert_allclose(d1, fd1, rtol=0, atol=1e-8)
    np.testing.assert_allclose(d2, fd2, rtol=0, atol=1e-8)


def test_base_activation_values():
    x = np.array([-2.0, -0.5, 0.0, 0.5, 2.0])
    sig = 1.0 / (1.0 + np.exp(-x))
    erf = np.array([math.erf(v / math.sqrt(2.0)) for v in x])
    np.testing.assert_allclose(at.sigmoid(x), sig, rtol=1e-15, atol=1e-15)
    np.testing.assert_allclose(at.softplus(x), np.log1p(np.exp(x)), rtol=1e-15, atol=1e-15)
    np.testing.assert_allclose(at.swish(x), x * sig, rtol=1e-15, atol=1e-15)
    np.testing.assert_allclose(at.elu(x), np.where(x > 0, x, np.exp(x) - 1), atol=1e-15)
    np.testing.assert_allclose(at.gelu_exact(x), 0.5 * x * (1 + erf), atol=1e-15)
    np.testing.assert_array_equal(at.leaky_relu(x, 0.2), np.where(x > 0, x, 0.2 * x))
    np.testing.assert_array_equal(at.relu(x), np.maximum(x, 0))
    # the tanh approximation differs from x Phi(x) by at most ~5e-4 on this range
    assert 0 < np.abs(at.gelu(x) - at.gelu_exact(x)).max() < 1e-3


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


@pytest.mark.parametrize("name", ["gelu", "elu", "leaky_relu"])
def test_q_map_slope_by_finite_differences(name):
    # Q'(1) = 1 on the public q_map: central difference with h = 1e-4 has truncation
    # h^2 |Q'''| / 6, below 1e-8 for these maps (|Q'''| < 1 near q = 1), rounding ~1e-12.
    t = activation_transform(name, "dks", 12)
    h = 1e-4
    slope = (q_map(t, 1 + h) - q_map(t, 1 - h)) / (2 * h)
    assert abs(slope - 1.0) < 1e-8
    assert abs(q_map(t, 1.0) - 1.0) < 1e-12


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


# ------------------------------------------------------------- closed forms vs quadrature

@pytest.mark.parametrize("case", [("leaky_relu", "tat", 36), ("leaky_relu", "dks", 12), "relu",
                                  "leaky_relu"])
@pytest.mark.parametrize("q", [1.0, 2.5])
def test_leaky_closed_form_vs_split_quadrature(case, q):
    t = activation_transform(*case) if isinstance(case, tuple) else case
    f = t if not isinstance(t, str) else at.ACTIVATIONS[t].fn
    c = np.array([-0.9, -0.3, 0.0, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0])
    closed = c_map(t, c, q=q)
    quad = c_map(lambda x: f(x), c, q=q, kink=0.0)         # a bare callable: split rule
    np.testing.assert_allclose(closed, quad, rtol=0, atol=1e-8)
    qs = np.array([0.3, 1.0, 2.5])
    np.testing.assert_allclose(q_map(t, qs), q_map(lambda x: f(x), qs, kink=0.0), rtol=1e-10)


def test_lrelu_cmap_forms():
    c = np.linspace(-1, 1, 41)
    for al in (0.0, 0.2, 0.35112, 0.9):
        beta = float(lrelu_beta(al))
        direct = ((1 - al) ** 2 * (np.sqrt(1 - c * c) + (np.pi - np.arccos(c)) * c) / np.pi
                  + 2 * al * c) / (1 + al * al)                             # §5 first form
        np.testing.assert_allclose(lrelu_cmap(c, al), direct, atol=1e-15)
        assert lrelu_cmap(0.0, al) == pytest.approx(beta, abs=1e-15)
        assert alpha_of_beta(beta) == pytest.approx(al, abs=1e-12)
    assert chain_c0(lrelu_beta(0.3), 1) == pytest.approx(float(lrelu_beta(0.3)), abs=1e-15)


@pytest.mark.parametrize("name", SMOOTH + ["elu"])
@pytest.mark.parametrize("method", ["dks", "tat"])
def test_cmap_against_finer_rule(name, method):
    # §8: 160 x 160 Gauss-Hermite is good to ~1e-14 for smooth phi_hat; the split rule
    # converges as fast. 1e-10 leaves room for summing 25,600 terms of size ~1.
    t = activation_transform(name, method, 36)
    fine = c_map(t, C_POINTS, n=240 if name != "elu" else 200)
    np.testing.assert_allclose(c_map(t, C_POINTS), fine, rtol=0, atol=1e-10)
    assert c_map(t, 1.0) == pytest.approx(1.0, abs=1e-12)
    assert np.all(np.diff(fine) > 0)                       # increasing on [0, 1]
    assert np.all(np.diff(np.diff(fine) / np.diff(C_POINTS)) > 0)   # convex: slopes increase
    # vectorised local map: Hermite series (smooth) or quadrature (elu)
    np.testing.assert_allclose(local_cmap(t).C(C_POINTS), fine, rtol=0, atol=1e-11)


@pytest.mark.parametrize("case", [("gelu", "tat", 12), ("tanh", "dks", 12), ("sigmoid", "tat", 36),
                                  ("elu", "tat", 12), ("leaky_relu", "dks", 12),
                                  ("leaky_relu", "tat", 36)])
def test_cmap_against_monte_carlo_wide_layer(case):
    # A random layer W (n_in, M), entries N(0, 1/n_in), applied to two inputs with
    # |x|^2 = n_in and x1.x2 = c n_in: each of the M output units is an exact draw of
    # (u, v) with correlation c, so mean(phi_hat(u) phi_hat(v)) -> C(c) at rate 1/sqrt(M).
    # Tolerance: 5 standard errors of that mean (seeded, so deterministic).
    t = activation_transform(*case)
    rng = np.random.default_rng(7)
    n_in, M = 16, 200_000
    for c in C_POINTS:
        e = np.linalg.qr(rng.standard_normal((n_in, 2)))[0].T * math.sqrt(n_in)   # orthogonal rows
        X = np.stack([e[0], c * e[0] + math.sqrt(1 - c * c) * e[1]])               # (2, n_in)
        H = X @ (rng.standard_normal((n_in, M)) / math.sqrt(n_in))                 # (2, M)
        prod = t(H[0]) * t(H[1])
        se = prod.std() / math.sqrt(M)
        assert abs(prod.mean() - c_map(t, c)) < 5 * se, (c, prod.mean(), c_map(t, c), se)


# ------------------------------------------------------------------ local maps, kernels

@pytest.mark.parametrize("case", [("gelu", "tat", 12), ("tanh", "dks", 36), ("elu", "dks", 12),
                                  ("leaky_relu", "dks", 12), ("leaky_relu", "tat", 36)])
def test_kernel_map(case):
    # Sigma' = E[phi_hat(u) phi_hat(u)^T] for u ~ N(0, Sigma) with unequal q-values,
    # against an entry-by-entry 2-D rule written here: x1 = sqrt(q1) z1,
    # x2 = sqrt(q2) (rho z1 + sqrt(1 - rho^2) z2), 400 x 400 Gauss-Legendre on [-12, 12]^2
    # for smooth phi_hat (1e-10), or against the split quadrature for kinked phi_hat.
    t = activation_transform(*case)
    rng = np.random.default_rng(3)
    T = 5
    X = rng.standard_normal((T, 12))
    S = X @ X.T / 12
    K = local_cmap(t).kernel(S)
    assert K.shape == (T, T) and np.allclose(K, K.T, atol=1e-14)
    np.testing.assert_allclose(np.diag(K), q_map(t, np.diag(S)), rtol=1e-10)
    x, w = leggauss(400)
    x, w = 12 * x, 12 * w * np.exp(-72 * x * x) / math.sqrt(2 * math.pi)
    smooth = not at.ACTIVATIONS[t.activation].kinked
    for i, j in [(0, 1), (2, 4), (3, 0)]:
        q1, q2 = S[i, i], S[j, j]
        rho = S[i, j] / math.sqrt(q1 * q2)
        if smooth:
            z1, z2 = x[:, None], x[None, :]
            ref = w @ (t(math.sqrt(q1) * z1) * t(math.sqrt(q2) * (rho * z1 + math.sqrt(1 - rho ** 2) * z2))) @ w
        else:
            ref = t._hat.bivariate(q1, q2, rho, n=200)
        assert abs(K[i, j] - ref) < 1e-10 * max(1.0, abs(ref))
    # with unit diagonal the kernel map is the C-map
    C = S / np.sqrt(np.outer(np.diag(S), np.diag(S)))
    np.testing.assert_allclose(local_cmap(t).kernel(C), local_cmap(t).C(C), atol=1e-11)


def test_kernel_map_large_q_falls_back_to_quadrature():
    # for q = 400 the Hermite series of TAT-tanh is too slow: those entries use quadrature
    t = activation_transform("tanh", "tat", 36)
    S = np.array([[400.0, 200.0], [200.0, 1.0 * 400]])
    K = local_cmap(t).kernel(S)
    assert K[0, 0] == pytest.approx(float(q_map(t, 400.0)), rel=1e-10)
    assert K[0, 1] == pytest.approx(float(c_map(t, 0.5, q=400.0)) * float(q_map(t, 400.0)), rel=1e-10)


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


def test_bad_map_input_raises():
    with pytest.raises(ValueError, match="c"):
        c_map("tanh", 1.5)
    with pytest.raises(ValueError, match="q"):
        q_map("tanh", -1.0)


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
        t = shaped_activation(name, 24)
        assert (t.activation, t.method) == (base, method)
        assert dict(t) == dict(activation_transform(base, method, 24))
        assert all(type(v) is float for v in t.values())   # Python floats: no promotion
        y32 = t(x32)
        assert y32.dtype == np.float32 and t.derivative(x32).dtype == np.float32
        np.testing.assert_allclose(y32, t(x64), rtol=1e-5, atol=1e-5 * np.abs(t(x64)).max())
        assert t.fn(x64).dtype == np.float64
    for required in ("dks_gelu", "tat_lrelu", "tat_gelu"):
        assert required in shaped_activation_names


@pytest.mark.parametrize("name", sorted(at.ACTIVATIONS))
def test_base_activations_keep_float32(name):
    x32 = np.linspace(-3, 3, 7, dtype=np.float32)
    assert at.ACTIVATIONS[name].fn(x32).dtype == np.float32
    assert all(d.dtype == np.float32 for d in at.ACTIVATIONS[name].d12(x32, np))


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
    np.testing.assert_array_equal(t(x), at.gelu(x))
    p = shaped_activation("relu")
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
        t = shaped_activation(name, 24)
        for f in (t, t.derivative):
            y = f(xd)
            assert y.dtype == np.float32
            ref = f(x)
            # float32 rounding on both sides: a few ulps of the largest value
            np.testing.assert_allclose(backend.to_numpy(y), ref, rtol=0, atol=1e-6 * np.abs(ref).max())
