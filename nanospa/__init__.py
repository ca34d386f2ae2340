"""nanospa: deep transformers without shortcuts, on a hand-written NumPy/CuPy autograd."""
