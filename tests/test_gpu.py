"""The GPU path on the strict CuPy stand-in (tests/cupy_standin): no machine of this project has
a GPU, so device "cuda" runs here on a module that is CuPy to nanospa, computes with NumPy,
refuses what CuPy refuses and counts what a GPU pays for (device-to-host reads, host-to-device
copies). What only a real GPU can show (speed, cuBLAS's and TF32's numerics, NCCL between
devices) is python -m nanospa.bench.gpu_check's.

Here: the stand-in refuses each kind of GPU mistake, and one planted in nanospa fails at its
line; every op of the engine's tables and whole models of every variant give the CPU's values
on the device; a training step's reads and copies do not grow with depth, length or scheme;
two runs on the device agree bit for bit (no atomics); worker threads use the process's GPU.
The commands (train.py, sample.py, the benchmark, an experiment) run on it in
tests/test_gpu_commands.py.
"""
import threading
import traceback

import numpy as np
import pytest

from conftest import standin_module
from nanospa import GPT, GPTConfig, Tensor, backend
from nanospa.beyond.optimizers import OPTIMIZER_DEFAULTS, make_optimizer
from nanospa.beyond import values
ATTENTIONS, NORMS, RESIDUALS, POSITIONS = values("attention"), values("norm"), values("residual"), values("pos")
from nanospa.model import Block
from nanospa.optim import AdamW
from nanospa.run import threads
from nanospa.run.step import train_step

import test_functions
import test_fused
import test_shape_ops

OPS = {**{f"functions.{k}": v for k, v in test_functions.OPS.items()},
       **{f"fused.{k}": v for k, v in test_fused.OPS.items()},
       **{f"shape_ops.{k}": v for k, v in test_shape_ops.OPS.items()}}


def tiny(**kw):
    base = dict(vocab_size=40, block_size=16, n_layer=2, n_head=2, n_embd=16)
    base.update(kw)
    return GPTConfig(**base)


# ----------------------------------------------------------------------------- the stand-in

def test_the_stand_in_refuses_implicit_conversion_to_the_host(gpu):
    cp = backend.cupy()
    a = cp.arange(3.0)
    with pytest.raises(TypeError, match="Implicit conversion to a NumPy array"):
        np.asarray(a)
    with pytest.raises(TypeError, match="Implicit conversion"):
        np.array(a, dtype=np.float32)


def test_the_stand_in_refuses_host_arrays_in_device_operations(gpu):
    cp = backend.cupy()
    a = cp.arange(3.0)
    for planted in (lambda: a + np.ones(3), lambda: cp.exp(np.ones(3)), lambda: cp.add(a, a, out=np.empty(3)),
                    lambda: a @ np.eye(3)):
        with pytest.raises(TypeError, match="Unsupported type|cupy.ndarray"):
            planted()
    assert float((a + 1.0).sum()) == 6.0     # Python numbers are fine: kernel arguments


def test_the_stand_in_has_cupys_names_and_no_others(gpu):
    cp = backend.cupy()
    a = cp.arange(4.0)
    with pytest.raises(AttributeError, match="errstate"):
        cp.errstate                          # NumPy has it, CuPy does not
    with pytest.raises(TypeError, match="no implementation found"):
        np.insert(a, 0, 1.0)                 # a NumPy function CuPy does not implement
    with pytest.raises(TypeError):
        list(range(10))[a[1]]                # cupy.ndarray has no __index__
    assert standin_module().VERSION == standin_module().NAMESPACE["cupy_version"] == cp.__version__
    assert "sliding_window_view" in dir(cp.lib.stride_tricks) and hasattr(cp, "searchsorted")


def test_the_stand_in_counts_reads_and_copies_where_they_happen(gpu):
    cp = backend.cupy()
    line = traceback.extract_stack(limit=1)[0].lineno
    a = cp.asarray(np.arange(6.0))             # line + 1: a copy
    b = a * 2.0 + cp.ones(6)                   # kernels only
    x = float(b.sum())                         # line + 3: a read
    b[np.array([0, 1])] = 0.0                  # line + 4: a host index is copied
    n = int(cp.nonzero(b > 1)[0].size)         # line + 5: the data decides the size: a read
    c = gpu.counts()
    here = __file__.rsplit("/", 1)[-1]
    assert {k.rsplit("/", 1)[-1] for k in c["copy_sites"]} == {f"{here}:{line + 1}", f"{here}:{line + 4}"}
    assert {k.rsplit("/", 1)[-1] for k in c["read_sites"]} == {f"{here}:{line + 3}", f"{here}:{line + 5}"}
    assert (x, n, c["reads"], c["copies"]) == (36.0, 4, 2, 2)


