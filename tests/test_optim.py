"""nanospa/optim.py: AdamW against its formula, no_decay and the optimiser state dict,
global-norm clipping, the warm-up + cosine schedule."""
import numpy as np
import pytest

from nanospa import AdamW
from nanospa import nn
from nanospa.optim import clip_grad_norm, cosine_lr, global_grad_norm


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
