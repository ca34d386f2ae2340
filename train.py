"""Train a nanospa GPT:  python train.py [--key=value ...]   (--help lists every key)

Reads top to bottom like nanoGPT's train.py: defaults, settings, device and seed, data,
model and init summary, optimiser, get_lr, estimate_loss, the loop, sample. The default run
is a vanilla transformer (no skips, no norms) with E-SPA attention and a TAT-shaped leaky
ReLU (docs/method.md §7, §10), small enough for a laptop CPU.

Files in out_dir: log.jsonl, one JSON record per logged step (iter, train_loss, lr,
tokens_per_s; at evaluation steps val_loss, eval_train_loss and the per-layer signal
statistics cos[l] and q[l] of docs/method.md §13; iter 0 is the model at init), and
ckpt.npz, the latest checkpoint, written atomically and only from a finite state.
--init_from=resume continues a run step for step. docs/running.md says what a run keeps,
how resuming works, and every exit status (0 done, 1 diverged, 2 bad input or environment,
130 / 143 after SIGINT / SIGTERM, which save the state first).

The loop shows each step as nanoGPT's does: the batch, forward and loss, backward, clip,
the optimiser step, zero_grad, then log, evaluate, checkpoint. What makes it a step of a
parallel run (micro-batches, slices on worker threads, MPI ranks, K-FAC's curvature pass)
sits behind calls named for it (nanospa/run/step.py); the out_dir, log, checkpoints,
resumption and what a signal does behind the Session (run/session.py: a signal ends the loop
with the state saved, and train() returns 128 + N); the settings' checks in run/checks.py.
"""
import os

# Each step's batch is split across --threads worker threads, and each thread calls
# single-threaded BLAS: a multi-threaded BLAS under them would put threads x BLAS-threads on
# the cores. BLAS reads these variables once, when NumPy loads, so this must run before the
# first import of NumPy; values already in the environment win.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import math
import sys
import time
from dataclasses import fields

import numpy as np
from tqdm import tqdm

from data import check_length, get_batch, load_dataset, unigram_entropy
from nanospa import backend
from nanospa.beyond.optimizers import OPTIMIZER_DEFAULTS, RATES, make_optimizer, rates_for
from nanospa.config import GPTConfig
from nanospa.measure import layer_stats, measured_kernels, show
from nanospa.model import GPT, dense_attention, evaluation
from nanospa.optim import clip_grad_norm, cosine_lr
from nanospa.run import distributed, malloc, step, threads
from nanospa.run.checks import check_settings
from nanospa.run.fits import check_fits
from nanospa.run.heads import share_heads
from nanospa.run.session import Diverged, Session
from nanospa.run.settings import encode_prompt, help_text, run_command, source_notes, wants_help
from nanospa.predict import predicted_kernels     # averaged over the probe's own sequences
from nanospa.sampling import generate
from nanospa.tensor import no_grad

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
    allow_changed="",          # resume: settings that may differ from the checkpoint's, e.g. batch_size,eval_iters (the log notes it)
    eval_only=False,           # evaluate once (at init or at the checkpoint) and exit; writes nothing
    preset="",                 # named bundle of settings applied before the other overrides: gpu
    max_iters=2500,            # optimiser steps
    eval_interval=250,         # evaluate train/val loss and signal statistics every N steps
    eval_iters=10,             # fixed batches per split in each evaluation
    log_interval=10,           # write a log.jsonl record every N steps
    checkpoint_interval=250,   # save out_dir/ckpt.npz every N steps (and at the end)
    batch_size=16,             # sequences per micro-batch (B); a step trains on batch_size * grad_accum
    grad_accum=1,              # micro-batches per optimiser step, their gradients added (gradient accumulation)
    block_size=64,             # tokens per sequence (T); SPA buffers are built for it
    n_layer=12,                # transformer blocks (L)
    n_head=4,                  # attention heads (H)
    n_embd=64,                 # width (C)
    learning_rate=RATES["adamw"]["learning_rate"],  # peak learning rate: AdamW's 2e-3; K-FAC's own 3e-2, Muon's 2e-2 (--optimizer=kfac, muon) unless given
    warmup_iters=100,          # linear warm-up steps
    lr_decay_iters=0,          # cosine decay reaches min_lr here, then min_lr; 0 = max_iters of the run's start
    min_lr=RATES["adamw"]["min_lr"],  # final learning rate: 2e-4 with AdamW, 3e-3 with --optimizer=kfac, 2e-3 with muon, unless given
    weight_decay=0.0,          # AdamW decoupled weight decay (never on no_decay parameters)
    beta1=0.9,                 # AdamW beta1 (K-FAC, Muon: their Adam fallback's)
    beta2=0.95,                # AdamW beta2 (K-FAC, Muon: their Adam fallback's)
    grad_clip=1.0,             # clip the global gradient norm to this; 0 = off
    sample_tokens=300,         # tokens generated at the end; 0 = no sample
    start="\n",                # prompt of the sample
    temperature=0.8,           # sampling temperature
    top_k=40,                  # sample among the k most likely tokens; 0 = all
)
PRESETS = {  # --preset=NAME: applied first, so explicit --key=value settings win
    # Its learning rate, 4e-5: within 2x of the width study's rule and below its divergence edge
    # (docs/running.md says how it was chosen; python -m nanospa.bench.gpu_check sweeps it).
    "gpu": dict(device="cuda", n_layer=36, n_head=8, n_embd=512, block_size=256, batch_size=32,
                max_iters=2000, eval_interval=250, checkpoint_interval=250, eval_iters=20,
                warmup_iters=200, learning_rate=4e-5, min_lr=4e-6),
}
MODEL_KEYS = [f.name for f in fields(GPTConfig) if f.name != "vocab_size"]  # vocab_size: from the data
DEFAULTS = {**TRAIN_DEFAULTS, **OPTIMIZER_DEFAULTS, **{f.name: f.default for f in fields(GPTConfig)
                                 if f.name in MODEL_KEYS and f.name not in TRAIN_DEFAULTS}}
