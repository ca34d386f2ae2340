"""Refusing a size that cannot fit, before anything is allocated.

    least_bytes(cfg, batch, held_tokens, probe, kfac)   a lower bound on a run's memory, by part
    available_bytes(device)           what this machine can give now, or None where unknown
    check_fits(cfg, batch, device, ...)   SettingsError naming the estimate and what to change

A model of width 4096 spent minutes in its orthogonal initialisation before running out of
memory; train.py, the benchmark and the experiments now ask check_fits first. The estimate
counts only what a step surely holds at once, so it refuses nothing that could run:

    weights      every parameter 3 times, from the second step on: its value and AdamW's two
                 moments (K-FAC keeps the same Adam moments for what it does not precondition,
                 and more); parameters: L (4 + 2 mlp_ratio) C^2 + 2 V C (embedding and head;
                 V C tied)
    kfac         with K-FAC: each block's Linear layers' factors A (in x in) and G (out x out)
                 and their eigenvectors, 2 (in^2 + out^2) each, from the first step on; the
                 head's too (C and V: its V x V factor dominates at a large vocabulary) unless
                 tied (then it is no Linear and K-FAC leaves it to Adam)
    batches      token ids (int64) held for the whole run: train.py's fixed evaluation batches
                 and a step's batch (`held_tokens`, counted by the caller)
    then the larger of
    gradients    one per parameter, at the update
    activations  at the end of the forward: the logits, 2 B T V with their softmax, and per
                 layer the block input and the MLP's hidden activations, L B T (1 + mlp_ratio)
                 C; dense attention (model.evaluation's choice at this T) adds its softmax
                 output, L B H T^2
    signal       at an evaluation, the signal statistics on `probe` = (rows, positions): the
                 2L + 1 float64 kernels (positions^2) and the traced states they come from

in the model's dtype; B is one micro-batch of one process. Measured against the peak of real
steps in tests/test_fits.py: the bound was 0.53 to 0.97 of the peak. train.py asks before it
draws a batch or builds a model, so a size it cannot hold allocates nothing.
"""
import os

from .settings import SettingsError

GB = 1e9


HELD = ("weights", "kfac", "batches")        # held the whole run; the other parts in turn


def least_bytes(cfg, batch, held_tokens=0, probe=None, kfac=False):
    """{part: bytes} of a run of GPT(cfg) on `batch` sequences a step (see above); it needs at
    least the parts held the whole run (HELD) plus the largest of the others (total)."""
    from ..model import evaluation
    L, C, T, V, H, M = cfg.n_layer, cfg.n_embd, cfg.block_size, cfg.vocab_size, cfg.n_head, cfg.mlp_ratio * cfg.n_embd
    size = 8 if cfg.dtype == "float64" else 4
    tied = cfg.tie_embeddings
    params = L * (4 + 2 * cfg.mlp_ratio) * C * C + (1 if tied else 2) * V * C
    attention = L * batch * H * T * T if not getattr(evaluation(cfg), "by_blocks", False) else 0
    parts = dict(weights=3 * params * size, gradients=params * size,
                 activations=(2 * batch * T * V + L * batch * T * (1 + cfg.mlp_ratio) * C + attention) * size)
    if kfac:                                  # per block: q, k, v, proj (C x C), fc (C x M), proj (M x C)
        head = 0 if tied else 2 * (C * C + V * V)
        parts["kfac"] = (2 * L * (4 * 2 * C * C + 2 * (C * C + M * M)) + head) * size
    if held_tokens:
        parts["batches"] = 8 * held_tokens
    if probe:
        rows, positions = probe
        parts["signal"] = (2 * L + 1) * (8 * positions * positions + rows * positions * C * size)
    return parts


def total(parts):
    return sum(v for k, v in parts.items() if k in HELD) + max(v for k, v in parts.items() if k not in HELD)


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


LOWER = dict(weights="n_embd or n_layer", kfac="n_embd or n_layer", gradients="n_embd or n_layer",
             activations="batch_size or block_size", signal="n_layer or block_size",
             batches="batch_size, grad_accum, eval_iters or block_size")   # what shrinks the largest part


def check_fits(cfg, batch, device="cpu", available=None, held_tokens=0, probe=None, kfac=False):
    """SettingsError when even the lower bound of the run is above the memory available."""
    parts = least_bytes(cfg, batch, held_tokens, probe, kfac)
    need, have = total(parts), available if available is not None else available_bytes(device)
    if have is None or need <= have:
        return
    change = LOWER[max(parts, key=parts.get)]
    shown = ", ".join(f"{k} {v / GB:.1f}" for k, v in parts.items())
    what = "run" if held_tokens or probe or kfac else "step"
    raise SettingsError(f"a training {what} of n_layer={cfg.n_layer} n_embd={cfg.n_embd} block_size={cfg.block_size} "
                        f"batch {batch} needs at least {need / GB:.1f} GB ({shown}) and {device} has "
                        f"{have / GB:.1f} GB available: lower {change}")
