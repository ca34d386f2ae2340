"""The GPU kernels of nanospa.backend, checked without a GPU.

On the GPU each backend helper is a CuPy ElementwiseKernel whose body is a line of C. Here
that same body is compiled by the system C compiler into a loop with ElementwiseKernel's
rules (inputs by value, outputs by reference, arrays broadcast together, the type
placeholder T one dtype for every argument that uses it), the backend is pointed at this
stand-in, and each helper's GPU path is compared with its NumPy path. This catches a wrong
body, a wrong argument order or an inconsistent dtype on any machine with a C compiler; it
does not check CuPy itself (tests/test_backend_cuda.py does, on a GPU). Skipped without a
compiler.
"""
import ctypes
import shutil
import subprocess

import numpy as np
import pytest

from nanospa import backend

CC = shutil.which("cc") or shutil.which("gcc")
pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler")

C_TYPES = {"float32": ("float", ctypes.c_float), "float64": ("double", ctypes.c_double),
           "bool": ("bool", ctypes.c_bool)}


def _params(spec):
    """'T x, bool c' -> [('T', 'x'), ('bool', 'c')]"""
    return [tuple(p.split()) for p in spec.split(",")]


class CElementwiseKernel:
    """cupy.ElementwiseKernel(in_params, out_params, operation, name), run on the CPU."""

    def __init__(self, in_params, out_params, operation, name, tmp):
        self.ins, self.outs = _params(in_params), _params(out_params)
        self.operation, self.name, self.tmp, self.compiled = operation, name, tmp, {}

    def __call__(self, *args):
        params = self.ins + self.outs
        if len(args) not in (len(self.ins), len(params)):
            raise TypeError(f"{self.name}: {len(args)} arguments for {len(self.ins)} inputs and {len(self.outs)} outputs")
        # T: one dtype for every array or NumPy scalar declared T (Python numbers adapt)
        typed = {np.dtype(a.dtype).name for (t, _), a in zip(params, args) if t == "T" and hasattr(a, "dtype")}
        if len(typed) != 1:
            raise TypeError(f"{self.name}: type placeholder T bound to {sorted(typed)}")
        T = typed.pop()
        arrays = [a for a in args if isinstance(a, np.ndarray)]
        shape = np.broadcast_shapes(*(a.shape for a in arrays))
        outs = list(args[len(self.ins):]) or [np.empty(shape, dtype=T if t == "T" else t) for t, _ in self.outs]
        for (t, name), o in zip(self.outs, outs):
            if o.shape != shape:
                raise ValueError(f"{self.name}: output {name} has shape {o.shape}, not the broadcast {shape}")
        ins = [np.ascontiguousarray(np.broadcast_to(a, shape)) if isinstance(a, np.ndarray) else a
               for a in args[:len(self.ins)]]
        work = [np.ascontiguousarray(o) for o in outs]        # written through, copied back below
        kind = tuple(isinstance(a, np.ndarray) for a in ins)
        fn = self._compile(T, kind)
        c_args = [ctypes.c_long(int(np.prod(shape)))]
        for (t, _), a in zip(self.ins, ins):
            ctype = C_TYPES[T if t == "T" else t][1]
            c_args.append(ctypes.c_void_p(a.ctypes.data) if isinstance(a, np.ndarray) else ctype(a))
        c_args += [ctypes.c_void_p(w.ctypes.data) for w in work]
        fn(*c_args)
        for o, w in zip(outs, work):
            if o is not w:
                o[...] = w
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _compile(self, T, kind):
        if (T, kind) not in self.compiled:
            ctype = lambda t: C_TYPES[T if t == "T" else t][0]
            sig = ["long n"] + [f"const {ctype(t)} *{v}_" if is_array else f"{ctype(t)} {v}"
                                for (t, v), is_array in zip(self.ins, kind)]
            sig += [f"{ctype(t)} *{v}_" for t, v in self.outs]
            loads = "".join(f"{ctype(t)} {v} = {v}_[i]; " for (t, v), is_array in zip(self.ins, kind) if is_array)
            refs = "".join(f"#define {v} ({v}_[i])\n" for _, v in self.outs)   # outputs: references
            src = (f"#include <math.h>\n#include <stdbool.h>\ntypedef {C_TYPES[T][0]} T;\n{refs}"
                   f"void kernel({', '.join(sig)}) {{\n  for (long i = 0; i < n; i++) {{ {loads}{self.operation}; }}\n}}\n")
            stem = self.tmp / f"{self.name}_{T}_{len(self.compiled)}"
            stem.with_suffix(".c").write_text(src)
            subprocess.run([CC, "-O1", "-shared", "-fPIC", "-o", str(stem.with_suffix(".so")), str(stem.with_suffix(".c")), "-lm"],
                           check=True, capture_output=True)
            fn = ctypes.CDLL(str(stem.with_suffix(".so"))).kernel
            fn.restype = None
            self.compiled[(T, kind)] = fn
        return self.compiled[(T, kind)]


@pytest.fixture
def gpu_path(monkeypatch, tmp_path):
    """Call fn(*args) through the backend's GPU branch, with the C stand-in for CuPy."""
    made = []

    class FakeCuPy:
        @staticmethod
        def ElementwiseKernel(in_params, out_params, operation, name):
            made.append(name)
            return CElementwiseKernel(in_params, out_params, operation, name, tmp_path)

    def call(fn, *args, **kwargs):
        with monkeypatch.context() as m:
            m.setattr(backend, "_cp", FakeCuPy)
            m.setattr(backend, "_KERNELS", {})
            m.setattr(backend, "is_device_array", lambda a: True)
            return fn(*args, **kwargs)
    call.kernels = made                                   # names of the kernels built so far
    return call


