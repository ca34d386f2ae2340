"""nGPT (residual="ngpt", nanospa/beyond/ngpt.py, docs/residuals.md §3): the combinations GPTConfig
refuses, the published initial values (init/scale trick), the forward pass against a NumPy
transcription of the paper's equations, float64 gradient checks, the unit norms after a step
and after_step(), and an exact resume of a training run."""
import json
import math

import numpy as np
import pytest

import train
from nanospa import GPT, AdamW, GPTConfig
from nanospa.gradcheck import check_directions
from nanospa.beyond.ngpt import renormalise, unit
from nanospa.tensor import Tensor

from test_model import perturb  # the shared random move off the initialisation

IDX = np.array([[1, 4, 4, 0, 9, 2], [3, 3, 7, 10, 1, 5]])
TARGETS = np.roll(IDX, -1, axis=1)
NGPT = dict(residual="ngpt", attention="softmax", activation="swish")

# (name suffix in the state dict, axis of the vectors along the embedding dimension)
MATRICES = (("attn.q.weight", 0), ("attn.k.weight", 0), ("attn.v.weight", 0), ("attn.proj.weight", 1),
            ("mlp.fc_u.weight", 0), ("mlp.fc_v.weight", 0), ("mlp.proj.weight", 1))


def tiny(**kw):
    base = dict(vocab_size=11, block_size=6, n_layer=2, n_head=2, n_embd=8, dtype="float64", **NGPT)
    base.update(kw)
    return GPTConfig(**base)


def sphere_matrices(model):
    """{name: (array, axis)} of every matrix nGPT keeps on the unit sphere."""
    sd = model.state_dict()
    out = {"wte.weight": (sd["wte.weight"], 1), "head.out.weight": (sd["head.out.weight"], 0)}
    for l in range(model.config.n_layer):
        for name, axis in MATRICES:
            out[f"blocks.{l}.{name}"] = (sd[f"blocks.{l}.{name}"], axis)
    return out


# ------------------------------------------------------------------ configuration

@pytest.mark.parametrize("kw,field", [
    (dict(norm="layernorm"), "norm"), (dict(attention="espa"), "attention"),
    (dict(attention="value_skipinit"), "attention"), (dict(zero_query=True), "zero_query"),
    (dict(activation="tat_lrelu"), "activation"), (dict(activation="dks_gelu"), "activation"),
    (dict(bias=True), "bias"), (dict(pos="learned"), "pos"), (dict(pos="sinusoidal"), "pos"),
    (dict(final_norm="yes"), "final_norm")])
def test_bad_combinations_name_the_field(kw, field):
    with pytest.raises(ValueError, match=rf"^GPTConfig\.{field}="):
        GPTConfig(**{**NGPT, **kw})


def test_accepted_combinations():
    for act in ("swish", "gelu", "relu"):
        GPTConfig(**{**NGPT, "activation": act})
    GPTConfig(**NGPT, residual_attention=True, attention_impl="dense")


# ------------------------------------------------------------------ initialisation

def test_published_initial_values_and_scales():
    """Stored at s_scale, used at s_init: alpha 0.05 (scale 1/sqrt(d)), s_qk 1 (1/sqrt(d)),
    s_u = s_v = 1 (scale 1), s_z 1 (1/sqrt(d)); no norm layers; every vector used is s_init."""
    cfg = tiny(n_embd=16, mlp_ratio=2)
    model = GPT(cfg)
    d = cfg.n_embd
    sd = model.state_dict()
    expect = {"blocks.0.alpha_attn.weight": ((d,), 1 / math.sqrt(d), 0.05),
              "blocks.0.alpha_mlp.weight": ((d,), 1 / math.sqrt(d), 0.05),
              "blocks.0.attn.qk_norm.s_qk.weight": ((2, 1, 8), 1 / math.sqrt(d), 1.0),
              "blocks.0.mlp.s_u.weight": ((32,), 1.0, 1.0), "blocks.0.mlp.s_v.weight": ((32,), 1.0, 1.0),
              "head.s_z.weight": ((11,), 1 / math.sqrt(d), 1.0)}
    b = model.blocks[0]
    used = {"blocks.0.alpha_attn.weight": b.alpha_attn, "blocks.0.alpha_mlp.weight": b.alpha_mlp,
            "blocks.0.attn.qk_norm.s_qk.weight": b.attn.qk_norm.s_qk, "blocks.0.mlp.s_u.weight": b.mlp.s_u,
            "blocks.0.mlp.s_v.weight": b.mlp.s_v, "head.s_z.weight": model.head.s_z}
    for name, (shape, stored, value) in expect.items():
        assert sd[name].shape == shape
        np.testing.assert_allclose(sd[name], stored, rtol=1e-15, err_msg=name)
        np.testing.assert_allclose(used[name]().data, value, rtol=1e-14, err_msg=name)
        assert used[name].weight.no_decay
    assert model.ln_f is None and not any("norm1" in k or "norm2" in k for k in sd)


