"""A strict CuPy stand-in on NumPy, so that the GPU path is run and checked on any CPU.

No development or CI machine of this project has a GPU, so nanospa's GPU path is run here on a
module that looks to nanospa exactly like CuPy (``import cupy`` finds it) and computes with
NumPy. It is strict where a GPU is strict, and it counts what costs time on a GPU:

  refuses, as CuPy refuses:
    - implicit conversion of a device array to the host (``np.asarray(a)``, ``__array__``):
      TypeError, with CuPy's message;
    - host arrays inside device operations (``cupy_a + numpy_b``, ``cupy.exp(numpy_b)``,
      ``out=numpy_b``): TypeError "Unsupported type";
    - names CuPy does not have (``cupy.errstate``, ``a.__index__``, a NumPy function called on
      a device array that CuPy does not implement): AttributeError / TypeError. The names are
      read from a real CuPy by make_namespace.py and kept in namespace.json (NAMESPACE);
    - arrays of one GPU used while another is current (CuPy's current device is per thread):
      ValueError, with CuPy's message;
  counts, by call site (the first frame outside the stand-in):
    - device-to-host reads (synchronisations): ``float(a)``, ``int(a)``, ``bool(a)``,
      ``a.item()``, ``a.get()``, ``cupy.asnumpy(a)``, ``a.tolist()``, printing an array, and
      the operations whose result's shape depends on the data (``nonzero``, boolean-mask
      indexing, ``unique``, one-argument ``where``);
    - host-to-device copies: ``cupy.asarray`` / ``cupy.array`` of host data (NumPy arrays,
      lists, Python numbers), ``a.set(host)``, host arrays used as indices or assigned into a
      device array;
  models the order of addition where a GPU leaves it open:
    - ``cupyx.scatter_add`` and ``ufunc.at`` add with atomics on a GPU, so the order of the
      additions (and a float result's last bits) changes from run to run: here they add in a
      random order drawn afresh at each call. Everything else (reductions, products) is
      deterministic on a GPU for a given shape, and NumPy's order stands in for it.

What it cannot show: speed, memory on a real device, kernels' own numerics (cuBLAS, TF32),
NCCL between real GPUs. bench/gpu_check.py does those on a machine with a GPU.

Use: put tests/cupy_standin on PYTHONPATH (``cupy`` and ``cupyx`` are then these modules), or
call install() in-process; counts() / reset() read and clear the counters; with the
environment variable CUPY_STANDIN_COUNTS=path the counts are written there as JSON at exit.
CUPY_STANDIN_DEVICES=n (default 1) sets how many GPUs it shows.
"""
import atexit
import collections
import json
import math
import os
import pathlib
import sys
import threading
import time
import types
import weakref

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
NAMESPACE = json.loads((HERE / "namespace.json").read_text())
VERSION = NAMESPACE["cupy_version"]
MEMORY = 141 * 2 ** 30          # what memGetInfo reports: an H200's 141 GiB

# ----------------------------------------------------------------------------- counting

_lock = threading.Lock()
_reads = collections.Counter()
_copies = collections.Counter()
_OWN = (str(HERE),)
_PASS = (os.sep + os.path.join("nanospa", "backend.py"),)   # nanospa's device layer: its caller is the site


def _site():
    """'file:line' of the first frame outside the stand-in (and outside NumPy's dispatch)."""
    f = sys._getframe(2)
    while f is not None:
        name = f.f_code.co_filename
        if not name.startswith(_OWN) and "/numpy/" not in name and not name.endswith(_PASS):
            root = os.getcwd()
            if name.startswith(root + os.sep):
                name = name[len(root) + 1:]
            return f"{name}:{f.f_lineno}"
        f = f.f_back
    return "?"


def _read():
    with _lock:
        _reads[_site()] += 1


def _copy():
    with _lock:
        _copies[_site()] += 1


def counts():
    """{"reads": n, "copies": n, "read_sites": {site: n}, "copy_sites": {site: n}}."""
    with _lock:
        return dict(reads=sum(_reads.values()), copies=sum(_copies.values()),
                    read_sites=dict(_reads), copy_sites=dict(_copies))


