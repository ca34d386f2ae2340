"""nanospa/beyond/norms.py and the train / eval mode (nn.Module.train): BatchNorm (plain and causal),
PRepBN and GroupNorm against NumPy references, float64 gradient checks of each op alone
(random upstream gradient) and of whole models in pre and post position with a residual,
running statistics (momentum, one update per step, deterministic under threads, in the
state dict), PRepBN's schedule, GroupNorm with one group = LayerNorm, evaluation mode in
generate / evaluate / train.py, and the GPTConfig fields. Future leakage:
tests/test_causality.py; kernel maps: tests/test_signal_norm_maps.py."""
import warnings

import numpy as np
import pytest

from nanospa import GPT, GPTConfig, backend
from nanospa.experiments.common import evaluate
from nanospa.gradcheck import check_directions, check_jacobian, tensor64
from nanospa.nn import LayerNorm
from nanospa.beyond.norms import BN_MOMENTUM, BatchNorm, BatchNormOp, GroupNorm, PRepBN, batch_stats
from nanospa.optim import AdamW
from nanospa.run import threads as cpu
from nanospa.run.threads import sharded_backward
from nanospa.sampling import generate
from nanospa.tensor import Tensor

from test_model import perturb  # the shared random move off the initialisation
from test_train import _cache, read_log, run, text_file  # noqa: F401  (fixtures and helpers)

pytestmark = pytest.mark.filterwarnings("ignore:norm=.* with norm_causal=False")

# Every output of BatchNorm depends on every input of its window, so the central difference
# of sum(out R) carries the rounding of all B T C outputs, about 1e-16 sqrt(B T C) / eps ~ 1e-9
# here (measured 0.7e-9); entries whose true value is near 0 are compared against 1e-8.
BN_ATOL = 1e-8
IDX = np.array([[1, 4, 4, 0, 9, 2], [3, 3, 7, 10, 1, 5]])
TARGETS = np.roll(IDX, -1, axis=1)


def tiny(**kw):
    base = dict(vocab_size=11, block_size=6, n_layer=2, n_head=2, n_embd=8, dtype="float64",
                activation="gelu", residual="standard", pos="learned", norm_groups=2, prepbn_steps=2)
    base.update(kw)
    return GPTConfig(**base)


def reference_bn(x, causal, eps=1e-5):
    """Per channel over the batch and positions (<= t when causal), in plain NumPy."""
    B, T, C = x.shape
    out = np.empty_like(x)
    for t in range(T):
        window = x[:, : t + 1] if causal else x
        mu, var = window.mean(axis=(0, 1)), window.var(axis=(0, 1))
        out[:, t] = (x[:, t] - mu) / np.sqrt(var + eps)
    return out


# ------------------------------------------------------------------ GPTConfig fields

@pytest.mark.parametrize("kw,message", [
    (dict(norm="groupnorm", norm_groups=3), "norm_groups=3 does not divide n_embd=128"),
    (dict(norm_groups=0), "norm_groups must be an integer >= 1"),
    (dict(prepbn_steps=-1), "prepbn_steps must be an integer >= 0"),
    (dict(prepbn_steps=2.5), "prepbn_steps must be an integer >= 0"),
    (dict(prepbn_eta=float("nan")), "prepbn_eta must be a finite number"),
    (dict(prepbn_eta="1"), "prepbn_eta must be a finite number"),
    (dict(norm="layernorm", norm_causal=True), r"norm_causal=True applies to norm in \['batchnorm', 'prepbn'\]"),
    (dict(norm="batchnorm", norm_causal="yes"), "norm_causal must be True or False"),
])
def test_bad_norm_fields_are_named(kw, message):
    with pytest.raises(ValueError, match="GPTConfig." + message):
        GPTConfig(**kw)
    GPTConfig(norm="groupnorm", norm_groups=4)                      # 128 / 4: fine
    GPTConfig(norm="groupnorm", norm_groups=3, n_embd=12, n_head=4)


def test_non_causal_batch_norms_warn_and_causal_ones_do_not():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        GPT(tiny(norm="batchnorm"))
        GPT(tiny(norm="prepbn", norm_causal=True))
    assert {str(w.message)[:17] for w in seen} == {"norm='batchnorm' "}


# ------------------------------------------------------------------ the ops alone

@pytest.mark.parametrize("causal", [False, True])
def test_batchnorm_matches_numpy_and_passes_the_jacobian_check(causal):
    rng = np.random.default_rng(0)
    x = tensor64(rng.standard_normal((3, 4, 5)) + 3.0)              # a large mean: the shift matters
    w, b = tensor64(rng.standard_normal(5)), tensor64(rng.standard_normal(5))

    def f(x, w, b):
        shift, mean, var, n = batch_stats(x.data, causal)
        return BatchNormOp.apply(x, w, b, shift=shift, mean=mean, var=var, n=n, causal=causal)

    np.testing.assert_allclose(f(x, w, b).data, reference_bn(x.data, causal) * w.data + b.data, rtol=1e-12, atol=1e-12)
    assert check_jacobian(f, [x, w, b], atol=BN_ATOL) < 1e-6


