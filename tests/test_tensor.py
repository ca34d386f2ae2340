"""nanospa/tensor.py: the graph of Functions, backward, no_grad (and run/threads.sliced_loss).

Graph mechanics (no recursion limit, fan-out and repeated backward accumulate, the graph
freed as it is used, unsaved intermediates freed before backward, shared gradient arrays
never written in place), error messages, and data-parallel slices of a batch on worker
threads giving the full batch's gradients.
"""
import gc
import sys
import weakref

import numpy as np
import pytest

from conftest import perturbed_model, tiny_config
from nanospa import GPT, Tensor, backend, no_grad
from nanospa.fused import softmax
from nanospa.gradcheck import tensor64
from nanospa.more_ops import activation
from nanospa.run import threads as cpu
from nanospa.run.threads import sharded_backward, sliced_loss


def normal(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


def test_long_chain_has_no_recursion_limit():
    x = Tensor(np.ones(3), requires_grad=True)
    y = x
    n = max(10_000, 2 * sys.getrecursionlimit())
    for _ in range(n):
        y = y * 1.0001
    y.sum().backward()
    np.testing.assert_allclose(x.grad, np.full(3, 1.0001 ** n), rtol=1e-9)


def test_fan_out_accumulates():
    x = tensor64([1.5, -2.0])
    (x * x + x).sum().backward()
    np.testing.assert_allclose(x.grad, 2 * np.array([1.5, -2.0]) + 1)


def test_gradients_accumulate_across_backward_calls():
    x = tensor64([1.0, 2.0])
    (x * 3.0).sum().backward()
    (x * 2.0).sum().backward()
    np.testing.assert_allclose(x.grad, [5.0, 5.0])


def test_graph_is_freed_after_backward():
    x = Tensor(np.ones(3), requires_grad=True)
    y = activation(x * 2.0, "tanh")
    z = y.sum()
    z.backward()
    assert z._ctx.parents is None and z._ctx.saved is None      # the Sum node: no arrays left
    assert y._ctx.parents is None and y._ctx.saved is None      # the Activation node


def test_backward_through_a_freed_graph_is_an_error_like_pytorchs():
    """The second backward of a loss, or a second loss sharing the first one's forward, would
    reach nodes whose saved arrays are gone: an error naming the remedy, as in PyTorch
    ("Trying to backward through the graph a second time"), never a partial gradient."""
    x = tensor64(normal(5))
    h = activation(x * 1.5, "tanh")
    loss, aux = (h * h).sum(), (h ** 3).mean()
    loss.backward()
    with pytest.raises(RuntimeError, match=r"add the losses and call backward once"):
        aux.backward()
    with pytest.raises(RuntimeError, match=r"earlier backward freed"):
        loss.backward()
    # the remedy gives the gradient of the sum
    x2 = tensor64(x.data)
    h2 = activation(x2 * 1.5, "tanh")
    ((h2 * h2).sum() + (h2 ** 3).mean()).backward()
    t = np.tanh(1.5 * x.data)
    expected = 1.5 * (1 - t ** 2) * (2 * t + 3 * t ** 2 / 5)
    np.testing.assert_allclose(x2.grad, expected, rtol=1e-13)
    # branches that reach no freed node still back-propagate: a fresh loss on the same leaf
    x.grad = None
    (x * 2.0).sum().backward()
    np.testing.assert_allclose(x.grad, 2.0)


def test_freed_graph_errors_match_pytorch():
    torch = pytest.importorskip("torch")
    for second in ("same loss", "shared forward"):
        w = torch.tensor([0.3, -0.2], dtype=torch.float64, requires_grad=True)
        h = activation(w * 2.0, "tanh")
        loss, aux = (h * h).sum(), (h ** 3).mean()
        loss.backward()
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            (loss if second == "same loss" else aux).backward()
        x = tensor64([0.3, -0.2])
        h = activation(x * 2.0, "tanh")
        loss, aux = (h * h).sum(), (h ** 3).mean()
        loss.backward()
        with pytest.raises(RuntimeError, match="earlier backward freed"):
            (loss if second == "same loss" else aux).backward()


def test_no_grad_records_nothing():
    x = Tensor(np.ones(3), requires_grad=True)
    with no_grad():
        y = x * 2.0
    assert not y.requires_grad and y._ctx is None


def test_error_backward_non_scalar():
    x = Tensor(np.ones(3), requires_grad=True)
    with pytest.raises(RuntimeError, match=r"non-scalar output of shape \(3,\)"):
        (x * 2.0).backward()


def test_error_backward_without_grad():
    with pytest.raises(RuntimeError, match="does not require grad"):
        Tensor(np.ones(3)).sum().backward()


def test_error_shape_mismatch_names_op_and_shapes():
    a, b = Tensor(np.ones((2, 3))), Tensor(np.ones((4, 5)))
    with pytest.raises(ValueError, match=r"MatMul.*\(2, 3\), \(4, 5\)"):
        a @ b
    with pytest.raises(ValueError, match=r"Add.*\(2, 3\), \(4, 5\)"):
        a + b


def test_unsaved_intermediates_are_freed_before_backward():
    """The graph links Functions, so an intermediate that no op saved is freed in forward
    (here h, the input of Softmax, which saves only its output); backward is still right."""
    x = Tensor(normal(3), requires_grad=True)
    W = normal(3, seed=1)
    h = x * 2.0
    ref = weakref.ref(h.data)
    y = softmax(h)
    loss = (y * W).sum()
    del h
    gc.collect()
    assert ref() is None
    loss.backward()
    p = y.data
    np.testing.assert_allclose(x.grad, 2.0 * p * (W - (p * W).sum()), rtol=1e-14)


def test_shared_gradient_arrays_are_never_written_in_place():
    """Add hands one array to both inputs; sums of fan-in gradients are made in place only
    in arrays the backward pass allocated itself. d/dx of ((x + x) + x) * w is 3 w."""
    x = Tensor(normal(4), requires_grad=True)
    w = Tensor(normal(4, seed=2), requires_grad=True)
    (((x + x) + x) * w).sum().backward()
    np.testing.assert_allclose(x.grad, 3.0 * w.data, rtol=1e-15)
    np.testing.assert_allclose(w.grad, 3.0 * x.data, rtol=1e-15)


@pytest.fixture
def two_threads():
    previous = cpu.set_threads(2)
    yield
    cpu.set_threads(previous)


@pytest.mark.parametrize("batch", [3, 4])
def test_sharded_backward_is_the_full_batch_backward(two_threads, batch):
    """Slices of the batch on two threads give the full batch's loss and gradients (float64:
    only the order of the batch sum differs), odd batch sizes included."""
    cfg = tiny_config(attention="espa", activation="tat_lrelu")
    full, sharded = perturbed_model(cfg), perturbed_model(cfg)
    rng = np.random.default_rng(7)
    idx, tgt = rng.integers(0, 13, (batch, 8)), rng.integers(0, 13, (batch, 8))
    _, loss = full(idx, tgt)
    loss.backward()
    value = sharded_backward(lambda x, y: sharded(x, y)[1], idx, tgt)
    assert not value.requires_grad
    np.testing.assert_allclose(value.item(), loss.item(), rtol=1e-13)
    for (name, p), q in zip(full.named_parameters(), sharded.parameters()):
        np.testing.assert_allclose(q.grad, p.grad, rtol=1e-11, atol=1e-15, err_msg=name)


def test_the_sliced_loss_in_hand_is_the_full_batch_loss(two_threads):
    """run/threads.sliced_loss, train.py's forward: one graph per slice, built on the worker
    threads, and nothing back-propagated until loss.backward(); then the value and every
    gradient are the full batch's, and `* w` (a micro-batch's share) scales both."""
    cfg = tiny_config(attention="espa", activation="tat_lrelu")
    full, sliced = perturbed_model(cfg), perturbed_model(cfg)
    rng = np.random.default_rng(7)
    idx, tgt = rng.integers(0, 13, (3, 8)), rng.integers(0, 13, (3, 8))
    _, loss = full(idx, tgt)
    (loss * 0.25).backward()
    part = sliced_loss(lambda x, y: sliced(x, y)[1], idx, tgt) * 0.25
    assert len(part.parts) == 2 and all(p.grad is None for p in sliced.parameters())
    part.backward()
    np.testing.assert_allclose(part.data, 0.25 * loss.item(), rtol=1e-13)
    for (name, p), q in zip(full.named_parameters(), sliced.parameters()):
        np.testing.assert_allclose(q.grad, p.grad, rtol=1e-11, atol=1e-15, err_msg=name)
    with pytest.raises(TypeError, match="scales by a number"):
        part * np.ones(2)


def test_sharded_backward_is_deterministic_in_float32(two_threads):
    model = GPT(tiny_config(dtype="float32"), seed=0)
    idx = np.random.default_rng(8).integers(0, 13, (4, 8))
    grads = []
    for _ in range(3):
        model.zero_grad()
        sharded_backward(lambda x, y: model(x, y)[1], idx, idx)
        grads.append([p.grad.copy() for p in model.parameters()])
    for other in grads[1:]:  # slices are added in a fixed order, whatever the thread timing
        assert all(np.array_equal(a, b) for a, b in zip(grads[0], other))


def test_two_losses_sharing_a_model_forward():
    """The reported case: the logits' auxiliary loss after the cross-entropy's backward."""
    model = GPT(tiny_config(dtype="float64"))
    x = np.random.default_rng(0).integers(0, model.config.vocab_size, (2, 8))
    logits, loss = model(x, x)
    aux = (logits ** 2).mean()
    loss.backward()
    with pytest.raises(RuntimeError, match="add the losses and call backward once"):
        aux.backward()


WAITING = """
import signal, sys, threading, time
from nanospa.run import threads
threads.set_threads(2)
def stop(signum, frame):
    raise KeyboardInterrupt
signal.signal(signal.SIGINT, stop)
threading.Timer(0.5, lambda: signal.raise_signal(signal.SIGINT)).start()
started = time.monotonic()
try:
    threads.parallel_map(lambda s: time.sleep(s), [60, 60, 60, 60])   # slices that take a minute
except KeyboardInterrupt:
    print(f"left after {time.monotonic() - started:.1f} s")
    sys.exit(130)
"""


@pytest.mark.skipif(not hasattr(signal_module := __import__("signal"), "raise_signal"), reason="needs raise_signal")
def test_a_signal_leaves_the_worker_threads_at_once_and_the_process_exits():
    """The caller waits interruptibly; the slices not started are dropped, and the busy daemon
    workers do not hold up the exit (a pool of non-daemon threads kept this process for a
    minute)."""
    import subprocess
    import time
    started = time.monotonic()
    p = subprocess.run([sys.executable, "-c", WAITING], capture_output=True, text=True, timeout=300,
                       cwd=str(__import__("pathlib").Path(__file__).resolve().parents[1]))
    assert p.returncode == 130 and p.stdout.startswith("left after"), p.stderr
    assert time.monotonic() - started < 30
