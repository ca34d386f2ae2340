"""nanospa: deep transformers without shortcuts (He et al., ICLR 2023, arXiv 2302.10322)
on a hand-written NumPy/CuPy autograd.

Reading order (README.md's reading guide, first pass): backend -> tensor -> functions ->
shape_ops -> fused -> nn -> optim -> signal/ (its own order) -> config -> model -> data.py -> train.py.
Second pass: README's "read second" table (the kernel budget, the model at init predicted and
measured with the maps they walk, the dense references, gradient checks, sampling, more_ops).
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