def test_batchnorm_with_fixed_statistics_passes_the_jacobian_check():
    rng = np.random.default_rng(1)
    x, w, b = tensor64(rng.standard_normal((2, 3, 4))), tensor64(rng.standard_normal(4)), tensor64(rng.standard_normal(4))
    mean, var = rng.standard_normal((1, 3, 4)), rng.uniform(0.5, 2.0, (1, 3, 4))
    f = lambda x, w, b: BatchNormOp.apply(x, w, b, shift=mean, mean=0.0, var=var, fixed=True)
    np.testing.assert_allclose(f(x, w, b).data, (x.data - mean) / np.sqrt(var + 1e-5) * w.data + b.data, rtol=1e-13)
    assert check_jacobian(f, [x, w, b]) < 1e-6


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("causal", [False, True])
def test_prepbn_layer_passes_the_jacobian_check_mid_schedule(training, causal):
    rng = np.random.default_rng(2)
    m = PRepBN(4, steps=4, causal=causal, block_size=3, dtype="float64")
    m.after_step()                                                  # lambda = 0.75: both terms matter
    m.bn.running_mean, m.bn.running_var = rng.standard_normal(m.bn.running_mean.shape), rng.uniform(0.5, 2, m.bn.running_var.shape)
    for p in m.parameters():
        p.data = p.data + 0.3 * rng.standard_normal(p.shape)
    m.train(training)
    x = tensor64(rng.standard_normal((2, 3, 4)))
    assert check_jacobian(lambda x, *ps: m(x), [x] + m.parameters(), atol=BN_ATOL) < 1e-6


def test_groupnorm_matches_numpy_and_passes_the_jacobian_check():
    rng = np.random.default_rng(3)
    gn = GroupNorm(6, 2, dtype="float64")     # 3 channels a group (with 2 the output is +-1 up to eps)
    for p in gn.parameters():
        p.data = p.data + 0.5 * rng.standard_normal(p.shape)
    x = tensor64(rng.standard_normal((2, 3, 6)))
    g = x.data.reshape(2, 3, 2, 3)                                  # groups of adjacent channels
    ref = ((g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + 1e-5)).reshape(2, 3, 6)
    np.testing.assert_allclose(gn(x).data, ref * gn.weight.data + gn.bias.data, rtol=1e-12, atol=1e-14)
    assert check_jacobian(lambda x, w, b: gn(x), [x, gn.weight, gn.bias]) < 1e-6


def test_groupnorm_with_one_group_is_layernorm():
    rng = np.random.default_rng(4)
    gn, ln = GroupNorm(6, 1, dtype="float64"), LayerNorm(6, dtype="float64")
    for p, q in zip(gn.parameters(), ln.parameters()):
        p.data = q.data = rng.standard_normal(p.shape)
    x1, x2 = tensor64(rng.standard_normal((2, 3, 6))), None
    x2 = tensor64(x1.data.copy())
    y1, y2 = gn(x1), ln(x2)
    np.testing.assert_array_equal(y1.data, y2.data)
    R = rng.standard_normal(y1.shape)
    y1.backward(R)
    y2.backward(R)
    for a, b in ((x1, x2), (gn.weight, ln.weight), (gn.bias, ln.bias)):
        np.testing.assert_allclose(a.grad, b.grad, rtol=1e-13, atol=1e-15)
    a, b = GPT(tiny(norm="groupnorm", norm_groups=1)), GPT(tiny(norm="layernorm"))
    assert list(a.state_dict()) == list(b.state_dict())
    np.testing.assert_array_equal(a(IDX, TARGETS)[0].data, b(IDX, TARGETS)[0].data)


# ------------------------------------------------------------------ whole models

@pytest.mark.parametrize("norm,causal", [("batchnorm", False), ("batchnorm", True), ("prepbn", False),
                                         ("prepbn", True), ("groupnorm", False)])
@pytest.mark.parametrize("position", ["pre", "post"])
def test_model_directional_gradcheck(norm, causal, position):
    model = GPT(tiny(norm=norm, norm_causal=causal, norm_position=position))
    model.after_step()                                              # PRepBN: lambda = 0.5
    perturb(model)
    assert check_directions(lambda: model(IDX, TARGETS)[1], model.parameters(), n_directions=2) < 1e-6
    model.eval()                                                    # running statistics
    assert check_directions(lambda: model(IDX, TARGETS)[1], model.parameters(), n_directions=2) < 1e-6


