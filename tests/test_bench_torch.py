"""nanospa/bench/yardstick.py, the PyTorch yardstick of the benchmark: for the same weights it
computes nanospa's loss and gradients (float64), with the manual attention and with
scaled_dot_product_attention. Skipped without torch (never a dependency)."""
import numpy as np
import pytest

from conftest import perturbed_model, tiny_config


YARDSTICK_CONFIGS = [
    dict(attention="espa", activation="tat_lrelu"),
    dict(attention="uspa", activation="tat_gelu"),
    dict(attention="softmax", residual="standard", norm="layernorm", pos="learned", activation="gelu"),
    dict(attention="value_skipinit", residual="normalised", norm="rmsnorm", pos="sinusoidal", activation="relu"),
]


@pytest.mark.parametrize("kw", YARDSTICK_CONFIGS, ids=lambda kw: kw["attention"])
def test_torch_yardstick_gives_nanospa_loss_and_gradients(kw):
    torch = pytest.importorskip("torch")
    from nanospa.bench.yardstick import TorchGPT
    model = perturbed_model(tiny_config(**kw))
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
    from nanospa.bench.yardstick import TorchGPT
    model = perturbed_model(tiny_config())
    idx = np.random.default_rng(1).integers(0, 13, (2, 8))
    loss = model(idx, idx)[1].item()
    tloss = TorchGPT(model, sdpa=True)(torch.as_tensor(idx), torch.as_tensor(idx))[1].item()
    np.testing.assert_allclose(tloss, loss, rtol=1e-10)  # float64; a different summation order
