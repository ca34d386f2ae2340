"""The one place that knows about devices.

Every op resolves its array module (``xp``) from the arrays it receives, so the same
forward/backward code runs on NumPy and on CuPy, and a float64 CPU gradient check can
run in the same process as a GPU model. CuPy is imported here and nowhere else.

    use("cpu" | "cuda")   choose where new parameters and batches live
    xp_of(*arrays)        numpy or cupy, from the arrays an op receives
    asarray(a, dtype)     host -> current device (no copy when already there)
    to_numpy(a)           device -> host
    scatter_add(a, i, v)  a[i] += v with repeated indices summed (embedding backward)
    synchronize()         wait for the device (a no-op on the CPU)
    set_threads(n)        worker threads for data-parallel slices of a batch (CPU)
    auto_slices(B, work)  slices a plain model call trains on when nobody set threads
    gpu_count(), select_gpu(i), nccl(), stream_ptr()   one process per GPU (distributed.py)

All random initialisation is drawn on the host from a seeded numpy.random.Generator and
then moved with ``asarray``, so CPU and GPU runs start from identical weights.

The second half of this file holds the fused elementwise kernels the fast paths use
(scale_where, scale_add, exp_sub, div_flush, softmax_grad, adamw_update) and erf: each one
CuPy ElementwiseKernel on the GPU and a few in-place NumPy calls on the CPU. Not here: any
differentiation (tensor.py) or op (functions.py, shape_ops.py, fused.py); those call these.
"""
import os
import threading

import numpy as np

try:  # CuPy is optional: the 'gpu' extra
    import cupy as _cp
except Exception:  # ImportError, or a CuPy build that fails to load its CUDA libraries
    _cp = None

_device = "cpu"
MAX_AUTO_THREADS = 4   # cpu_threads(0, ...): one per core, at most this many


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
    _device = device
    return xp()


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
    (Plain fancy-index ``+=`` keeps only one of them.)"""
    if is_device_array(a):
        import cupyx  # ships with CuPy
        cupyx.scatter_add(a, indices, values)
    else:
        np.add.at(a, indices, values)
    return a


_threads = 1
_auto = True          # no set_threads call yet: plain model calls may train on slices (auto_slices)
_pools = {}           # worker count -> ThreadPoolExecutor
_worker = threading.local()
AUTO_SLICE_MIN_WORK = 1 << 16   # B T C of a call below which slicing costs more than it saves


def threads():
    """nanospa's worker threads (see set_threads); 1 until someone sets them."""
    return _threads


def thread_setting():
    """What set_threads was last given: None when never called (or reset), else the count.
    Save it and hand it back to set_threads to restore a caller's state."""
    return None if _auto else _threads


def set_threads(n):
    """Use n worker threads for tensor.sharded_backward: slices of a batch trained at once on
    the CPU. BLAS should then be single-threaded (OPENBLAS_NUM_THREADS=1 before NumPy loads,
    or threadpoolctl), or the two counts multiply. Any call turns off the automatic slicing
    of plain model calls (auto_slices); ``set_threads(None)`` turns it back on (threads 1).
    Returns the previous setting (thread_setting)."""
    global _threads, _auto
    if n is not None and (not isinstance(n, int) or n < 1):
        raise ValueError(f"threads must be a positive integer, got {n!r}")
    previous = thread_setting()
    _auto, _threads = n is None, 1 if n is None else n
    return previous


def cpu_threads(requested, batch_size):
    """A --threads setting: 0 means one per core this process may use, at most MAX_AUTO_THREADS
    (the Python work between NumPy calls holds the GIL, so many threads on small slices stop
    paying); never more threads than sequences in a batch."""
    if requested == 0:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        requested = min(cores, MAX_AUTO_THREADS)
    return min(requested, batch_size)


def in_worker():
    """True on one of nanospa's worker threads (their work is never sliced again)."""
    return getattr(_worker, "active", False)


