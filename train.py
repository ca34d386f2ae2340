"""Train a nanospa GPT:  python train.py [--key=value ...]   (--help lists every key)

Reads top to bottom like nanoGPT's train.py: defaults, overrides, backend and seed, data,
model and init summary, optimiser, get_lr, estimate_loss, the loop, checkpoint, sample.
The default run is a vanilla transformer (no skips, no norms) with E-SPA attention and a
TAT-shaped leaky ReLU (docs/method.md §7, §10), small enough for a laptop CPU.

Files in out_dir:
  log.jsonl  one JSON object per logged step: iter (optimiser steps done), train_loss (loss
             of that step's batch), lr, tokens_per_s; at evaluation steps also val_loss and
             eval_train_loss (means over eval_iters fixed batches) and the per-layer signal
             statistics of docs/method.md §13 on a fixed batch: cos[l] (mean off-diagonal
             cosine of the hidden states, l = 0..L) and q[l] (mean q-value). iter 0 is the
             model at init (train_loss there is the eval estimate; no step was taken).
  ckpt.npz   the latest checkpoint (model and AdamW state, settings, GPTConfig, iteration,
             RNG state, best val loss), written atomically: see nanospa/checkpoint.py.
Exit status: 0 done, 1 training diverged, 2 bad settings or data, 130 interrupted (Ctrl-C
saves a checkpoint first; a second Ctrl-C stops at once).

Not here: the --key=value parser (nanospa/settings.py), the checkpoint file's format and its
checks (nanospa/checkpoint.py), the experiments' compact training runs (nanospa/experiments).
"""
import os

# Each step's batch is split across --threads worker threads (nanospa.tensor.sharded_backward),
# and each thread calls single-threaded BLAS: a multi-threaded BLAS under them would put
# threads x BLAS-threads on the cores. BLAS reads these variables once, when NumPy loads, so
# this must run before the first import of NumPy; values already in the environment win.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import json
import math
import signal
import sys
import time
from dataclasses import fields

import numpy as np
from tqdm import tqdm

from data import VOCAB_SIZE, DataError, check_length, decode, encode, get_batch, load_dataset, unigram_entropy
from nanospa import backend
from nanospa.backend import DeviceError
from nanospa.checkpoint import (CheckpointError, check_same_model, load_checkpoint, restore, save_checkpoint,
                                training_state)
from nanospa.config import GPTConfig
from nanospa.measure import measured_kernels
from nanospa.model import GPT
from nanospa.optim import AdamW, clip_grad_norm, cosine_lr
from nanospa.settings import SettingsError, fail, help_text, parse_settings, source_notes, wants_help
from nanospa.signal import mean_offdiag, normalised_kernel, q_values
from nanospa.signal.table import predicted_kernels  # averaged over the probe's own sequences
from nanospa.tensor import no_grad, sharded_backward