def test_the_stand_in_scatter_adds_in_an_order_that_changes(gpu):
    """GPU atomics leave the order of additions open: the stand-in's cupyx.scatter_add gives
    float32 sums that differ from run to run (what nanospa's scatter_add must not use)."""
    import cupyx
    cp = backend.cupy()
    values = cp.asarray(np.random.default_rng(0).standard_normal(4000).astype(np.float32) * 1e3)
    index = cp.zeros(4000, dtype=np.int64)

    def total():
        out = cp.zeros(1, dtype=np.float32)
        cupyx.scatter_add(out, index, values)
        return out.get()[0]
    assert len({total() for _ in range(6)}) > 1


def test_the_stand_in_keeps_the_current_device_per_thread(gpu):
    cp = backend.cupy()
    previous = gpu.set_devices(2)
    try:
        with cp.cuda.Device(1):
            a = cp.ones(3)
            assert float(a.sum()) == 3.0
        errors = []

        def other():
            try:
                a + 1.0                          # this thread's current device is 0
            except ValueError as e:
                errors.append(str(e))
        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert errors and "current device" in errors[0]
    finally:
        gpu.set_devices(previous)


# ----------------------------------------------------------------------------- planted mistakes

def _planted_line(err):
    """The source line of the deepest frame in this file: where the planted mistake is."""
    frames = [f for f in traceback.extract_tb(err.tb) if f.filename == __file__]
    return frames[-1].line


def _step(cfg, steps=1):
    model = GPT(cfg, seed=0)
    opt = AdamW(model.parameters(), lr=1e-3)
    x = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, cfg.block_size))
    for _ in range(steps):
        train_step(model, opt, x, np.roll(x, -1, axis=1), 1.0)
    return model


@pytest.mark.parametrize("kind", ["host_conversion", "host_operand", "missing_name"])
def test_a_planted_gpu_mistake_fails_at_its_line(gpu, monkeypatch, kind):
    """Each kind of mistake that breaks on a GPU, planted in the model's forward, fails on the
    stand-in at the line that makes it (a CPU run would pass)."""
    real = Block.forward

    def planted(self, x, record=None, carry=None, cache=None):
        y = real(self, x, record, carry, cache)
        if kind == "host_conversion":
            np.asarray(y.data).mean()                                    # planted: host_conversion
        elif kind == "host_operand":
            y = y * Tensor(np.ones(y.shape[-1], dtype=np.float32))       # planted: host_operand
        else:
            backend.xp_of(y.data).errstate(over="ignore")                # planted: missing_name
        return y
    monkeypatch.setattr(Block, "forward", planted)
    with pytest.raises((TypeError, AttributeError)) as err:
        _step(tiny())
    assert _planted_line(err).endswith(f"# planted: {kind}")
    backend.use("cpu")
    _step(tiny())                                                        # the same code on the CPU: fine


def test_a_planted_read_per_layer_shows_at_its_line(gpu, monkeypatch):
    """A device read in every block (float() of an activation) is legal on a GPU, only slow:
    the stand-in counts it at its line, once per block per step."""
    real = Block.forward
    line = traceback.extract_stack(limit=1)[0].lineno

    def planted(self, x, record=None, carry=None, cache=None):
        y = real(self, x, record, carry, cache)
        float(y.data.std())                  # line + 4: a sync per block
        return y
    monkeypatch.setattr(Block, "forward", planted)
    cfg = tiny(n_layer=3)
    model = _step(cfg)
    gpu.reset()
    train_step(model, AdamW(model.parameters(), lr=1e-3), np.zeros((2, 16), np.int64), np.zeros((2, 16), np.int64))
    sites = {k.rsplit("/", 1)[-1]: n for k, n in gpu.counts()["read_sites"].items()}
    assert sites[f"{__file__.rsplit('/', 1)[-1]}:{line + 4}"] == 3


# ----------------------------------------------------------------------------- ops and models

def _run_op(fn, arrays, device, dtype=np.float64):
    """fn on Tensors of the arrays (on `device`), backward from a fixed random gradient ->
    (output, gradients) on the host."""
    backend.use(device)
    inputs = [Tensor(backend.asarray(a.astype(dtype)), requires_grad=True) for a in arrays]
    out = fn(*inputs)
    R = np.random.default_rng(7).standard_normal(out.shape).astype(dtype)
    out.backward(backend.asarray(R))
    return backend.to_numpy(out.data), [backend.to_numpy(t.grad) if t.grad is not None else None for t in inputs]


