"""The automatic batch slices of a plain model call (backend.auto_slices, tensor.sliced_call,
model.GPT.forward) and the BLAS thread control they rely on (nanospa/run/blas.py).

A plain ``model(idx, targets); loss.backward()`` with nobody having called set_threads trains
on slices of the batch at once on the CPU's cores. It must give the whole batch's loss and
gradients (float64: up to the order of the batch sum) for every model kind, any upstream
gradient, odd batch sizes; never slice a model with batch statistics; stay off once
set_threads is called; and hold BLAS at one thread only while it runs.
"""
import threading

import numpy as np
import pytest

from conftest import perturbed_model, tiny_config
from nanospa import backend, model as model_module, no_grad
from nanospa.run import blas
from nanospa.tensor import sliced_call


@pytest.fixture
def auto(monkeypatch):
    """Automatic slices on (nobody set threads), for calls of any size."""
    previous = backend.set_threads(None)
    monkeypatch.setattr(backend, "AUTO_SLICE_MIN_WORK", 1)
    yield
    backend.set_threads(previous)


def needs_slices():
    if backend.auto_slices(4, 1) == 1:
        pytest.skip("needs 2 cores and an OpenBLAS nanospa can hold at one thread (nanospa/run/blas.py)")


def batch(B, seed=7, V=13, T=8):
    rng = np.random.default_rng(seed)
    return rng.integers(0, V, (B, T)), rng.integers(0, V, (B, T))


def grads_of(model, idx, tgt, upstream=1.0):
    model.zero_grad()
    logits, loss = model(idx, tgt)
    (loss * upstream).backward()
    return loss.item(), logits.numpy(), {n: p.grad.copy() for n, p in model.named_parameters()}


CASES = [dict(attention="espa", activation="tat_lrelu"),
         dict(attention="uspa"),
         dict(attention="softmax", residual="standard", norm="layernorm", pos="rope"),
         dict(attention="value_skipinit", pos="alibi"),
         dict(attention="softmax", residual="standard", norm="layernorm", residual_attention=True),
         dict(attention="espa", residual="normalised", norm="rmsnorm")]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c.values())))
@pytest.mark.parametrize("B", [3, 4])
def test_sliced_call_is_the_whole_batch(auto, case, B):
    """Loss, logits and every gradient of a sliced call equal the unsliced ones (float64),
    under a random upstream gradient, with slices of unequal size (B = 3)."""
    needs_slices()
    cfg = tiny_config(**case)
    idx, tgt = batch(B)
    c = float(np.random.default_rng(11).standard_normal())
    sliced = grads_of(perturbed_model(cfg), idx, tgt, c)
    backend.set_threads(1)                                   # slicing off
    whole = grads_of(perturbed_model(cfg), idx, tgt, c)
    np.testing.assert_allclose(sliced[0], whole[0], rtol=1e-13)
    np.testing.assert_allclose(sliced[1], whole[1], rtol=1e-13, atol=1e-15)
    assert sliced[2].keys() == whole[2].keys()
    for name in whole[2]:
        np.testing.assert_allclose(sliced[2][name], whole[2][name], rtol=1e-10, atol=1e-13, err_msg=name)


def test_slices_run_on_worker_threads_and_not_again_inside(auto):
    needs_slices()
    model = perturbed_model(tiny_config())
    seen = []
    inner = model._forward

    def spy(idx, targets=None, record=None):
        seen.append((threading.current_thread().name, backend.in_worker(), len(idx)))
        return inner(idx, targets, record)

    model._forward = spy
    idx, tgt = batch(4)
    model(idx, tgt)[1].backward()
    assert sorted(n for _, _, n in seen) == [2, 2]                 # two slices, each once
    assert all(name.startswith("nanospa") and worker for name, worker, _ in seen)
    assert not backend.in_worker()                                   # the caller's thread


def test_backward_through_sliced_logits_raises(auto):
    needs_slices()
    model = perturbed_model(tiny_config())
    logits, loss = model(*batch(4))
    with pytest.raises(RuntimeError, match="batch slices"):
        (logits * logits).sum().backward()


def test_no_grad_sliced_call_is_a_value(auto):
    model = perturbed_model(tiny_config())
    idx, tgt = batch(4)
    with no_grad():
        logits, loss = model(idx, tgt)
    assert not loss.requires_grad and not logits.requires_grad
    backend.set_threads(1)
    with no_grad():
        whole = model(idx, tgt)[1].item()
    np.testing.assert_allclose(loss.item(), whole, rtol=1e-13)