# ----------------------------------------------------------------------------- defaults
# Each key is a --key=value setting; the comment beside it is its --help line. Every
# GPTConfig field (attention, activation, residual, norm, pos, kernel_budget, ...) is a key
# too, with GPTConfig's own default unless it is set here.
TRAIN_DEFAULTS = dict(
    out_dir="out",             # folder for ckpt.npz and log.jsonl
    data="default",            # dataset: default | PATH | shakespeare[:FILE] | wikitext2[:...] (see data.py)
    device="cpu",              # cpu | cuda (needs CuPy and a GPU)
    threads=0,                 # CPU worker threads, each training a slice of the batch; 0 = one per core, at most 4
    seed=0,                    # seeds the weights, the training batches and the sample
    init_from="scratch",       # scratch | resume (continue from out_dir/ckpt.npz)
    eval_only=False,           # evaluate once (at init or at the checkpoint) and exit
    preset="",                 # named bundle of settings applied before the other overrides: gpu
    max_iters=2500,            # optimiser steps
    eval_interval=250,         # evaluate train/val loss and signal statistics every N steps
    eval_iters=10,             # fixed batches per split in each evaluation
    log_interval=10,           # write a log.jsonl record every N steps
    checkpoint_interval=250,   # save out_dir/ckpt.npz every N steps (and at the end)
    batch_size=16,             # sequences per step (B)
    block_size=64,             # tokens per sequence (T); SPA buffers are built for it
    n_layer=12,                # transformer blocks (L)
    n_head=4,                  # attention heads (H)
    n_embd=64,                 # width (C)
    learning_rate=2e-3,        # peak AdamW learning rate
    warmup_iters=100,          # linear warm-up steps
    lr_decay_iters=0,          # cosine decay reaches min_lr here; 0 = max_iters
    min_lr=2e-4,               # final learning rate
    weight_decay=0.0,          # AdamW decoupled weight decay (never on no_decay parameters)
    beta1=0.9,                 # AdamW beta1
    beta2=0.95,                # AdamW beta2
    grad_clip=1.0,             # clip the global gradient norm to this; 0 = off
    sample_tokens=300,         # tokens generated at the end; 0 = no sample
    start="\n",                # prompt of the sample
    temperature=0.8,           # sampling temperature
    top_k=40,                  # sample among the k most likely tokens; 0 = all
)
PRESETS = {  # --preset=NAME: applied first, so explicit --key=value settings win
    # ~0.28 s/step on one H200 (~30k tokens/s). At this depth and width, learning rates of 3e-4
    # and above diverged within 250 steps; 4e-5 reached val 2.18 at step 450 (1e-4: 2.48).
    # The default corpus is only 2 MB: runs much longer than this one start to overfit it.
    "gpu": dict(device="cuda", n_layer=36, n_head=8, n_embd=512, block_size=256, batch_size=32,
                max_iters=2000, eval_interval=250, checkpoint_interval=250, eval_iters=20,
                warmup_iters=200, learning_rate=4e-5, min_lr=4e-6),
}
MODEL_KEYS = [f.name for f in fields(GPTConfig) if f.name != "vocab_size"]  # vocab_size: from the data
DEFAULTS = {**TRAIN_DEFAULTS, **{f.name: f.default for f in fields(GPTConfig)
                                 if f.name in MODEL_KEYS and f.name not in TRAIN_DEFAULTS}}
EVAL_SEED = 1234       # the fixed evaluation batches do not depend on --seed, so runs compare
PROBE_ROWS = 4         # sequences of the fixed batch on which the signal statistics are measured
MAX_AUTO_THREADS = 4   # --threads=0: one per core, at most this many (see cpu_threads)
STAT_DECIMALS = 6      # log.jsonl keeps cos[l] and q[l] to this many decimals
SHOWN_LAYERS = 12      # the printed statistics show about this many layers (log.jsonl has all)
EXIT_DIVERGED, EXIT_INTERRUPTED = 1, 130   # and settings.EXIT_BAD_INPUT = 2


class Diverged(RuntimeError):
    """A non-finite loss or gradient norm."""


# ----------------------------------------------------------------------------- overrides

def parse_args(argv, defaults):
    """--key=value overrides on top of `defaults` by nanospa's one settings parser
    (nanospa/settings.py): typed like the default, --preset=NAME first, a bare --flag for a
    bool key; SettingsError names a bad one."""
    s = parse_settings(argv, defaults, PRESETS)
    del s["_explicit"]                                # not a setting: checkpoints store the rest
    return s


CHECKS = [  # settings GPTConfig does not check itself: (keys, test, what a good value is)
    (("batch_size", "block_size", "eval_interval", "eval_iters", "log_interval", "checkpoint_interval"),
     lambda v: v > 0, "a positive integer"),
    (("threads", "max_iters", "warmup_iters", "lr_decay_iters", "sample_tokens", "top_k"), lambda v: v >= 0, ">= 0"),
    (("learning_rate", "min_lr", "weight_decay", "grad_clip"), lambda v: 0 <= v < math.inf, "finite and >= 0"),
    (("beta1", "beta2"), lambda v: 0 <= v < 1, "in [0, 1)"),
    (("temperature",), lambda v: 0 < v < math.inf, "finite and > 0"),
    (("device",), lambda v: v in ("cpu", "cuda"), "'cpu' or 'cuda'"),
    (("init_from",), lambda v: v in ("scratch", "resume"), "'scratch' or 'resume'"),
    (("start",), lambda v: v != "", "a non-empty prompt"),
]


