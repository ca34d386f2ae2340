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
             cosine of the hidden states, l = 0..L) and q[l] (mean q-value); each loss in nats
             per token and as NAME_per_byte (data.Dataset.per_byte). iter 0: the model at init
             (train_loss there is the eval estimate; no step was taken).
  ckpt.npz   the latest checkpoint, written atomically and only from a finite state
             (nanospa/run/checkpoint.py); run.lock while a run lasts (nanospa/run/rundir.py).
A scratch run refuses an out_dir holding ckpt.npz or log.jsonl unless --overwrite=True, and
writes ckpt.npz at iter 0 before its first step, so every run that started can be resumed.

Resume (--init_from=resume): the checkpoint's settings, changed by the command line's (not
the model's), and the run's schedule (lr_decay_iters=0 is stored as the first max_iters), so
a larger max_iters trains the extra steps at min_lr; max_iters at the checkpoint's iteration
has nothing to do, below it is refused; another corpus needs --new_data=True; the log is
cut back to the checkpoint's iteration (a partial last record too), then appended to.

Exit status: 0 done, 1 diverged (the last good checkpoint kept and named), 2 bad settings,
data or environment (unwritable path, full disk, out of memory: one error: line, the last
checkpoint intact), 130 / 143 after SIGINT / SIGTERM, which save the current state first (a
second signal stops at once). NANOSPA_DEBUG=1: a failure's traceback instead of its line.

Not here: the --key=value parser and the exit-status convention (nanospa/run/settings.py), the
checkpoint file's format and its checks (nanospa/run/checkpoint.py), the lock and the log
(nanospa/run/rundir.py), the experiments' compact training runs (nanospa/experiments).
"""
import os

# Each step's batch is split across --threads worker threads (nanospa/run/threads.py),
# and each thread calls single-threaded BLAS: a multi-threaded BLAS under them would put
# threads x BLAS-threads on the cores. BLAS reads these variables once, when NumPy loads, so
# this must run before the first import of NumPy; values already in the environment win.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import math
import signal
import sys
import time
from contextlib import nullcontext
from dataclasses import fields

import numpy as np
from tqdm import tqdm

from data import VOCAB_SIZE, check_length, check_tokenizer, get_batch, load_dataset, unigram_entropy
from nanospa import backend
from nanospa.run.checkpoint import (NotFiniteError, check_same_data, check_same_model, data_identity, load_checkpoint,
                                restore, save_checkpoint, training_state)
from nanospa.config import GPTConfig
from nanospa.measure import layer_stats, measured_kernels, show
from nanospa.model import GPT
from nanospa.optim import clip_grad_norm, cosine_lr
from nanospa.beyond.optimizers import OPTIMIZER_DEFAULTS, check_optimizer, curvature, make_optimizer
from nanospa.run.rundir import Interrupts, RunFiles, RunLock, check_run_dir, heal_log, held_files
from nanospa.run.settings import (EXIT_SIGNAL_BASE, SettingsError, help_text, parse_settings, run_command,
                              source_notes, wants_help)
from nanospa.signal.table import predicted_kernels  # averaged over the probe's own sequences
from nanospa.tensor import no_grad
from nanospa.run import threads as cpu
from nanospa.run.threads import sharded_backward
from nanospa.run import distributed

# ----------------------------------------------------------------------------- defaults
# Each key is a --key=value setting; the comment beside it is its --help line. Every
# GPTConfig field (attention, activation, residual, norm, pos, kernel_budget, ...) is a key
# too, with GPTConfig's own default unless it is set here.
TRAIN_DEFAULTS = dict(
    out_dir="out",             # folder for ckpt.npz and log.jsonl
    data="default",            # dataset: default | PATH | shakespeare[:FILE] | wikitext2[:...] (see data.py)
    tokenizer="byte",          # byte | bpe:N (byte-level BPE of N tokens trained on the train split; extra [bpe])
    device="cpu",              # cpu | cuda (needs CuPy and a GPU)
    threads=0,                 # CPU worker threads, each training a slice of the batch; 0 = one per core, at most 4
    seed=0,                    # seeds the weights, the training batches and the sample
    init_from="scratch",       # scratch | resume (continue from out_dir/ckpt.npz)
    overwrite=False,           # scratch: replace the run (ckpt.npz, log.jsonl) an out_dir already holds
    new_data=False,            # resume: allow a corpus other than the checkpoint's (best val loss starts afresh)
    eval_only=False,           # evaluate once (at init or at the checkpoint) and exit; writes nothing
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
    learning_rate=2e-3,        # peak learning rate (AdamW's, or K-FAC's with --optimizer=kfac)
    warmup_iters=100,          # linear warm-up steps
    lr_decay_iters=0,          # cosine decay reaches min_lr here, then min_lr; 0 = max_iters of the run's start
    min_lr=2e-4,               # final learning rate
    weight_decay=0.0,          # AdamW decoupled weight decay (never on no_decay parameters)
    beta1=0.9,                 # AdamW beta1 (K-FAC: its Adam fallback's)
    beta2=0.95,                # AdamW beta2 (K-FAC: its Adam fallback's)
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
PER_RUN = ("out_dir", "init_from", "overwrite", "new_data", "eval_only", "preset")  # never from a checkpoint
DEFAULTS = {**TRAIN_DEFAULTS, **OPTIMIZER_DEFAULTS, **{f.name: f.default for f in fields(GPTConfig)
                                 if f.name in MODEL_KEYS and f.name not in TRAIN_DEFAULTS}}
EVAL_SEED = 1234       # the fixed evaluation batches do not depend on --seed, so runs compare
PROBE_ROWS = 4         # sequences of the fixed batch on which the signal statistics are measured


class Diverged(RuntimeError):
    """A non-finite loss, gradient norm, parameter or optimiser state (exit status 1)."""


# ----------------------------------------------------------------------------- overrides

def parse_args(argv, defaults):
    """--key=value overrides on top of `defaults` by nanospa's one settings parser
    (nanospa/run/settings.py): typed like the default, --preset=NAME first, a bare --flag for a
    bool key; SettingsError names a bad one."""
    s = parse_settings(argv, defaults, PRESETS)
    del s["_explicit"]                                # not a setting: checkpoints store the rest
    return s


CHECKS = [  # settings GPTConfig does not check itself: (keys, test, what a good value is)
    (("batch_size", "block_size", "eval_interval", "eval_iters", "log_interval", "checkpoint_interval"),
     lambda v: v > 0, "a positive integer"),
    (("threads", "seed", "max_iters", "warmup_iters", "lr_decay_iters", "sample_tokens", "top_k"),
     lambda v: v >= 0, ">= 0"),
    (("learning_rate", "min_lr", "weight_decay", "grad_clip"), lambda v: 0 <= v < math.inf, "finite and >= 0"),
    (("beta1", "beta2"), lambda v: 0 <= v < 1, "in [0, 1)"),
    (("temperature",), lambda v: 0 < v < math.inf, "finite and > 0"),
    (("device",), lambda v: v in ("cpu", "cuda"), "'cpu' or 'cuda'"),
    (("init_from",), lambda v: v in ("scratch", "resume"), "'scratch' or 'resume'"),
    (("start",), lambda v: v != "", "a non-empty prompt"),
]


def check_settings(s, explicit=(), unset="the default"):
    """SettingsError naming the first bad setting, as the user wrote it (`explicit`: the keys
    set on the command line; the others are named as coming from `unset`)."""
    check_tokenizer(s["tokenizer"])                   # a bad spec, or bpe:N without its package: one line now
    for keys, ok, what in CHECKS:
        for key in keys:
            if not ok(s[key]):
                raise SettingsError(f"{key} must be {what}, got {s[key]!r}")
    try:
        check_optimizer(s)                            # --optimizer and the kfac_* settings
    except ValueError as e:
        raise SettingsError(str(e)) from None
    if s["min_lr"] > s["learning_rate"]:
        given = lambda k: f"{k}={s[k]!r}" + ("" if k in explicit else f" ({unset})")
        raise SettingsError(f"{given('min_lr')} is above {given('learning_rate')}: the learning rate would "
                            "rise during the decay; set --min_lr to at most --learning_rate")


def usage():
    """The --help screen: every key with its default and the comment beside it, here or in
    GPTConfig's source (marked [GPTConfig])."""
    notes = source_notes(__file__, sys.modules[GPTConfig.__module__].__file__, sys.modules[make_optimizer.__module__].__file__)
    notes = {k: notes.get(k, "") + ("" if k in TRAIN_DEFAULTS or k in OPTIMIZER_DEFAULTS else " [GPTConfig]") for k in DEFAULTS}
    return help_text(__doc__.splitlines()[0], DEFAULTS, notes, PRESETS)


# ----------------------------------------------------------------------------- training

def train(argv):
    """The whole run; returns the exit status (raises for bad input, see main). One run per
    out_dir (RunLock: RunDirError naming the owner), SIGINT and SIGTERM handled from the start."""
    s = parse_args(argv, DEFAULTS)
    check_run_dir(s["out_dir"])                      # a file or a folder where one is expected: refused now
    world = distributed.world()                      # size 1 without mpiexec: every call below is a no-op
    lock_out_dir = nullcontext() if s["eval_only"] or not world.is_main else RunLock(s["out_dir"])
    with Interrupts() as stop, lock_out_dir as lock:
        for note in lock.notes if lock else []:       # eval_only reads and writes nothing: no lock
            print(note, file=sys.stderr)
        return run(argv, s, stop, world)


def run(argv, s, stop, world):
    # -- overrides (on resume: the checkpoint's settings, then the command line's)
    out_dir = s["out_dir"]
    files = RunFiles(out_dir, writer=world.is_main)   # ckpt.npz and log.jsonl; rank 0 writes them
    ckpt_path, log_path = files.ckpt, files.log_path
    explicit = {a[2:].partition("=")[0] for a in argv}
    ckpt, start = None, 0
    if s["init_from"] == "resume":
        ckpt = world.bcast(load_checkpoint(ckpt_path) if world.is_main else None)  # rank 0 reads it
        saved = {k: v for k, v in ckpt["settings"].items() if k in DEFAULTS and k not in PER_RUN}
        s = parse_args(argv, {**DEFAULTS, **saved, "out_dir": out_dir})
        check_same_model(s, saved, MODEL_KEYS + ["optimizer", "tokenizer"])
        start = int(ckpt["state"]["iter"])
    check_settings(s, explicit, "from the checkpoint" if ckpt else "the default")
    cfg = GPTConfig(vocab_size=VOCAB_SIZE, **{k: s[k] for k in MODEL_KEYS})  # ValueError names a bad field
    B, T = s["batch_size"], s["block_size"]
    world.check_batch(B)                              # one line on every rank, before any collective
    if not world.is_main:
        sys.stdout = open(os.devnull, "w")            # rank 0 alone prints; errors still reach stderr
    if not s["eval_only"]:
        held = held_files(out_dir)
        if not ckpt and held and not s["overwrite"]:
            raise SettingsError(f"--out_dir={out_dir} holds a run ({', '.join(held)}): continue it with "
                                f"--init_from=resume, choose another --out_dir, or replace it with --overwrite=True")
        if ckpt and s["max_iters"] < start:
            raise SettingsError(f"max_iters={s['max_iters']} is below the iteration of {ckpt_path} ({start}): a "
                                "resumed run cannot go back; pass a larger --max_iters, or --eval_only=True")
        if ckpt and s["max_iters"] == start:
            print(f"nothing to do: {ckpt_path} is at iter {start} = max_iters; pass --max_iters=N with N > "
                  f"{start} to train further")
            return 0
    # The schedule is the run's: lr_decay_iters=0 becomes this run's max_iters, stored so in the
    # checkpoint, so that a resumed run with a larger max_iters does not re-stretch the cosine.
    s["lr_decay_iters"] = s["lr_decay_iters"] or s["max_iters"]
    if ckpt and s["lr_decay_iters"] < s["max_iters"] and "lr_decay_iters" not in explicit and not s["eval_only"]:
        print(f"note: the schedule is the run's: its cosine decay ends at iter {s['lr_decay_iters']} (lr_decay_iters), "
              f"so iters {max(start, s['lr_decay_iters'])}..{s['max_iters']} train at min_lr={s['min_lr']:g}; "
              f"--lr_decay_iters={s['max_iters']} stretches it instead")

    # -- backend and seed
    world.use_device(s["device"])                     # cuda: the GPU of this local rank, NCCL
    backend.use(s["device"])                          # DeviceError without CuPy or a GPU
    cpu.set_threads(cpu.cpu_threads(s["threads"], B // world.size) if s["device"] == "cpu" else 1)
    rng = np.random.default_rng(s["seed"])            # training batches; saved in checkpoints

    # -- data
    ds = load_dataset(s["data"], tokenizer=s["tokenizer"])   # bpe:N: trained once, then cached
    check_length(ds, T)                               # DataError when a split is shorter than T + 1
    cfg = GPTConfig(**{**cfg.to_dict(), "vocab_size": ds.vocab_size})   # the tokenizer's own size
    print(f"data: {ds.name}: {len(ds.train):,} train / {len(ds.val):,} val {ds.tokenizer} tokens, unigram entropy "
          f"{unigram_entropy(ds.train, ds.vocab_size):.3f} nats/token (a context-free predictor)")
    data_id = data_identity(ds.meta, s["data"])      # recorded in each checkpoint
    new_corpus = bool(ckpt) and check_same_data(ckpt_path, ckpt["state"].get("data"), data_id, s["new_data"])
    eval_rng = np.random.default_rng(EVAL_SEED)
    eval_sets = {split: [get_batch(tokens, B, T, eval_rng) for _ in range(s["eval_iters"])]
                 for split, tokens in (("train", ds.train), ("val", ds.val))}
    probe = eval_sets["val"][0][0][:PROBE_ROWS]       # (b, T) fixed batch for the signal statistics

    # -- model and init summary
    model = GPT(cfg, seed=s["seed"])                  # ValueError: e.g. an unreachable activation target
    # A checkpoint's arrays are C-ordered; some fresh weights are not (orthogonal init). Loading
    # either way gives both runs the same memory layout, so BLAS repeats the same roundings.
    model.load_state_dict(world.bcast(model.state_dict()))   # rank 0's weights on every rank
    print(f"model: {model.num_params():,} parameters; L={cfg.n_layer} H={cfg.n_head} C={cfg.n_embd} T={T}; "
          f"attention={cfg.attention} activation={cfg.activation} residual={cfg.residual} "
          f"norm={cfg.norm} pos={cfg.pos} {cfg.dtype} on {s['device']}"
          + (f" ({cpu.threads()} threads)" if s["device"] == "cpu" else ""))
    print("plan: " + " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in model.plan.info.items())
          + f"; activation {model.activation!r}")

    # -- optimiser
    optimizer = make_optimizer(s, model, seed=s["seed"], rank=world.rank,     # AdamW or K-FAC (optimizers.py)
                               allreduce=world.allreduce_grads if world.size > 1 else None)
    best_val = math.inf
    if ckpt:                                          # exact resume: weights, AdamW state, batch RNG, iter
        start, best_val = restore(ckpt, optimizer, rng, model, ckpt_path)
        files.saved_iter = start
        if new_corpus:
            best_val = math.inf
            print(f"note: --new_data=True: training on {ds.name}, not the checkpoint's corpus; the best "
                  "validation loss starts afresh")
        print(f"resumed from {ckpt_path} at iter {start}")

    # -- get_lr: linear warm-up, then cosine decay to min_lr at lr_decay_iters, then min_lr
    def get_lr(it):
        return cosine_lr(it, s["learning_rate"], s["warmup_iters"], s["lr_decay_iters"], s["min_lr"])

    # -- estimate_loss on the fixed batches, plus the per-layer signal statistics (method §13)
    def estimate_loss():                              # in evaluation mode (BatchNorm: running statistics)
        with no_grad(), model.evaluating():
            loss = {split: world.mean(np.mean([model(world.shard(x), world.shard(y))[1].item() for x, y in batches]))
                    for split, batches in eval_sets.items()}
            kernels = measured_kernels(model, probe)["hidden"]  # L+1 batch-mean kernels (T, T)
        return dict(ds.per_byte(val_loss=loss["val"], eval_train_loss=loss["train"]), **layer_stats(kernels))

    # On resume the log is cut back to the checkpoint (a partial last record, records after it).
    kept, notes = 0, []
    if not s["eval_only"]:
        stop.arm()                                    # from here on a signal saves the state first
        kept, notes = heal_log(log_path, start) if ckpt and world.is_main else (0, [])
        kept = world.bcast(kept)                      # whether to evaluate now must agree (a collective)
    for note in notes:
        print(note, file=sys.stderr)
    ev = None
    if s["eval_only"] or (start == 0 and kept == 0):
        ev, label = estimate_loss(), f"iter {start}" if ckpt else "init"
        print(f"{label}: {ds.loss_text(ev)}\n{label}: measured  {show(ev)}")
        if start == 0:
            predicted = layer_stats(predicted_kernels(cfg, model.plan, backend.to_numpy(probe)))
            print(f"{label}: predicted {show(predicted)} (wide limit, same tokens)")
            ev.update(pred_cos=predicted["cos"], pred_q=predicted["q"])
    if s["eval_only"]:
        return 0

    # -- files: the checkpoint of iter 0, then the log, appended to (see nanospa/run/rundir.py)
    def save(n, loss):
        """The checkpoint of the state after n steps; only a finite one is written."""
        try:
            files.save(n, lambda path: save_checkpoint(path, model, optimizer, s, cfg,
                                                       training_state(n, best_val, rng, data_id, loss)))
        except NotFiniteError as e:
            raise Diverged(f"{e}; stopped. Last good checkpoint: {files.last_good()}") from None

    if not ckpt and world.is_main:
        for name in held_files(out_dir):             # --overwrite=True: the old run goes now, not before
            os.remove(os.path.join(out_dir, name))
    if not ckpt:
        save(0, None)
    files.open()
    if ev is not None and start == 0:                 # iter 0: the model at init
        files.write(dict(iter=0, **ds.per_byte(train_loss=ev["eval_train_loss"]), lr=0.0, tokens_per_s=0.0, **ev), sync=True)
    print(f"log: {files.log_path}  checkpoint: {files.ckpt} (iter {start})")

    # -- the loop: forward, backward, clip, step, zero_grad; log, evaluate, checkpoint
    params, tokens, t0, n, record = model.parameters(), 0, time.perf_counter(), start, {}
    bar = tqdm(range(start, s["max_iters"] if stop.signum is None else start), initial=start,
               total=s["max_iters"], dynamic_ncols=True, disable=not world.is_main)
    try:
        for it in bar:
            lr = optimizer.lr = get_lr(it)
            x, y = get_batch(ds.train, B, T, rng)     # (B, T) int64 each
            # loss.backward(), over slices of the batch on the worker threads (one slice with
            # one thread); the slices' gradients are added in a fixed order: deterministic.
            xs, ys = world.shard(x), world.shard(y)   # this rank's part of the batch
            loss = sharded_backward(lambda a, b: model(a, b)[1], xs, ys)
            curvature(optimizer, xs, ys)              # K-FAC: the factors' pass (.grad untouched); AdamW: none
            world.allreduce_grads(params)             # the global-batch mean gradient, on every rank
            norm = clip_grad_norm(params, s["grad_clip"])
            value = world.mean(loss.item())           # the global batch's loss
            if not (math.isfinite(value) and math.isfinite(norm)):
                raise Diverged(f"non-finite loss or gradient at iter {it + 1} (loss {value}, gradient "
                               f"norm {norm}); stopped. Last good checkpoint: {files.last_good()}")
            optimizer.step()
            optimizer.zero_grad()
            model.after_step()                        # schemes with per-step state (nGPT, PRepBN)
            n, tokens = it + 1, tokens + B * T
            tokens_per_s = tokens / (time.perf_counter() - t0)
            bar.set_postfix(loss=f"{value:.4f}", lr=f"{lr:.2e}", tok_s=f"{tokens_per_s:.0f}", refresh=False)
            evaluating = n % s["eval_interval"] == 0 or n == s["max_iters"]
            if evaluating or n % s["log_interval"] == 0:
                record = dict(iter=n, **ds.per_byte(train_loss=value), lr=lr, tokens_per_s=tokens_per_s)
                if evaluating:
                    record.update(estimate_loss())
                    if not math.isfinite(record["val_loss"]):
                        raise Diverged(f"non-finite validation loss at iter {n}; stopped. Last good "
                                       f"checkpoint: {files.last_good()}")
                    best_val = min(best_val, record["val_loss"])
                    tqdm.write(f"iter {n}: {ds.loss_text(record)} | {show(record)}")
                files.write(record)
                tokens, t0 = 0, time.perf_counter()   # evaluation time is not training time

            # -- checkpoint: the state after the update, checked finite, once the log it covers is on disk
            stop_signum = world.max(stop.signum or 0)  # a signal that reached any rank stops all here
            if n % s["checkpoint_interval"] == 0 or n == s["max_iters"] or stop_signum:
                save(n, value)
            if stop_signum:
                stop.signum = stop_signum
                break
    finally:
        bar.close()
        files.close()
    if stop.signum is not None:
        if world.is_main:
            print(f"{signal.Signals(stop.signum).name}: stopped at iter {n}, checkpoint saved to {ckpt_path}; "
                  f"continue with {files.resume}", file=sys.stderr)
        return EXIT_SIGNAL_BASE + stop.signum
    print(f"done: iter {n}" + (f", {ds.loss_text(record)} (best {best_val:.4f})"
                               if n > start and "val_loss" in record else "")
          + f"; checkpoint {files.last_good()}, log {log_path}")

    # -- sample
    if s["sample_tokens"] and world.is_main:
        prompt = ds.encode(s["start"])[None, :]       # (1, t)
        out = model.generate(prompt, s["sample_tokens"], temperature=s["temperature"],
                             top_k=s["top_k"] or None, rng=np.random.default_rng(s["seed"]))
        print("sample:\n" + ds.decode(out[0]))
    return 0


# ----------------------------------------------------------------------------- helpers

def main(argv=None):
    """-> the exit status: 0 done, 1 diverged, 2 bad input or environment (one error: line),
    128 + N after signal N (see the module docstring)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if wants_help(argv):
        print(usage())
        return 0
    threads = cpu.threads()                           # train() sets its own; restored for callers
    try:
        return run_command(train, argv, diverged=Diverged)   # Diverged: status 1, not bad input
    finally:
        cpu.set_threads(threads)


if __name__ == "__main__":
    sys.exit(distributed.run(main))
