"""nanospa/beyond/muon.py: the Newton-Schulz iteration against a plain float64 reference and
the band its singular values land in, one and two steps of the whole optimiser against a
float64 reference written out here, the fan-in / fan-out scale in nanospa's (in, out)
orientation, which parameters take Muon and which AdamW on several model variants, the
settings' checks, the checkpointed state (a resume continues bit for bit; another
optimiser's state is refused), no host reads in the step, and (slow) train.py's exact
resume and two MPI ranks training as one process. docs/muon.md states what is tested here.

Notation as in muon.py: W (n_in, n_out), y = x W, M the momentum, mu its coefficient."""
import re

import numpy as np
import pytest
from conftest import DEVICES, tiny_config

import train
from nanospa import GPT, backend
from nanospa.beyond.kfac import KFAC
from nanospa.beyond.muon import Muon, hidden_matrices, newton_schulz, update_scale
from nanospa.beyond.optimizers import (MUON_KEYS, OPTIMIZER_DEFAULTS, RATES, check_optimizer,
                                       make_optimizer, rates_for)
from nanospa.optim import AdamW

from test_distributed import MPIEXEC, RTOL, _has_mpi4py, log_losses, run_train
from test_train import read_log, run, text_file  # noqa: F401 (fixture)

# The public description's quintic, written here, not imported: a wrong coefficient in
# muon.py must show as a difference.
A, B, C = 3.4445, -4.7750, 2.0315
BAND = (0.68, 1.21)   # measured below (test_band_is_the_quintic_maps): after 5 steps, for s / ||G||_F >= 2e-3
SMALLEST = 2e-3       # the smallest normalised singular value that is carried into the band


def reference_ns(G, steps=5, eps=1e-7):
    """The iteration as written: X = G / (||G||_F + eps), then X <- a X + b (X X^T) X +
    c (X X^T)^2 X, in float64, on G as it is (no transposing)."""
    X = np.asarray(G, dtype=np.float64) / (np.linalg.norm(G) + eps)
    for _ in range(steps):
        S = X @ X.T
        X = A * X + B * (S @ X) + C * (S @ S @ X)
    return X


def random_matrix(shape, seed, scale=1.0):
    return scale * np.random.default_rng(seed).standard_normal(shape)


def spread_matrix(shape, seed, lo=1e-2):
    """A matrix with singular values log-spaced from lo to 1 (times 50): a spread spectrum."""
    rng = np.random.default_rng(seed)
    m, n = shape
    k = min(m, n)
    U, _ = np.linalg.qr(rng.standard_normal((m, k)))
    V, _ = np.linalg.qr(rng.standard_normal((n, k)))
    return 50 * (U * np.geomspace(lo, 1, k)) @ V.T


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOSPA_CACHE", str(tmp_path / "cache"))


SHAPES = [(16, 16), (8, 32), (48, 12), (1, 9), (9, 1)]


# ----------------------------------------------------------------------------- the iteration

@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("scale", [1.0, 1e-6, 3e4])
def test_newton_schulz_is_the_float64_reference(shape, scale):
    """float64 to rounding, float32 to float32's rounding: square, wide, tall, a row, a column;
    small and large norms (the Frobenius normalisation removes the norm)."""
    G = random_matrix(shape, seed=sum(shape), scale=scale)
    ref = reference_ns(G)
    out = newton_schulz(G)
    assert out.shape == G.shape and out.dtype == np.float64
    np.testing.assert_allclose(out, ref, rtol=1e-10, atol=1e-12)
    out32 = newton_schulz(G.astype(np.float32))
    assert out32.dtype == np.float32
    np.testing.assert_allclose(out32, ref, rtol=0, atol=2e-5 * np.abs(ref).max())