def auto_slices(batch, work):
    """How many slices of a batch a plain model call with targets trains on at once
    (model.GPT.forward, tensor.sliced_call): cpu_threads(0, batch) when nobody called
    set_threads, on the CPU, outside a worker thread, for calls of at least
    AUTO_SLICE_MIN_WORK (``work`` = B T C), with a BLAS whose threads nanospa can hold at
    1 meanwhile (nanospa/run/blas.py); else 1. Python's GIL is released inside NumPy's loops
    and BLAS, so the slices run at once: what train.py's --threads does, without a setting."""
    if not _auto or _device != "cpu" or batch < 2 or work < AUTO_SLICE_MIN_WORK or in_worker():
        return 1
    from .run import blas
    if blas.threads() is None:
        return 1
    return cpu_threads(0, batch)


def _mark_worker():
    _worker.active = True


def parallel_map(fn, items, workers=None):
    """[fn(x) for x in items], on ``workers`` worker threads (default threads()) when there
    are several; results in the order of items, exceptions re-raised here."""
    items = list(items)
    workers = _threads if workers is None else workers
    if workers == 1 or len(items) < 2:
        return [fn(x) for x in items]
    if workers not in _pools:
        from concurrent.futures import ThreadPoolExecutor
        _pools[workers] = ThreadPoolExecutor(workers, thread_name_prefix="nanospa", initializer=_mark_worker)
    return list(_pools[workers].map(fn, items))


def balanced_groups(costs, k):
    """range(len(costs)) split into k groups of near-equal total cost, the same split for
    the same arguments (snake order over the costs, largest first), each in ascending order:
    how parallel_map's callers share work among k workers."""
    groups = [[] for _ in range(k)]
    for r, i in enumerate(sorted(range(len(costs)), key=lambda i: -costs[i])):
        turn, pos = divmod(r, k)
        groups[pos if turn % 2 == 0 else k - 1 - pos].append(i)
    return [sorted(g) for g in groups if g]


def synchronize():
    """Block until queued device work is done (for timing). A no-op on the CPU."""
    if _device == "cuda" and _cp is not None:
        _cp.cuda.Device().synchronize()


def gpu_count():
    """GPUs CuPy sees (0 without CuPy)."""
    return _cp.cuda.runtime.getDeviceCount() if cuda_available() else 0


def select_gpu(index):
    """Make GPU ``index`` this process's current device (before any array is put on it):
    one process per GPU, chosen by distributed.World from its rank on the machine."""
    if not cuda_available():
        raise DeviceError("device 'cuda' requested but CuPy sees no GPU")
    _cp.cuda.Device(index).use()


def nccl():
    """CuPy's NCCL bindings (cupy.cuda.nccl); DeviceError when this CuPy build has none."""
    if _cp is None:
        raise DeviceError("NCCL needs CuPy: pip install -e .[gpu]")
    try:
        from cupy.cuda import nccl as _nccl  # ships with CuPy; usable only where NCCL was found
    except ImportError:
        _nccl = None
    if _nccl is None or not getattr(_nccl, "available", True):
        raise DeviceError("this CuPy finds no NCCL library (install NCCL, e.g. pip install nvidia-nccl-cu12)")
    return _nccl


def stream_ptr():
    """The current CUDA stream as an integer handle, for NCCL calls ordered after queued work."""
    return _cp.cuda.get_current_stream().ptr


def memory_pool_bytes():
    """Bytes held by CuPy's default memory pool (0 on the CPU)."""
    if _cp is None:
        return 0
    return int(_cp.get_default_memory_pool().total_bytes())


def free_memory_pool():
    """Return the unused blocks of CuPy's default memory pool to the device (a no-op without
    CuPy), so that memory_pool_bytes() counts only live arrays until the pool grows again."""
    if _cp is not None:
        _cp.get_default_memory_pool().free_all_blocks()


# ---------------------------------------------------------------- fused elementwise kernels
# Each helper below is one pass over memory on the GPU (a CuPy ElementwiseKernel, compiled
# on first use) and a short sequence of NumPy calls on the CPU, which is the path the
# gradient checks test. The kernel body is the equation in the docstring, written in C.

_KERNELS = {}


def _kernel(name, in_params, out_params, body):
    if name not in _KERNELS:
        _KERNELS[name] = _cp.ElementwiseKernel(in_params, out_params, body, "nanospa_" + name)
    return _KERNELS[name]


