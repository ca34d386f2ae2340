"""nanospa/beyond/kfac.py: K-FAC's factors against explicit sums over a batch, its direction against
the exact Fisher of one Linear built by brute force in float64 (where the Kronecker
factorisation is exact, and where it is not), damping, the inverse refresh, KL clipping and
momentum, the checkpointed state and an exact resume, threads, CuPy, and that the AdamW path
records nothing (docs/kfac.md states what is tested here).

Notation as in docs/kfac.md: W (n_in, n_out), row-major vec, so the gradient of one row's
loss is kron(x, g) and (A (x) G) vec(M) = vec(A M G)."""
import io

import numpy as np
import pytest
from conftest import DEVICES, tiny_config

from nanospa.run import threads as cpu
from nanospa import GPT, AdamW, Tensor, backend
from nanospa.beyond import kfac
from nanospa.fused import cross_entropy
from nanospa.nn import Linear, Module
from nanospa.beyond.kfac import KFAC
from nanospa.optim import clip_grad_norm

LAM = 1e-3


# ----------------------------------------------------------------------------- helpers

class OneLinear(Module):
    """Fixed features per token (a buffer), then the one trainable layer: a Linear giving the
    logits. Fed single-token sequences (B, 1)."""

    def __init__(self, features, n_out, bias, rng):
        super().__init__()
        self.register_buffer("features", features)
        self.head = Linear(features.shape[1], n_out, bias=bias, rng=rng, dtype="float64")

    def forward(self, idx):
        return self.head(Tensor(self.features[np.asarray(idx)]))  # (B, 1) -> (B, 1, n_in) -> (B, 1, V)


def one_linear(exact, bias=True, n_in=4, V=5, N=6, seed=0):
    """The model, its single-token batch and targets. exact: W's rows 2.. are zero and the
    inputs differ only there, so every token has the same predictive distribution."""
    rng = np.random.default_rng(seed)
    feats = rng.standard_normal((N, n_in))
    model = OneLinear(feats, V, bias, rng)
    model.head.weight.data = 2.0 * rng.standard_normal((n_in, V))
    if bias:
        model.head.bias.data = rng.standard_normal(V)
    if exact:
        model.head.weight.data[2:] = 0.0
        feats[:, :2] = feats[0, :2]                       # x_n = x_0 + u_n with u_n W = 0
    return model, np.arange(N)[:, None], rng.integers(0, V, size=(N, 1))


def softmax(z):
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def brute_force(model, idx, targets):
    """float64 by hand: inputs with the homogeneous 1, probabilities, the exact Fisher
    F = 1/N sum_n sum_k p_nk v v^T with v = kron(x_n, p_n - e_k), the gradient of the mean
    loss, and the Kronecker factors A = 1/N sum x x^T, G = 1/N sum (diag p - p p^T)."""
    lin = model.head
    X = model.features[idx[:, 0]]
    if lin.bias is not None:
        X = np.concatenate([X, np.ones((len(X), 1))], axis=1)
    Wb = lin.weight.data if lin.bias is None else np.vstack([lin.weight.data, lin.bias.data])
    P = softmax(X @ Wb)
    N, V = P.shape
    F = np.zeros((Wb.size, Wb.size))
    grad = np.zeros(Wb.size)
    for n in range(N):
        for k in range(V):
            v = np.kron(X[n], P[n] - np.eye(V)[k])
            F += P[n, k] * np.outer(v, v) / N
        grad += np.kron(X[n], P[n] - np.eye(V)[targets[n, 0]]) / N
    A = sum(np.outer(x, x) for x in X) / N
    G = sum(np.diag(p) - np.outer(p, p) for p in P) / N
    return F, grad, A, G


def kfac_direction(model, idx, targets, **kw):
    """K-FAC's direction for the one Linear (row-major, bias last) and the model's gradient."""
    opt = KFAC(model, fisher="exact", stats_fraction=1.0, damping=LAM, **kw)
    model.zero_grad()
    cross_entropy(model(idx), targets).backward()
    opt.update_curvature(idx, targets)
    opt.refresh_inverses()
    d = opt.precondition()
    lin = model.head
    parts = [d[0]] + ([d[1][None, :]] if lin.bias is not None else [])
    grads = [lin.weight.grad] + ([lin.bias.grad[None, :]] if lin.bias is not None else [])
    return np.concatenate(parts).ravel(), np.concatenate(grads).ravel(), opt


