"""nanospa: deep transformers without shortcuts (He et al., ICLR 2023, arXiv 2302.10322)
on a hand-written NumPy/CuPy autograd.

Reading order: backend -> tensor -> functions -> shape_ops -> fused -> nn -> optim -> gradcheck ->
signal/ -> config -> model. See README.md for the code map.
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
