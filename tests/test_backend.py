"""nanospa/backend.py: the device switch, host/device transfers, scatter_add, the worker
threads, and CuPy imported nowhere else. (The CuPy kernel bodies are checked by
test_backend_kernels_c.py without a GPU and by test_backend_cuda.py on one.)
"""
import pathlib
import re

import numpy as np
import pytest

from nanospa import backend


def test_scatter_add_repeated_indices():
    a = np.zeros(3)
    backend.scatter_add(a, np.array([1, 1, 2, 1]), np.array([1.0, 2.0, 3.0, 4.0]))
    np.testing.assert_allclose(a, [0, 7, 3])


def test_cupy_imported_only_in_backend():
    root = pathlib.Path(__file__).resolve().parents[1]
    files = list((root / "nanospa").rglob("*.py")) + [root / "train.py", root / "data.py"]
    offenders = [f.name for f in files if f.exists() and f.name != "backend.py"
                 and re.search(r"^\s*(import cupy|from cupy)", f.read_text(), re.M)]
    assert offenders == []


def test_cuda_request_without_gpu_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(backend, "_cp", None)
    with pytest.raises(backend.DeviceError, match="needs CuPy"):
        backend.use("cuda")
    with pytest.raises(ValueError, match="'cpu' or 'cuda'"):
        backend.use("tpu")


def test_to_numpy_and_asarray_roundtrip():
    a = np.arange(6.0).reshape(2, 3)
    assert np.array_equal(backend.to_numpy(backend.asarray(a)), a)
    assert backend.xp_of(a) is np


def test_set_threads_rejects_bad_counts():
    with pytest.raises(ValueError, match="threads must be a positive integer, got 0"):
        backend.set_threads(0)
