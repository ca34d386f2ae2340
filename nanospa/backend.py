"""The one place that knows about devices.

Every op resolves its array module (``xp``) from the arrays it receives, so the same
forward/backward code runs on NumPy and on CuPy, and a float64 CPU gradient check can
run in the same process as a GPU model. CuPy is imported here and nowhere else (but for
cupyx's erf, which signal/beyond/activations.py's exact GELU looks up on a GPU).

    use("cpu" | "cuda")   choose where new parameters and batches live (on "cuda": the GPU
                          current in the calling thread, which bind_thread gives the others)
    xp_of(*arrays)        numpy or cupy, from the arrays an op receives
    asarray(a, dtype)     host -> current device (no copy when already there)
    to_numpy(a)           device -> host
    scatter_add(a, i, v)  a[i] += v with repeated indices summed (embedding backward)
    synchronize()         wait for the device (a no-op on the CPU)
    bind_thread()         make the GPU of use() current in this thread (CuPy's is per thread)
    cupy()                the CuPy module or None, for the run infrastructure (GPUs, NCCL)

All random initialisation is drawn on the host from a seeded numpy.random.Generator and
then moved with ``asarray``, so CPU and GPU runs start from identical weights.

On a GPU every device-to-host read (``float(a)``, ``.item()``, ``to_numpy``) waits for the
device, and every host array handed to ``asarray`` is a copy: the training step does a
constant number of each, whatever the depth or length (the CuPy stand-in in
tests/cupy_standin counts them: tests/test_gpu.py). scatter_add on a GPU does not use
atomics, whose order of addition changes from run to run, so that two runs with one seed
agree bit for bit (segment_sum).

Not here: threads (nanospa/run/threads.py), MPI and NCCL (nanospa/run/distributed.py), any
differentiation (tensor.py) or op (functions.py, shape_ops.py, fused.py).
"""
import numpy as np

try:  # CuPy is optional: the 'gpu' extra
    import cupy as _cp
except Exception:  # ImportError, or a CuPy build that fails to load its CUDA libraries
    _cp = None

_device = "cpu"
_device_id = 0      # on "cuda": the GPU use() found current (World.use_device picks it per rank)


class DeviceError(RuntimeError):
    """Raised when a device is requested that this machine cannot provide."""


def cuda_available():
    """True when CuPy imports and sees at least one GPU."""
    if _cp is None:
        return False
    try:
        return _cp.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def use(device):
    """Select the device for new arrays: "cpu" or "cuda". Returns the array module."""
    global _device
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    if device == "cuda":
        if _cp is None:
            raise DeviceError("device 'cuda' needs CuPy: pip install -e .[gpu] "
                              "(or the cupy-cudaXXx wheel matching your CUDA)")
        if not cuda_available():
            raise DeviceError("device 'cuda' requested but CuPy sees no GPU")
    if device == "cuda":
        global _device_id
        _device_id = _cp.cuda.get_device_id()
    _device = device
    return xp()


def bind_thread():
    """Make the GPU of use("cuda") current in the calling thread: CuPy's current device is per
    thread, so a worker thread would otherwise allocate on GPU 0 whatever the process's rank
    chose. A no-op on the CPU. run/threads.py calls it in every worker."""
    if _device == "cuda":
        _cp.cuda.Device(_device_id).use()


def xp():
    """The array module of the current device."""
    return _cp if _device == "cuda" else np


def xp_of(*arrays):
    """numpy, or cupy when any argument is a CuPy array."""
    if _cp is not None:
        for a in arrays:
            if isinstance(a, _cp.ndarray):
                return _cp
    return np


def is_device_array(a):
    return _cp is not None and isinstance(a, _cp.ndarray)


def asarray(a, dtype=None):
    """Put a host (or device) array on the current device."""
    return xp().asarray(a, dtype=dtype)


def to_numpy(a):
    """Bring an array (NumPy or CuPy) back to the host as a numpy.ndarray."""
    if is_device_array(a):
        return _cp.asnumpy(a)
    return np.asarray(a)


def scatter_add(a, indices, values):
    """a[indices] += values, in place, summing contributions of repeated indices.
    (Plain fancy-index ``+=`` keeps only one of them.) On the CPU np.add.at, which adds in
    index order; on a GPU segment_sum, which adds in an order fixed by the indices (CuPy's own
    scatter_add uses atomics: its float sums differ in the last bits from run to run)."""
    if not is_device_array(a):
        np.add.at(a, indices, values)
        return a
    xp = _cp
    if (isinstance(indices, xp.ndarray) and indices.ndim == 1 and a.ndim >= 1
            and values.shape == indices.shape + a.shape[1:]):
        rows, n = indices, a.shape[0]                        # whole rows (an embedding's backward)
        vals = values.reshape(indices.size, -1)
    else:                                                    # any index: one entry at a time
        pos = xp.arange(a.size).reshape(a.shape)[indices]
        rows, n = pos.reshape(-1), a.size
        vals = xp.broadcast_to(values, pos.shape).reshape(-1, 1)
    target = a.reshape(n, -1)
    if not target.flags.c_contiguous:
        raise ValueError("scatter_add: the target array must be C-contiguous on a GPU")
    target += segment_sum(rows, vals, n).astype(a.dtype)
    return a


def segment_sum(keys, values, n):
    """(n, C) float64 sums of the rows of values (N, C) by key (N,) integers in [0, n), in an
    order that depends only on the keys: rows sorted by (key, position), running sums in
    float64 down the sorted rows, and each key's total as the difference of the running sums
    at its ends. The differences carry an error of about N eps_64 times the largest running
    sum, far below a float32 result's rounding; there are no atomics, so a GPU gives the same
    bits at every run. Device-array arithmetic only: no host reads, no copies."""
    xp = xp_of(keys, values)
    N = keys.size
    order = xp.argsort(keys.astype(xp.int64) * N + xp.arange(N))   # unique: one order however ties sort
    sums = xp.cumsum(values[order], axis=0, dtype=xp.float64)         # (N, C)
    sums = xp.concatenate([xp.zeros((1, values.shape[1]), dtype=xp.float64), sums])
    sorted_keys, ids = keys[order], xp.arange(n)
    hi = xp.searchsorted(sorted_keys, ids, side="right")             # key k: sorted rows [lo, hi)
    lo = xp.searchsorted(sorted_keys, ids, side="left")
    return sums[hi] - sums[lo]


def synchronize():
    """Block until queued device work is done (for timing). A no-op on the CPU."""
    if _device == "cuda" and _cp is not None:
        _cp.cuda.Device().synchronize()


def cupy():
    """The CuPy module, or None without it: how the run infrastructure (one process per GPU,
    NCCL, the benchmark's memory pool) reaches CuPy without importing it."""
    return _cp