def factored_reference(A, G, grad):
    """((A + pi sqrt(lam) I) (x) (G + sqrt(lam)/pi I))^-1 grad, pi = sqrt((trA/n_A)/(trG/n_G))."""
    pi = np.sqrt((np.trace(A) / len(A)) / (np.trace(G) / len(G)))
    r = np.sqrt(LAM)
    M = np.kron(A + pi * r * np.eye(len(A)), G + r / pi * np.eye(len(G)))
    return np.linalg.solve(M, grad)


def rel(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


# ----------------------------------------------------------------------------- the exact Fisher

@pytest.mark.parametrize("bias", [False, True])
def test_direction_is_the_damped_exact_fisher_inverse(bias):
    """Single tokens, one trainable Linear, every token with the same predictive distribution:
    F = 1/N sum_n x_n x_n^T (x) G_n = A (x) G exactly (the difference is
    1/N sum_n (x_n x_n^T - A) (x) (G_n - G), zero when all G_n agree). Then K-FAC's direction
    with exact damping is (F + lam I)^-1 g, and with factored damping the explicit
    (A + pi sqrt(lam) I) (x) (G + sqrt(lam)/pi I) solve."""
    model, idx, y = one_linear(exact=True, bias=bias)
    F, grad, A, G = brute_force(model, idx, y)
    assert np.abs(np.kron(A, G) - F).max() < 1e-14          # the condition holds
    P = softmax(model.head(Tensor(model.features[idx[:, 0]])).data)
    assert np.ptp(P[0]) > 0.1                               # and the prediction is not uniform
    d, g, _ = kfac_direction(model, idx, y, damping_mode="exact")
    np.testing.assert_allclose(g, grad, rtol=1e-12, atol=1e-15)  # the engine's gradient
    exact = np.linalg.solve(F + LAM * np.eye(len(F)), grad)
    assert rel(d, exact) < 1e-10
    d, _, _ = kfac_direction(model, idx, y, damping_mode="factored")
    assert rel(d, factored_reference(A, G, grad)) < 1e-10


def test_planted_pi_error_is_caught(monkeypatch):
    """The factored comparison has teeth: without the pi correction (pi = 1) it fails."""
    model, idx, y = one_linear(exact=True)
    _, grad, A, G = brute_force(model, idx, y)
    monkeypatch.setattr(kfac, "pi_correction", lambda evA, evG: 1.0)
    d, _, _ = kfac_direction(model, idx, y, damping_mode="factored")
    assert rel(d, factored_reference(A, G, grad)) > 1e-3


def test_where_the_factorisation_is_not_exact():
    """Distinct predictive distributions: A (x) G differs from F by a visible amount, so the
    direction differs from (F + lam I)^-1 g, and it is exactly (A (x) G + lam I)^-1 g."""
    model, idx, y = one_linear(exact=False)
    F, grad, A, G = brute_force(model, idx, y)
    gap = np.linalg.norm(np.kron(A, G) - F) / np.linalg.norm(F)
    d, _, _ = kfac_direction(model, idx, y, damping_mode="exact")
    kron = np.linalg.solve(np.kron(A, G) + LAM * np.eye(len(F)), grad)
    exact = np.linalg.solve(F + LAM * np.eye(len(F)), grad)
    assert gap > 0.05 and rel(d, exact) > 0.05
    assert rel(d, kron) < 1e-10


# ----------------------------------------------------------------------------- factors

def lin_has_bias(model, name):
    return dict(kfac.linears(model))[name].bias is not None


def record_rows(model):
    """Wrap every Linear's forward: keep its input rows and a zero probe added to its output,
    whose gradient is then d(sum of token losses)/dy, row by row."""
    rows = {}
    for name, lin in kfac.linears(model):
        def fwd(x, lin=lin, name=name, orig=lin.forward):
            out = orig(x)
            e = Tensor(np.zeros(out.shape), requires_grad=True)
            rows[name] = (x.data.reshape(-1, x.shape[-1]).copy(), e)
            return out + e
        lin.forward = fwd
    return rows


@pytest.mark.parametrize("fisher", ["empirical", "sampled"])
def test_factors_equal_explicit_sums(fisher):
    """A and G of every Linear (GPT with biases: homogeneous coordinate) equal
    1/R sum_r x_r x_r^T and 1/R sum_r g_r g_r^T over the R = B T rows, g_r from a separate
    backward of the token losses' sum with the same targets (the sampled ones redrawn here
    from the documented rule: u = default_rng([seed, t]), first class with cdf > u)."""
    cfg = tiny_config(bias=True)
    model, rng = GPT(cfg, seed=0), np.random.default_rng(5)
    x, y = rng.integers(0, cfg.vocab_size, size=(2, 2, cfg.block_size))
    opt = KFAC(model, fisher=fisher, stats_fraction=1.0, seed=7, ema=0.9)
    opt.update_curvature(x, y)
    rows = record_rows(model)
    logits = model(x)[0]
    if fisher == "sampled":
        P = softmax(logits.data.reshape(-1, cfg.vocab_size))
        u = np.random.default_rng([7, 0]).random(len(P))
        y = np.array([np.searchsorted(np.cumsum(p), v, side="right") for p, v in zip(P, u)]).reshape(y.shape)
    R = y.size
    (cross_entropy(logits, y) * R).backward()
    for i, (name, _) in enumerate(kfac.linears(model)):
        X, e = rows[name]
        if lin_has_bias(model, name):                        # the homogeneous coordinate
            X = np.concatenate([X, np.ones((len(X), 1))], axis=1)
        g = e.grad.reshape(-1, e.shape[-1])
        A = sum(np.outer(r, r) for r in X) / R
        G = sum(np.outer(r, r) for r in g) / R
        fa, fg = opt.factors(i)
        np.testing.assert_allclose(fa, A, rtol=1e-12, atol=1e-15, err_msg=name)
        np.testing.assert_allclose(fg, G, rtol=1e-12, atol=1e-15, err_msg=name)


def test_sampled_targets_follow_the_model():
    """Inverse-CDF draws: class frequencies within 5 standard errors of p."""
    p = softmax(np.random.default_rng(0).standard_normal((1, 6)) * 2)[0]
    n = 40000
    k = kfac.sample_targets(np.tile(p, (n, 1)), np.random.default_rng(1).random(n))
    freq = np.bincount(k, minlength=6) / n
    assert np.all(np.abs(freq - p) < 5 * np.sqrt(p * (1 - p) / n))


def test_moving_average_is_bias_corrected():
    """factors() = sum_j (1-ema) ema^(n-j) F_j / (1 - ema^n) over n batch estimates F_j."""
    model, idx, y = one_linear(exact=False)
    opt, est = KFAC(model, fisher="exact", stats_fraction=1.0, ema=0.8), []
    for j in range(3):
        sub = idx[j:j + 3]
        opt.update_curvature(sub, y[j:j + 3])
        est.append(brute_force(model, sub, y[j:j + 3])[2:])
    w = np.array([0.2 * 0.8 ** (2 - j) for j in range(3)])
    for f, k in zip(opt.factors(0), (0, 1)):
        np.testing.assert_allclose(f, sum(wj * e[k] for wj, e in zip(w, est)) / (1 - 0.8 ** 3), rtol=1e-12)


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_threads_give_the_same_factors(dropout):
    """With dropout each slice of the curvature pass draws its own rows' masks (those of the
    step's training pass), so the factors do not depend on the threads either."""
    cfg = tiny_config(dropout=dropout)
    x, y = np.random.default_rng(2).integers(0, cfg.vocab_size, size=(2, 4, cfg.block_size))
    out = []
    for n in (1, 2):
        previous = cpu.set_threads(n)
        try:
            opt = KFAC(GPT(cfg, seed=0), stats_fraction=1.0)
            opt.update_curvature(x, y)
            out.append([opt.factors(i) for i in range(len(opt.blocks))])
        finally:
            cpu.set_threads(previous)
    for (a1, g1), (a2, g2) in zip(*out):
        np.testing.assert_allclose(a1, a2, rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(g1, g2, rtol=1e-12, atol=1e-15)


# ----------------------------------------------------------------------------- damping, refresh

def test_damping_limits_and_pi_invariance():
    """Large damping: the direction tends to g / lam (both modes). Factored damping with pi
    is unchanged when A -> c A and G -> G / c (same A (x) G); with pi = 1 it is not."""
    rng = np.random.default_rng(0)
    A = np.cov(rng.standard_normal((4, 20))) + 0.1 * np.eye(4)
    G = 0.01 * np.cov(rng.standard_normal((3, 20)))
    M = rng.standard_normal((4, 3))

    def solve(A, G, lam, mode):
        (a, UA), (c, UG) = np.linalg.eigh(A), np.linalg.eigh(G)
        return kfac.damped_solve(M, a, UA, c, UG, lam, mode)

    for mode in kfac.DAMPING_MODES:
        assert rel(solve(A, G, 1e6, mode), M / 1e6) < 1e-3
    exact = np.linalg.solve(np.kron(A, G) + 0.01 * np.eye(12), M.ravel()).reshape(4, 3)
    assert rel(solve(A, G, 0.01, "exact"), exact) < 1e-12
    base, scaled = solve(A, G, 0.01, "factored"), solve(50 * A, G / 50, 0.01, "factored")
    assert rel(scaled, base) < 1e-12
    r = 0.1                                                   # sqrt(0.01), pi = 1 by hand
    unfixed = [np.linalg.solve(np.kron(a + r * np.eye(4), g + r * np.eye(3)), M.ravel()) for a, g in
               ((A, G), (50 * A, G / 50))]
    assert rel(unfixed[1], unfixed[0]) > 0.1


def test_inverses_refresh_every_inv_interval_steps():
    """Eigendecompositions change only at steps t = 0, k, 2k, ...; in between the direction
    uses the last refresh's, not the current factors'."""
    model, idx, y = one_linear(exact=False)
    opt = KFAC(model, fisher="empirical", stats_fraction=1.0, inv_interval=3, damping_mode="exact",
               damping=LAM, ema=0.5, kl_clip=0.0, momentum=0.0, lr=1e-3)
    rng = np.random.default_rng(3)
    snapshot = None
    for t in range(7):
        sub = rng.choice(6, size=3, replace=False)
        model.zero_grad()
        cross_entropy(model(idx[sub]), y[sub]).backward()
        opt.update_curvature(idx[sub], y[sub])
        before = opt.blocks[0].UA
        W = model.head.weight.data.copy()
        opt.step()
        blk = opt.blocks[0]
        assert (blk.UA is not before) == (t % 3 == 0), t
        if t % 3 == 0:
            snapshot = [a.copy() for a in opt.factors(0)]
        (a, UA), (c, UG) = np.linalg.eigh(snapshot[0]), np.linalg.eigh(snapshot[1])
        M = np.vstack([model.head.weight.grad, model.head.bias.grad])
        expect = kfac.damped_solve(M, a, UA, c, UG, LAM, "exact")[:-1]
        np.testing.assert_allclose(W - model.head.weight.data, 1e-3 * expect, rtol=1e-8, atol=1e-14)
        if t % 3:
            (a, UA), (c, UG) = [np.linalg.eigh(f) for f in opt.factors(0)]
            stale = kfac.damped_solve(M, a, UA, c, UG, LAM, "exact")[:-1]
            assert rel(expect, stale) > 1e-6


def test_kl_clip_and_momentum():
    """First step: the K-FAC blocks move by lr nu d, with lr^2 nu^2 sum d.g = kl_clip when
    clipping binds; second step by lr (momentum * nu1 d1 + nu2 d2)."""
    model, idx, y = one_linear(exact=False)
    opt = KFAC(model, fisher="exact", stats_fraction=1.0, kl_clip=1e-6, momentum=0.7, lr=0.5)
    lin, moves, steps = model.head, [], []
    for _ in range(2):
        model.zero_grad()
        cross_entropy(model(idx), y).backward()
        opt.update_curvature(idx, y)
        if opt.t % opt.inv_interval == 0:
            opt.refresh_inverses()
        d = opt.precondition()
        vg = sum(float((d[i] * opt.params[i].grad).sum()) for i in d) * 0.25
        nu = min(1.0, np.sqrt(1e-6 / vg))
        assert nu < 1                                       # the clip binds
        W = lin.weight.data.copy()
        opt.step()
        moves.append(W - lin.weight.data)
        steps.append(nu * d[0])
    np.testing.assert_allclose(moves[0], 0.5 * steps[0], rtol=1e-10)
    np.testing.assert_allclose(moves[1], 0.5 * (0.7 * steps[0] + steps[1]), rtol=1e-10)


# ----------------------------------------------------------------------------- state and resume

def test_blocks_cover_every_linear_and_fallback_the_rest():
    model = GPT(tiny_config(pos="learned"), seed=0)
    opt = KFAC(model)
    names = [b.name for b in opt.blocks]
    assert names[-1] == "head" and len(names) == 6 * 2 + 1
    fallback = {n for n, p in model.named_parameters() if any(p is opt.params[i] for i in opt.fallback)}
    assert fallback == {"wte.weight", "wpe.weight"}


def train_steps(model, opt, batches):
    losses = []
    for x, y in batches:
        loss = model(x, y)[1]
        loss.backward()
        opt.update_curvature(x, y)
        clip_grad_norm(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def test_checkpoint_holds_the_state_and_resume_is_exact():
    """Six steps straight, or four, an npz round trip of model and K-FAC state, then two
    more on a fresh model and optimiser: the same losses, bit for bit. The resume lands
    between inverse refreshes (inv_interval 3), so the stored eigendecompositions are used."""
    cfg = tiny_config(bias=True, pos="learned")
    rng = np.random.default_rng(4)
    batches = [tuple(rng.integers(0, cfg.vocab_size, size=(2, 4, cfg.block_size))) for _ in range(6)]
    settings = dict(inv_interval=3, momentum=0.5, lr=0.05, weight_decay=0.1)
    model = GPT(cfg, seed=0)
    model.load_state_dict(model.state_dict())               # C-ordered arrays, as after a load
    straight = train_steps(model, KFAC(model, **settings), batches)

    model = GPT(cfg, seed=0)
    model.load_state_dict(model.state_dict())
    opt = KFAC(model, **settings)
    first = train_steps(model, opt, batches[:4])
    state = opt.state_dict()
    n = len(opt.blocks)
    for name in kfac.KFAC.STATE:
        assert all(f"kfac.{name}.{i}" in state for i in range(n)), name
    for i in range(len(opt.params)):
        assert (f"kfac.mom.{i}" in state) == (i not in opt.fallback)
        assert (f"kfac.m.{i}" in state) == (f"kfac.v.{i}" in state) == (i in opt.fallback)
    assert int(state["t"]) == 4 and int(state["kfac.updates"]) == 4
    buf = io.BytesIO()
    np.savez(buf, **{f"model/{k}": v for k, v in model.state_dict().items()},
             **{f"optim/{k}": v for k, v in state.items()})
    buf.seek(0)
    with np.load(buf, allow_pickle=False) as z:
        saved = {k: z[k] for k in z.files}
    model = GPT(cfg, seed=1)
    model.load_state_dict({k[6:]: v for k, v in saved.items() if k.startswith("model/")})
    opt = KFAC(model, **settings)
    opt.load_state_dict({k[6:]: v for k, v in saved.items() if k.startswith("optim/")})
    assert first + train_steps(model, opt, batches[4:]) == straight


def test_load_rejects_a_foreign_state():
    model = GPT(tiny_config(), seed=0)
    opt = KFAC(model)
    with pytest.raises(ValueError, match="not K-FAC"):
        opt.load_state_dict(AdamW(model.parameters()).state_dict())
    x = np.zeros((1, 8), dtype=np.int64)
    opt.update_curvature(x, x)
    state = opt.state_dict()
    state["kfac.A.0"] = state["kfac.A.0"][:-1]
    with pytest.raises(ValueError, match="kfac.A.0"):
        KFAC(model).load_state_dict(state)


# ----------------------------------------------------------------------------- engine and settings

def tap_nodes(t):
    """Count _Tap nodes in the graph under tensor t."""
    seen, todo, n = set(), [t._ctx], 0
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen or isinstance(node, Tensor):
            continue
        seen.add(id(node))
        n += isinstance(node, kfac._Tap)
        todo.extend(node.parents)
    return n


def test_training_pass_records_nothing_and_curvature_leaves_grad_alone():
    """Without K-FAC every Linear is a plain nn.Linear (AdamW pays nothing); with it, the
    training graph has no taps; the curvature pass does not touch .grad."""
    cfg = tiny_config()
    x, y = np.random.default_rng(0).integers(0, cfg.vocab_size, size=(2, 2, cfg.block_size))
    model = GPT(cfg, seed=0)
    assert all(type(lin) is Linear for _, lin in kfac.linears(model))
    assert tap_nodes(model(x, y)[1]) == 0
    opt = KFAC(model)
    assert all(type(lin) is kfac._RegisteredLinear for _, lin in kfac.linears(model))
    loss = model(x, y)[1]
    assert tap_nodes(loss) == 0
    loss.backward()
    grads = [p.grad.copy() for p in model.parameters()]
    opt.update_curvature(x, y)
    assert all(np.array_equal(g, p.grad) for g, p in zip(grads, model.parameters()))
    assert opt._local.stats is None


def test_bad_settings_and_order_of_calls():
    model = GPT(tiny_config(), seed=0)
    for kw in (dict(damping=0.0), dict(fisher="natural"), dict(inv_interval=0), dict(ema=1.0),
               dict(damping_mode="tikhonov"), dict(inverse_dtype="float16"), dict(stats_fraction=0)):
        with pytest.raises(ValueError, match=next(iter(kw))):
            KFAC(model, **kw)
    with pytest.raises(RuntimeError, match="update_curvature"):
        KFAC(model).step()
    with pytest.raises(ValueError, match="targets"):
        KFAC(model, fisher="empirical").update_curvature(np.zeros((1, 8), dtype=np.int64))


@pytest.mark.parametrize("device", DEVICES)
def test_same_steps_on_every_device(device):
    """float64: CuPy (where a GPU exists) gives the CPU's factors and weights to rounding."""
    cfg = tiny_config()
    x, y = np.random.default_rng(6).integers(0, cfg.vocab_size, size=(2, 2, cfg.block_size))
    out = []
    for dev in ("cpu", device):
        backend.use(dev)
        model = GPT(cfg, seed=0)
        opt = KFAC(model)
        train_steps(model, opt, [(x, y)] * 2)
        out.append([backend.to_numpy(p.data) for p in model.parameters()])
    backend.use("cpu")
    for a, b in zip(*out):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)


def test_each_step_draws_new_targets():
    """The uniforms behind the sampled targets follow the step count: two passes on the same
    batch and weights at steps 0 and 1 give different G (ema 0: the factors are the batch's)."""
    cfg = tiny_config()
    x = np.random.default_rng(8).integers(0, cfg.vocab_size, size=(2, cfg.block_size))
    opt = KFAC(GPT(cfg, seed=0), ema=0.0, stats_fraction=1.0)
    opt.update_curvature(x)
    first = opt.factors(len(opt.blocks) - 1)[1].copy()
    opt.t = 1
    opt.update_curvature(x)
    assert rel(opt.factors(len(opt.blocks) - 1)[1], first) > 1e-3


def test_allreduce_averages_the_batch_factors_over_ranks():
    """Two ranks with equal shards: each rank's batch factors, averaged by the hook (the
    signature of World.allreduce_grads: objects with .data and .grad), equal one process's
    factors over both shards."""
    cfg = tiny_config(bias=True)
    x, y = np.random.default_rng(9).integers(0, cfg.vocab_size, size=(2, 4, cfg.block_size))
    other = []
    rank1 = KFAC(GPT(cfg, seed=0), fisher="empirical", stats_fraction=1.0,
                 allreduce=lambda slots: other.extend(s.grad.copy() for s in slots))
    rank1.update_curvature(x[2:], y[2:])

    def mean_with_rank1(slots):
        assert all(s.data is s.grad for s in slots) and len(slots) == len(other)
        for s, o in zip(slots, other):
            s.grad = (s.grad + o) / 2

    rank0 = KFAC(GPT(cfg, seed=0), fisher="empirical", stats_fraction=1.0, allreduce=mean_with_rank1)
    rank0.update_curvature(x[:2], y[:2])
    one = KFAC(GPT(cfg, seed=0), fisher="empirical", stats_fraction=1.0)
    one.update_curvature(x, y)
    for i in range(len(one.blocks)):
        for f0, f in zip(rank0.factors(i), one.factors(i)):
            np.testing.assert_allclose(f0, f, rtol=1e-12, atol=1e-15)


def test_float32_descends_and_keeps_its_dtype():
    """A float32 Pre-LN Value-SkipInit model (norm gains, alpha, beta in the fallback): steps
    on one batch lower its loss, and weights and optimiser state stay float32."""
    cfg = tiny_config(dtype="float32", attention="value_skipinit", residual="standard", norm="layernorm")
    x, y = np.random.default_rng(10).integers(0, cfg.vocab_size, size=(2, 4, cfg.block_size))
    model = GPT(cfg, seed=0)
    opt = KFAC(model, lr=0.05)
    losses = train_steps(model, opt, [(x, y)] * 5)
    assert losses[-1] < losses[0] - 0.1
    assert all(p.dtype == np.float32 for p in model.parameters())
    assert all(v.dtype == np.float32 for k, v in opt.state_dict().items() if k != "t" and v.ndim)
