"""Explicit CPU parallelism: worker threads that train slices of a batch at once.

NumPy releases Python's GIL inside its loops and inside BLAS, so k threads that each run
the forward and backward of a slice of the batch keep k cores busy. Nothing in the core
(nanospa/*.py) uses threads: a model call means the same whatever the batch size or the
machine. Parallelism is asked for by name, by train.py's --threads, the benchmark's
--threads and the ops that split their own work (beyond/blockwise.py, beyond/kfac.py, run/heads.py),
whose results do not depend on it beyond the order of a sum.

    set_threads(n), threads()        the worker count (1 until set)
    cpu_threads(requested, batch, shares)  what --threads means for this run
    parallel_map(fn, items)          [fn(x) for x in items] on the workers, in order
    slice_bounds(n, k)               where k slices of n batch entries start and end
    balanced_groups(costs, k)        k groups of near-equal cost, the same for the same input
    sliced_loss(loss_fn, *batch)     the forward of a batch-mean loss by slices, one per thread:
                                     a SlicedLoss, whose backward() runs each slice's on its thread
    sharded_backward(loss_fn, *batch)   both at once: one backward of a batch-mean loss, by slices
    current_slice()                  which slice of sliced_loss this thread is running

Each worker should call single-threaded BLAS, or threads x BLAS threads compete for the
cores: train.py sets OPENBLAS_NUM_THREADS=1 before NumPy loads (BLAS reads it once).
"""
import contextlib
import os
import threading

from .. import backend
from ..tensor import Tensor

_rows = threading.local()          # the first row of this thread's model call (batch_rows)


@contextlib.contextmanager
def batch_rows(first):
    """Within the block, a model call on this thread holds rows first, first + 1, ... of its
    step's batch, and draws those rows' dropout masks (DropoutMasks). The code that splits a
    step's batch says where each part starts: run/step.micro_batches (micro-batches, MPI
    ranks), sliced_loss below (slices on worker threads); 0 outside."""
    before, _rows.first = first_row(), int(first)
    try:
        yield
    finally:
        _rows.first = before


def first_row():
    """The index in its step's batch of the first row of a model call on this thread."""
    return getattr(_rows, "first", 0)

MAX_AUTO_THREADS = 4   # cpu_threads(0, ...): one per core, at most this many
_threads = 1
_pools = {}            # worker count -> _Workers
if hasattr(os, "register_at_fork"):            # a forked child has none of its parent's threads
    os.register_at_fork(after_in_child=_pools.clear)
_worker = threading.local()


def threads():
    """The worker count (set_threads); 1 until someone sets it."""
    return _threads


def set_threads(n):
    """Use n worker threads for sliced_loss and the ops that split their work; returns
    the previous count (hand it back to restore)."""
    global _threads
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"threads must be a positive integer, got {n!r}")
    previous, _threads = _threads, n
    return previous


def cpu_threads(requested, batch_size, shares_blocks=False):
    """A --threads setting: 0 means one per core this process may use, at most MAX_AUTO_THREADS
    (the Python work between NumPy calls holds the GIL, so many threads on small slices stop
    paying); never more threads than sequences in a batch, unless the model's attention shares
    its work outside the slices (shares_blocks): attention by blocks shares its blocks, dense
    attention its heads (run/heads.py): then one long sequence still uses every thread in its
    attention."""
    if requested == 0:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        requested = min(cores, MAX_AUTO_THREADS)
    return max(1, requested if shares_blocks else min(requested, batch_size))


def current_slice():
    """The index of the slice of sliced_loss that the calling thread is running (0 outside
    one): a key that orders what slices record (BatchNorm's statistics) the same way whatever
    thread finished first, with nothing read from a device."""
    return getattr(_worker, "slice", 0)


def in_worker():
    """True on one of the worker threads (their work is never split again)."""
    return getattr(_worker, "active", False)


def _mark_worker():
    _worker.active = True


def parallel_map(fn, items, workers=None):
    """[fn(x) for x in items], on ``workers`` worker threads (default threads()) when there
    are several; results in the order of items, exceptions re-raised here. The calling thread
    waits interruptibly: a signal handler's exception (train.py's Abandoned) leaves at once,
    the items not yet started are dropped, and the daemon workers never hold up the exit."""
    items = list(items)
    workers = _threads if workers is None else workers
    if workers == 1 or len(items) < 2 or in_worker():
        return [fn(x) for x in items]
    if workers not in _pools:
        _pools[workers] = _Workers(workers)
    return _pools[workers].map(fn, items)


