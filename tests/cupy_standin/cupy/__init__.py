"""`import cupy` with tests/cupy_standin on PYTHONPATH: the strict CuPy stand-in (standin.py)
takes this module's place in sys.modules, with CuPy's names and nothing else."""
import standin

standin.install()
