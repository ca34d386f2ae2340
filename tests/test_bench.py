"""The benchmark and the engine fast paths it led to.

- ``python -m nanospa.bench`` runs once on a tiny configuration and reports what it should
  (no time is asserted: the benchmark is not a test);
- the FLOP formula, by hand;
- the PyTorch yardstick computes nanospa's loss and gradients for the same weights
  (skipped without torch).

The engine fast paths the benchmark led to are tested next to the code they live in
(tests/test_functions.py, test_fused.py, test_tensor.py, test_backend.py, ...).
"""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from nanospa import GPT, GPTConfig
from nanospa.bench import model_flops

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
