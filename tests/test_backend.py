"""nanospa/backend.py: the device switch and the worker threads.
"""
import pytest

from nanospa import backend


def test_set_threads_rejects_bad_counts():
    with pytest.raises(ValueError, match="threads must be a positive integer, got 0"):
        backend.set_threads(0)