# ------------------------------------------------------------------ running statistics

@pytest.mark.parametrize("causal", [False, True])
def test_running_statistics_move_once_per_step_with_the_momentum(causal):
    rng = np.random.default_rng(5)
    bn = BatchNorm(3, causal=causal, block_size=6, dtype="float64")
    x = rng.standard_normal((4, 5, 3)) * 2.0 + 1.0                  # T = 5 < block_size
    bn(Tensor(x))
    np.testing.assert_array_equal(bn.running_mean, 0.0)            # nothing before the step
    bn.after_step()
    _, mean, var, _ = batch_stats(x, causal)
    mean = mean + x[:, :1].mean(axis=0, keepdims=True)
    rows = 5 if causal else 1
    m = BN_MOMENTUM
    np.testing.assert_allclose(bn.running_mean[:rows], m * mean[0], rtol=1e-14)
    np.testing.assert_allclose(bn.running_var[:rows], (1 - m) + m * var[0], rtol=1e-14)
    if causal:
        np.testing.assert_array_equal(bn.running_mean[5], 0.0)      # a position the batch lacked
        np.testing.assert_allclose(bn.running_mean[0], m * x[:, 0].mean(0), rtol=1e-13)
    bn.eval()
    y = bn(Tensor(x)).data
    expected = (x - bn.running_mean[:rows]) / np.sqrt(bn.running_var[:rows] + 1e-5)
    np.testing.assert_allclose(y, expected, rtol=1e-13)
    assert bn.pending == []                                         # evaluation records nothing


def test_the_fold_does_not_depend_on_the_order_slices_finished():
    """Three slices' statistics (slice index, tokens, mean, var) arriving in two orders give
    bit-identical running statistics; the means below are chosen so that plain left-to-right
    sums differ with the order (without the fold's sort by slice this test fails)."""
    def fold(order):
        bn = BatchNorm(1, dtype="float64")
        entries = [(0, 4, np.array([[[1e16]]]), np.array([[[1.0]]])), (1, 4, np.array([[[-1e16]]]), np.array([[[2.0]]])),
                   (2, 4, np.array([[[1.0]]]), np.array([[[3.0]]]))]
        bn.pending = [entries[i] for i in order]
        bn.after_step()
        return bn.running_mean.copy(), bn.running_var.copy()
    a, b = fold([0, 1, 2]), fold([0, 2, 1])
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


def test_threaded_slices_use_their_own_statistics_deterministically():
    """With 2 worker threads each slice of the batch (2 and 3 sequences) is normalised by its
    own statistics (what per-device BatchNorm does): the loss is the slices' losses weighted
    2/5 and 3/5, the running statistics the token-weighted mean of the slices', and two runs
    agree bit for bit."""
    cfg = tiny(norm="batchnorm", block_size=6)
    idx = np.concatenate([IDX, IDX[::-1] % 7, (IDX[:1] + 3) % 11])  # B = 5
    tg = np.roll(idx, -1, axis=1)

    def step(threads):
        model = GPT(cfg, seed=0)
        previous = cpu.set_threads(threads)
        try:
            loss = sharded_backward(lambda x, y: model(x, y)[1], idx, tg)
        finally:
            cpu.set_threads(previous)
        model.after_step()
        return model, loss.item()

    m2, l2 = step(2)
    m2b, l2b = step(2)
    assert l2 == l2b
    for k, v in m2.state_dict().items():
        np.testing.assert_array_equal(v, m2b.state_dict()[k], err_msg=k)
    slices = (slice(0, 2), slice(2, 5))
    fresh = GPT(cfg, seed=0)
    expected = sum(fresh(idx[s], tg[s])[1].item() * (s.stop - s.start) / 5 for s in slices)
    assert l2 == pytest.approx(expected, rel=1e-13)
    emb = fresh.embed(idx).data                                     # the first norm's input
    mean = sum(emb[s].mean(axis=(0, 1)) * (s.stop - s.start) / 5 for s in slices)
    np.testing.assert_allclose(m2.blocks[0].norm1.running_mean[0], BN_MOMENTUM * mean, rtol=1e-12)
    m1, l1 = step(1)
    assert abs(l1 - l2) > 1e-6                                      # the whole batch's statistics differ


