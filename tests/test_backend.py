"""nanospa/backend.py: scatter_add and the worker threads. (The CuPy kernel bodies are
checked by test_backend_kernels_c.py without a GPU and by test_backend_cuda.py on one.)
"""
import numpy as np
import pytest

from nanospa import backend


def test_scatter_add_repeated_indices():
    a = np.zeros(3)
    backend.scatter_add(a, np.array([1, 1, 2, 1]), np.array([1.0, 2.0, 3.0, 4.0]))
    np.testing.assert_allclose(a, [0, 7, 3])


def test_set_threads_rejects_bad_counts():
    with pytest.raises(ValueError, match="threads must be a positive integer, got 0"):
        backend.set_threads(0)