@pytest.mark.parametrize("name", sorted(OPS))
def test_every_op_gives_the_cpus_values_on_the_device(gpu, name):
    """Forward and backward of every op of the engine's tables (test_functions, test_fused,
    test_shape_ops), float64, on the device against the CPU: the same NumPy operations, so
    equal to the bit, but where the device adds in another order (scatter_add's segment sums:
    float64 running sums, error ~N eps_64 of the largest)."""
    fn, arrays = OPS[name]
    cpu = _run_op(fn, arrays, "cpu")
    dev = _run_op(fn, arrays, "cuda")
    np.testing.assert_array_equal(dev[0], cpu[0])
    for g_dev, g_cpu in zip(dev[1], cpu[1]):
        assert (g_dev is None) == (g_cpu is None)
        if g_cpu is not None:
            np.testing.assert_allclose(g_dev, g_cpu, rtol=0, atol=1e-13 * max(1.0, np.abs(g_cpu).max()))


@pytest.mark.parametrize("name", sorted(OPS))
def test_every_op_keeps_float32_on_the_device(gpu, name):
    fn, arrays = OPS[name]
    out, grads = _run_op(fn, arrays, "cuda", np.float32)
    assert out.dtype == np.float32 and all(g.dtype == np.float32 for g in grads if g is not None)


def _variants():
    """One configuration per value of every field that changes the computation."""
    out = [dict(attention=a) for a in ATTENTIONS]
    out += [dict(activation=a) for a in ("tat_lrelu", "tat_gelu", "dks_gelu", "gelu", "relu", "gelu_exact",
                                         "dks_tanh", "swish", "tat_softplus")]
    out += [dict(residual=r, norm="layernorm") for r in RESIDUALS if r not in ("none", "ngpt")]
    out += [dict(residual="ngpt", activation="swish")]
    out += [dict(residual="standard", norm=n) for n in NORMS if n != "none"]
    out += [dict(residual="standard", norm=n, norm_causal=True) for n in ("batchnorm", "prepbn")]
    out += [dict(residual="standard", norm="layernorm", norm_position="post")]
    out += [dict(pos=p, attention="softmax") for p in POSITIONS]
    out += [dict(attention_impl="blockwise", attention_block=8, attention=a) for a in ATTENTIONS]
    out += [dict(attention_impl="blockwise", attention_block=8, attention="softmax", pos="alibi"),
            dict(attention_impl="blockwise", attention_block=8, train_bias=True),
            dict(residual_attention=True, attention="softmax"), dict(train_bias=True),
            dict(skipinit_per_head=True, attention="value_skipinit"), dict(bias=True), dict(dropout=0.2),
            dict(dropout=0.2, attention="softmax", residual_attention=True)]
    return out


def _backward(cfg, device):
    """A float64 model's logits, loss and gradients on one batch, on the device -> (model,
    optimiser, host copies of logits, loss, gradients)."""
    backend.use(device)
    model = GPT(cfg, seed=0)
    rng = np.random.default_rng(0)
    x = rng.integers(0, cfg.vocab_size, (3, cfg.block_size))
    y = rng.integers(0, cfg.vocab_size, (3, cfg.block_size))
    logits, loss = model(x, y)
    loss.backward()
    grads = {n: backend.to_numpy(p.grad) for n, p in model.named_parameters() if p.grad is not None}
    return model, backend.to_numpy(logits.data), float(loss.data), grads


