"""`import cupyx` with tests/cupy_standin on PYTHONPATH: the stand-in's cupyx (standin.py)."""
import standin

standin.install()
