"""The benchmark and the engine fast paths it led to.

- ``python -m nanospa.bench`` runs once on a tiny configuration and reports what it should
  (no time is asserted: the benchmark is not a test);
- the FLOP formula, by hand;
- the PyTorch yardstick computes nanospa's loss and gradients for the same weights
  (skipped without torch);
- the fast paths (fused leaky ReLU, cached SPA bias + mask, graph that frees unsaved
  intermediates, in-place gradient sums) agree with the plain definitions, with float64
  gradient checks; the CuPy kernels agree with the NumPy path where a GPU exists.
"""
import gc
import json
import subprocess
import sys
import weakref
from pathlib import Path

import numpy as np
import pytest

from nanospa import GPT, GPTConfig, Tensor, backend
from nanospa import functions as F
from nanospa.bench import model_flops
from nanospa.gradcheck import check_directions, check_jacobian

from conftest import DEVICES

ROOT = Path(__file__).resolve().parents[1]


def tiny(**kw):
    base = dict(vocab_size=13, block_size=8, n_layer=2, n_head=2, n_embd=8, dtype="float64")
    base.update(kw)
    return GPTConfig(**base)


# ----------------------------------------------------------------------------- the command


def test_model_flops_by_hand():
    cfg = GPTConfig(vocab_size=10, block_size=4, n_layer=2, n_head=1, n_embd=3, mlp_ratio=4)
    f = model_flops(cfg, batch_size=5)
    N = 2 * (4 * 9 + 2 * 4 * 9) + 3 * 10          # q, k, v, proj; fc, proj; head = 246
    assert f["n_matmul_params"] == N
    assert f["per_token"] == 6 * N + 12 * 2 * 4 * 3
    assert f["per_step"] == f["per_token"] * 5 * 4


