"""nanospa/backend.py on a GPU. NumPy vs CuPy parity: the same seed gives the same weights,
outputs and gradients on the GPU as on the CPU, op by op and for whole models. Skipped
cleanly where CuPy or a GPU is missing."""
import numpy as np
import pytest

from nanospa import GPT, GPTConfig, Tensor, backend
from nanospa import fused

pytestmark = pytest.mark.skipif(not backend.cuda_available(), reason="CuPy with a GPU is not available")

RTOL = 1e-5  # float32: GPU and CPU reduce in different orders


def run(device, cfg, idx, targets):
    backend.use(device)
    model = GPT(cfg, seed=0)
    logits, loss = model(idx, targets)
    loss.backward()
    grads = {n: backend.to_numpy(p.grad) for n, p in model.named_parameters() if p.grad is not None}
    return backend.to_numpy(logits.data), loss.item(), grads, model.state_dict()


@pytest.mark.parametrize("attention,extra", [
    ("espa", {}), ("uspa", {}), ("value_skipinit", {}),
    ("softmax", dict(residual="standard", norm="layernorm", pos="learned", activation="gelu")),
    ("espa", dict(residual="normalised", norm="rmsnorm", activation="dks_gelu")),
])
def test_model_parity(attention, extra):
    cfg = GPTConfig(vocab_size=64, block_size=32, n_layer=4, n_head=4, n_embd=64, attention=attention,
                    **{"activation": "tat_lrelu", "eta": 0.5, **extra})
    rng = np.random.default_rng(0)
    idx = rng.integers(0, 64, (3, 32))
    targets = rng.integers(0, 64, (3, 32))
    cpu = run("cpu", cfg, idx, targets)
    gpu = run("cuda", cfg, idx, targets)
    for k in cpu[3]:
        np.testing.assert_array_equal(cpu[3][k], gpu[3][k], err_msg=f"initial {k}")
    np.testing.assert_allclose(gpu[0], cpu[0], rtol=RTOL, atol=1e-5)
    assert gpu[1] == pytest.approx(cpu[1], rel=RTOL)
    assert cpu[2].keys() == gpu[2].keys()
    for k in cpu[2]:
        scale = np.abs(cpu[2][k]).max() + 1e-12
        np.testing.assert_allclose(gpu[2][k] / scale, cpu[2][k] / scale, rtol=RTOL, atol=1e-5, err_msg=k)


def test_scatter_add_repeated_indices_on_gpu():
    xp = backend.use("cuda")
    a = xp.zeros(3, dtype=xp.float32)
    backend.scatter_add(a, xp.asarray([1, 1, 2, 1]), xp.asarray([1.0, 2.0, 3.0, 4.0], dtype=xp.float32))
    np.testing.assert_allclose(backend.to_numpy(a), [0, 7, 3])


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
             "gelu_exact": lambda: (X.gelu("none") * X).sum()}[name]()
        y.backward()
        outs.append((y.item(), backend.to_numpy(X.grad)))
    assert outs[1][0] == pytest.approx(outs[0][0], rel=RTOL, abs=1e-5)
    np.testing.assert_allclose(outs[1][1], outs[0][1], rtol=RTOL, atol=1e-5)
