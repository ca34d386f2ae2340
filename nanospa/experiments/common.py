"""A compact training run for the experiment commands: the same steps as train.py (AdamW or K-FAC,
linear warm-up then cosine decay, global-norm clipping), without checkpoints or progress
bars, returning the loss history as plain numbers.

The step is train.py's (nanospa/run/step.py) and so are the batches (data.get_batch). The
results committed before 2026-12-02 were made with a sampler of the experiments' own whose
window starts stopped one short of data.get_batch's ([0, N - T - 1) for [0, N - T)); their
runs are not reused for new jobs (runner.BATCHES is part of a job's key).

Not here: which runs to make and how to compare them (runner.py), writing results
(report.py), checkpoints, logs and the command line of a single run (train.py).
"""
import math
import time

import numpy as np

from data import get_batch

from .. import backend
from ..beyond.optimizers import OPTIMIZER_DEFAULTS, make_optimizer
from ..model import GPT
from ..optim import cosine_lr
from ..run.step import train_step
from ..tensor import no_grad

EVAL_SEED = 12345         # the fixed evaluation batches: the same for every model and seed
BETAS = (0.9, 0.95)       # AdamW betas, as train.py's defaults
WARMUP_DIVISOR = 10       # warmup=None: steps // WARMUP_DIVISOR linear warm-up steps


def evaluate(model, tokens, batch_size, block_size, n_batches, seed=EVAL_SEED):
    """Mean loss over n_batches fixed random batches (the same batches for every model), in
    evaluation mode (BatchNorm, PRepBN: running statistics); the mode before is restored."""
    rng = np.random.default_rng(seed)
    losses = []
    with no_grad(), model.evaluating():
        for _ in range(n_batches):
            x, y = get_batch(tokens, batch_size, block_size, rng)
            losses.append(model(x, y)[1].item())
    return float(np.mean(losses))


def evaluate_whole(model, tokens, block_size, batch_size):
    """Mean loss over every target of `tokens` (all but its first token) once: consecutive
    non-overlapping windows of block_size, batch_size of them at a time, the last shorter
    window alone; a window's first token is predicted without context, as in random windows.
    Evaluation mode; the mode before is restored."""
    n = len(tokens) - 1
    starts = np.arange(0, n, block_size)
    full, rest = starts[starts + block_size <= n], starts[starts + block_size > n]
    groups = [full[i:i + batch_size] for i in range(0, len(full), batch_size)] + ([rest] if len(rest) else [])
    total, count = 0.0, 0
    with no_grad(), model.evaluating():
        for group in groups:
            T = min(block_size, n - int(group[0]))
            chunk = np.asarray(tokens[group[:, None] + np.arange(T + 1)]).astype(np.int64)   # (b, T + 1)
            total += model(chunk[:, :-1], chunk[:, 1:])[1].item() * chunk[:, 1:].size
            count += chunk[:, 1:].size
    return total / count


def train_run(cfg, train_tokens, val_tokens, *, steps, lr, batch_size=8, seed=0, warmup=None,
              min_lr_ratio=0.1, weight_decay=0.0, grad_clip=1.0, eval_every=0, eval_batches=4,
              log_every=1, optimizer=None, whole_val=False):
    """Train GPT(cfg) from scratch; returns a dict of plain numbers.

    history: [(iter, train_loss)] every log_every steps; evals: [(iter, val_loss)];
    final_train / final_val: mean losses over eval_batches fixed batches after training;
    diverged: True when a loss or gradient norm became non-finite (training stops there).
    seconds, cpu_seconds: wall-clock and process CPU time of the training steps (the CPU time
    of a single-threaded worker does not grow when other work shares the machine).
    optimizer: optimiser settings (nanospa.beyond.optimizers.OPTIMIZER_DEFAULTS' keys, and beta1,
    beta2 where a method sets its own; default AdamW with BETAS).
    whole_val: also final_val_whole, the loss over the whole validation split (evaluate_whole).
    """
    model = GPT(cfg, seed=seed)
    settings = {**OPTIMIZER_DEFAULTS, "beta1": BETAS[0], "beta2": BETAS[1], **(optimizer or {}),
                "learning_rate": lr, "weight_decay": weight_decay}
    opt = make_optimizer(settings, model, seed=seed)
    rng = np.random.default_rng(seed + 1)
    warmup = max(1, steps // WARMUP_DIVISOR) if warmup is None else warmup
    T = cfg.block_size
    history, evals, diverged = [], [], False
    t0, c0 = time.time(), time.process_time()
    for it in range(steps):
        opt.lr = cosine_lr(it, lr, warmup, steps, lr * min_lr_ratio)
        x, y = get_batch(train_tokens, batch_size, T, rng)
        value, norm = train_step(model, opt, x, y, grad_clip)     # train.py's step: no update if not finite
        if not (math.isfinite(value) and math.isfinite(norm)):
            diverged = True
            history.append((it, float("nan")))
            break
        if it % log_every == 0 or it == steps - 1:
            history.append((it, value))
        if eval_every and (it + 1) % eval_every == 0:
            evals.append((it + 1, evaluate(model, val_tokens, batch_size, T, eval_batches)))
    seconds, cpu_seconds = time.time() - t0, time.process_time() - c0
    nan = float("nan")
    final_train = nan if diverged else evaluate(model, train_tokens, batch_size, T, eval_batches)
    final_val = nan if diverged else evaluate(model, val_tokens, batch_size, T, eval_batches)
    extra = {}
    if whole_val:
        extra["final_val_whole"] = nan if diverged else evaluate_whole(model, val_tokens, T, batch_size)
    backend.synchronize()
    return dict(**extra, history=history, evals=evals, final_train=final_train, final_val=final_val,
                diverged=diverged, seconds=seconds, cpu_seconds=cpu_seconds, steps_done=len(history) and history[-1][0] + 1,
                lr=lr, seed=seed, n_params=model.num_params())
