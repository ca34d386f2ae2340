"""Refusing a size that cannot fit, before anything is allocated.

    least_bytes(cfg, batch)           a lower bound on one training step's memory, by part
    available_bytes(device)           what this machine can give now, or None where unknown
    check_fits(cfg, batch, device)    SettingsError naming the estimate and what to change

A model of width 4096 spent minutes in its orthogonal initialisation before running out of
memory; train.py, the benchmark and the experiments now ask check_fits first. The estimate
counts only what a step surely holds at once, so it refuses nothing that could run:

    weights      every parameter 3 times, from the second step on: its value and AdamW's two
                 moments (K-FAC keeps the same Adam moments for what it does not precondition,
                 and more); parameters: L (4 + 2 mlp_ratio) C^2 + 2 V C (embedding and head)
    then the larger of
    gradients    one per parameter, at the update
    activations  at the end of the forward: the logits, 2 B T V with their softmax, and per
                 layer the block input and the MLP's hidden activations, L B T (1 + mlp_ratio)
                 C; dense attention (model.evaluation's choice at this T) adds its softmax
                 output, L B H T^2

in the model's dtype; B is one micro-batch of one process. Measured against the peak of real
steps in tests/test_fits.py: the bound was 0.53 to 0.97 of the peak.
"""
import os

from .settings import SettingsError

GB = 1e9


def least_bytes(cfg, batch):
    """{part: bytes} of one training step of GPT(cfg) on `batch` sequences (see above); the
    step needs at least weights + max(gradients, activations)."""
    from ..model import evaluation
    L, C, T, V, H = cfg.n_layer, cfg.n_embd, cfg.block_size, cfg.vocab_size, cfg.n_head
    size = 8 if cfg.dtype == "float64" else 4
    params = L * (4 + 2 * cfg.mlp_ratio) * C * C + 2 * V * C
    attention = L * batch * H * T * T if not getattr(evaluation(cfg), "by_blocks", False) else 0
    return dict(weights=3 * params * size, gradients=params * size,
                activations=(2 * batch * T * V + L * batch * T * (1 + cfg.mlp_ratio) * C + attention) * size)


def total(parts):
    return parts["weights"] + max(parts["gradients"], parts["activations"])


def available_bytes(device="cpu"):
    """Memory this process can have now: the GPU's free memory, or the host's MemAvailable
    (Linux), or None where neither is known (then nothing is refused)."""
    if device == "cuda":                               # no CuPy, no GPU: the device check says so
        from .. import backend
        return backend.cupy().cuda.runtime.memGetInfo()[0] if backend.cuda_available() else None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_fits(cfg, batch, device="cpu", available=None):
    """SettingsError when even the lower bound of a step is above the memory available."""
    parts = least_bytes(cfg, batch)
    need, have = total(parts), available if available is not None else available_bytes(device)
    if have is None or need <= have:
        return
    change = ("batch_size or block_size" if parts["activations"] > parts["weights"] else "n_embd or n_layer")
    shown = ", ".join(f"{k} {v / GB:.1f}" for k, v in parts.items())
    raise SettingsError(f"a training step of n_layer={cfg.n_layer} n_embd={cfg.n_embd} block_size={cfg.block_size} "
                        f"batch {batch} needs at least {need / GB:.1f} GB ({shown}) and {device} has "
                        f"{have / GB:.1f} GB available: lower {change}")
