import os
import pathlib

import numpy as np
import pytest

from nanospa import backend

SHARED_DATA = pathlib.Path(os.environ.get(
    "NANOSPA_SHARED_DATA", pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"))

DEVICES = ["cpu"] + (["cuda"] if backend.cuda_available() else [])


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