def scale_where(x, cond, k_true, k_false):
    """x * (k_true where cond else k_false), a new array of x's dtype; cond a boolean array
    of x's shape, k_true and k_false Python floats (the leaky ReLU and its derivative)."""
    if is_device_array(x):
        f = _kernel("scale_where", "T x, bool c, T kt, T kf", "T y", "y = c ? kt * x : kf * x")
        return f(x, cond, x.dtype.type(k_true), x.dtype.type(k_false))
    # factor = k_false + (k_true - k_false) * cond: four cheap passes, where np.where with
    # scalar branches is ~8x slower. The factor for cond may differ from k_true in the last
    # bit; forward and backward use the same factors, so gradients stay exact.
    out = cond.astype(x.dtype)
    out *= k_true - k_false
    out += k_false
    out *= x
    return out


def scale_add(x, scale, bias=None):
    """z = scale * x + bias, a new array of x's dtype; bias (optional) broadcasts to x."""
    if is_device_array(x):
        if bias is None:
            return x * x.dtype.type(scale)
        f = _kernel("scale_add", "T x, T s, T b", "T z", "z = s * x + b")
        return f(x, x.dtype.type(scale), bias)
    z = np.multiply(x, scale, dtype=x.dtype)  # a Python float scale keeps x's dtype
    if bias is not None:
        z += bias
    return z


def exp_sub(z, m):
    """z <- exp(z - m) in place; m broadcasts to z (a softmax's row maxima)."""
    if is_device_array(z):
        _kernel("exp_sub", "T m", "T z", "z = exp(z - m)")(m, z)
    else:
        z -= m
        np.exp(z, out=z)
    return z


def div_flush(z, s, threshold):
    """z <- z / s in place, then entries below ``threshold`` set to 0; s broadcasts to z."""
    if is_device_array(z):
        f = _kernel("div_flush", "T s, T t", "T z", "z = z / s; z = z >= t ? z : (T)0")
        f(s, z.dtype.type(threshold), z)
    else:
        z *= 1.0 / s
        z *= z >= threshold
    return z


def softmax_grad(y, g, s, scale, out):
    """out <- scale * y * (g - s): the softmax backward, with s = sum(g y) along the softmax
    axis (broadcasting to y). ``out`` may be the array s was summed from."""
    if is_device_array(y):
        f = _kernel("softmax_grad", "T y, T g, T s, T k", "T o", "o = k * y * (g - s)")
        return f(y, g, s, y.dtype.type(scale), out)
    np.subtract(g, s, out=out)
    out *= y
    if scale != 1.0:
        out *= scale
    return out


def adamw_update(p, g, m, v, b1, b2, step_size, eps, inv_c2, decay):
    """One AdamW update of one parameter, all arrays in place (optim.AdamW):
        m <- b1 m + (1 - b1) g;   v <- b2 v + (1 - b2) g^2
        p <- decay p - step_size m / (sqrt(v inv_c2) + eps)
    with step_size = lr / (1 - b1^t), inv_c2 = 1 / (1 - b2^t), decay = 1 - lr wd (or 1)."""
    if is_device_array(p):
        f = _kernel("adamw", "T g, T b1, T b2, T lr, T eps, T ic2, T d", "T p, T m, T v",
                    "m = b1 * m + (1 - b1) * g; v = b2 * v + (1 - b2) * g * g; "
                    "p = d * p - lr * m / (sqrt(v * ic2) + eps)")
        t = p.dtype.type
        f(g, t(b1), t(b2), t(step_size), t(eps), t(inv_c2), t(decay), p, m, v)
        return p
    tmp = np.multiply(g, 1.0 - b1, dtype=p.dtype)  # one scratch array, reused below
    m *= b1
    m += tmp
    np.multiply(g, g, out=tmp)
    tmp *= 1.0 - b2
    v *= b2
    v += tmp
    np.sqrt(v, out=tmp)
    tmp *= inv_c2 ** 0.5                            # sqrt(v inv_c2)
    tmp += eps
    np.divide(m, tmp, out=tmp)
    tmp *= step_size
    if decay != 1.0:
        p *= decay
    p -= tmp
    return p


def erf(x):
    """The error function, elementwise (exact GELU only). NumPy has none, so the CPU path
    applies math.erf per element: correct to double precision, but slow on big arrays."""
    if is_device_array(x):
        import cupyx.scipy.special  # ships with CuPy
        return cupyx.scipy.special.erf(x)
    import math
    return np.frompyfunc(math.erf, 1, 1)(x).astype(x.dtype)
