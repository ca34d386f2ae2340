import ctypes
import importlib.util
import os
import pathlib
import sys
import urllib.error
import urllib.request

# ----------------------------------------------------------------------------- BLAS threads
# One BLAS thread per test process, as train.py runs (docs/decisions.md, "The tests run on
# one BLAS thread"). On 2 cores shared with other work, a 2-thread OpenBLAS waits for its
# second thread in each of the many small products and factorisations the tests make, and the
# fast tier took twice to three times as long. Set here, before NumPy loads (OpenBLAS reads the
# variables once); subprocesses the tests start inherit them. A value already set wins. What
# tests BLAS threading sets its own: the benchmark's --cpu_threading=blas re-runs itself with
# OPENBLAS_NUM_THREADS=n (tests/test_bench.py).
BLAS_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _set_loaded_openblas_threads(n):
    """The thread count of an OpenBLAS this process has already loaded, through its C API
    (NumPy's wheels: scipy_openblas_*); False when none is mapped (or no /proc/self/maps)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = sorted({line.split()[-1] for line in maps
                            if "openblas" in line.lower() and line.split()[-1].startswith("/")})
    except OSError:
        return False
    for path in paths:
        lib = ctypes.CDLL(path)                  # already loaded: the same library, not a copy
        for name in ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
                     "openblas_set_num_threads64_", "openblas_set_num_threads"):
            if hasattr(lib, name):
                getattr(lib, name).argtypes = [ctypes.c_int]
                getattr(lib, name)(n)
                return True
    return False


def _pin_blas_threads():
    unset = [var for var in BLAS_THREAD_VARS if var not in os.environ]
    for var in unset:
        os.environ[var] = "1"
    if "numpy" in sys.modules and "OPENBLAS_NUM_THREADS" in unset:   # a plugin loaded NumPy first
        _set_loaded_openblas_threads(1)                                # (-p tolerance_margins does)


_pin_blas_threads()

import numpy as np  # noqa: E402  (after the pin)
import pytest

from nanospa import GPT, GPTConfig, Tensor, backend
from nanospa.gradcheck import check_jacobian, tensor64

SHARED_DATA = pathlib.Path(os.environ.get(
    "NANOSPA_SHARED_DATA", pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"))

DEVICES = ["cpu"] + (["cuda"] if backend.cuda_available() else [])
STANDIN = pathlib.Path(__file__).resolve().parent / "cupy_standin"   # the strict CuPy stand-in


def shared_file(name):
    """A file of the shared test data, or a clean skip when it is absent."""
    path = SHARED_DATA / name
    if not path.is_file():
        pytest.skip(f"shared data file {name} not available")
    return path


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture(autouse=True)
def _cpu_device():
    """Every test starts on the CPU, whatever a previous test selected."""
    backend.use("cpu")
    yield
    backend.use("cpu")


# ----------------------------------------------------------------------------- the GPU, stood in

def standin_module():
    """tests/cupy_standin/standin.py, loaded once per process (its counters are per process)."""
    if "standin" not in sys.modules:
        spec = importlib.util.spec_from_file_location("standin", STANDIN / "standin.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["standin"] = module
        spec.loader.exec_module(module)
    return sys.modules["standin"]


@pytest.fixture
def gpu(monkeypatch):
    """Device "cuda" on the strict CuPy stand-in for this test (tests/cupy_standin): nanospa's
    backend sees it as CuPy with one GPU. Yields the stand-in (counts(), reset())."""
    st = standin_module()
    saved = st.install()
    monkeypatch.setattr(backend, "_cp", sys.modules["cupy"])
    backend.use("cuda")
    st.reset()
    try:
        yield st
    finally:
        backend.use("cpu")
        st.uninstall(saved)


def standin_env(**extra):
    """The environment of a subprocess that runs on the stand-in: tests/cupy_standin first on
    PYTHONPATH, so that `import cupy` finds it."""
    env = dict(os.environ, **extra)
    env["PYTHONPATH"] = os.pathsep.join([str(STANDIN), str(STANDIN.parent.parent), env.get("PYTHONPATH", "")])
    return env


# ----------------------------------------------------------------------------- op tables
# test_functions.py, test_fused.py and test_shape_ops.py each hold an OPS table
# (name -> (function of Tensors, input arrays)) and check every entry with these two.

def assert_full_jacobian(fn, arrays):
    """The op's full Jacobian in float64 against central differences (random upstream gradient)."""
    inputs = [tensor64(a.copy()) for a in arrays]
    err = check_jacobian(fn, inputs, rtol=1e-6)
    assert err < 1e-6


def assert_keeps_float32(name, fn, arrays):
    """float32 in -> float32 out, values and gradients."""
    inputs = [Tensor(a.astype(np.float32), requires_grad=True) for a in arrays]
    out = fn(*inputs)
    assert out.dtype == np.float32, f"{name} promoted to {out.dtype}"
    out.backward(np.ones(out.shape, dtype=np.float32))
    for t in inputs:
        assert t.grad is not None and t.grad.dtype == np.float32, name


# ----------------------------------------------------------------------------- small models

def tiny_config(**kw):
    """A small float64 GPTConfig (V = 13, T = 8, 2 layers, 2 heads, width 8), kw overriding."""
    base = dict(vocab_size=13, block_size=8, n_layer=2, n_head=2, n_embd=8, dtype="float64")
    base.update(kw)
    return GPTConfig(**base)


def perturbed_model(cfg):
    """GPT(cfg, seed=0) moved off its init by 0.3 * N(0, 1) (rng seed 3)."""
    model = GPT(cfg, seed=0)
    rng = np.random.default_rng(3)
    for p in model.parameters():  # move off init (W^Q = 0 there) so every path matters
        p.data = p.data + 0.3 * rng.standard_normal(p.shape)
    return model


# ----------------------------------------------------------------------------- data and corpus

def _offline(url, *a, **k):
    raise urllib.error.URLError("network disabled in tests")


@pytest.fixture
def isolated_data(tmp_path, monkeypatch):
    """No network, and the default cache is a fresh temporary folder. test_corpus.py and
    test_data.py apply it to every test (pytestmark = pytest.mark.usefixtures(...))."""
    monkeypatch.setattr(urllib.request, "urlopen", _offline)
    monkeypatch.setenv("NANOSPA_CACHE", str(tmp_path / "cache"))


def write(path, text_or_bytes):
    path.parent.mkdir(parents=True, exist_ok=True)
    b = text_or_bytes.encode() if isinstance(text_or_bytes, str) else text_or_bytes
    path.write_bytes(b)
    return path


def one_line(err):
    msg = str(err.value)
    assert "\n" not in msg and msg
    return msg