def test_batch_statistics_are_never_sliced(auto, monkeypatch):
    """BatchNorm normalises by the statistics of what it is given: slices would change the loss."""
    def refuse(*a, **k):
        raise AssertionError("sliced")
    monkeypatch.setattr(model_module, "sliced_call", refuse)
    for norm in ("batchnorm", "prepbn"):
        model = perturbed_model(tiny_config(residual="standard", norm=norm, norm_causal=True))
        model(*batch(4))[1].backward()
    with pytest.raises(AssertionError, match="sliced"):
        perturbed_model(tiny_config())(*batch(4))


def test_set_threads_turns_slicing_off_and_none_back_on(monkeypatch):
    monkeypatch.setattr(backend, "AUTO_SLICE_MIN_WORK", 1)
    previous = backend.set_threads(3)
    try:
        assert backend.thread_setting() == 3 and backend.auto_slices(8, 10 ** 9) == 1
        assert backend.set_threads(None) == 3
        assert backend.thread_setting() is None and backend.threads() == 1
        expected = 1 if blas.threads() is None else backend.cpu_threads(0, 8)
        assert backend.auto_slices(8, 10 ** 9) == expected
        assert backend.auto_slices(1, 10 ** 9) == 1          # one sequence: nothing to slice
    finally:
        backend.set_threads(previous)


def test_small_calls_are_not_sliced(monkeypatch):
    previous = backend.set_threads(None)
    try:
        assert backend.auto_slices(8, backend.AUTO_SLICE_MIN_WORK - 1) == 1
    finally:
        backend.set_threads(previous)


def test_blas_limited_holds_one_thread_and_restores():
    if blas.threads() is None:
        pytest.skip("NumPy's BLAS here is not an OpenBLAS nanospa can see")
    get, put = blas._api()
    before = get()
    put(2)
    try:
        with blas.limited(1):
            assert blas.threads() == 1
            with blas.limited(1):                            # nested: the outer count comes back last
                assert blas.threads() == 1
            assert blas.threads() == 1
        assert blas.threads() == 2
    finally:
        put(before)


def test_sliced_call_adds_slices_in_order_with_their_weights():
    """sliced_call on a toy batch-mean loss: value and gradient of sum_s (n_s / n) L_s."""
    from nanospa import Tensor
    w = Tensor(np.array([0.5, -2.0]), requires_grad=True)
    x = np.random.default_rng(0).standard_normal((5, 2))

    def fn(xs):
        out = Tensor(xs) * w
        return out, (out * out).mean()

    out, loss = sliced_call(fn, 2, [w], x)
    loss.backward()
    np.testing.assert_allclose(loss.item(), np.mean((x * w.data) ** 2), rtol=1e-14)
    np.testing.assert_allclose(w.grad, np.mean(x * x, axis=0) * w.data, rtol=1e-14)
    np.testing.assert_allclose(out.data, x * w.data, rtol=1e-15)


def test_adamw_updates_parameter_groups_on_workers_bit_for_bit(auto, monkeypatch):
    """With automatic slices on, AdamW updates groups of parameters on the workers: each
    parameter's update is the serial one exactly (they are independent)."""
    needs_slices()
    from nanospa import optim
    model_auto, model_serial = (perturbed_model(tiny_config()) for _ in range(2))
    idx, tgt = batch(4)
    threads = []
    real = backend.adamw_update

    def spy(*a, **k):
        threads.append(backend.in_worker())
        return real(*a, **k)

    monkeypatch.setattr(backend, "adamw_update", spy)
    for model, setting in ((model_auto, None), (model_serial, 1)):
        backend.set_threads(setting)
        opt = optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
        for _ in range(2):
            opt.zero_grad()
            backend.set_threads(1)                    # the same gradients for both models
            model(idx, tgt)[1].backward()
            backend.set_threads(setting)
            opt.step()
    n = len(model_auto.parameters())
    assert all(threads[:2 * n]) and not any(threads[2 * n:])
    for (name, p), q in zip(model_auto.named_parameters(), model_serial.parameters()):
        assert np.array_equal(p.data, q.data), name