def reset():
    with _lock:
        _reads.clear()
        _copies.clear()


def _dump():
    path = os.environ.get("CUPY_STANDIN_COUNTS")
    if path:
        pathlib.Path(path).write_text(json.dumps(counts(), indent=1, sort_keys=True))


atexit.register(_dump)

# ----------------------------------------------------------------------------- devices

_current = threading.local()
_ndevices = int(os.environ.get("CUPY_STANDIN_DEVICES", "1"))


class CUDARuntimeError(RuntimeError):
    pass


def _current_id():
    return getattr(_current, "id", 0)


def set_devices(n):
    """Show n GPUs (CUPY_STANDIN_DEVICES at start); returns the previous count."""
    global _ndevices
    previous, _ndevices = _ndevices, int(n)
    return previous


class Device:
    """cupy.cuda.Device: the current device is per thread (as CUDA's), 0 until set."""

    def __init__(self, device=None):
        self.id = _current_id() if device is None else int(device)
        self._stack = []

    def use(self):
        if not 0 <= self.id < _ndevices:
            raise CUDARuntimeError("cudaErrorInvalidDevice: invalid device ordinal")
        _current.id = self.id

    def synchronize(self):
        pass

    def __enter__(self):
        self._stack.append(_current_id())
        self.use()
        return self

    def __exit__(self, *exc):
        _current.id = self._stack.pop()

    @property
    def mem_info(self):
        return MEMORY - _pool.used, MEMORY

    @property
    def compute_capability(self):
        return "90"

    def __eq__(self, other):
        return isinstance(other, Device) and other.id == self.id

    def __hash__(self):
        return hash(self.id)

    def __repr__(self):
        return f"<CUDA Device {self.id}>"


# ----------------------------------------------------------------------------- the array

_HOST = (np.ndarray,)


def _unsupported(x):
    return TypeError(f"Unsupported type {type(x)}")


def _dev(x):
    """The NumPy array of a device array, refusing arrays of another device and host arrays."""
    if isinstance(x, ndarray):
        if x._device != _current_id():
            raise ValueError(f"Array device must be same as the current device: array device = "
                             f"{x._device} while current = {_current_id()}")
        return x._a
    if isinstance(x, _HOST):
        raise _unsupported(x)
    return x


def _args(x):
    """Unwrap the arguments of a device operation (nested lists and tuples too)."""
    if isinstance(x, (ndarray,) + _HOST):
        return _dev(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_args(v) for v in x) if not hasattr(x, "_fields") else type(x)(*(_args(v) for v in x))
    return x


def _wrap(x):
    """NumPy results as device arrays; NumPy scalars become 0-d arrays, as CuPy's are."""
    if isinstance(x, np.ndarray):
        return ndarray._of(x)
    if isinstance(x, np.generic):
        return ndarray._of(np.asarray(x))
    if isinstance(x, tuple):
        return type(x)(*map(_wrap, x)) if hasattr(x, "_fields") else tuple(map(_wrap, x))
    if isinstance(x, list):
        return [_wrap(v) for v in x]
    return x


def _index(index):
    """An index for a device array: device arrays unwrapped; host arrays and lists are copied
    to the device (counted); a boolean mask makes the result's size depend on the data (a read)."""
    parts = index if isinstance(index, tuple) else (index,)
    out = []
    for p in parts:
        if isinstance(p, ndarray):
            a = _dev(p)
            if a.dtype == bool:
                _read()
            out.append(a)
        elif isinstance(p, (np.ndarray, list)):
            _copy()
            a = np.asarray(p)
            if a.dtype == bool:
                _read()
            out.append(a)
        else:
            out.append(p)
    return tuple(out) if isinstance(index, tuple) else out[0]