EVAL_SEED = 1234       # the fixed evaluation batches do not depend on --seed, so runs compare
PROBE_ROWS = 4         # sequences of the fixed batch on which the signal statistics are measured
SIGNAL_POSITIONS = 256 # ... on their first positions: cos[l], q[l] over a (256, 256) kernel, whatever T


def usage():
    """The --help screen: every key with its default and the comment beside it, here or in
    GPTConfig's source (marked [GPTConfig])."""
    notes = source_notes(__file__, sys.modules[GPTConfig.__module__].__file__, sys.modules[make_optimizer.__module__].__file__)
    notes = {k: notes.get(k, "") + ("" if k in TRAIN_DEFAULTS or k in OPTIMIZER_DEFAULTS else " [GPTConfig]") for k in DEFAULTS}
    return help_text(__doc__.splitlines()[0], DEFAULTS, notes, PRESETS)


# ----------------------------------------------------------------------------- training

def train(argv):
    """The whole run -> exit status; raises for bad input (main turns that into one line)."""
    # rates_for: an --optimizer's own learning_rate and min_lr, where the command line gives none
    with Session(argv, DEFAULTS, PRESETS, check_settings, MODEL_KEYS, rates_for) as run:  # out_dir, lock, signals, resume
        s, world = run.settings, run.world
        if run.nothing_to_do:
            return 0
        B, A, T = s["batch_size"], s["grad_accum"], s["block_size"]   # A: micro-batches a step (not A_l)

        # -- device and seed
        world.use_device(s["device"])                 # cuda: the GPU of this local rank, NCCL
        backend.use(s["device"])                      # DeviceError without CuPy or a GPU
        rng = np.random.default_rng(s["seed"])        # training batches; saved in checkpoints

        # -- data
        ds = load_dataset(s["data"], tokenizer=s["tokenizer"])   # bpe:N: trained once, then cached
        check_length(ds, T)                           # DataError when a split is shorter than T + 1
        print(f"data: {ds.name}: {len(ds.train):,} train / {len(ds.val):,} val {ds.tokenizer} tokens, unigram "
              f"entropy {unigram_entropy(ds.train, ds.vocab_size):.3f} nats/token (a context-free predictor)")
        prompt = encode_prompt(ds.encode, s["start"], ds.vocab_size)[None, :]   # (1, t): refused now, not after the run
        cfg = GPTConfig(vocab_size=ds.vocab_size, **{k: s[k] for k in MODEL_KEYS})   # the tokenizer's size
        # A size this machine cannot hold is refused now, before anything is allocated: the run's
        # weights, the evaluation batches and a step's (int64 x and y), a step, the signal statistics
        check_fits(cfg, B // world.size, s["device"], held_tokens=2 * (2 * s["eval_iters"] + 1) * B * A * T,
                   probe=(min(PROBE_ROWS, B * A), min(T, SIGNAL_POSITIONS)), kfac=s["optimizer"] == "kfac")
        eval_rng = np.random.default_rng(EVAL_SEED)
        eval_sets = {split: [get_batch(tokens, B * A, T, eval_rng) for _ in range(s["eval_iters"])]
                     for split, tokens in (("train", ds.train), ("val", ds.val))}   # each a step's batch
        # The signal statistics: on the first SIGNAL_POSITIONS positions of a fixed batch. The model is
        # causal, so these are exactly the positions' values in the whole sequence, at O(256^2) memory
        # where the (T, T) kernels of every layer would cost more than the training step at long T.
        probe = eval_sets["val"][0][0][:PROBE_ROWS, :SIGNAL_POSITIONS]

        # -- model and init summary
        attn_impl = evaluation(cfg)                    # dense attention shares its heads, by blocks its blocks,
        shares = attn_impl is dense_attention or getattr(attn_impl, "by_blocks", False)   # so threads > sequences pays
        threads.set_threads(threads.cpu_threads(s["threads"], B // world.size, shares) if s["device"] == "cpu" else 1)
        malloc.keep_freed_memory()                    # no page faults from each step's fresh arrays
        model = GPT(cfg, seed=s["seed"])              # ValueError: e.g. an unreachable activation target
        # A checkpoint's arrays are C-ordered; some fresh weights are not (orthogonal init). Loading
        # either way gives both runs the same memory layout, so BLAS repeats the same roundings.
        model.load_state_dict(world.bcast(model.state_dict()))   # rank 0's weights on every rank
        if threads.threads() > B // world.size:       # more threads than sequences: attention's heads on them
            share_heads(model)                        # (run/heads.py; the same numbers as one thread)
        print(f"model: {model.num_params():,} parameters; L={cfg.n_layer} H={cfg.n_head} C={cfg.n_embd} T={T}; "
              f"attention={cfg.attention} activation={cfg.activation} residual={cfg.residual} "
              f"norm={cfg.norm} pos={cfg.pos} {cfg.dtype} on {s['device']}"
              + (f" ({threads.threads()} threads)" if s["device"] == "cpu" else ""))
        print("plan: " + " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                  for k, v in model.plan.info.items()) + f"; activation {model.activation!r}")
        for note in model.plan.notes:                 # a target the plan could not meet, e.g. a ReLU for a leaky ReLU
            print(f"plan note: {note}")

        # -- optimiser; the checkpoint's state on resume (weights, optimiser, batch generator)
        optimizer = make_optimizer(s, model, seed=s["seed"], rank=world.rank,
                                   allreduce=world.allreduce_grads if world.size > 1 else None)  # AdamW, K-FAC or Muon
        start, run.best_val, evaluate_now = run.begin(model, optimizer, rng, ds)
        print(f"optimizer: {s['optimizer']}, learning rate {s['learning_rate']:g} -> {s['min_lr']:g}, batch "
              f"{B * A} sequences" + (f" in {A} micro-batches of {B}" if A > 1 else ""))

        # -- get_lr: linear warm-up, then cosine decay to min_lr at lr_decay_iters, then min_lr
        def get_lr(it):
            return cosine_lr(it, s["learning_rate"], s["warmup_iters"], s["lr_decay_iters"], s["min_lr"])

        # -- estimate_loss on the fixed batches, plus the per-layer signal statistics (method §13)
        def mean_loss(batches):                       # by micro-batches of B: the memory of a step
            losses = []
            with no_grad(), run.abandoning():         # a signal ends it (one process: at once;
                for x, y in batches:                  # under MPI: at the next micro-batch)
                    for xs, ys, _ in step.micro_batches(x, y, A, world):
                        run.stop_point()
                        losses.append(model(xs, ys)[1].data)
            xp = backend.xp_of(*losses)               # one device read for all of them:
            return world.mean(np.mean(backend.to_numpy(xp.stack(losses).astype(np.float64))))

        def estimate_loss():
            with model.evaluating():                  # BatchNorm: running statistics
                loss = {split: mean_loss(batches) for split, batches in eval_sets.items()}
                with no_grad():
                    kernels = measured_kernels(model, probe)["hidden"]  # L+1 batch-mean kernels
            return dict(ds.per_byte(val_loss=loss["val"], eval_train_loss=loss["train"]), **layer_stats(kernels),
                        signal_positions=probe.shape[1])

        if evaluate_now:                              # at init, the checkpoint's (eval_only), or one cut short
            ev = estimate_loss()
            label, window = "init" if start == 0 else f"iter {start}", probe.shape[1]
            print(f"{label}: {ds.loss_text(ev)}\n{label}: measured  {show(ev)}"
                  + (f" (first {window} positions)" if window < T else ""))
            if run.pending:                           # the evaluation a signal cut short, completed
                run.complete_pending(ev)
            elif start == 0:
                predicted = layer_stats(predicted_kernels(cfg, model.plan, backend.to_numpy(probe)))
                print(f"{label}: predicted {show(predicted)} (wide limit, same tokens)")
                ev.update(pred_cos=predicted["cos"], pred_q=predicted["q"])
                if not s["eval_only"]:
                    run.log(dict(iter=0, **ds.per_byte(train_loss=ev["eval_train_loss"]), lr=0.0, tokens_per_s=0.0,
                                 **ev), sync=True)
        if s["eval_only"]:
            return 0
        print(f"log: {run.files.log_path}  checkpoint: {run.files.ckpt} (iter {start})")

        # -- the loop: the batch; forward, backward, clip, step, zero_grad; log, evaluate, checkpoint.
        # SIGINT / SIGTERM end it where they come, with the state saved: the Session decides what
        # (run/session.py); the run then returns 128 + N, below.
        params, tokens, t0, n, record = model.parameters(), 0, time.perf_counter(), start, {}
        with tqdm(run.steps(), initial=start, total=s["max_iters"], dynamic_ncols=True,
                  disable=not world.is_main) as bar:
            for it in bar:
                lr = optimizer.lr = get_lr(it)
                x, y = get_batch(ds.train, B * A, T, rng)  # (B A, T) int64 each: A micro-batches of B
                losses = []                           # the micro-batches' shares of the batch's mean loss
                with run.abandoning():                # a signal in here drops the step: only .grad changed
                    for xs, ys, weight in step.micro_batches(x, y, A, world):  # weight 1/A; MPI: this rank's rows
                        loss = step.forward(model, xs, ys) * weight   # forward: a slice per worker thread
                        loss.backward()               # backward: each slice's on its thread, into .grad in order
                        losses.append(loss.data)
                step.update_curvature(optimizer, x, y, A, world)   # K-FAC's curvature pass; AdamW: none
                world.allreduce_grads(params)         # MPI: the mean gradient over the ranks
                norm = clip_grad_norm(params, s["grad_clip"])
                loss, norm = step.read(losses, norm, world)   # the step's one device read: two floats
                run.watch(it + 1, loss, norm)         # Diverged: non-finite, or exploded
                optimizer.step()
                optimizer.zero_grad()
                model.after_step()                    # schemes with per-step state (nGPT, PRepBN, dropout's masks)

                n, tokens = it + 1, tokens + B * A * T
                tokens_per_s = tokens / (time.perf_counter() - t0)
                bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}", tok_s=f"{tokens_per_s:.0f}", refresh=False)
                evaluating = n % s["eval_interval"] == 0 or n == s["max_iters"]
                if evaluating or n % s["log_interval"] == 0:
                    record = dict(iter=n, **ds.per_byte(train_loss=loss), lr=lr, tokens_per_s=tokens_per_s)
                    if evaluating:
                        with run.evaluation_of(record):   # a signal in here: saved with this record pending
                            record.update(estimate_loss())
                        if not math.isfinite(record["val_loss"]):
                            raise Diverged(f"non-finite validation loss at iter {n}; stopped. Last good "
                                           f"checkpoint: {run.last_good()}")
                        run.best_val = min(run.best_val, record["val_loss"])
                        tqdm.write(f"iter {n}: {ds.loss_text(record)} | {show(record)}")
                    run.log(record)
                    tokens, t0 = 0, time.perf_counter()   # evaluation time is not training time
                if n % s["checkpoint_interval"] == 0 or n == s["max_iters"]:
                    run.save(n, loss, mean_loss([(x, y)]))   # saved unless the updated model scores > 2x the best loss on this batch
        print(f"done: iter {n}" + (f", {ds.loss_text(record)} (best {run.best_val:.4f})"
                                   if n > start and "val_loss" in record else "")
              + f"; checkpoint {run.last_good()}, log {run.files.log_path}")

        # -- sample
        run.stop.disarm("while sampling: stopped; the run is saved")   # a signal now stops at once
        if s["sample_tokens"] and world.is_main:
            out = generate(model, prompt, s["sample_tokens"], temperature=s["temperature"],
                                 top_k=s["top_k"] or None, rng=np.random.default_rng(s["seed"]))
            print("sample:\n" + ds.decode(out[0]))
        return 0
    return run.exit_status                            # only after SIGINT / SIGTERM: the Session saved the state


def main(argv=None):
    """-> the exit status: 0 done, 1 diverged, 2 bad input or environment (one error: line),
    128 + N after signal N (docs/running.md)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if wants_help(argv):
        print(usage())
        return 0
    previous = threads.threads()                      # train() sets its own; restored for callers
    try:
        return run_command(train, argv, diverged=Diverged)   # Diverged: status 1, not bad input
    finally:
        threads.set_threads(previous)


if __name__ == "__main__":
    sys.exit(distributed.run(main))