def test_matrices_start_on_the_sphere():
    for name, (w, axis) in sphere_matrices(GPT(tiny(dtype="float32"))).items():
        np.testing.assert_allclose(np.linalg.norm(w.astype(np.float64), axis=axis), 1.0, atol=1e-6, err_msg=name)


# ------------------------------------------------------------------ forward = the paper's equations

def reference_logits(model, idx):
    """nGPT's forward in plain NumPy from the state dict, the constants written out here."""
    cfg, sd = model.config, model.state_dict()
    C, H = cfg.n_embd, cfg.n_head
    D, T, sqrt_c = C // H, idx.shape[1], math.sqrt(C)
    norm = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)
    heads = lambda x: x.reshape(x.shape[0], T, H, D).transpose(0, 2, 1, 3)
    silu = lambda x: x / (1.0 + np.exp(-x))
    mask = np.tril(np.ones((T, T), dtype=bool))
    h = norm(sd["wte.weight"][idx])
    for l in range(cfg.n_layer):
        w = lambda name: sd[f"blocks.{l}.{name}"]
        s_qk = w("attn.qk_norm.s_qk.weight") * sqrt_c                    # init 1, scale 1/sqrt(C)
        q, k, v = (heads(h @ w(f"attn.{n}.weight")) for n in "qkv")
        q, k = norm(q) * s_qk, norm(k) * s_qk
        z = np.where(mask, math.sqrt(D) * q @ k.transpose(0, 1, 3, 2), -np.inf)
        P = np.exp(z - z.max(-1, keepdims=True))
        P /= P.sum(-1, keepdims=True)
        h_a = (P @ v).transpose(0, 2, 1, 3).reshape(h.shape) @ w("attn.proj.weight")
        alpha_a = w("alpha_attn.weight") * 0.05 * sqrt_c                   # init 0.05, scale 1/sqrt(C)
        h = norm(h + alpha_a * (norm(h_a) - h))
        u = (h @ w("mlp.fc_u.weight")) * w("mlp.s_u.weight")
        nu = (h @ w("mlp.fc_v.weight")) * w("mlp.s_v.weight") * sqrt_c
        h_m = (u * silu(nu)) @ w("mlp.proj.weight")
        alpha_m = w("alpha_mlp.weight") * 0.05 * sqrt_c
        h = norm(h + alpha_m * (norm(h_m) - h))
    return (h @ sd["head.out.weight"]) * sd["head.s_z.weight"] * sqrt_c


@pytest.mark.parametrize("perturbed", [False, True])
def test_forward_is_the_papers_equations(perturbed):
    model = GPT(tiny(n_layer=3))
    if perturbed:                                                        # every vector off its init
        perturb(model, 0.3)
    np.testing.assert_allclose(model(IDX)[0].data, reference_logits(model, IDX), rtol=1e-12, atol=1e-12)


def test_hidden_states_are_unit_vectors_and_the_initial_loss_is_near_log_v():
    model = GPT(tiny(n_embd=32, vocab_size=64, dtype="float32"))
    idx = np.random.default_rng(0).integers(0, 64, (2, 6))
    tr = model.trace(idx)
    for h in tr.hidden:
        np.testing.assert_allclose(np.linalg.norm(h, axis=-1), 1.0, atol=1e-5)
    _, loss = model(idx, idx)
    assert abs(float(loss.data) - math.log(64)) < 0.1                    # logits are cosines