class _Pool:
    """The bytes of live device arrays that own their memory, and the peak since the last
    free_all_blocks (what CuPy's pool would hold)."""

    def __init__(self):
        self.used = self.peak = 0
        self.lock = threading.Lock()

    def add(self, n):
        with self.lock:
            self.used += n
            self.peak = max(self.peak, self.used)

    def sub(self, n):
        with self.lock:
            self.used -= n


_pool = _Pool()
_pointers = weakref.WeakValueDictionary()   # data.ptr -> array, for the NCCL stand-in


class MemoryPointer:
    def __init__(self, a):
        self.ptr = id(a)
        self.device_id = a._device
        _pointers[self.ptr] = a


class ndarray:
    """cupy.ndarray on a NumPy array (``_a``) of one device (``_device``)."""
    __slots__ = ("_a", "_device", "_owned", "__weakref__")
    __array_priority__ = 100.0
    __hash__ = None

    def __init__(self, shape, dtype=float, memptr=None, strides=None, order="C"):
        self._set(np.empty(shape, dtype=dtype, order=order))

    @classmethod
    def _of(cls, a):
        obj = cls.__new__(cls)
        obj._set(a)
        return obj

    def _set(self, a):
        self._a, self._device = a, _current_id()
        self._owned = a.nbytes if a.flags.owndata else 0
        if self._owned:
            _pool.add(self._owned)

    def __del__(self, _pools=[_pool]):    # bound now: at shutdown the module's globals are gone
        if getattr(self, "_owned", 0):
            _pools[0].sub(self._owned)

    # ---- host metadata: free
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    strides = property(lambda self: self._a.strides)
    itemsize = property(lambda self: self._a.itemsize)
    nbytes = property(lambda self: self._a.nbytes)
    flags = property(lambda self: self._a.flags)
    device = property(lambda self: Device(self._device))
    data = property(lambda self: MemoryPointer(self))
    base = property(lambda self: None if self._a.base is None else ndarray._of(self._a.base))
    T = property(lambda self: _wrap(_dev(self).T))
    mT = property(lambda self: _wrap(np.swapaxes(_dev(self), -1, -2)))
    real = property(lambda self: _wrap(_dev(self).real))
    imag = property(lambda self: _wrap(_dev(self).imag))

    def __len__(self):
        if self._a.ndim == 0:
            raise TypeError("len() of unsized object")
        return len(self._a)

    def __iter__(self):
        if self._a.ndim == 0:
            raise TypeError("iteration over a 0-d array")
        return (self[i] for i in range(len(self)))

    # ---- what CuPy refuses
    def __array__(self, dtype=None, copy=None):
        raise TypeError("Implicit conversion to a NumPy array is not allowed. Please use `.get()` "
                        "to construct a NumPy array explicitly.")

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        mine = getattr(_module("cupy"), ufunc.__name__, None)
        if not isinstance(mine, _Ufunc):
            return NotImplemented
        return getattr(mine, method)(*inputs, **kwargs) if method != "__call__" else mine(*inputs, **kwargs)

    def __array_function__(self, func, types, args, kwargs):
        space = "cupy" + func.__module__[len("numpy"):] if func.__module__.startswith("numpy") else None
        if space == "cupy.lib._stride_tricks_impl":
            space = "cupy.lib.stride_tricks"
        target = NAMESPACE["modules"].get(space, {}).get(func.__name__)
        if target is None:
            return NotImplemented       # NumPy raises TypeError: no implementation for cupy.ndarray
        return getattr(_module(space), func.__name__)(*args, **kwargs)

    # ---- device -> host: each a read (a synchronisation)
    def _scalar(self):
        if self._a.size != 1:
            raise ValueError("The truth value of an array with more than one element is ambiguous.")
        _read()
        return self._a.reshape(()).item()

    def __float__(self):
        return float(self._scalar())

    def __int__(self):
        return int(self._scalar())

    def __bool__(self):
        return bool(self._scalar())

    def __complex__(self):
        return complex(self._scalar())

    def item(self):
        return self._scalar()

    def get(self, stream=None, order="C", out=None, blocking=True):
        _read()
        a = np.array(_dev(self), order=order)
        if out is not None:
            out[...] = a
            return out
        return a

    def tolist(self):
        _read()
        return _dev(self).tolist()

    def tobytes(self, order="C"):
        _read()
        return _dev(self).tobytes(order)

    def __repr__(self):
        _read()
        return repr(self._a).replace("array", "array", 1)

    def __str__(self):
        _read()
        return str(self._a)

    def __format__(self, spec):
        if self._a.ndim == 0:
            return format(self._scalar(), spec)
        return str(self)

    # ---- host -> device
    def set(self, arr, stream=None):
        if not isinstance(arr, np.ndarray):
            raise TypeError(f"Only numpy.ndarray can be set to cupy.ndarray, got {type(arr)}")
        _copy()
        self._a[...] = arr

    # ---- indexing
    def __getitem__(self, index):
        return _wrap(_dev(self)[_index(index)])

    def __setitem__(self, index, value):
        if isinstance(value, (np.ndarray, list)):
            _copy()
            value = np.asarray(value)
        _dev(self)[_index(index)] = _dev(value)

    def __copy__(self):
        return _wrap(_dev(self).copy())

    def __deepcopy__(self, memo):
        return self.__copy__()

    def __reduce__(self):
        _read()
        return (_asarray_host, (self._a.copy(),))