class _Workers:
    """n daemon threads taking (fn, item) jobs from one queue."""

    def __init__(self, n):
        import queue
        self.jobs = queue.SimpleQueue()
        for i in range(n):
            threading.Thread(target=self._work, name=f"nanospa-{i}", daemon=True).start()

    def _work(self):
        _mark_worker()
        while True:
            fn, x, call = self.jobs.get()
            if not call["dropped"]:
                backend.bind_thread()                # the GPU the process chose (CuPy's is per thread)
                try:
                    call["results"][x] = (True, fn(call["items"][x]))
                except BaseException as e:          # noqa: BLE001 -- handed to the caller
                    call["results"][x] = (False, e)
            call["done"].release()

    def map(self, fn, items):
        call = dict(items=items, results={}, dropped=False, done=threading.Semaphore(0))
        for i in range(len(items)):
            self.jobs.put((fn, i, call))
        try:
            for _ in items:                          # woken every 0.1 s: Python runs a signal's
                while not call["done"].acquire(timeout=0.1):   # handler here even when the OS
                    pass                             # delivered the signal to a worker thread
        except BaseException:
            call["dropped"] = True
            raise
        out = []
        for i in range(len(items)):
            ok, value = call["results"][i]
            if not ok:
                raise value
            out.append(value)
        return out


def slice_bounds(n, k):
    """Where k slices of n batch entries start and end: [0, ..., n], sizes differing by at
    most one."""
    return [n * s // k for s in range(k + 1)]


def balanced_groups(costs, k):
    """range(len(costs)) split into k groups of near-equal total cost, the same split for
    the same arguments (snake order over the costs, largest first), each in ascending order:
    how parallel_map's callers share work among k workers."""
    groups = [[] for _ in range(k)]
    for r, i in enumerate(sorted(range(len(costs)), key=lambda i: -costs[i])):
        turn, pos = divmod(r, k)
        groups[pos if turn % 2 == 0 else k - 1 - pos].append(i)
    return [sorted(g) for g in groups if g]


def sliced_loss(loss_fn, *batch, slices=None):
    """The forward of a batch-mean loss ``loss_fn(*batch)`` in slices of the batch (axis 0 of
    every array in ``batch``; default threads() slices), each on a worker thread: a SlicedLoss
    holding one loss Tensor, with its graph, per slice. For a loss that is a mean over batch
    entries (cross-entropy over rows of equal length),

        L = sum_s (n_s / n) L_s,      dL/dtheta = sum_s (n_s / n) dL_s/dtheta,

    so SlicedLoss.backward() back-propagates slice s from L_s with upstream gradient n_s / n,
    on a worker thread, into a dict of its own, and adds the dicts to the leaves' ``.grad``
    in slice order: the result does not depend on thread timing. Each slice's forward draws
    its own rows' dropout masks (batch_rows), so the slices are the batch's call, masks
    included. With one slice this is loss_fn(*batch) and its backward()."""
    n = len(batch[0])
    k = max(1, min(n, threads() if slices is None else slices))
    bounds, first = slice_bounds(n, k), first_row()

    def run(s):                                  # rows bounds[s]: of the call, first + bounds[s] of the
        with batch_rows(first + bounds[s]):      # step's batch: their own dropout masks (batch_rows)
            return _on_slice(s, loss_fn, *(b[bounds[s]:bounds[s + 1]] for b in batch))
    return SlicedLoss(parallel_map(run, range(k)), bounds)


def _on_slice(s, fn, *args):
    """fn(*args) as slice s (current_slice() is s inside)."""
    outer, _worker.slice = current_slice(), s
    try:
        return fn(*args)
    finally:
        _worker.slice = outer


class SlicedLoss:
    """A batch's mean loss whose slices' graphs were built on the worker threads (sliced_loss),
    scaled by a number: ``loss * w`` is w times it (gradient accumulation's share of a
    micro-batch). ``.data``: its value on the model's device, the slices' values added in
    slice order; ``.backward()``: each slice's backward on a worker thread, into ``.grad`` in
    slice order, the graphs freed as they go."""

    def __init__(self, parts, bounds, scale=1.0):
        self.parts, self.bounds, self.scale = parts, bounds, scale

    def __mul__(self, w):
        if not isinstance(w, (int, float)) or isinstance(w, bool):
            raise TypeError(f"a SlicedLoss scales by a number, not {type(w).__name__}")
        return SlicedLoss(self.parts, self.bounds, self.scale * w)

    __rmul__ = __mul__

    def _weights(self):                          # slice s's share of the scaled mean: scale n_s / n
        n = self.bounds[-1]
        return [self.scale * (hi - lo) / n for lo, hi in zip(self.bounds, self.bounds[1:])]

    @property
    def data(self):
        total = None
        for part, w in zip(self.parts, self._weights()):
            total = part.data * w if total is None else total + part.data * w
        return total

    def backward(self):
        weights = self._weights()

        def run(s):
            grads = {}
            _on_slice(s, self.parts[s].backward, weights[s], grads)   # Tensor.backward(grad, leaf_grads)
            return grads

        for grads in parallel_map(run, range(len(self.parts))):   # results in slice order
            for leaf, g in grads.items():
                leaf.grad = g if leaf.grad is None else leaf.grad + g


def sharded_backward(loss_fn, *batch, slices=None, weight=1.0):
    """Back-propagate ``weight`` times the batch-mean loss ``loss_fn(*batch)`` in slices of the
    batch on the worker threads (sliced_loss, then its backward); returns weight * L as a
    Tensor without a graph. With one slice and weight 1 this is loss_fn(*batch).backward()."""
    loss = sliced_loss(loss_fn, *batch, slices=slices) * weight
    loss.backward()
    return Tensor(loss.data)
