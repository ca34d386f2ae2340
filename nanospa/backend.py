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
    cupy()                the CuPy module or None, for the run infrastructure (GPUs, NCCL)

All random initialisation is drawn on the host from a seeded numpy.random.Generator and
then moved with ``asarray``, so CPU and GPU runs start from identical weights.

Not here: threads (nanospa/run/threads.py), MPI and NCCL (nanospa/run/distributed.py), any
differentiation (tensor.py) or op (functions.py, shape_ops.py, fused.py).
"""
import numpy as np

try:  # CuPy is optional: the 'gpu' extra
    import cupy as _cp
except Exception:  # ImportError, or a CuPy build that fails to load its CUDA libraries
    _cp = None

_device = "cpu"


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


def device():
    """The current device: "cpu" or "cuda"."""
    return _device


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


def synchronize():
    """Block until queued device work is done (for timing). A no-op on the CPU."""
    if _device == "cuda" and _cp is not None:
        _cp.cuda.Device().synchronize()


def cupy():
    """The CuPy module, or None without it: how the run infrastructure (one process per GPU,
    NCCL, the benchmark's memory pool) reaches CuPy without importing it."""
    return _cp
