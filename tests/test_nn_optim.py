"""Modules, state dicts, optimisers, schedule; the backend switch."""
import pathlib
import re

import numpy as np
import pytest

from nanospa import AdamW, SGD, Tensor, backend
from nanospa import nn
from nanospa.gradcheck import check_directions
from nanospa.optim import clip_grad_norm, cosine_lr, global_grad_norm


class Tiny(nn.Module):
    def __init__(self, dtype="float64"):
        super().__init__()
        rng = np.random.default_rng(0)
        self.emb = nn.Embedding(7, 6, rng=rng, dtype=dtype)
        self.ln = nn.LayerNorm(6, dtype=dtype)
        self.rms = nn.RMSNorm(6, dtype=dtype)
        self.dyt = nn.DyT(6, dtype=dtype)
        self.fc = nn.Linear(6, 5, bias=True, rng=rng, dtype=dtype)
        self.register_buffer("scale", np.full(5, 0.5, dtype=dtype))

    def forward(self, idx):
        return self.fc(self.dyt(self.rms(self.ln(self.emb(idx))))) * self.scale


def test_parameter_order_is_deterministic():
    names = [n for n, _ in Tiny().named_parameters()]
    assert names == ["emb.weight", "ln.weight", "ln.bias", "rms.weight", "dyt.alpha", "dyt.weight",
                     "dyt.bias", "fc.weight", "fc.bias"]


def test_layers_directional_gradcheck():
    m = Tiny()
    rng = np.random.default_rng(1)
    for p in m.parameters():  # move away from the init so that no gradient is trivially 0
        p.data = p.data + 0.3 * rng.standard_normal(p.shape)
    idx = np.array([[1, 2, 2, 6], [0, 1, 5, 5]])
    assert check_directions(lambda: m(idx), m.parameters(), n_directions=4) < 1e-6


def test_state_dict_roundtrip_and_errors():
    a, b = Tiny(), Tiny()
    for p in b.parameters():
        p.data = p.data + 1.0
    sd = a.state_dict()
    assert "scale" in sd and all(isinstance(v, np.ndarray) for v in sd.values())
    b.load_state_dict(sd)
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        np.testing.assert_array_equal(p.data, q.data)
    bad = dict(sd, **{"fc.weight": np.zeros((5, 6))})
    with pytest.raises(ValueError, match=r"'fc.weight': shape \(5, 6\)"):
        b.load_state_dict(bad)
    bad = dict(sd, **{"fc.weight": sd["fc.weight"].astype(np.float32)})
    with pytest.raises(ValueError, match=r"'fc.weight': dtype float32"):
        b.load_state_dict(bad)
    with pytest.raises(ValueError, match="missing keys \\['fc.bias'\\]"):
        b.load_state_dict({k: v for k, v in sd.items() if k != "fc.bias"})


def test_adamw_matches_formula():
    p = nn.Parameter(np.array([1.0, -2.0]), dtype="float64")
    opt = AdamW([p], lr=0.1, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.5)
    m = v = np.zeros(2)
    x = np.array([1.0, -2.0])
    for t in range(1, 4):
        g = np.array([0.3, -0.1]) * t
        p.grad = g.copy()
        opt.step()
        m = 0.9 * m + 0.1 * g
        v = 0.99 * v + 0.01 * g * g
        x = x * (1 - 0.1 * 0.5)
        x = x - 0.1 * (m / (1 - 0.9 ** t)) / (np.sqrt(v / (1 - 0.99 ** t)) + 1e-8)
    np.testing.assert_allclose(p.data, x, rtol=1e-12)


def test_adamw_no_decay_and_state_roundtrip():
    p = nn.Parameter(np.ones(3), no_decay=True, dtype="float32")
    opt = AdamW([p], lr=0.1, weight_decay=1.0)
    p.grad = np.zeros(3, dtype=np.float32)
    opt.step()
    np.testing.assert_array_equal(p.data, np.ones(3))  # zero grad, no decay: unchanged
    assert p.data.dtype == np.float32 and opt.m[0].dtype == np.float32
    sd = opt.state_dict()
    opt2 = AdamW([p], lr=0.1)
    opt2.load_state_dict(sd)
    assert opt2.t == 1 and np.array_equal(opt2.v[0], opt.v[0])


def test_sgd_momentum():
    p = nn.Parameter(np.array([1.0]), dtype="float64")
    opt = SGD([p], lr=0.1, momentum=0.9)
    for _ in range(2):
        p.grad = np.array([1.0])
        opt.step()
    np.testing.assert_allclose(p.data, [1.0 - 0.1 * 1.0 - 0.1 * 1.9])


def test_clip_grad_norm():
    a, b = nn.Parameter(np.array([3.0]), dtype="float64"), nn.Parameter(np.array([4.0]), dtype="float64")
    a.grad, b.grad = np.array([3.0]), np.array([4.0])
    assert clip_grad_norm([a, b], 1.0) == pytest.approx(5.0)
    assert global_grad_norm([a, b]) == pytest.approx(1.0, rel=1e-5)


def test_cosine_schedule():
    lrs = [cosine_lr(i, 1.0, 10, 110, 0.1) for i in range(120)]
    assert lrs[0] < lrs[5] < lrs[9] < 1.0
    assert lrs[10] == pytest.approx(1.0)
    assert lrs[60] == pytest.approx(0.55)
    assert lrs[110] == lrs[119] == 0.1
    assert all(x >= y for x, y in zip(lrs[10:], lrs[11:]))


def test_cupy_imported_only_in_backend():
    root = pathlib.Path(__file__).resolve().parents[1]
    files = list((root / "nanospa").rglob("*.py")) + [root / "train.py", root / "data.py"]
    offenders = [f.name for f in files if f.exists() and f.name != "backend.py"
                 and re.search(r"^\s*(import cupy|from cupy)", f.read_text(), re.M)]
    assert offenders == []


def test_cuda_request_without_gpu_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(backend, "_cp", None)
    with pytest.raises(backend.DeviceError, match="needs CuPy"):
        backend.use("cuda")
    with pytest.raises(ValueError, match="'cpu' or 'cuda'"):
        backend.use("tpu")


def test_to_numpy_and_asarray_roundtrip():
    a = np.arange(6.0).reshape(2, 3)
    assert np.array_equal(backend.to_numpy(backend.asarray(a)), a)
    assert backend.xp_of(a) is np
