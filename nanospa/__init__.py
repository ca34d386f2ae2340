"""nanospa: deep transformers without shortcuts (He et al., ICLR 2023, arXiv 2302.10322)
on a hand-written NumPy/CuPy autograd.

Reading order (README.md's reading guide, first pass): backend -> tensor -> functions ->
shape_ops -> fused -> nn -> optim -> signal/ (its own order) -> config -> model -> train.py.
Second pass: signal/budget.py and walks.py (the kernel budget), predict.py and measure.py,
gradcheck.py, sampling.py (generate and its KV cache).
"""
from . import backend
from .tensor import Tensor, Function, no_grad
from . import functions, shape_ops, fused
from .nn import Module, Parameter
from .optim import AdamW
from . import signal
from .config import GPTConfig
from .model import GPT

__version__ = "0.1.0"