def _asarray_host(a):
    return ndarray._of(a)


def _binary(name):
    def op(self, other):
        try:
            result = getattr(_dev(self), name)(_dev(other))
        except TypeError:
            raise
        return NotImplemented if result is NotImplemented else _wrap(result)
    op.__name__ = name
    return op


def _inplace(name):
    def op(self, other):
        getattr(_dev(self), name)(_dev(other))
        return self
    op.__name__ = name
    return op


def _unary(name):
    def op(self):
        return _wrap(getattr(_dev(self), name)())
    op.__name__ = name
    return op


for _n in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and", "or", "xor",
           "lshift", "rshift", "divmod"):
    setattr(ndarray, f"__{_n}__", _binary(f"__{_n}__"))
    setattr(ndarray, f"__r{_n}__", _binary(f"__r{_n}__"))
    if _n != "divmod":
        setattr(ndarray, f"__i{_n}__", _inplace(f"__i{_n}__"))
for _n in ("lt", "le", "gt", "ge", "eq", "ne"):
    setattr(ndarray, f"__{_n}__", _binary(f"__{_n}__"))
for _n in ("neg", "pos", "abs", "invert"):
    setattr(ndarray, f"__{_n}__", _unary(f"__{_n}__"))

_METHOD_READS = {"nonzero", "compress", "dump", "dumps", "tofile"}   # data-dependent shape, or host output
_SPECIAL = set(vars(ndarray)) | {"scatter_add", "scatter_max", "scatter_min", "cstruct", "mdspan",
                                 "toDlpack", "reduced_view"}


def _method(name):
    def m(self, *args, **kwargs):
        if name in _METHOD_READS:
            _read()
        return _wrap(getattr(_dev(self), name)(*_args(args), **{k: _args(v) for k, v in kwargs.items()}))
    m.__name__ = name
    return m


for _n in NAMESPACE["ndarray"]:
    if not _n.startswith("_") and _n not in _SPECIAL and hasattr(np.ndarray, _n):
        setattr(ndarray, _n, _method(_n))
ndarray.scatter_add = lambda self, slices, value: _scatter(np.add, self, slices, value)
ndarray.__module__ = "cupy"
ndarray.__qualname__ = ndarray.__name__ = "ndarray"

# ----------------------------------------------------------------------------- ufuncs


def _kwargs(kwargs):
    """Keyword arguments unwrapped, ``out=`` included (which must be device arrays) -> (kwargs,
    the out argument as given, or None)."""
    out = kwargs.get("out")
    unwrapped = {k: _args(v) for k, v in kwargs.items() if k != "out"}
    if out is None:
        return unwrapped, None
    outs = out if isinstance(out, tuple) else (out,)
    for o in outs:
        if o is not None and not isinstance(o, ndarray):
            raise TypeError(f"Output arrays must be cupy.ndarray, got {type(o)}")
    unwrapped["out"] = tuple(_dev(o) for o in outs) if isinstance(out, tuple) else _dev(out)
    return unwrapped, out