def check_settings(s):
    for keys, ok, what in CHECKS:
        for key in keys:
            if not ok(s[key]):
                raise SettingsError(f"{key} must be {what}, got {s[key]!r}")


def usage():
    """The --help screen: every key with its default and the comment beside it, here or in
    GPTConfig's source (marked [GPTConfig])."""
    notes = source_notes(__file__, sys.modules[GPTConfig.__module__].__file__)
    notes = {k: notes.get(k, "") + ("" if k in TRAIN_DEFAULTS else " [GPTConfig]") for k in DEFAULTS}
    return help_text(__doc__.splitlines()[0], DEFAULTS, notes, PRESETS)


# ----------------------------------------------------------------------------- training

def train(argv):
    """The whole run; returns the exit status (raises for bad input, see main)."""
    # -- overrides (on resume: the checkpoint's settings, then the command line's)
    s = parse_args(argv, DEFAULTS)
    out_dir = s["out_dir"]
    ckpt_path, log_path = os.path.join(out_dir, "ckpt.npz"), os.path.join(out_dir, "log.jsonl")
    ckpt = None
    if s["init_from"] == "resume":
        ckpt = load_checkpoint(ckpt_path)
        saved = {k: v for k, v in ckpt["settings"].items() if k in DEFAULTS}
        s = parse_args(argv, {**DEFAULTS, **saved, "out_dir": out_dir, "preset": ""})
        check_same_model(s, saved, MODEL_KEYS)
    check_settings(s)
    cfg = GPTConfig(vocab_size=VOCAB_SIZE, **{k: s[k] for k in MODEL_KEYS})  # ValueError names a bad field
    B, T = s["batch_size"], s["block_size"]

    # -- backend and seed
    backend.use(s["device"])                          # DeviceError without CuPy or a GPU
    backend.set_threads(cpu_threads(s["threads"], B) if s["device"] == "cpu" else 1)
    rng = np.random.default_rng(s["seed"])            # training batches; saved in checkpoints

    # -- data
    ds = load_dataset(s["data"])
    check_length(ds, T)                               # DataError when a split is shorter than T + 1
    print(f"data: {ds.name}: {len(ds.train):,} train / {len(ds.val):,} val tokens, unigram entropy "
          f"{unigram_entropy(ds.train, ds.vocab_size):.3f} nats/token (a context-free predictor)")
    eval_rng = np.random.default_rng(EVAL_SEED)
    eval_sets = {split: [get_batch(tokens, B, T, eval_rng) for _ in range(s["eval_iters"])]
                 for split, tokens in (("train", ds.train), ("val", ds.val))}
    probe = eval_sets["val"][0][0][:PROBE_ROWS]       # (b, T) fixed batch for the signal statistics

    # -- model and init summary
    model = GPT(cfg, seed=s["seed"])                  # ValueError: e.g. an unreachable activation target
    # A checkpoint's arrays are C-ordered; some fresh weights are not (orthogonal init). Loading
    # either way gives both runs the same memory layout, so BLAS repeats the same roundings.
    model.load_state_dict(ckpt["model"] if ckpt else model.state_dict())
    print(f"model: {model.num_params():,} parameters; L={cfg.n_layer} H={cfg.n_head} C={cfg.n_embd} T={T}; "
          f"attention={cfg.attention} activation={cfg.activation} residual={cfg.residual} "
          f"norm={cfg.norm} pos={cfg.pos} {cfg.dtype} on {s['device']}"
          + (f" ({backend.threads()} threads)" if s["device"] == "cpu" else ""))
    print("plan: " + " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in model.plan.info.items())
          + f"; activation {model.activation!r}")

    # -- optimiser
    optimizer = AdamW(model.parameters(), lr=s["learning_rate"], betas=(s["beta1"], s["beta2"]),
                      weight_decay=s["weight_decay"])  # parameters marked no_decay are never decayed
    start, best_val, saved_iter = 0, math.inf, None
    if ckpt:                                          # exact resume: AdamW state, batch RNG, iter
        start, best_val = restore(ckpt, optimizer, rng)
        saved_iter = start
        print(f"resumed from {ckpt_path} at iter {start}")

    # -- get_lr: linear warm-up, then cosine decay to min_lr
    decay_iters = s["lr_decay_iters"] or s["max_iters"]

    def get_lr(it):
        return cosine_lr(it, s["learning_rate"], s["warmup_iters"], decay_iters, s["min_lr"])

    # -- estimate_loss on the fixed batches, plus the per-layer signal statistics (method §13)
    def estimate_loss():
        with no_grad():
            loss = {split: float(np.mean([model(x, y)[1].item() for x, y in batches]))
                    for split, batches in eval_sets.items()}
        kernels = measured_kernels(model, probe)["hidden"]  # L+1 batch-mean kernels (T, T)
        return dict(val_loss=loss["val"], eval_train_loss=loss["train"], **layer_stats(kernels))

    if not ckpt or s["eval_only"]:
        ev, label = estimate_loss(), f"iter {start}" if ckpt else "init"
        print(f"{label}: train {ev['eval_train_loss']:.4f}, val {ev['val_loss']:.4f}\n{label}: measured  {show(ev)}")
        if not ckpt:
            predicted = layer_stats(predicted_kernels(cfg, model.plan, backend.to_numpy(probe)))
            print(f"{label}: predicted {show(predicted)} (wide limit, same tokens)")
            ev.update(pred_cos=predicted["cos"], pred_q=predicted["q"])
    if s["eval_only"]:
        return 0
    os.makedirs(out_dir, exist_ok=True)
    log = open_log(log_path, start)
    if not ckpt:                                      # iter 0: the model at init
        write(log, dict(iter=0, train_loss=ev["eval_train_loss"], lr=0.0, tokens_per_s=0.0, **ev))
    print(f"log: {log_path}  checkpoint: {ckpt_path}")

    # -- the loop: forward, backward, clip, step, zero_grad; log, evaluate, checkpoint
    stop = []                                         # Ctrl-C: finish the step, save, exit

    def on_sigint(signum, frame):
        if stop:
            raise KeyboardInterrupt                   # a second Ctrl-C stops at once
        stop.append(signum)
        tqdm.write("Ctrl-C: saving a checkpoint after this step (Ctrl-C again to stop at once)")

    previous_handler = signal.signal(signal.SIGINT, on_sigint)
    params, tokens, t0, record = model.parameters(), 0, time.perf_counter(), None
    bar = tqdm(range(start, s["max_iters"]), initial=start, total=s["max_iters"], dynamic_ncols=True)
    try:
        for it in bar:
            lr = optimizer.lr = get_lr(it)
            x, y = get_batch(ds.train, B, T, rng)     # (B, T) int64 each
            # loss.backward(), over slices of the batch on the worker threads (one slice with
            # one thread); the slices' gradients are added in a fixed order: deterministic.
            loss = sharded_backward(lambda xs, ys: model(xs, ys)[1], x, y)
            norm = clip_grad_norm(params, s["grad_clip"])
            value = loss.item()                       # a device sync, like the norm above
            if not (math.isfinite(value) and math.isfinite(norm)):
                last_good = f"{ckpt_path} (iter {saved_iter})" if saved_iter is not None else "none written"
                raise Diverged(f"non-finite loss or gradient at iter {it + 1} (loss {value}, gradient "
                               f"norm {norm}); stopped. Last good checkpoint: {last_good}")
            optimizer.step()
            optimizer.zero_grad()
            n, tokens = it + 1, tokens + B * T
            tokens_per_s = tokens / (time.perf_counter() - t0)
            bar.set_postfix(loss=f"{value:.4f}", lr=f"{lr:.2e}", tok_s=f"{tokens_per_s:.0f}", refresh=False)
            evaluating = n % s["eval_interval"] == 0 or n == s["max_iters"]
            if evaluating or n % s["log_interval"] == 0:
                record = dict(iter=n, train_loss=value, lr=lr, tokens_per_s=tokens_per_s)
                if evaluating:
                    record.update(estimate_loss())
                    best_val = min(best_val, record["val_loss"])
                    tqdm.write(f"iter {n}: train {record['eval_train_loss']:.4f}, val {record['val_loss']:.4f} | {show(record)}")
                write(log, record)
                tokens, t0 = 0, time.perf_counter()   # evaluation time is not training time

            # -- checkpoint
            if n % s["checkpoint_interval"] == 0 or n == s["max_iters"] or stop:
                save_checkpoint(ckpt_path, model, optimizer, s, cfg, training_state(n, best_val, rng))
                saved_iter = n
            if stop:
                bar.close()
                print(f"interrupted at iter {n}: checkpoint saved to {ckpt_path}; continue with "
                      f"python train.py --init_from=resume --out_dir={out_dir}", file=sys.stderr)
                return EXIT_INTERRUPTED
    finally:
        bar.close()
        log.close()
        signal.signal(signal.SIGINT, previous_handler)
    if record and "val_loss" in record:
        print(f"done: iter {record['iter']}, train {record['eval_train_loss']:.4f}, val {record['val_loss']:.4f} "
              f"(best {best_val:.4f}); checkpoint {ckpt_path}, log {log_path}")

    # -- sample
    if s["sample_tokens"]:
        prompt = encode(s["start"])[None, :]          # (1, t)
        out = model.generate(prompt, s["sample_tokens"], temperature=s["temperature"],
                             top_k=s["top_k"] or None, rng=np.random.default_rng(s["seed"]))
        print("sample:\n" + decode(out[0]))
    return 0