DTYPES = ["float32", "float64"]
SHAPE = (2, 3, 5)


def close(dtype):
    # C's exp and sqrt of a float return a double that is rounded once; NumPy's float32
    # routines round their own way: a few ulp apart, never more.
    return dict(rtol=2e-6, atol=1e-7) if dtype == "float32" else dict(rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize("dtype", DTYPES)
def test_scale_where_matches_numpy(gpu_path, dtype):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(SHAPE).astype(dtype)
    cond = x > 0
    y = gpu_path(backend.scale_where, x, cond, 1.4, 0.19)
    assert gpu_path.kernels == ["nanospa_scale_where"]
    assert y.dtype == x.dtype
    np.testing.assert_allclose(y, backend.scale_where(x, cond, 1.4, 0.19), **close(dtype))
    np.testing.assert_allclose(y, np.where(cond, 1.4 * x, 0.19 * x), **close(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias_shape", [None, (5,), (3, 5)])
def test_scale_add_matches_numpy(gpu_path, dtype, bias_shape):
    rng = np.random.default_rng(1)
    x = rng.standard_normal(SHAPE).astype(dtype)
    bias = None if bias_shape is None else rng.standard_normal(bias_shape).astype(dtype)
    z = gpu_path(backend.scale_add, x, 0.125, bias)
    assert gpu_path.kernels == ([] if bias is None else ["nanospa_scale_add"])   # x * s needs no kernel
    assert z.dtype == x.dtype and z.shape == x.shape
    np.testing.assert_allclose(z, backend.scale_add(x, 0.125, bias), **close(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_exp_sub_and_div_flush_in_place_match_numpy(gpu_path, dtype):
    rng = np.random.default_rng(2)
    z = (4 * rng.standard_normal(SHAPE)).astype(dtype)
    m = z.max(axis=-1, keepdims=True)
    a, b = z.copy(), z.copy()
    assert gpu_path(backend.exp_sub, a, m) is a                    # in place
    backend.exp_sub(b, m)
    np.testing.assert_allclose(a, b, **close(dtype))
    s = a.sum(axis=-1, keepdims=True)
    b = a.copy()
    threshold = float(np.quantile(a / s, 0.3))                     # some entries flushed
    gpu_path(backend.div_flush, a, s, threshold)
    backend.div_flush(b, s, threshold)
    np.testing.assert_allclose(a, b, **close(dtype))
    assert (a == 0).sum() == (b == 0).sum() > 0
    assert gpu_path.kernels == ["nanospa_exp_sub", "nanospa_div_flush"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_grad_matches_numpy(gpu_path, dtype):
    rng = np.random.default_rng(3)
    y = rng.random(SHAPE).astype(dtype)
    g = rng.standard_normal(SHAPE).astype(dtype)
    s = (g * y).sum(axis=-1, keepdims=True)
    for scale in (1.0, 0.125):
        out = gpu_path(backend.softmax_grad, y, g, s, scale, np.empty_like(y))
        np.testing.assert_allclose(out, scale * y * (g - s), **close(dtype))
        np.testing.assert_allclose(out, backend.softmax_grad(y, g, s, scale, np.empty_like(y)), **close(dtype))
    assert set(gpu_path.kernels) == {"nanospa_softmax_grad"}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("decay", [1.0, 0.99])
def test_adamw_update_matches_numpy(gpu_path, dtype, decay):
    rng = np.random.default_rng(4)
    p, g, m = (rng.standard_normal(SHAPE).astype(dtype) for _ in range(3))
    v = rng.random(SHAPE).astype(dtype)
    gpu, cpu = (p.copy(), m.copy(), v.copy()), (p.copy(), m.copy(), v.copy())
    hyper = (0.9, 0.95, 1e-3 / (1 - 0.9 ** 3), 1e-8, 1 / (1 - 0.95 ** 3), decay)
    gpu_path(backend.adamw_update, gpu[0], g, gpu[1], gpu[2], *hyper)
    backend.adamw_update(cpu[0], g, cpu[1], cpu[2], *hyper)
    for a, b, name in zip(gpu, cpu, "pmv"):
        np.testing.assert_allclose(a, b, err_msg=name, **close(dtype))
    assert not np.allclose(gpu[0], p)                              # it moved
    assert gpu_path.kernels == ["nanospa_adamw"]


def test_the_stand_in_enforces_cupys_rules(gpu_path, tmp_path):
    """The checks above can fail: a body with a wrong sign, a dtype mix and a wrong
    argument count are caught."""
    x = np.arange(6.0, dtype=np.float32).reshape(2, 3)
    wrong = CElementwiseKernel("T x, T s, T b", "T z", "z = s * x - b", "wrong", tmp_path)
    assert not np.allclose(wrong(x, np.float32(2), np.ones(3, np.float32)),
                           backend.scale_add(x, 2.0, np.ones(3, np.float32)))
    with pytest.raises(TypeError, match="placeholder"):
        wrong(x, np.float64(2), np.ones(3, np.float32))
    with pytest.raises(TypeError, match="arguments"):
        wrong(x, np.float32(2))
