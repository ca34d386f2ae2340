"""nanospa.signal.beyond: the signal-propagation maths of the schemes beyond the paper, in
float64 NumPy like the rest of signal/ (which imports these where a configuration names them).

    positions.py   ALiBi, RoPE and E-SPA's prior in the logits (docs/positions.md)
    norm_maps.py   BatchNorm (batch kernels), causal BatchNorm, PRepBN, GroupNorm (docs/norms.md)
    residuals.py   the constants of DeepNorm and nGPT (docs/residuals.md)
    activations.py the activations beyond the paper's and TAT for a smooth phi (docs/activations.md)
"""
