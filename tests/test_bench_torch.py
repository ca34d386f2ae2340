"""nanospa/bench/yardstick.py, the PyTorch yardstick of the benchmark (nn.Linear, SDPA with the
bias as a float mask built once, fused activations): for the same weights it computes nanospa's
loss and every parameter's gradient in float64, configuration by configuration; it refuses every
configuration it does not implement; its fresh-process timing imports nothing of nanospa.
Skipped without torch (never a dependency)."""
import numpy as np
import pytest

from conftest import perturbed_model, tiny_config

pytest.importorskip("torch")

YARDSTICK_CONFIGS = {
    "espa": dict(attention="espa", activation="tat_lrelu"),
    "espa_blockwise": dict(attention="espa", activation="tat_lrelu", attention_impl="blockwise", attention_block=4),
    "uspa": dict(attention="uspa", activation="tat_gelu"),
    "softmax_pre_ln": dict(attention="softmax", residual="standard", norm="layernorm", pos="learned",
                           activation="gelu", bias=True),
    "skipinit": dict(attention="value_skipinit", residual="normalised", norm="rmsnorm", pos="sinusoidal",
                     activation="relu", skipinit_per_head=True),
    "deepnorm": dict(attention="softmax", residual="deepnorm", norm="layernorm", activation="gelu_exact"),
    "spa_prior": dict(attention="softmax", pos="spa_prior", activation="dks_softplus"),
    "post_ln": dict(attention="softmax", residual="standard", norm="layernorm", norm_position="post",
                    activation="leaky_relu"),
    "dks_tanh": dict(attention="uspa", activation="dks_tanh"),
}


def losses_and_grads(cfg, seed=0):
    """(nanospa loss, {name: grad}, yardstick loss, {name: grad}) for one perturbed model."""
    import torch

    from nanospa.bench.yardstick import TorchGPT
    model = perturbed_model(cfg)
    rng = np.random.default_rng(seed)
    idx, tgt = rng.integers(0, 13, (3, 8)), rng.integers(0, 13, (3, 8))
    tm = TorchGPT(model)                         # before nanospa's backward: a copy, not a view
    _, loss = model(idx, tgt)
    loss.backward()
    tloss = tm(torch.as_tensor(idx), torch.as_tensor(tgt))[1]
    tloss.backward()
    grads = {k: g.numpy() for k, g in tm.nanospa_grads().items()}
    return loss.item(), {k: p.grad for k, p in model.named_parameters()}, tloss.item(), grads


@pytest.mark.parametrize("kw", YARDSTICK_CONFIGS.values(), ids=YARDSTICK_CONFIGS.keys())
def test_yardstick_gives_nanospa_loss_and_every_gradient(kw):
    loss, grads, tloss, tgrads = losses_and_grads(tiny_config(**kw))
    assert set(tgrads) == set(grads)             # every parameter of nanospa's has one here
    # float64 on both sides, the same maths in another order (SDPA's softmax, fused q|k|v):
    # a few ulps; a modelling difference is O(1e-2), a planted 1e-6 change in B_l is caught below
    np.testing.assert_allclose(tloss, loss, rtol=1e-12)
    for name, g in grads.items():
        np.testing.assert_allclose(tgrads[name], g, rtol=1e-9, atol=1e-12, err_msg=name)


def test_the_parity_check_catches_a_planted_change(monkeypatch):
    """A 1e-6 change in one row of D_l, or in phi_hat's output scale, fails the loss check."""
    from nanospa.bench import yardstick
    cfg = tiny_config(attention="espa", activation="tat_lrelu")
    real = yardstick.export_nanospa

    def planted_D(model):
        out = real(model)
        out["state"]["blocks.1.attn.D"] = out["state"]["blocks.1.attn.D"] * (1 + 1e-6)
        return out
    monkeypatch.setattr(yardstick, "export_nanospa", planted_D)
    loss, _, tloss, _ = losses_and_grads(cfg)
    assert abs(tloss - loss) > 1e-12 * abs(loss)

    def planted_s(model):
        out = real(model)
        out["spec"]["activation"]["s"] *= 1 + 1e-6
        return out
    monkeypatch.setattr(yardstick, "export_nanospa", planted_s)
    loss, _, tloss, _ = losses_and_grads(cfg)
    assert abs(tloss - loss) > 1e-12 * abs(loss)