def test_steps_and_a_zero_matrix():
    G = random_matrix((6, 10), seed=1)
    np.testing.assert_allclose(newton_schulz(G, steps=2), reference_ns(G, steps=2), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(newton_schulz(G, steps=1), reference_ns(G, steps=1), rtol=1e-10, atol=1e-12)
    assert not newton_schulz(np.zeros((4, 6))).any()        # eps: zero in, zero out, no NaN


def test_band_is_the_quintic_maps():
    """The band is the scalar map's: p(s) = a s + b s^3 + c s^5 five times, over normalised
    singular values s in [2e-3, 1], spans [0.682, 1.202]; BAND holds it with rounding room.
    Smaller s are not carried there (1e-3 ends at 0.47)."""
    s = np.geomspace(SMALLEST, 1.0, 200001)
    x = s.copy()
    for _ in range(5):
        x = A * x + B * x ** 3 + C * x ** 5
    assert 0.6815 < x.min() < 0.682 and 1.202 < x.max() < 1.203
    assert BAND[0] <= x.min() and x.max() <= BAND[1]
    y = 1e-3
    for _ in range(5):
        y = A * y + B * y ** 3 + C * y ** 5
    assert y < BAND[0]


@pytest.mark.parametrize("make", [
    lambda: random_matrix((32, 128), 3), lambda: random_matrix((128, 32), 4),
    lambda: random_matrix((64, 256), 5, scale=1e3), lambda: spread_matrix((24, 24), 6),
    lambda: spread_matrix((40, 16), 7, lo=5e-2)])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_result_is_orthogonal_up_to_the_band(make, dtype):
    """U S' V^T: the singular vectors kept (the result's Gram commutes with G's), the singular
    values in BAND (every normalised one is >= 2e-3 in these matrices), not all at 1: the
    iteration's band, measured, not tuned."""
    G = make()
    s_in = np.linalg.svd(G, compute_uv=False)
    assert s_in.min() / np.linalg.norm(G) >= SMALLEST
    X = newton_schulz(G.astype(dtype)).astype(np.float64)
    s_out = np.linalg.svd(X, compute_uv=False)
    assert BAND[0] <= s_out.min() and s_out.max() <= BAND[1], (s_out.min(), s_out.max())
    U, _, Vt = np.linalg.svd(G, full_matrices=False)
    tol = 1e-9 if dtype == "float64" else 1e-4
    np.testing.assert_allclose(U.T @ X @ Vt.T, np.diag(np.diag(U.T @ X @ Vt.T)), atol=tol)
    if G.shape == (24, 24):                                  # a spread spectrum: a band, not a point
        assert s_out.max() - s_out.min() > 0.1


def test_update_scale_is_fan_out_over_fan_in_for_in_out_weights():
    """nanospa's Linear stores (n_in, n_out): the MLP's fc (C, 4C) steps sqrt(4) = 2 in spectral
    norm, its proj (4C, C) and a square matrix 1 (PyTorch's (out, in): rows / cols)."""
    assert update_scale((64, 256)) == 2.0
    assert update_scale((256, 64)) == 1.0
    assert update_scale((64, 64)) == 1.0
    model = GPT(tiny_config(), seed=0)
    fc, proj = model.blocks[0].mlp.fc.weight, model.blocks[0].mlp.proj.weight
    assert fc.shape == (8, 32) and update_scale(fc.shape) == 2.0 and update_scale(proj.shape) == 1.0


# ----------------------------------------------------------------------------- the step

def set_gradients(model, seed):
    rng = np.random.default_rng(seed)
    for p in model.parameters():
        p.grad = rng.standard_normal(p.shape)


HIDDEN = re.compile(r"blocks\.\d+\.(attn\.(q|k|v|proj)|mlp\.(fc|proj|fc_u|fc_v))\.weight")


def reference_steps(model, grads, lrs, mu, nesterov, wd, ratio, b1=0.9, b2=0.95, eps=1e-8):
    """Every parameter of `model` after len(grads) steps at learning rates `lrs`, in float64
    from the equations: Muon on the names HIDDEN matches, Adam with bias correction at
    lr * ratio on the rest, decoupled decay (not on no_decay parameters) on both."""
    out = {}
    for name, p in model.named_parameters():
        w = np.array(p.data, dtype=np.float64)
        M, m, v = np.zeros_like(w), np.zeros_like(w), np.zeros_like(w)
        for t, (gs, lr) in enumerate(zip(grads, lrs), start=1):
            g = gs[name]
            if HIDDEN.fullmatch(name):
                M = mu * M + (1 - mu) * g
                U = (1 - mu) * g + mu * M if nesterov else M
                n_in, n_out = w.shape
                w = (1 - lr * wd) * w - lr * np.sqrt(max(1, n_out / n_in)) * reference_ns(U)
            else:
                a = lr * ratio
                m = b1 * m + (1 - b1) * g
                v = b2 * v + (1 - b2) * g * g
                step = a * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
                w = (w if p.no_decay else (1 - a * wd) * w) - step
        out[name] = w
    return out


@pytest.mark.parametrize("nesterov", [True, False])
@pytest.mark.parametrize("kw", [dict(), dict(bias=True, norm="layernorm", residual="standard", attention="softmax",
                                             pos="learned")])
def test_two_steps_are_the_float64_reference(nesterov, kw):
    """Momentum, Nesterov, the scale, weight decay and lr on the hidden matrices, AdamW at
    lr * ratio on the rest (decayed only where not no_decay), over two steps whose rates
    differ as the schedule's do: to rounding."""
    model = GPT(tiny_config(**kw), seed=0)
    opt = Muon(model, lr=0.05, momentum=0.9, nesterov=nesterov, weight_decay=0.1, adam_lr_ratio=0.3)
    grads, lrs = [], (0.05, 0.03)
    for seed, lr in enumerate(lrs):
        set_gradients(model, seed)
        grads.append({n: p.grad.copy() for n, p in model.named_parameters()})
        opt.lr = lr
        opt.step()
    want = reference_steps(GPT(tiny_config(**kw), seed=0), grads, lrs, 0.9, nesterov, 0.1, 0.3)
    for name, p in model.named_parameters():
        np.testing.assert_allclose(p.data, want[name], rtol=1e-10, atol=1e-13, err_msg=name)
    assert opt.t == 2


def test_a_parameter_without_gradient_is_left_alone():
    model = GPT(tiny_config(), seed=0)
    before = {n: p.data.copy() for n, p in model.named_parameters()}
    opt = Muon(model, weight_decay=0.1)
    set_gradients(model, 0)
    skipped = ("blocks.0.attn.k.weight", "wte.weight")
    for name, p in model.named_parameters():
        if name in skipped:
            p.grad = None
    opt.step()
    for name, p in model.named_parameters():
        assert (name in skipped) == np.array_equal(p.data, before[name]), name
    assert opt.mom[opt.params.index(model.blocks[0].attn.k.weight)] is None


# ----------------------------------------------------------------------------- which parameters

VARIANTS = {   # name -> GPTConfig overrides; every one the split is checked on
    "vanilla E-SPA": dict(),
    "Pre-LN, learned positions": dict(attention="softmax", residual="standard", norm="layernorm", pos="learned"),
    "Value-SkipInit": dict(attention="value_skipinit"),
    "trainable B_l": dict(train_bias=True),
    "Linear biases": dict(bias=True, attention="softmax", residual="standard", norm="rmsnorm"),
    "nGPT": dict(residual="ngpt", attention="softmax", activation="swish"),
}
ADAMW_EXPECTED = {   # names (regex) that must be on AdamW's side in the variant, besides the rest
    "vanilla E-SPA": [r"wte\.weight", r"head\.weight"],
    "Pre-LN, learned positions": [r"wpe\.weight", r"blocks\.0\.norm1\.weight", r"ln_f\.bias"],
    "Value-SkipInit": [r"blocks\.1\.attn\.alpha", r"blocks\.1\.attn\.beta"],
    "trainable B_l": [r"blocks\.0\.attn\.B"],
    "Linear biases": [r"blocks\.0\.attn\.q\.bias", r"blocks\.1\.mlp\.fc\.bias"],
    "nGPT": [r"head\.out\.weight", r"head\.s_z\.weight", r"blocks\.0\.alpha_attn\.weight",
             r"blocks\.0\.mlp\.s_u\.weight", r"blocks\.0\.attn\.qk_norm\.s_qk\.weight"],
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_hidden_matrices_take_muon_and_everything_else_adamw(variant):
    """By where a parameter sits: the blocks' Linear weights (6 per block, 7 with nGPT's gate)
    are Muon's; the embeddings, the head, gains, biases, scalars and a trainable B_l (2-D, in
    the blocks) are AdamW's, and every parameter is on exactly one side."""
    model = GPT(tiny_config(**VARIANTS[variant]), seed=0)
    names = [n for n, _ in model.named_parameters()]
    opt = make_optimizer({**train.DEFAULTS, "optimizer": "muon"}, model)
    assert isinstance(opt, Muon)
    mine = [names[i] for i in opt.matrices]
    assert mine == [n for n in names if HIDDEN.fullmatch(n)]
    assert [n for _, n in hidden_matrices(model)] == mine
    assert len(mine) == (7 if variant == "nGPT" else 6) * model.config.n_layer
    assert sorted(opt.matrices + opt.others) == list(range(len(names)))
    others = [names[i] for i in opt.others]
    for pattern in ADAMW_EXPECTED[variant]:
        assert any(re.fullmatch(pattern, n) for n in others), (pattern, others)
    assert all(p.ndim == 2 for i, p in enumerate(opt.params) if i in opt.matrices)


def test_a_model_without_blocks_is_refused():
    from nanospa.nn import Linear
    with pytest.raises(ValueError, match="model.blocks"):
        Muon(Linear(3, 4))


# ----------------------------------------------------------------------------- settings

def test_settings_are_train_settings_with_help_and_rates(capsys):
    assert MUON_KEYS == ["muon_momentum", "muon_nesterov", "muon_ns_steps", "muon_adam_lr_ratio"]
    assert (OPTIMIZER_DEFAULTS["muon_momentum"], OPTIMIZER_DEFAULTS["muon_nesterov"],
            OPTIMIZER_DEFAULTS["muon_ns_steps"]) == (0.95, True, 5)          # the public defaults
    assert train.main(["--help"]) == 0
    out = capsys.readouterr().out
    for key in MUON_KEYS:
        assert train.DEFAULTS[key] == OPTIMIZER_DEFAULTS[key]
        line = next(l for l in out.splitlines() if l.lstrip().startswith(f"--{key}="))
        assert "Muon" in line, line
    assert "muon" in next(l for l in out.splitlines() if l.lstrip().startswith("--optimizer="))
    assert RATES["muon"] == dict(learning_rate=2e-2, min_lr=2e-3)
    s = rates_for({**train.DEFAULTS, "optimizer": "muon"}, given={"optimizer"})
    assert (s["learning_rate"], s["min_lr"]) == (2e-2, 2e-3)
    s = rates_for({**train.DEFAULTS, "optimizer": "muon", "learning_rate": 0.01}, given={"optimizer", "learning_rate"})
    assert (s["learning_rate"], s["min_lr"]) == (0.01, 2e-3)


def test_make_optimizer_passes_every_setting():
    model = GPT(tiny_config(), seed=0)
    s = {**train.DEFAULTS, "optimizer": "muon", "learning_rate": 0.07, "muon_momentum": 0.8, "muon_nesterov": False,
         "muon_ns_steps": 3, "muon_adam_lr_ratio": 0.5, "beta1": 0.85, "beta2": 0.9, "weight_decay": 0.01}
    opt = make_optimizer(s, model, seed=5, rank=1)
    assert (opt.lr, opt.momentum, opt.nesterov, opt.ns_steps, opt.adam_lr_ratio, opt.b1, opt.b2, opt.weight_decay) \
        == (0.07, 0.8, False, 3, 0.5, 0.85, 0.9, 0.01)
    lean = {k: v for k, v in s.items() if k not in MUON_KEYS}              # callers with no muon_* keys
    assert make_optimizer(lean, model).momentum == 0.95
    assert isinstance(make_optimizer({**s, "optimizer": "adamw"}, model), AdamW)


BAD = [("muon_momentum", 1.0, "in [0, 1)"), ("muon_momentum", -0.1, "in [0, 1)"),
       ("muon_momentum", float("nan"), "in [0, 1)"), ("muon_nesterov", 1, "True or False"),
       ("muon_ns_steps", 0, "a positive integer"), ("muon_ns_steps", 2.5, "a positive integer"),
       ("muon_ns_steps", True, "a positive integer"), ("muon_adam_lr_ratio", -1.0, "finite and >= 0"),
       ("muon_adam_lr_ratio", float("inf"), "finite and >= 0")]


@pytest.mark.parametrize("key, value, what", BAD)
def test_bad_settings_are_one_line_errors_naming_the_setting(key, value, what):
    with pytest.raises(ValueError) as e:
        check_optimizer({**train.DEFAULTS, "optimizer": "muon", key: value})
    msg = str(e.value)
    assert msg.startswith(key) and what in msg and "\n" not in msg


@pytest.mark.parametrize("arg, named", [("--muon_momentum=1.5", "muon_momentum"), ("--muon_ns_steps=0", "muon_ns_steps"),
                                        ("--muon_adam_lr_ratio=-1", "muon_adam_lr_ratio"),
                                        ("--mup_base_width=64", "mup_base_width")])
def test_train_refuses_bad_settings_before_anything_is_written(arg, named, tmp_path, capsys):
    assert train.main(["--optimizer=muon", arg, f"--out_dir={tmp_path / 'out'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and named in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_constructor_checks_its_arguments():
    model = GPT(tiny_config(), seed=0)
    for kw in (dict(momentum=1.0), dict(nesterov="yes"), dict(ns_steps=0), dict(weight_decay=-1.0),
               dict(adam_lr_ratio=float("nan")), dict(adam_eps=0.0)):
        with pytest.raises(ValueError, match=next(iter(kw))):
            Muon(model, **kw)
    with pytest.raises(ValueError, match="learning rate"):
        Muon(model, lr=float("nan"))
    with pytest.raises(ValueError, match="beta1"):
        Muon(model, adam_betas=(1.0, 0.9))


# ----------------------------------------------------------------------------- state

def steps(model, opt, seeds):
    for seed in seeds:
        set_gradients(model, seed)
        opt.step()
        opt.zero_grad()


def test_state_dict_resumes_bit_for_bit_and_holds_every_buffer():
    """Three steps, or one, a state_dict through host arrays into a fresh model and Muon, then
    two more: equal arrays, bit for bit (float32)."""
    cfg = tiny_config(dtype="float32", attention="value_skipinit")
    whole = GPT(cfg, seed=0)
    opt = Muon(whole, weight_decay=0.1)
    steps(whole, opt, [1, 2, 3])
    first = GPT(cfg, seed=0)
    opt1 = Muon(first, weight_decay=0.1)
    steps(first, opt1, [1])
    state, weights = opt1.state_dict(), first.state_dict()
    assert sorted(state) == sorted(["t", "muon.matrices"] + [f"muon.mom.{i}" for i in opt1.matrices]
                                   + [f"muon.{k}.{i}" for i in opt1.others for k in "mv"])
    assert all(isinstance(a, np.ndarray) for a in state.values())
    resumed = GPT(cfg, seed=1)
    resumed.load_state_dict(weights)
    opt2 = Muon(resumed, weight_decay=0.1)
    opt2.load_state_dict({k: v.copy() for k, v in state.items()})
    assert opt2.t == 1 and all(opt2.mom[i].dtype == np.float32 for i in opt2.matrices)
    steps(resumed, opt2, [2, 3])
    for (name, a), b in zip(whole.named_parameters(), resumed.parameters()):
        np.testing.assert_array_equal(a.data, b.data, err_msg=name)
    for k, v in opt.state_dict().items():
        np.testing.assert_array_equal(v, opt2.state_dict()[k], err_msg=k)


def test_another_optimisers_state_is_refused():
    model = GPT(tiny_config(), seed=0)
    adam, kfac, opt = AdamW(model.parameters()), KFAC(model), Muon(model)
    set_gradients(model, 0)
    adam.step()
    with pytest.raises(ValueError, match="not Muon's"):
        opt.load_state_dict(adam.state_dict())
    with pytest.raises(ValueError, match="not K-FAC's"):
        kfac.load_state_dict(opt.state_dict())
    opt.step()
    state = opt.state_dict()
    other = Muon(GPT(tiny_config(train_bias=True), seed=0))         # one more parameter per block
    with pytest.raises(ValueError, match="other hidden matrices"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="keys this model does not"):
        Muon(model).load_state_dict({**state, "muon.x.0": np.zeros(1)})
    bad = dict(state)
    bad[f"muon.mom.{opt.matrices[0]}"] = np.zeros((3, 3))
    with pytest.raises(ValueError, match="shape"):
        Muon(model).load_state_dict(bad)


# ----------------------------------------------------------------------------- the device

class HostRead(np.ndarray):
    """An ndarray that refuses every read to a Python number or bool: on a GPU each of these
    would wait for the device and copy back. Results of operations stay HostRead."""

    def __array_wrap__(self, arr, context=None, return_scalar=False):
        return np.asarray(arr).view(HostRead)

    def _refuse(self, *args, **kwargs):
        raise AssertionError("host read in the optimiser step")

    __float__ = __int__ = __bool__ = __index__ = item = tolist = _refuse


def test_the_step_reads_nothing_back_to_the_host():
    model = GPT(tiny_config(bias=True, norm="layernorm", residual="standard", attention="softmax"), seed=0)
    opt = Muon(model, weight_decay=0.1)
    set_gradients(model, 0)
    for p in model.parameters():
        p.data, p.grad = p.data.view(HostRead), p.grad.view(HostRead)
    with pytest.raises(AssertionError, match="host read"):
        float(model.parameters()[0].data.sum())                    # the guard works
    opt.step()
    opt.step()
    assert all(isinstance(opt.mom[i], HostRead) for i in opt.matrices)


@pytest.mark.parametrize("device", DEVICES)
def test_same_steps_on_every_device(device):
    """float64: CuPy (where a GPU exists) gives the CPU's weights and state to rounding."""
    out = []
    for dev in ("cpu", device):
        backend.use(dev)
        model = GPT(tiny_config(attention="value_skipinit"), seed=0)
        opt = Muon(model, weight_decay=0.1)
        for seed in (1, 2):
            rng = np.random.default_rng(seed)
            for p in model.parameters():
                p.grad = backend.asarray(rng.standard_normal(p.shape))
            opt.step()
        out.append([backend.to_numpy(p.data) for p in model.parameters()] + list(opt.state_dict().values()))
    backend.use("cpu")
    for a, b in zip(*out):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)


def test_threads_do_not_change_the_step():
    from nanospa.run import threads as cpu
    results = []
    for n in (1, 2):
        previous = cpu.set_threads(n)
        try:
            model = GPT(tiny_config(), seed=0)
            steps(model, Muon(model), [1, 2])
        finally:
            cpu.set_threads(previous)
        results.append([p.data.copy() for p in model.parameters()])
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)


# ----------------------------------------------------------------------------- train.py (slow)

MUON_ARGS = ["--optimizer=muon", "--dtype=float64", "--log_interval=1", "--eval_interval=3", "--lr_decay_iters=8",
             "--checkpoint_interval=100", "--sample_tokens=0", "--weight_decay=0.1"]


@pytest.mark.slow
def test_train_resume_continues_step_for_step(tmp_path, text_file):
    """8 steps at once, and 5 then a resume to 8: equal losses at every step and equal
    checkpoints (weights, momentum buffers, the AdamW side's moments), bit for bit."""
    assert run(tmp_path, text_file, "--max_iters=8", *MUON_ARGS, out="whole") == 0
    assert run(tmp_path, text_file, "--max_iters=5", *MUON_ARGS, out="split") == 0
    assert run(tmp_path, text_file, "--max_iters=8", "--init_from=resume", *MUON_ARGS, out="split") == 0
    whole, split = read_log(tmp_path / "whole"), read_log(tmp_path / "split")
    assert [(r["iter"], r["train_loss"]) for r in whole] == [(r["iter"], r["train_loss"]) for r in split]
    assert whole[-1]["train_loss"] < whole[1]["train_loss"]        # it trained
    w = np.load(tmp_path / "whole" / "ckpt.npz", allow_pickle=False)
    s = np.load(tmp_path / "split" / "ckpt.npz", allow_pickle=False)
    assert any(k.startswith("optim/muon.mom.") for k in w.files) and any(k.startswith("optim/muon.v.") for k in w.files)
    assert sorted(w.files) == sorted(s.files)
    for name in w.files:
        if name.startswith(("model/", "optim/")):
            np.testing.assert_array_equal(w[name], s[name], err_msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("first, second", [("muon", "adamw"), ("adamw", "muon"), ("kfac", "muon")])
def test_resume_with_another_optimiser_is_refused(first, second, tmp_path, text_file, capsys):
    assert run(tmp_path, text_file, "--max_iters=1", "--sample_tokens=0", f"--optimizer={first}") == 0
    capsys.readouterr()
    assert run(tmp_path, text_file, "--max_iters=2", "--init_from=resume", f"--optimizer={second}") == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and f"optimizer={second!r}" in err and first in err and len(err.splitlines()) == 1


@pytest.mark.slow
def test_a_resumed_muon_run_keeps_its_rates(tmp_path, text_file):
    from nanospa.run.checkpoint import load_checkpoint
    assert run(tmp_path, text_file, "--max_iters=1", "--optimizer=muon", out="o") == 0
    s = load_checkpoint(str(tmp_path / "o" / "ckpt.npz"))["settings"]
    assert (s["learning_rate"], s["min_lr"]) == (2e-2, 2e-3)                   # Muon's own
    assert run(tmp_path, text_file, "--max_iters=2", "--init_from=resume", out="o") == 0
    s = load_checkpoint(str(tmp_path / "o" / "ckpt.npz"))["settings"]
    assert (s["optimizer"], s["learning_rate"], s["min_lr"]) == ("muon", 2e-2, 2e-3)


@pytest.mark.slow
def test_two_ranks_train_as_one_process_and_resume_under_another_count(tmp_path):
    """mpiexec -n 2 python train.py --optimizer=muon (float64): the gradients are averaged
    before the step, so every rank takes the one process's update; then 2 ranks, 1, 2 again
    (resuming each time) is the same run too."""
    if not (MPIEXEC and _has_mpi4py()):
        pytest.skip("mpi4py or mpiexec missing (extra [mpi])")
    args = ["--optimizer=muon", "--weight_decay=0.1", "--lr_decay_iters=6"]
    p1, p2 = run_train(0, tmp_path / "one", *args), run_train(2, tmp_path / "two", *args)
    assert p1.returncode == 0, p1.stderr
    assert p2.returncode == 0, p2.stderr
    (t1, v1), (t2, v2) = log_losses(tmp_path / "one"), log_losses(tmp_path / "two")
    assert len(t1) == len(t2) >= 6
    np.testing.assert_allclose(t2, t1, rtol=RTOL, atol=0)
    np.testing.assert_allclose(v2, v1, rtol=RTOL, atol=0)
    out = tmp_path / "mixed"
    for n, until, more in ((2, 2, []), (0, 4, ["--init_from=resume"]), (2, 6, ["--init_from=resume"])):
        p = run_train(n, out, *args, f"--max_iters={until}", *more)
        assert p.returncode == 0, p.stderr
    logs = [{r["iter"]: r for r in read_log(p)} for p in (tmp_path / "one", out)]
    assert sorted(logs[0]) == sorted(logs[1])
    for it, r in logs[0].items():
        np.testing.assert_allclose(logs[1][it]["train_loss"], r["train_loss"], rtol=RTOL, atol=0)