def test_bench_command_runs_on_a_tiny_configuration():
    cmd = [sys.executable, "-m", "nanospa.bench", "--config=tiny", "--steps=2", "--warmup=1",
           "--threads=1", "--torch=no", "--gemm_n=64", "--settle=0", "--set", "n_layer=3", "--json"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert {"date", "command", "cpu", "numpy", "env"} <= set(report["machine"])
    (r,) = report["results"]
    assert r["config"] == "tiny" and r["gpt_config"]["n_layer"] == 3 and r["threads"] == 1
    assert r["model_flops"]["per_step"] == model_flops(GPTConfig(**r["gpt_config"]), r["batch_size"])["per_step"]
    nano = r["frameworks"]["nanospa"]
    assert set(r["frameworks"]) == {"nanospa"} and "ratio_nanospa_over_pytorch" not in r
    assert nano["tokens_per_s"] > 0 and r["gemm_peak_flops"] > 0 and np.isfinite(nano["mfu"])
    assert nano["step_s_min"] <= nano["step_s_median"] <= nano["step_s_max"]
    if sys.platform.startswith("linux"):  # resident-set figures come from /proc
        assert 0 < nano["peak_mem_bytes"] < nano["process_peak_rss_bytes"]


def test_bench_rejects_unknown_configuration():
    from nanospa.bench import main
    with pytest.raises(SystemExit, match="unknown configuration 'huge'"):
        main(["--config=huge"])


# ----------------------------------------------------------------------------- the yardstick

YARDSTICK_CONFIGS = [
    dict(attention="espa", activation="tat_lrelu"),
    dict(attention="uspa", activation="tat_gelu"),
    dict(attention="softmax", residual="standard", norm="layernorm", pos="learned", activation="gelu"),
    dict(attention="value_skipinit", residual="normalised", norm="rmsnorm", pos="sinusoidal", activation="relu"),
]


def _perturbed(cfg):
    model = GPT(cfg, seed=0)
    rng = np.random.default_rng(3)
    for p in model.parameters():  # move off init (W^Q = 0 there) so every path matters
        p.data = p.data + 0.3 * rng.standard_normal(p.shape)
    return model


@pytest.mark.parametrize("kw", YARDSTICK_CONFIGS, ids=lambda kw: kw["attention"])
def test_torch_yardstick_gives_nanospa_loss_and_gradients(kw):
    torch = pytest.importorskip("torch")
    from nanospa.bench_torch import TorchGPT
    model = _perturbed(tiny(**kw))
    rng = np.random.default_rng(0)
    idx = rng.integers(0, 13, (3, 8))
    tgt = rng.integers(0, 13, (3, 8))
    _, loss = model(idx, tgt)
    loss.backward()
    tm = TorchGPT(model)
    tloss = tm(torch.as_tensor(idx), torch.as_tensor(tgt))[1]
    tloss.backward()
    # float64 on both sides, same operations in a slightly different order: agreement to
    # a few ulps of the loss, far below any modelling difference (which would be O(1e-2))
    np.testing.assert_allclose(tloss.item(), loss.item(), rtol=1e-12)
    for name, p in model.named_parameters():
        g = tm.params[name.replace(".", "_")].grad.numpy()
        np.testing.assert_allclose(g, p.grad, rtol=1e-9, atol=1e-12, err_msg=name)


def test_torch_yardstick_sdpa_variant_gives_the_same_loss():
    torch = pytest.importorskip("torch")
    from nanospa.bench_torch import TorchGPT
    model = _perturbed(tiny())
    idx = np.random.default_rng(1).integers(0, 13, (2, 8))
    loss = model(idx, idx)[1].item()
    tloss = TorchGPT(model, sdpa=True)(torch.as_tensor(idx), torch.as_tensor(idx))[1].item()
    np.testing.assert_allclose(tloss, loss, rtol=1e-10)  # float64; a different summation order


# ----------------------------------------------------------------------------- fast paths


def normal(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


def away_from_zero(*shape):
    x = normal(*shape)
    return x + 0.2 * np.sign(x)  # finite differences (eps 1e-6) never cross the kink


@pytest.mark.parametrize("base,opts", [("leaky_relu", dict(a=0.7, s=1.3, o=0.2, slope=0.3)),
                                       ("relu", dict(a=2.5, s=-0.8, o=-0.1))])
def test_shaped_fast_path_is_the_shaped_activation(base, opts):
    """s (phi(a x) + o) for positively homogeneous phi, a > 0 (the fast path), against the
    definition, and its full Jacobian."""
    x = away_from_zero(4, 5)
    slope = opts.get("slope", 0.0)
    u = opts["a"] * x
    expected = opts["s"] * (np.where(u > 0, u, slope * u) + opts["o"])
    y = F.Shaped.apply(Tensor(x), base=base, **opts).data
    np.testing.assert_allclose(y, expected, rtol=1e-14)
    assert check_jacobian(lambda t: F.Shaped.apply(t, base=base, **opts),
                          [Tensor(x, requires_grad=True)], rtol=1e-6) < 1e-6


def test_shaped_generic_path_still_used_with_a_shift():
    """b != 0 takes the generic path (phi(a x + b) is not a phi(x)); same definition."""
    x = away_from_zero(3, 4)
    y = F.Shaped.apply(Tensor(x), base="leaky_relu", a=0.9, b=0.05, s=1.1, slope=0.2).data
    u = 0.9 * x + 0.05
    np.testing.assert_allclose(y, 1.1 * np.where(u > 0, u, 0.2 * u), rtol=1e-14)


def test_cached_bias_and_mask_is_softmax_with_bias_and_causal_mask():
    model = GPT(tiny(attention="espa"), seed=0)
    attn = model.blocks[1].attn
    x = normal(2, 2, 6, 6)
    bias, causal = attn.logit_bias(6)
    assert not causal and bias is attn.logit_bias(6)[0]  # computed once per length
    y = F.softmax(Tensor(x), bias, scale=0.3, causal=False).data
    reference = F.softmax(Tensor(x), Tensor(attn.B[:6, :6]), scale=0.3, causal=True).data
    np.testing.assert_allclose(y, reference, rtol=1e-13, atol=1e-300)
    model.load_state_dict(model.state_dict())  # a new B_l array: the cache must follow it
    assert attn.logit_bias(6)[0] is not bias


def test_softmax_gradient_with_trainable_bias_and_scale():
    x, b = Tensor(normal(2, 1, 5, 5), requires_grad=True), Tensor(normal(5, 5, seed=1), requires_grad=True)
    assert check_jacobian(lambda u, v: F.softmax(u, v, scale=0.7, causal=False), [x, b], rtol=1e-6) < 1e-6


def test_unsaved_intermediates_are_freed_before_backward():
    """The graph links Functions, so an intermediate that no op saved is freed in forward
    (here h, the input of Exp, which saves only its output); backward is still right."""
    x = Tensor(normal(3), requires_grad=True)
    h = x * 2.0
    ref = weakref.ref(h.data)
    y = h.exp().sum()
    del h
    gc.collect()
    assert ref() is None
    y.backward()
    np.testing.assert_allclose(x.grad, 2.0 * np.exp(2.0 * x.data), rtol=1e-14)


def test_shared_gradient_arrays_are_never_written_in_place():
    """Add hands one array to both inputs; sums of fan-in gradients are made in place only
    in arrays the backward pass allocated itself. d/dx of ((x + x) + x) * w is 3 w."""
    x = Tensor(normal(4), requires_grad=True)
    w = Tensor(normal(4, seed=2), requires_grad=True)
    (((x + x) + x) * w).sum().backward()
    np.testing.assert_allclose(x.grad, 3.0 * w.data, rtol=1e-15)
    np.testing.assert_allclose(w.grad, 3.0 * x.data, rtol=1e-15)


def test_espa_model_gradients_through_all_fast_paths():
    """The reference architecture (E-SPA, TAT leaky ReLU: cached bias + mask, fused leaky
    ReLU, flattened matmuls) in float64, by random directions."""
    model = _perturbed(tiny(attention="espa", activation="tat_lrelu"))
    idx = np.random.default_rng(5).integers(0, 13, (2, 8))
    assert check_directions(lambda: model(idx, np.roll(idx, 1))[1], model.parameters(), n_directions=3) < 1e-6


@pytest.mark.skipif("cuda" not in DEVICES, reason="needs CuPy and a GPU")
def test_cuda_kernels_match_numpy():
    """Each fused CuPy kernel of backend.py against its NumPy path (the one the gradient
    checks test), in float32 (rtol 1e-6: a few ulps of reordering)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    g = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    bias = np.triu(np.full((8, 8), -np.inf, np.float32), 1) + rng.standard_normal((8, 8)).astype(np.float32)
    on = lambda a: backend.use("cuda").asarray(a)  # noqa: E731
    close = lambda gpu, cpu: np.testing.assert_allclose(backend.to_numpy(gpu), cpu, rtol=1e-6, atol=1e-7)  # noqa: E731
    close(backend.scale_where(on(x), on(x > 0), 1.3, 0.2), backend.scale_where(x, x > 0, 1.3, 0.2))
    close(backend.scale_add(on(x), 0.5, on(bias)), backend.scale_add(x, 0.5, bias))
    z = backend.scale_add(x, 0.5, bias)
    m = z.max(-1, keepdims=True)
    close(backend.exp_sub(on(z), on(m)), backend.exp_sub(z.copy(), m))
    e = backend.exp_sub(z.copy(), m)
    s = e.sum(-1, keepdims=True)
    close(backend.div_flush(on(e), on(s), 0.05), backend.div_flush(e.copy(), s, 0.05))
    y = backend.div_flush(e.copy(), s, 0.0)
    gs = (g * y).sum(-1, keepdims=True)
    close(backend.softmax_grad(on(y), on(g), on(gs), 0.7, out=on(np.empty_like(y))),
          backend.softmax_grad(y, g, gs, 0.7, out=np.empty_like(y)))


# ----------------------------------------------------------------------------- threads


@pytest.fixture
def two_threads():
    previous = backend.set_threads(2)
    yield
    backend.set_threads(previous)


@pytest.mark.parametrize("batch", [3, 4])
def test_sharded_backward_is_the_full_batch_backward(two_threads, batch):
    """Slices of the batch on two threads give the full batch's loss and gradients (float64:
    only the order of the batch sum differs), odd batch sizes included."""
    cfg = tiny(attention="espa", activation="tat_lrelu")
    full, sharded = _perturbed(cfg), _perturbed(cfg)
    rng = np.random.default_rng(7)
    idx, tgt = rng.integers(0, 13, (batch, 8)), rng.integers(0, 13, (batch, 8))
    _, loss = full(idx, tgt)
    loss.backward()
    from nanospa.tensor import sharded_backward
    value = sharded_backward(lambda x, y: sharded(x, y)[1], idx, tgt)
    assert not value.requires_grad
    np.testing.assert_allclose(value.item(), loss.item(), rtol=1e-13)
    for (name, p), q in zip(full.named_parameters(), sharded.parameters()):
        np.testing.assert_allclose(q.grad, p.grad, rtol=1e-11, atol=1e-15, err_msg=name)


def test_sharded_backward_is_deterministic_in_float32(two_threads):
    from nanospa.tensor import sharded_backward
    model = GPT(tiny(dtype="float32"), seed=0)
    idx = np.random.default_rng(8).integers(0, 13, (4, 8))
    grads = []
    for _ in range(3):
        model.zero_grad()
        sharded_backward(lambda x, y: model(x, y)[1], idx, idx)
        grads.append([p.grad.copy() for p in model.parameters()])
    for other in grads[1:]:  # slices are added in a fixed order, whatever the thread timing
        assert all(np.array_equal(a, b) for a, b in zip(grads[0], other))


def test_set_threads_rejects_bad_counts():
    with pytest.raises(ValueError, match="threads must be a positive integer, got 0"):
        backend.set_threads(0)