@pytest.mark.parametrize("kw, words", [
    (dict(pos="rope"), "pos='rope'"),
    (dict(pos="alibi"), "pos='alibi'"),
    (dict(residual_attention=True, attention="softmax"), "residual_attention=True"),
    (dict(train_bias=True), "train_bias=True"),
    (dict(norm="batchnorm", residual="standard"), "norm='batchnorm'"),
    (dict(residual="ngpt", activation="swish"), "residual='ngpt'"),
])
def test_yardstick_refuses_what_it_does_not_implement(kw, words):
    from nanospa.bench.yardstick import TorchGPT, check
    cfg = tiny_config(**kw)
    with pytest.raises(ValueError, match="does not implement") as e:
        check(cfg)
    assert words in str(e.value)
    with pytest.raises(ValueError, match="does not implement"):
        TorchGPT(perturbed_model(cfg))


def test_benchmark_gives_no_ratio_for_a_refused_configuration():
    from nanospa.bench.measure import Yardstick, make_batch
    from nanospa.model import GPT
    cfg = tiny_config(pos="rope", dtype="float32")
    idx, tgt = make_batch(cfg, 2)
    y = Yardstick(GPT(cfg, seed=0), idx, tgt, "cpu", ("pytorch",))
    assert y.runners == [] and "pos='rope'" in y.unavailable["pytorch"]


def test_fresh_process_times_the_yardstick_alone():
    from nanospa.bench.measure import Yardstick, make_batch, time_fresh
    from nanospa.model import GPT
    cfg = tiny_config(dtype="float32")
    idx, tgt = make_batch(cfg, 2)
    y = Yardstick(GPT(cfg, seed=0), idx, tgt, "cpu", ("pytorch",))
    got = time_fresh(y.export, idx, tgt, ("pytorch",), threads=1, device="cpu", steps=3, warmup=1, settle=0.0)
    assert "unavailable" not in got, got
    assert got["nanospa_imported"] is False and got["torch_threads"] == 1
    assert len(got["rows"]["pytorch"]["times"]) == 3 and min(got["rows"]["pytorch"]["times"]) > 0


def test_paired_ratios_headline_is_the_faster_row():
    from nanospa.bench.measure import paired_ratios
    pairs = dict(pytorch=([2.0, 1.5, 2.0], [1.0, 1.0, 2.0]), pytorch_compiled=([1.0, 0.5, 1.0], [1.0, 1.0, 2.0]))
    headline, ratios = paired_ratios(pairs)
    assert headline == "pytorch_compiled"
    assert ratios["pytorch"]["median"] == 1.5 and ratios["pytorch_compiled"]["median"] == 0.5


def test_profile_of_the_pytorch_step_sorts_its_ops_into_kinds():
    from nanospa.bench.measure import Yardstick, make_batch, make_config
    from nanospa.bench.profile import LINEAR, OPTIMIZER, REST, profile_torch, torch_kind
    from nanospa.model import GPT
    assert torch_kind("aten::addmm") == LINEAR and torch_kind("aten::_fused_adamw_") == OPTIMIZER
    assert torch_kind("aten::_scaled_dot_product_flash_attention_for_cpu") == "SDPA attention (fused)"
    assert torch_kind("autograd::engine::evaluate_function: MmBackward0") == REST == torch_kind("MmBackward0")
    assert torch_kind("aten::index_select") == "embedding" and torch_kind("aten::tanh") == "activation (phi_hat)"
    cfg, batch = make_config("tiny", {}, "float32")
    idx, tgt = make_batch(cfg, batch)
    y = Yardstick(GPT(cfg, seed=0), idx, tgt, "cpu", ("pytorch",))
    kinds, wall = profile_torch(y.runners[0], steps=2)
    assert kinds[LINEAR] > 0 and kinds["SDPA attention (fused)"] > 0 and kinds[OPTIMIZER] > 0
    assert kinds.get("other ops", 0.0) < 0.25 * sum(kinds.values())   # the kinds name most of the time


@pytest.mark.slow
def test_the_benchmark_times_both_rows_and_each_alone(capsys):
    """The whole command with PyTorch: eager and compiled rows, each row's ratio, the headline
    against the faster, and each row again in a fresh process (a compiler missing on the
    machine makes the compiled row 'unavailable', which is a valid outcome here)."""
    import json

    from nanospa.bench.command import main
    assert main(["--config=tiny", "--steps=2", "--warmup=0", "--no_memory", "--settle=0", "--gemm_n=64",
                 "--json"]) == 0
    r = json.loads(capsys.readouterr().out)["results"][0]
    y = r["yardstick"]
    rows = y["rows"]
    assert rows[0] == "pytorch" and set(rows) | set(y["unavailable"]) == {"pytorch", "pytorch_compiled"}
    assert set(r["ratios_nanospa_over"]) == set(rows)
    assert r["ratio_nanospa_over_pytorch"]["yardstick"] in rows
    fresh = y["fresh_process"]
    assert fresh["nanospa_imported"] is False and set(fresh["rows"]) == set(rows)
    assert all(d["step_s_median"] > 0 for d in fresh["rows"].values())