class _Ufunc:
    """cupy.ufunc around numpy's: device arrays and scalars in, device arrays out."""

    def __init__(self, np_ufunc):
        self._np = np_ufunc
        self.__name__ = self.name = np_ufunc.__name__
        self.nin, self.nout, self.nargs, self.types = np_ufunc.nin, np_ufunc.nout, np_ufunc.nargs, np_ufunc.types

    def __call__(self, *args, **kwargs):
        kwargs, out = _kwargs(kwargs)
        result = self._np(*map(_dev, args), **kwargs)
        return out if out is not None else _wrap(result)

    def _method(self, method, *args, **kwargs):
        kwargs, out = _kwargs(kwargs)
        result = getattr(self._np, method)(*map(_dev, args), **kwargs)
        return out if out is not None else _wrap(result)

    def reduce(self, *args, **kwargs):
        return self._method("reduce", *args, **kwargs)

    def accumulate(self, *args, **kwargs):
        return self._method("accumulate", *args, **kwargs)

    def reduceat(self, *args, **kwargs):
        return self._method("reduceat", *args, **kwargs)

    def outer(self, *args, **kwargs):
        return self._method("outer", *args, **kwargs)

    def at(self, a, indices, b=None):
        """Atomic updates on a GPU: for add, the order of the additions is open (random here)."""
        if self._np is np.add:
            return _scatter(np.add, a, indices, b)
        self._np.at(_dev(a), _index(indices), *(() if b is None else (_dev(b),)))

    def __repr__(self):
        return f"<ufunc '{self.name}'>"


_rng = np.random.default_rng()     # OS entropy: a different order of additions at every run


def _scatter(ufunc, a, indices, values):
    """a[indices] (op)= values with repeated indices all applied, in a random order: the
    atomics of a GPU leave the order open, so float sums differ in their last bits run to run."""
    target = _dev(a)
    pos = np.arange(target.size).reshape(target.shape)[_index(indices)]
    vals = np.broadcast_to(_dev(values), pos.shape).reshape(-1)
    pos = pos.reshape(-1)
    order = _rng.permutation(pos.size)
    flat = target.reshape(-1)
    if not np.shares_memory(flat, target):
        raise ValueError("scatter into a non-contiguous array is not modelled by the stand-in")
    ufunc.at(flat, pos[order], vals[order])


# ----------------------------------------------------------------------------- module functions

_HOST_RESULTS = {"array_equal", "array_equiv", "allclose", "count_nonzero"}   # 0-d arrays in CuPy
_READ_FUNCTIONS = {"nonzero", "argwhere", "flatnonzero", "unique", "extract", "compress",
                   "trim_zeros", "histogram", "bincount"}                        # data-dependent shapes


def _function(name, fn):
    def f(*args, **kwargs):
        if name in _READ_FUNCTIONS or (name == "where" and len(args) == 1):
            _read()
        kwargs, out = _kwargs(kwargs)
        result = fn(*_args(args), **kwargs)
        if out is not None:
            return out
        if name in _HOST_RESULTS and isinstance(result, (bool, int, float, np.generic)):
            return ndarray._of(np.asarray(result))
        return _wrap(result)
    f.__name__ = name
    return f


def _host_leaves(x):
    if isinstance(x, (list, tuple)):
        return [leaf for v in x for leaf in _host_leaves(v)]
    return [x]