# ----------------------------------------------------------------------------- helpers

def cpu_threads(requested, batch_size):
    """--threads: 0 means one per core this process may use, at most MAX_AUTO_THREADS (the Python work
    between NumPy calls holds the GIL, so many threads on small slices stop paying); never
    more threads than sequences in a batch."""
    if requested == 0:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        requested = min(cores, MAX_AUTO_THREADS)
    return min(requested, batch_size)


def layer_stats(kernels):
    """Per-layer mean off-diagonal cosine and mean q-value of kernels Sigma_l (T, T)."""
    cos = [mean_offdiag(normalised_kernel(S)) if np.all(np.diag(S) > 0) else math.nan for S in kernels]
    return dict(cos=[round(v, STAT_DECIMALS) for v in cos],
                q=[round(float(q_values(S).mean()), STAT_DECIMALS) for S in kernels])


def show(stats):
    """Per-layer cos and q on one line, about SHOWN_LAYERS layers (log.jsonl has them all)."""
    step = max(1, len(stats["cos"]) // SHOWN_LAYERS)
    return (f"cos[0::{step}] " + " ".join(f"{v:.2f}" for v in stats["cos"][::step]) +
            f" | q[0::{step}] " + " ".join(f"{v:.2g}" for v in stats["q"][::step]))


def open_log(path, start):
    """log.jsonl for appending; a new run starts it afresh, a resumed one keeps iter <= start."""
    kept = []
    if start and os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            kept = [line for line in f if line.strip() and json.loads(line)["iter"] <= start]
    log = open(path, "w", encoding="utf-8")
    log.writelines(kept)
    return log


def write(log, record):
    """One JSON line; nan and inf become null (JSON has no such numbers)."""
    def finite(v):
        return None if isinstance(v, float) and not math.isfinite(v) else v
    log.write(json.dumps({k: [finite(u) for u in v] if isinstance(v, list) else finite(v)
                          for k, v in record.items()}) + "\n")
    log.flush()


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if wants_help(argv):
        print(usage())
        return 0
    threads = backend.threads()                       # train() sets its own; restored for callers
    try:
        return train(argv)
    except Diverged as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_DIVERGED
    except (SettingsError, CheckpointError, DataError, DeviceError, ValueError) as e:
        return fail(e)                                # one line on stderr, exit status 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        backend.set_threads(threads)


if __name__ == "__main__":
    sys.exit(main())