@pytest.mark.filterwarnings("ignore:norm=")
@pytest.mark.parametrize("kw", _variants(), ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_every_variant_trains_on_the_device_as_on_the_cpu(gpu, kw):
    """Forward and backward of a float64 model of every attention, activation, residual, norm,
    position and attention implementation give the CPU's values on the device, to the segment
    sums' float64 rounding in the embedding's gradient (measured: below 1e-15 of the largest
    gradient; bound 1e-12); then an AdamW step and the model's after_step from the CPU's
    gradients give the CPU's parameters and buffers bit for bit. (Steps from each side's own
    gradients are not compared: a gradient that is 0 in exact arithmetic, such as a key bias's,
    is rounding noise, and Adam's first step turns noise into +-lr.)"""
    cfg = tiny(dtype="float64", **kw)
    cpu_model, *cpu = _backward(cfg, "cpu")
    dev_model, *dev = _backward(cfg, "cuda")
    scale = max(np.abs(g).max() for g in cpu[2].values())
    np.testing.assert_allclose(dev[0], cpu[0], rtol=1e-12, atol=1e-12)
    assert dev[1] == pytest.approx(cpu[1], rel=1e-13)
    assert cpu[2].keys() == dev[2].keys()
    for k in cpu[2]:
        np.testing.assert_allclose(dev[2][k], cpu[2][k], rtol=0, atol=1e-12 * scale, err_msg=k)
    for p_cpu, p_dev in zip(cpu_model.parameters(), dev_model.parameters()):
        if p_cpu.grad is not None:
            p_dev.grad = backend.asarray(p_cpu.grad)
    for model, device in ((cpu_model, "cpu"), (dev_model, "cuda")):
        backend.use(device)
        AdamW(model.parameters(), lr=1e-2, weight_decay=0.1).step()
        model.after_step()
    after_cpu, after_dev = cpu_model.state_dict(), dev_model.state_dict()
    for k in after_cpu:
        if k.endswith(("running_mean", "running_var")):       # statistics of each side's own forward
            np.testing.assert_allclose(after_dev[k], after_cpu[k], rtol=1e-12, atol=1e-13, err_msg=k)
        else:
            np.testing.assert_array_equal(after_dev[k], after_cpu[k], err_msg=k)


# ----------------------------------------------------------------------------- host work per step

SCHEMES = {
    "espa": {}, "uspa": dict(attention="uspa"), "value_skipinit": dict(attention="value_skipinit"),
    "pre_ln": dict(attention="softmax", residual="standard", norm="layernorm", pos="learned", activation="gelu"),
    "alibi": dict(attention="softmax", pos="alibi"), "rope": dict(attention="softmax", pos="rope"),
    "spa_prior": dict(attention="softmax", pos="spa_prior"),
    "blockwise": dict(attention_impl="blockwise", attention_block=8),
    "blockwise_alibi": dict(attention_impl="blockwise", attention_block=8, attention="softmax", pos="alibi"),
    "batchnorm": dict(residual="standard", norm="batchnorm", norm_causal=True),
    "prepbn": dict(residual="standard", norm="prepbn", norm_causal=True),
    "ngpt": dict(residual="ngpt", activation="swish"), "deepnorm": dict(residual="deepnorm", norm="layernorm"),
    "realformer": dict(residual_attention=True, attention="softmax"), "train_bias": dict(train_bias=True),
    "dropout": dict(dropout=0.2),
}
OPTIMIZERS = {"adamw": {}, "kfac": dict(optimizer="kfac"), "mup": dict(mup_base_width=8)}


def _step_counts(gpu, cfg, opt_settings=None, accum=1, steps=3):
    """Reads and copies of one training step (run/step.train_step, after a warm-up step)."""
    model = GPT(cfg, seed=0)
    s = dict(OPTIMIZER_DEFAULTS, learning_rate=1e-3, beta1=0.9, beta2=0.95, weight_decay=0.1, **(opt_settings or {}))
    opt = make_optimizer(s, model)
    x = np.random.default_rng(0).integers(0, cfg.vocab_size, (4, cfg.block_size))
    for _ in range(steps):
        train_step(model, opt, x, np.roll(x, -1, axis=1), 1.0, accum=accum)
    gpu.reset()
    train_step(model, opt, x, np.roll(x, -1, axis=1), 1.0, accum=accum)
    return gpu.counts()


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_a_steps_host_work_does_not_grow_with_depth_or_length(gpu, scheme):
    """One read (the loss and the gradient norm together) and one copy (the batch's ids and
    targets) per step, at depth 2 and T 16 as at depth 5 and T 40, for every scheme."""
    small = _step_counts(gpu, tiny(**SCHEMES[scheme]))
    large = _step_counts(gpu, tiny(n_layer=5, block_size=40, **SCHEMES[scheme]))
    for c in (small, large):
        assert (c["reads"], c["copies"]) == (1, 1), (c["read_sites"], c["copy_sites"])


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("accum", [1, 2])
def test_the_optimisers_host_work_is_a_constant(gpu, optimizer, accum):
    """With gradient accumulation one copy per micro-batch; K-FAC adds its curvature pass's
    ids and its uniforms (drawn on the host, the same on every device): constants, whatever
    the depth and length. (Linear biases on: K-FAC's factors then carry a bias row.)"""
    counts = [_step_counts(gpu, tiny(n_layer=L, block_size=T, bias=True), OPTIMIZERS[optimizer], accum)
              for L, T in ((2, 16), (5, 40))]
    assert counts[0]["reads"] == counts[1]["reads"] == 1
    assert counts[0]["copies"] == counts[1]["copies"] == accum + (2 if optimizer == "kfac" else 0), counts


# ----------------------------------------------------------------------------- reproducible

def _embedding_gradients(runs=4):
    """The token embedding's gradient of one float32 backward, `runs` times from one seed."""
    out = []
    for _ in range(runs):
        model = GPT(tiny(vocab_size=4), seed=0)
        x = np.random.default_rng(0).integers(0, 4, (4, 16))
        model(x, np.roll(x, -1, axis=1))[1].backward()
        out.append(backend.to_numpy(model.wte.weight.grad))
    return out


def test_two_device_runs_agree_bit_for_bit(gpu):
    """The stand-in adds atomics in a random order; nanospa's embedding backward does not use
    them (backend.segment_sum), so two backward passes, and two runs of three training steps,
    agree to the bit in float32."""
    grads = _embedding_gradients()
    assert all(np.array_equal(grads[0], g) for g in grads[1:])
    a, b = _step(tiny(), steps=3).state_dict(), _step(tiny(), steps=3).state_dict()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_with_atomics_two_device_runs_differ(gpu, monkeypatch):
    """The test above has teeth: the embedding backward through cupyx.scatter_add (what
    backend.scatter_add did on a GPU before) gives gradients that differ from run to run."""
    import cupyx

    def atomic(a, indices, values):
        cupyx.scatter_add(a, indices, values)
        return a
    monkeypatch.setattr(backend, "scatter_add", atomic)
    grads = _embedding_gradients()
    assert any(not np.array_equal(grads[0], g) for g in grads[1:])


def test_segment_sum_is_the_sum_in_float64():
    """backend.segment_sum (the device's scatter_add) against np.add.at, on the host."""
    rng = np.random.default_rng(0)
    keys = rng.integers(0, 7, 500)
    values = rng.standard_normal((500, 3)) * 10.0 ** rng.integers(-3, 4, (500, 1))
    expected = np.zeros((9, 3))
    np.add.at(expected, keys, values)
    got = backend.segment_sum(keys, values, 9)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12 * np.abs(values).sum())
    assert np.all(got[7:] == 0.0)