def asarray(a, dtype=None, order=None, *, blocking=False):
    """A device array of a: a device array is kept (cast to dtype on the device); host data
    (NumPy arrays, lists, Python numbers) is copied over: one host-to-device copy. A list of
    device arrays is stacked on the device; a list mixing them with host numbers is read back
    and copied, as CuPy does."""
    if isinstance(a, ndarray):
        x = _dev(a)
        return a if dtype is None or np.dtype(dtype) == x.dtype else _wrap(x.astype(dtype))
    leaves = _host_leaves(a)
    on_device = [v for v in leaves if isinstance(v, ndarray)]
    if on_device and len(on_device) == len(leaves):
        return _wrap(np.asarray(_args(a), dtype=dtype))        # stacked on the device
    if on_device:
        _read()
    _copy()
    return ndarray._of(np.array(_args_host(a), dtype=dtype, order=order or "K", copy=True))


def _args_host(x):
    if isinstance(x, ndarray):
        return x._a
    if isinstance(x, (list, tuple)):
        return [_args_host(v) for v in x]
    return x


def array(obj, dtype=None, copy=True, order="K", subok=False, ndmin=0, *, blocking=False):
    if isinstance(obj, ndarray):
        return _wrap(np.array(_dev(obj), dtype=dtype, copy=True, order=order, ndmin=ndmin))
    out = asarray(obj, dtype=dtype)
    return _wrap(np.array(out._a, copy=False, ndmin=ndmin)) if ndmin else out


def asnumpy(a, stream=None, order="C", out=None, blocking=True):
    if isinstance(a, ndarray):
        return a.get(order=order, out=out)
    return np.asarray(a, order=order)


def get_array_module(*args):
    for a in args:
        if isinstance(a, ndarray):
            return _module("cupy")
    return np


class _MemoryPool:
    def used_bytes(self):
        return _pool.used

    def total_bytes(self):
        return _pool.peak

    def free_bytes(self):
        return _pool.peak - _pool.used

    def free_all_blocks(self, stream=None):
        with _pool.lock:
            _pool.peak = _pool.used

    def free_all_free(self):
        self.free_all_blocks()

    def n_free_blocks(self):
        return 0

    def set_limit(self, size=None, fraction=None):
        pass

    def get_limit(self):
        return 0

    def malloc(self, size):
        raise NotImplementedError("MemoryPool.malloc is not modelled by the stand-in")


_default_pool = _MemoryPool()


class _Stream:
    ptr = 0
    null = None

    def synchronize(self):
        pass

    def use(self):
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


class _Event:
    def __init__(self, *args, **kwargs):
        self.t = None

    def record(self, stream=None):
        self.t = time.perf_counter()

    def synchronize(self):
        pass


def _elapsed(start, end):
    return (end.t - start.t) * 1e3


# ---- cupyx.scipy.special.erf, and the random module: device results, no copies

def erf(x, out=None):
    y = np.frompyfunc(math.erf, 1, 1)(_dev(x)).astype(_dev(x).dtype)
    if out is not None:
        out._a[...] = y
        return out
    return _wrap(y)


_random_state = [np.random.default_rng(0)]


def _random(name):
    def f(*args, **kwargs):
        gen = _random_state[0]
        if name == "seed":
            _random_state[0] = np.random.default_rng(*args)
            return None
        legacy = {"rand": lambda *s: gen.random(s), "randn": lambda *s: gen.standard_normal(s),
                  "random_sample": gen.random, "ranf": gen.random, "sample": gen.random,
                  "randint": gen.integers}
        fn = legacy.get(name) or getattr(gen, name)
        return _wrap(fn(*_args(args), **{k: _args(v) for k, v in kwargs.items()}))
    return f


class _Generator:
    """cupy.random.default_rng(seed): draws on the device (no copies)."""

    def __init__(self, seed=None):
        self._g = np.random.default_rng(seed)

    def __getattr__(self, name):
        fn = getattr(self._g, name)
        return lambda *a, **k: _wrap(fn(*_args(a), **{key: _args(v) for key, v in k.items()}))


# ----------------------------------------------------------------------------- NCCL


