"""Write namespace.json: the names CuPy has, read from an installed CuPy, for the stand-in.

    pip install cupy-cuda12x          # any machine; no GPU or CUDA toolkit is needed to import it
    python tests/cupy_standin/make_namespace.py

The stand-in (tests/cupy_standin/standin.py) offers exactly these names and refuses every
other: a NumPy function CuPy lacks fails on the stand-in as it would on a GPU. Reading names
needs no device; nothing here calls one. Run it again when CuPy changes and commit the file.
"""
import importlib
import json
import pathlib
import sys
import types

import numpy

HERE = pathlib.Path(__file__).resolve().parent
# Run as a script, this folder is first on sys.path and `import cupy` would find the stand-in.
sys.path = [p for p in sys.path if pathlib.Path(p or ".").resolve() != HERE]


def public(obj):
    return sorted(n for n in dir(obj) if not n.startswith("_") or n in ("__version__",))


def kind(obj):
    if isinstance(obj, types.ModuleType):
        return "module"
    if type(obj).__name__ == "ufunc":
        return "ufunc"
    if isinstance(obj, type):
        return "type"
    if callable(obj):
        return "function"
    return "constant"


def main():
    import cupy
    import cupyx
    if pathlib.Path(cupy.__file__).resolve().is_relative_to(HERE):
        sys.exit("make_namespace.py: `import cupy` found the stand-in, not CuPy")
    spaces = {}

    def module(name):
        m = importlib.import_module(name)
        spaces[name] = {n: kind(getattr(m, n)) for n in public(m)}

    for name in ("cupy", "cupy.linalg", "cupy.random", "cupy.fft", "cupy.lib", "cupy.lib.stride_tricks",
                 "cupy.cuda", "cupy.cuda.runtime", "cupyx", "cupyx.scipy", "cupyx.scipy.special"):
        module(name)
    try:
        module("cupy.cuda.nccl")
    except ImportError:
        pass
    out = {
        "cupy_version": cupy.__version__,
        "numpy_version": numpy.__version__,
        "modules": spaces,
        "ndarray": sorted(n for n in dir(cupy.ndarray) if not n.startswith("__") or n in NDARRAY_DUNDERS),
        "ufunc_methods": public(cupy.add),
        "device_attributes": public(cupy.cuda.Device),
        "memory_pool_attributes": public(cupy.cuda.MemoryPool),
    }
    path = HERE / "namespace.json"
    path.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"wrote {path}: CuPy {cupy.__version__}, {len(spaces['cupy'])} names in cupy, "
          f"{len(out['ndarray'])} in cupy.ndarray")


NDARRAY_DUNDERS = {  # the protocol methods whose presence matters (conversions, operators)
    "__array__", "__array_ufunc__", "__array_function__", "__float__", "__int__", "__bool__",
    "__index__", "__complex__", "__iter__", "__len__", "__getitem__", "__setitem__",
    "__matmul__", "__rmatmul__", "__imatmul__", "__dlpack__", "__cuda_array_interface__",
}

if __name__ == "__main__":
    main()