def test_scatter_add_on_the_device_sums_repeated_indices(gpu):
    cp = backend.cupy()
    a = cp.zeros((3, 2), dtype=np.float32)
    backend.scatter_add(a, cp.asarray([1, 1, 2, 1]), cp.asarray(np.arange(8.0, dtype=np.float32).reshape(4, 2)))
    np.testing.assert_array_equal(a.get(), [[0, 0], [8, 11], [4, 5]])
    b = cp.zeros((2, 3))
    backend.scatter_add(b, (cp.asarray([0, 0, 1]), cp.asarray([2, 2, 0])), cp.asarray([1.0, 2.0, 3.0]))
    np.testing.assert_array_equal(b.get(), [[0, 0, 3], [3, 0, 0]])


# ----------------------------------------------------------------------------- threads

def test_worker_threads_use_the_processs_gpu(gpu, monkeypatch):
    """On a rank whose GPU is 1, work handed to the worker threads runs on GPU 1 (CuPy's
    current device is per thread); without backend.bind_thread it fails on the stand-in."""
    cp = backend.cupy()
    previous = gpu.set_devices(2)
    before = threads.set_threads(2)
    try:
        cp.cuda.Device(1).use()
        backend.use("cuda")
        a = cp.arange(4.0)
        assert threads.parallel_map(lambda k: float((a * k).sum()), [1, 2, 3]) == [6.0, 12.0, 18.0]
        monkeypatch.setattr(backend, "bind_thread", lambda: None)
        threads._pools.clear()                  # fresh workers, which now never bind
        with pytest.raises(ValueError, match="current device"):
            threads.parallel_map(lambda k: float((a * k).sum()), [1, 2, 3])
    finally:
        cp.cuda.Device(0).use()
        threads.set_threads(before)
        threads._pools.clear()
        gpu.set_devices(previous)


# ----------------------------------------------------------------------------- the GPU check

def test_the_gpu_check_refuses_bad_settings_and_a_machine_without_gpu(capsys):
    from nanospa.bench import gpu_check
    assert gpu_check.main(["--stages=tests,bogus"]) == 2
    assert capsys.readouterr().err.strip() == "error: --stages: bogus not among tests, parity, train, bench, nccl, lr"
    assert gpu_check.main([]) == 2                       # no CuPy with a GPU here (the stand-in is not installed)
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: no GPU") and "\n" not in err