class _Nccl:
    """cupy.cuda.nccl between the ranks of an MPI job (mpi4py): allReduce reads the buffer
    through its pointer, sums over MPI and writes back. Not a copy the program makes, so not
    counted; it stands in for NCCL's device-to-device traffic."""
    NCCL_FLOAT32, NCCL_FLOAT64, NCCL_SUM = 7, 8, 0
    available = True

    @staticmethod
    def get_unique_id():
        return tuple(int(b) for b in os.urandom(16))

    @staticmethod
    def get_version():
        return 22703

    class NcclCommunicator:
        def __init__(self, ndev, uid, rank):
            from mpi4py import MPI
            self.comm, self.ndev, self.rank_ = MPI.COMM_WORLD, ndev, rank
            if self.comm.Get_size() != ndev:
                raise RuntimeError(f"NCCL stand-in: {ndev} ranks asked, MPI has {self.comm.Get_size()}")

        def allReduce(self, sendbuf, recvbuf, count, datatype, op, stream):
            from mpi4py import MPI
            send, recv = _pointers[sendbuf], _pointers[recvbuf]
            summed = np.empty_like(send._a.reshape(-1)[:count])
            self.comm.Allreduce(np.ascontiguousarray(send._a.reshape(-1)[:count]), summed, op=MPI.SUM)
            recv._a.reshape(-1)[:count] = summed

        def rank_id(self):
            return self.rank_

        def size(self):
            return self.ndev

        def destroy(self):
            pass

        abort = destroy


# ----------------------------------------------------------------------------- the modules


