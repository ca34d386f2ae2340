"""nanospa on a real GPU: NumPy vs CuPy parity. The same seed gives the same weights, and a
model of every variant (tests/test_gpu.py's list: every attention, activation, residual,
norm, position and attention implementation) the same logits, loss and gradients on the GPU
as on the CPU, in float64 (to another summation order) and float32 (to its rounding); the
fused ops too. Skipped cleanly where CuPy or a GPU is missing; python -m nanospa.bench.gpu_check
runs it on a machine with one (on the CPU, tests/test_gpu.py runs the same models on the
CuPy stand-in, with counts of host work the stand-in alone can give).
"""
import numpy as np
import pytest

from nanospa import GPT, GPTConfig, Tensor, backend
from nanospa import fused
from nanospa.more_ops import Activation
from test_gpu import _variants

pytestmark = pytest.mark.skipif(not backend.cuda_available(), reason="CuPy with a GPU is not available")

TOLERANCE = dict(float64=1e-9, float32=2e-4)  # relative to each quantity's largest entry: other
                                              # summation orders (cuBLAS, CuPy's reductions)


def run(device, cfg, idx, targets):
    backend.use(device)
    try:
        model = GPT(cfg, seed=0)
        logits, loss = model(idx, targets)
        loss.backward()
        grads = {n: backend.to_numpy(p.grad) for n, p in model.named_parameters() if p.grad is not None}
        return backend.to_numpy(logits.data), float(loss.data), grads, model.state_dict()
    finally:
        backend.use("cpu")


def close(a, b, tol, what):
    scale = max(float(np.abs(b).max()), 1e-30)
    err = float(np.abs(a - b).max()) / scale
    assert err <= tol, f"{what}: GPU differs from CPU by {err:.3g} of its largest entry (> {tol})"


@pytest.mark.filterwarnings("ignore:norm=")
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("kw", _variants(), ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_model_parity(kw, dtype):
    cfg = GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=16, dtype=dtype, **kw)
    rng = np.random.default_rng(0)
    idx = rng.integers(0, 64, (3, 16))
    targets = rng.integers(0, 64, (3, 16))
    cpu = run("cpu", cfg, idx, targets)
    gpu = run("cuda", cfg, idx, targets)
    for k in cpu[3]:
        np.testing.assert_array_equal(cpu[3][k], gpu[3][k], err_msg=f"initial {k}")
    tol = TOLERANCE[dtype]
    close(gpu[0], cpu[0], tol, "logits")
    assert gpu[1] == pytest.approx(cpu[1], rel=tol)
    assert cpu[2].keys() == gpu[2].keys()
    scale = max(np.abs(g).max() for g in cpu[2].values())
    for k in cpu[2]:
        assert np.abs(gpu[2][k] - cpu[2][k]).max() <= tol * scale, k


def test_scatter_add_repeated_indices_on_gpu():
    xp = backend.use("cuda")
    try:
        a = xp.zeros(3, dtype=xp.float32)
        backend.scatter_add(a, xp.asarray([1, 1, 2, 1]), xp.asarray([1.0, 2.0, 3.0, 4.0], dtype=xp.float32))
        np.testing.assert_allclose(backend.to_numpy(a), [0, 7, 3])
    finally:
        backend.use("cpu")


def test_the_embedding_gradient_is_the_same_at_every_run():
    """No atomics in the embedding's backward (backend.segment_sum): two runs, one seed, the
    same float32 bits on the GPU."""
    backend.use("cuda")
    try:
        out = []
        for _ in range(3):
            model = GPT(GPTConfig(vocab_size=8, block_size=64, n_layer=2, n_head=2, n_embd=32), seed=0)
            x = np.random.default_rng(0).integers(0, 8, (16, 64))
            model(x, np.roll(x, -1, axis=1))[1].backward()
            out.append(backend.to_numpy(model.wte.weight.grad))
        assert all(np.array_equal(out[0], g) for g in out[1:])
    finally:
        backend.use("cpu")


@pytest.mark.parametrize("name", ["softmax", "cross_entropy", "layernorm", "gelu_exact"])
def test_fused_ops_parity(name):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 8, 8)).astype(np.float32)
    w, b = rng.standard_normal(8).astype(np.float32), rng.standard_normal(8).astype(np.float32)
    t = rng.integers(0, 8, 32)
    outs = []
    for device in ("cpu", "cuda"):
        xp = backend.use(device)
        X = Tensor(xp.asarray(x), requires_grad=True)
        W, B = Tensor(xp.asarray(w), requires_grad=True), Tensor(xp.asarray(b), requires_grad=True)
        y = {"softmax": lambda: fused.softmax(X, B, causal=True, scale=0.5).sum(),
             "cross_entropy": lambda: fused.cross_entropy(X, t),
             "layernorm": lambda: (fused.layer_norm(X, W, B) * X).sum(),
             "gelu_exact": lambda: (Activation.apply(X, name="gelu_exact") * X).sum()}[name]()
        y.backward()
        outs.append((y.item(), backend.to_numpy(X.grad)))
    backend.use("cpu")
    assert outs[1][0] == pytest.approx(outs[0][0], rel=TOLERANCE["float32"], abs=1e-5)
    np.testing.assert_allclose(outs[1][1], outs[0][1], rtol=TOLERANCE["float32"], atol=1e-5)
