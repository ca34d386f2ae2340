"""nanospa/backend.py: the device switch, host/device transfers, scatter_add, and CuPy
imported nowhere else (tests/test_backend_cuda.py runs the ops on a GPU).
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
    """backend.py imports CuPy; the one other import is CuPy's NCCL bindings, by the MPI
    infrastructure (run/distributed.py), which the core never loads."""
    root = pathlib.Path(__file__).resolve().parents[1]
    files = list((root / "nanospa").rglob("*.py")) + [root / "train.py", root / "data.py"]
    found = {str(f.relative_to(root)): re.findall(r"^\s*(import cupy\S*|from cupy\S* import \w+)", f.read_text(), re.M)
             for f in files if f.exists()}
    assert {f: i for f, i in found.items() if i} == {"nanospa/backend.py": ["import cupy"],
                                                     "nanospa/run/distributed.py": ["from cupy.cuda import nccl"]}


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
    from nanospa.run import threads
    with pytest.raises(ValueError, match="threads must be a positive integer, got 0"):
        threads.set_threads(0)