class _StrictModule(types.ModuleType):
    """A module that has exactly CuPy's names: any other is AttributeError, as on CuPy."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(f"module {self.__name__!r} has no attribute {name!r} (not in CuPy {VERSION}; "
                             "tests/cupy_standin/namespace.json)")


_modules = {}


def _module(name):
    return _modules[name]


def _unmodelled(qualname):
    def f(*args, **kwargs):
        raise NotImplementedError(f"{qualname} exists in CuPy but is not modelled by the stand-in "
                                  "(tests/cupy_standin/standin.py)")
    return f


_NP_SPACE = {"cupy": np, "cupy.linalg": np.linalg, "cupy.fft": np.fft, "cupy.random": None,
             "cupy.lib": np.lib, "cupy.lib.stride_tricks": np.lib.stride_tricks}
_CUPY_FUNCTIONS = {"asarray": asarray, "array": array, "asanyarray": asarray, "ascontiguousarray": None,
                   "asnumpy": asnumpy, "get_array_module": get_array_module,
                   "get_default_memory_pool": lambda: _default_pool,
                   "get_default_pinned_memory_pool": lambda: _default_pool,
                   "is_available": lambda: True}


def _fill(space, module):
    names = NAMESPACE["modules"][space]
    base = _NP_SPACE.get(space)
    for name, kind in names.items():
        if name in ("annotations", "np", "__version__"):
            continue
        qual = f"{space}.{name}"
        if kind == "module":
            continue                                   # submodules: set by _build
        if space == "cupy" and name in _CUPY_FUNCTIONS and _CUPY_FUNCTIONS[name] is not None:
            value = _CUPY_FUNCTIONS[name]
        elif space == "cupy" and name == "ascontiguousarray":
            value = lambda a, dtype=None: asarray(a, dtype=dtype) if not isinstance(a, ndarray) else \
                _wrap(np.ascontiguousarray(_dev(a), dtype=dtype))
        elif name == "ndarray":
            value = ndarray
        elif name == "ufunc":
            value = _Ufunc
        elif space == "cupy.random":
            value = _Generator if name == "default_rng" else (_random(name) if kind == "function"
                                                              else _unmodelled(qual))
        elif base is not None and hasattr(base, name):
            np_value = getattr(base, name)
            if kind == "ufunc" and isinstance(np_value, np.ufunc):
                value = _Ufunc(np_value)
            elif kind == "function" and callable(np_value):
                value = _function(name, np_value)
            elif kind in ("type", "constant"):
                value = np_value                       # dtypes, finfo, inf, newaxis: NumPy's own
            else:
                value = _unmodelled(qual)
        else:
            value = _unmodelled(qual)
        setattr(module, name, value)


def _build():
    """The module objects: cupy (with linalg, fft, random, lib.stride_tricks, cuda and
    cuda.runtime, cuda.nccl) and cupyx (scatter_add, scipy.special.erf)."""
    if _modules:
        return _modules
    for space in NAMESPACE["modules"]:
        _modules[space] = _StrictModule(space)
    for space, module in _modules.items():
        if space in _NP_SPACE:
            _fill(space, module)
    cp = _modules["cupy"]
    cp.__version__ = VERSION
    cp.__file__ = str(HERE / "cupy" / "__init__.py")
    # cuda
    cuda, runtime = _modules["cupy.cuda"], _modules["cupy.cuda.runtime"]
    for name in NAMESPACE["modules"]["cupy.cuda"]:
        setattr(cuda, name, _unmodelled(f"cupy.cuda.{name}"))
    cuda.Device, cuda.Event, cuda.Stream = Device, _Event, _Stream
    cuda.MemoryPool = _MemoryPool
    cuda.get_current_stream = lambda device=None: _Stream()
    cuda.get_device_id = _current_id
    cuda.get_elapsed_time = _elapsed
    cuda.is_available = lambda: True
    cuda.runtime = runtime
    for name in NAMESPACE["modules"]["cupy.cuda.runtime"]:
        setattr(runtime, name, _unmodelled(f"cupy.cuda.runtime.{name}"))
    runtime.CUDARuntimeError = CUDARuntimeError
    runtime.getDeviceCount = lambda: _ndevices
    runtime.getDevice = _current_id
    runtime.setDevice = lambda i: Device(i).use()
    runtime.memGetInfo = lambda: (MEMORY - _pool.used, MEMORY)
    runtime.runtimeGetVersion = lambda: 12080
    runtime.driverGetVersion = lambda: 12080
    runtime.getDeviceProperties = lambda i: {"name": b"CuPy stand-in (NumPy)", "totalGlobalMem": MEMORY,
                                             "major": 9, "minor": 0, "multiProcessorCount": 132}
    nccl = _modules.get("cupy.cuda.nccl")
    if nccl is not None:
        for name in ("NCCL_FLOAT32", "NCCL_FLOAT64", "NCCL_SUM", "available", "get_unique_id", "get_version",
                     "NcclCommunicator"):
            setattr(nccl, name, getattr(_Nccl, name))
        cuda.nccl = nccl
    cp.cuda = cuda
    for sub in ("linalg", "fft", "random", "lib", "testing", "polynomial", "exceptions", "typing"):
        if f"cupy.{sub}" in _modules:
            setattr(cp, sub, _modules[f"cupy.{sub}"])
    if "cupy.lib.stride_tricks" in _modules:
        _modules["cupy.lib"].stride_tricks = _modules["cupy.lib.stride_tricks"]
    # cupyx
    x = _modules["cupyx"]
    for name in NAMESPACE["modules"]["cupyx"]:
        if name not in ("scipy", "linalg", "profiler", "optimizing", "time", "annotations"):
            setattr(x, name, _unmodelled(f"cupyx.{name}"))
    x.scatter_add = lambda a, slices, value: _scatter(np.add, a, slices, value)
    x.scatter_max = lambda a, slices, value: _scatter(np.maximum, a, slices, value)
    x.scatter_min = lambda a, slices, value: _scatter(np.minimum, a, slices, value)
    x.scipy = _modules["cupyx.scipy"]
    x.scipy.get_array_module = get_array_module
    x.scipy.special = special = _modules["cupyx.scipy.special"]
    for name in NAMESPACE["modules"]["cupyx.scipy.special"]:
        setattr(special, name, _unmodelled(f"cupyx.scipy.special.{name}"))
    special.erf = erf
    return _modules


def install():
    """Make ``import cupy`` / ``import cupyx`` (and their submodules) give the stand-in in this
    process; returns {name: previous module or None} for uninstall()."""
    saved = {}
    for name, module in _build().items():
        saved[name] = sys.modules.get(name)
        sys.modules[name] = module
    return saved


def uninstall(saved):
    for name, module in saved.items():
        if module is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = module