def test_checkpoint_holds_running_statistics_and_the_schedule_and_resume_reproduces():
    cfg = tiny(norm="prepbn", prepbn_steps=3, norm_causal=True)
    rng = np.random.default_rng(6)
    batches = [rng.integers(0, 11, (2, 7)) for _ in range(4)]

    def train(model, opt, bs):
        for b in bs:
            model(b[:, :-1], b[:, 1:])[1].backward()
            opt.step()
            opt.zero_grad()
            model.after_step()

    whole = GPT(cfg)
    opt = AdamW(whole.parameters(), lr=1e-2)
    train(whole, opt, batches)
    first = GPT(cfg)
    opt1 = AdamW(first.parameters(), lr=1e-2)
    train(first, opt1, batches[:2])
    sd = first.state_dict()
    assert {"blocks.0.norm1.steps_done", "blocks.0.norm1.bn.running_mean", "blocks.0.norm1.bn.running_var"} <= set(sd)
    resumed = GPT(cfg, seed=1)
    resumed.load_state_dict(sd)
    opt2 = AdamW(resumed.parameters(), lr=1e-2)
    opt2.load_state_dict(opt1.state_dict())
    assert resumed.blocks[0].norm1.lam == pytest.approx(1 / 3)
    train(resumed, opt2, batches[2:])
    assert resumed.blocks[0].norm1.lam == 0.0
    for k, v in whole.state_dict().items():
        np.testing.assert_array_equal(v, resumed.state_dict()[k], err_msg=k)


# ------------------------------------------------------------------ PRepBN's schedule

def test_prepbn_lambda_falls_linearly_and_its_ends_are_ln_and_repbn():
    rng = np.random.default_rng(7)
    m = PRepBN(4, steps=4, dtype="float64")
    assert m.eta.data.tolist() == [1.0]
    x = Tensor(rng.standard_normal((2, 3, 4)))
    np.testing.assert_array_equal(m(x).data, m.ln(x).data)          # lambda = 1: LayerNorm
    lams = []
    for _ in range(6):
        m.after_step()
        lams.append(m.lam)
    assert lams == [0.75, 0.5, 0.25, 0.0, 0.0, 0.0]
    np.testing.assert_array_equal(m(x).data, (m.bn(x) + x * m.eta).data)   # lambda = 0: RepBN
    assert PRepBN(4, steps=0).lam == 0.0
    assert PRepBN(4, steps=0, eta0=0.0)(x).data.tolist() == PRepBN(4, steps=0).bn(x).data.tolist()   # eta 0: BN
    model = GPT(tiny(norm="prepbn", prepbn_eta=0.25))
    assert {float(n.eta.data[0]) for b in model.blocks for n in (b.norm1, b.norm2)} | {float(model.ln_f.eta.data[0])} == {0.25}


# ------------------------------------------------------------------ modes

def test_train_and_eval_reach_every_module_and_evaluating_restores():
    model = GPT(tiny(norm="prepbn"))
    modules = [model, model.blocks[1], model.blocks[1].norm2, model.blocks[1].norm2.bn, model.ln_f.ln]
    assert all(m.training for m in modules)
    with model.evaluating():
        assert not any(m.training for m in modules)
    assert all(m.training for m in modules)
    model.eval()
    with model.evaluating():
        pass
    assert not any(m.training for m in modules)                     # the mode before, not training


def test_generate_and_evaluate_run_in_evaluation_mode_and_return():
    model = GPT(tiny(norm="batchnorm"))
    bn = model.blocks[0].norm1
    generate(model, IDX[:, :3], 2)
    evaluate(model, np.arange(200) % 11, batch_size=2, block_size=6, n_batches=2)
    assert bn.pending == [] and model.training                      # no batch statistics taken
    model(IDX, TARGETS)
    assert len(bn.pending) == 1


def test_train_py_with_prepbn_and_batchnorm_resumes_exactly(tmp_path, text_file):
    """train.py's loop calls after_step, evaluates in evaluation mode and checkpoints the
    running statistics and PRepBN's step count: a resumed run equals the uninterrupted one.
    (Switching to batch statistics within 5 steps, this tiny model's loss spiked to 3.6x its
    best, and a state that far from its best is not checkpointed: a switch over 30 steps.)"""
    common = ["--log_interval=1", "--eval_interval=3", "--lr_decay_iters=6", "--checkpoint_interval=100",
              "--residual=standard", "--norm=prepbn", "--prepbn_steps=30", "--norm_causal=True"]
    assert run(tmp_path, text_file, "--max_iters=6", *common, out="whole") == 0
    assert run(tmp_path, text_file, "--max_iters=3", *common, out="split") == 0
    assert run(tmp_path, text_file, "--max_iters=6", "--init_from=resume", *common, out="split") == 0
    whole, split = read_log(tmp_path / "whole"), read_log(tmp_path / "split")
    key = lambda log: [(r["iter"], r["train_loss"], r.get("val_loss")) for r in log]
    assert key(whole) == key(split)
    w, s = (np.load(tmp_path / d / "ckpt.npz", allow_pickle=False) for d in ("whole", "split"))
    assert int(w["model/blocks.0.norm1.steps_done"][0]) == 6
    for name in w.files:
        if name.startswith(("model/", "optim/")):
            np.testing.assert_array_equal(w[name], s[name], err_msg=name)