def test_unit_and_renormalise():
    x = Tensor(np.random.default_rng(0).standard_normal((3, 5)) * 7.0)
    np.testing.assert_allclose(np.linalg.norm(unit(x).data, axis=-1), 1.0, rtol=1e-14)
    w = Tensor(np.random.default_rng(1).standard_normal((4, 6)))
    buffer = w.data
    renormalise(w, 0)
    assert w.data is buffer                                              # in place
    np.testing.assert_allclose(np.linalg.norm(w.data, axis=0), 1.0, rtol=1e-14)


# ------------------------------------------------------------------ gradients

@pytest.mark.parametrize("extra", [dict(), dict(activation="gelu", mlp_ratio=2),
                                   dict(residual_attention=True), dict(n_head=1)])
def test_directional_gradcheck(extra):
    model = GPT(tiny(**extra), seed=0)
    perturb(model)
    assert check_directions(lambda: model(IDX, TARGETS)[1], model.parameters(), n_directions=3) < 1e-6


# ------------------------------------------------------------------ after_step

@pytest.mark.parametrize("dtype,tol", [("float64", 1e-13), ("float32", 3e-7)])
def test_every_weight_vector_has_norm_one_after_a_step_and_after_step(dtype, tol):
    model = GPT(tiny(dtype=dtype))
    opt = AdamW(model.parameters(), lr=0.05, weight_decay=0.1)
    for _ in range(2):
        _, loss = model(IDX, TARGETS)
        loss.backward()
        opt.step()
        opt.zero_grad()
        off = max(np.abs(np.linalg.norm(w.astype(np.float64), axis=a) - 1).max()
                  for w, a in sphere_matrices(model).values())
        assert off > 1e-3                                                # the step left the sphere
        model.after_step()
        for name, (w, axis) in sphere_matrices(model).items():
            np.testing.assert_allclose(np.linalg.norm(w.astype(np.float64), axis=axis), 1.0, atol=tol,
                                       err_msg=name)
    assert len(sphere_matrices(model)) == 2 + 7 * model.config.n_layer


# ------------------------------------------------------------------ resume

TINY = ["--n_layer=2", "--n_embd=16", "--n_head=2", "--block_size=16", "--batch_size=4", "--eval_iters=2",
        "--sample_tokens=8", "--warmup_iters=0", "--residual=ngpt", "--attention=softmax",
        "--activation=swish", "--learning_rate=0.01", "--log_interval=1", "--eval_interval=3",
        "--lr_decay_iters=6", "--checkpoint_interval=100"]


def test_resume_reproduces_the_uninterrupted_run(tmp_path, monkeypatch):
    """train.py calls after_step(); a checkpoint holds the renormalised weights as parameters,
    so a run resumed at iter 3 ends with the uninterrupted run's weights, bit for bit."""
    monkeypatch.setenv("NANOSPA_CACHE", str(tmp_path / "cache"))
    text = tmp_path / "tiny.txt"
    rng = np.random.default_rng(0)
    text.write_text(" ".join(rng.choice(["the", "sphere", "norm", "token", "learns"], size=1200)), encoding="utf-8")
    run = lambda out, *extra: train.main(TINY + [f"--data={text}", f"--out_dir={tmp_path / out}", *extra])
    assert run("whole", "--max_iters=6") == 0
    assert run("split", "--max_iters=3") == 0
    assert run("split", "--max_iters=6", "--init_from=resume") == 0
    w, s = (np.load(tmp_path / d / "ckpt.npz", allow_pickle=False) for d in ("whole", "split"))
    names = [n for n in w.files if n.startswith(("model/", "optim/"))]
    assert any(n.endswith("alpha_attn.weight") for n in names)
    for name in names:
        np.testing.assert_array_equal(w[name], s[name], err_msg=name)
    cfg = json.loads(str(w["config"]))
    assert cfg["residual"] == "ngpt"
    wte = w["model/wte.weight"].astype(np.float64)
    np.testing.assert_allclose(np.linalg.norm(wte, axis=1), 1.0, atol=1e-6)


def test_blockwise_attention_is_the_dense_one():
    """attention_impl="blockwise" gets nGPT's normalised q, k and scale sqrt(d_k) too."""
    dense = GPT(tiny(attention_impl="dense"))
    blockwise = GPT(tiny(attention_impl="blockwise", attention_block=4))
    perturb(dense), perturb(blockwise)
    np.testing.assert_allclose(blockwise(IDX)[0].data, dense(IDX)[0].data, rtol=1e-12, atol=1e-12)
