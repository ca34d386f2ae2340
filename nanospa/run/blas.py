"""The BLAS library's own thread count, read and changed while the process runs.

A plain training loop (``model(idx, targets); loss.backward(); opt.step()``) gets NumPy's
BLAS with one thread per core. nanospa's batch slices (backend.auto_slices) run on worker
threads of their own, and each worker's matrix products must then be single-threaded, or
threads x BLAS-threads compete for the cores (measured on the 2-core machine: a step of the
ref model on two slices over a 2-thread BLAS takes 2.2 s, over a 1-thread BLAS 1.3 to 1.5 s,
unsliced 1.7 to 2.0 s). ``limited(1)`` holds the count at 1 for the length of a sliced call.

The library: the OpenBLAS that NumPy's wheels ship (scipy-openblas; its C functions carry a
``scipy_`` prefix and, in the 64-bit-integer build, a ``64_`` suffix), or a system OpenBLAS
this process has loaded. OpenBLAS keeps one process-wide count (its ``_local`` variant is
process-wide too in the pthreads build), so while a sliced call runs, products on other
threads of the program are single-threaded as well. Any other BLAS (MKL, Accelerate, BLIS):
``threads()`` is None and nanospa does not slice plain calls (backend.auto_slices).

    threads()       the BLAS thread count, or None when nanospa cannot see the library
    limited(n)      a context manager: at most n BLAS threads inside, the old count after
"""
import ctypes
import functools
import glob
import os
import threading
from contextlib import contextmanager

# (get, set) pairs, the names NumPy's wheels and plain OpenBLAS builds export, first match wins
_NAMES = (("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_"),
          ("scipy_openblas_get_num_threads", "scipy_openblas_set_num_threads"),
          ("openblas_get_num_threads64_", "openblas_set_num_threads64_"),
          ("openblas_get_num_threads", "openblas_set_num_threads"))
_lock = threading.Lock()   # limited() from two threads at once: one saves, the last restores
_depth = 0
_saved = None


def _candidates():
    """Library files that may be NumPy's OpenBLAS: beside the wheel's numpy package (Linux and
    Windows: numpy.libs, macOS: numpy/.dylibs), then any OpenBLAS this process has mapped."""
    import numpy
    here = os.path.dirname(numpy.__file__)
    files = [f for pattern in (os.path.join(here, os.pardir, "numpy.libs", "*openblas*"),
                               os.path.join(here, ".dylibs", "*openblas*"))
             for f in sorted(glob.glob(pattern))]
    try:
        with open("/proc/self/maps") as maps:
            files += sorted({line.split()[-1] for line in maps if "openblas" in line.lower()
                             and line.split()[-1].startswith("/")})
    except OSError:
        pass
    return files


@functools.lru_cache(maxsize=None)
def _api():
    """(get, set) C functions of the OpenBLAS NumPy uses, or None."""
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)   # already loaded by NumPy: the same library, not a second copy
        except OSError:
            continue
        for get, put in _NAMES:
            if hasattr(lib, get) and hasattr(lib, put):
                getter, setter = getattr(lib, get), getattr(lib, put)
                getter.restype, setter.argtypes, setter.restype = ctypes.c_int, [ctypes.c_int], None
                return getter, setter
    return None


def threads():
    """The BLAS library's thread count, or None when it is not an OpenBLAS nanospa can see."""
    api = _api()
    return None if api is None else int(api[0]())


@contextmanager
def limited(n):
    """At most n BLAS threads inside the block (nested and concurrent blocks: the count of the
    outermost is restored when the last one ends); a no-op when threads() is None."""
    global _depth, _saved
    api = _api()
    if api is None:
        yield
        return
    with _lock:
        if _depth == 0:
            _saved = int(api[0]())
        _depth += 1
        if _saved > n:
            api[1](n)
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _saved > n:
                api[1](_saved)
