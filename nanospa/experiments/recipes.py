"""nanoGPT's two published tiny Shakespeare recipes, run by nanospa: Pre-LN as nanoGPT writes
it, and vanilla E-SPA (train.py's default model) on the same optimiser settings.

    python -m nanospa.experiments recipes [--preset=cpu|gpu] [--seeds=3] [--max_iters=N] [--data=PATH] [--key=value ...]

Presets (NANOGPT below, nanoGPT's own values): cpu (the default), the README's CPU command
line, published validation loss 1.88; gpu, nanoGPT's config/train_shakespeare_char.py, published
1.4697, on --device=cuda (on a CPU: --device=cpu with a shorter --max_iters, labelled
shortened and not comparable). The settings keep nanoGPT's names (max_iters, learning_rate,
min_lr, warmup_iters, beta1, beta2, eval_iters; the runner's steps, lrs, warmup,
min_lr_ratio and eval_batches are derived from them and refused on the command line). The
cosine ends at the run's last step: nanoGPT's lr_decay_iters equals max_iters in both
recipes, and a shortened run shortens both.

Methods:
    preln   nanoGPT's model: pre-norm LayerNorm, X + f(LN(X)) (residual="standard": weights
            1 and 1, not a weighted sum), softmax attention, learned positions, GELU MLP 4x,
            final LayerNorm, no linear biases, the head tied to the token embedding
            (--preln_tied=False: a head of its own)
    espa    vanilla E-SPA: no skips, no norms, TAT leaky ReLU (train.py's default model)

What differs from nanoGPT, by design or by what nanospa has: bytes, not characters (the text
is ASCII, so nats per byte are nats per character; the vocabulary is 256 wide, not 65, which
adds embedding rows the text never uses); nanospa's initialisation (docs/method.md §2; the
tied head is W_e^T / sqrt(C), §2.6), where nanoGPT draws N(0, 0.02^2) with 0.02 / sqrt(2 L)
on the residual projections; LayerNorm with a bias (nanoGPT's bias=False drops it there too);
GELU's tanh approximation (nanoGPT: erf's); dropout masks of nanospa's own generator.

Evaluation after the last step (nanoGPT evaluates at max_iters, after max_iters updates):
the train and validation losses over eval_iters fixed batches of batch_size random windows
(nanoGPT's sample size, drawn once for every model and seed: common.EVAL_SEED), and the
validation split as a whole, every target once in non-overlapping windows of block_size
(common.evaluate_whole): the larger-sample estimate.

Data: tiny Shakespeare from ../shared/data (beside the checkout, or NANOSPA_SHARED_DATA)
when it is there, else --data=PATH; never downloaded. The split is nanoGPT's: the first 90%
of the text trains, the last 10% validates (data.DEFAULT_VAL_FRACTION).
"""
import math
import os
import sys
from pathlib import Path

import numpy as np

from . import report, runner
from .runner import VANILLA, Method

NAME = "recipes"
TITLE = "nanoGPT's tiny Shakespeare recipes: Pre-LN as nanoGPT writes it, and vanilla E-SPA"
PAPER = ("Not the paper's: nanoGPT (karpathy/nanoGPT, README.md) reports a validation loss of 1.88 for its "
         "CPU recipe and 1.4697 for its GPU recipe, in nats per character over its 65-character "
         "vocabulary, one run each.")

# nanoGPT's settings. Source: karpathy/nanoGPT, config/train_shakespeare_char.py (gpu), the
# README's "I only have a macbook" command line on that config (cpu: --eval_iters=20
# --block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128 --max_iters=2000
# --lr_decay_iters=2000 --dropout=0.0), and train.py's defaults (weight_decay, beta1,
# grad_clip, bias). Published validation losses: the README (1.88 cpu, 1.4697 gpu).
NANOGPT = dict(
    cpu=dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch_size=12, max_iters=2000, lr_decay_iters=2000,
             learning_rate=1e-3, min_lr=1e-4, warmup_iters=100, beta1=0.9, beta2=0.99, weight_decay=0.1,
             grad_clip=1.0, dropout=0.0, bias=False, eval_iters=20),
    gpu=dict(n_layer=6, n_head=6, n_embd=384, block_size=256, batch_size=64, max_iters=5000, lr_decay_iters=5000,
             learning_rate=1e-3, min_lr=1e-4, warmup_iters=100, beta1=0.9, beta2=0.99, weight_decay=0.1,
             grad_clip=1.0, dropout=0.2, bias=False, eval_iters=200),
)
PUBLISHED = dict(cpu=1.88, gpu=1.4697)
SHAKESPEARE = "tinyshakespeare.txt"        # its name in ../shared/data
ROOT = Path(__file__).resolve().parents[2]  # the checkout: ../shared is beside it

OWN_PRESETS = True
PRESETS = {name: dict({k: v for k, v in p.items() if k != "lr_decay_iters"}, seeds=3, dtype="float32",
                      workers=2 if name == "cpu" else 0, device="cpu" if name == "cpu" else "cuda")
           for name, p in NANOGPT.items()}
EXTRA = dict(preset="cpu", data="", max_iters=0, learning_rate=0.0, min_lr=0.0, warmup_iters=0, beta1=0.0,
             beta2=0.0, eval_iters=0, preln_tied=True)
EXTRA_NOTES = dict(
    preset="cpu (nanoGPT's CPU recipe, published 1.88) | gpu (its GPU recipe, published 1.4697; --device=cuda)",
    data=f"tiny Shakespeare: PATH; default ../shared/data/{SHAKESPEARE} when present (never downloaded)",
    max_iters="optimiser steps (nanoGPT's max_iters; the cosine ends there); fewer than the preset's: shortened",
    learning_rate="peak learning rate", min_lr="the cosine's end", warmup_iters="linear warm-up steps",
    beta1="AdamW beta1", beta2="AdamW beta2", eval_iters="fixed evaluation batches (nanoGPT's eval_iters)",
    preln_tied="Pre-LN's head tied to its token embedding (nanoGPT's); False: a head of its own")
DERIVED = dict(steps="max_iters", lrs="learning_rate", warmup="warmup_iters", min_lr_ratio="min_lr",
               eval_batches="eval_iters")   # the runner's names, set from nanoGPT's

PRE_LN = dict(attention="softmax", residual="standard", norm="layernorm", norm_position="pre", final_norm="yes",
              pos="learned", activation="gelu")
ESPA = dict(VANILLA, attention="espa")


def shared_data():
    return Path(os.environ.get("NANOSPA_SHARED_DATA", ROOT.parent / "shared" / "data")) / SHAKESPEARE


def prepare(s):
    """nanoGPT's settings checked and turned into the runner's; the data file found. ValueError
    (one line, exit 2) before any data is read."""
    given = [k for k in DERIVED if k in s["_explicit"]]
    if given:
        raise ValueError(f"--{given[0]}: recipes takes nanoGPT's --{DERIVED[given[0]]} instead")
    if s["tokenizer"] != "byte":
        raise ValueError(f"--tokenizer={s['tokenizer']}: recipes trains on characters (bytes), as nanoGPT's "
                         "shakespeare_char does")
    if s["max_iters"] < 1 or s["eval_iters"] < 1 or s["warmup_iters"] < 0:
        raise ValueError(f"max_iters and eval_iters must be >= 1 and warmup_iters >= 0, got {s['max_iters']}, "
                         f"{s['eval_iters']}, {s['warmup_iters']}")
    if not (0 < s["learning_rate"] < math.inf and 0 <= s["min_lr"] <= s["learning_rate"]):
        raise ValueError(f"learning_rate must be > 0 and min_lr in [0, learning_rate], got {s['learning_rate']}, "
                         f"{s['min_lr']}")
    if not (0 <= s["beta1"] < 1 and 0 <= s["beta2"] < 1):
        raise ValueError(f"beta1 and beta2 must be in [0, 1), got {s['beta1']}, {s['beta2']}")
    s.update(steps=s["max_iters"], lrs=(s["learning_rate"],), warmup=s["warmup_iters"],
             min_lr_ratio=s["min_lr"] / s["learning_rate"], eval_batches=s["eval_iters"])
    path = Path(s["data"].removeprefix("shakespeare:")) if s["data"] else shared_data()
    if not path.is_file():
        raise ValueError(f"--data={s['data']}: no such file" if s["data"] else
                         f"no tiny Shakespeare at {path}: pass --data=PATH (char-rnn's input.txt, 1,115,394 "
                         "bytes; nothing is downloaded)")
    s["data"] = f"shakespeare:{path.resolve()}"


def methods(s):
    optimizer = dict(beta1=s["beta1"], beta2=s["beta2"])
    both = dict(dropout=s["dropout"], bias=s["bias"])
    run = dict(optimizer=optimizer, warmup=s["warmup_iters"], whole_val=True)
    tied = "tied head" if s["preln_tied"] else "own head"
    return {"preln": Method(dict(PRE_LN, **both, tie_embeddings=s["preln_tied"]),
                            f"Pre-LN as nanoGPT writes it (learned positions, GELU, final LayerNorm, {tied})", **run),
            "espa": Method(dict(ESPA, **both), "vanilla E-SPA (no skips, no norms; train.py's default)", **run)}


# ------------------------------------------------------------------ the numbers

def shortened(result):
    s = result["settings"]
    return s["max_iters"] < NANOGPT[s["preset"]]["max_iters"]


def _stats(values):
    """(mean, sample std over seeds (n - 1; nan for one seed)) of the finite values."""
    v = [x for x in values if x is not None and math.isfinite(x)]
    if not v:
        return math.nan, math.nan
    return float(np.mean(v)), float(np.std(v, ddof=1)) if len(v) > 1 else math.nan


def analysis(result):
    """Per method: each seed's losses, parameters, wall-clock and tokens/s, and their means
    and sample standard deviations; the published number and the gap to it."""
    s = result["settings"]
    tokens = s["batch_size"] * s["block_size"]
    out = {}
    for label, m in result["methods"].items():
        runs = []
        for r in sorted(m["runs"], key=lambda r: r["seed"]):
            tps = r["steps_done"] * tokens / r["seconds"] if r.get("seconds") else math.nan
            runs.append(dict(seed=r["seed"], val=r["final_val"], val_whole=r.get("final_val_whole", math.nan),
                             train=r["final_train"], params=r.get("n_params"), seconds=r.get("seconds"),
                             tokens_per_s=tps, diverged=r["diverged"]))
        stats = {k: _stats([r[k] for r in runs]) for k in ("val", "val_whole", "train", "seconds", "tokens_per_s")}
        out[label] = dict(runs=runs, **{k: v[0] for k, v in stats.items()},
                          **{f"{k}_std": v[1] for k, v in stats.items()},
                          params=runs[0]["params"] if runs else None,
                          published=PUBLISHED[s["preset"]], gap=stats["val"][0] - PUBLISHED[s["preset"]])
    return out


def _seeds(n):
    return f"{n} seed{'s' if n != 1 else ''}"


def _sample(s):
    """How the evaluation's sample compares with nanoGPT's eval_iters."""
    theirs = NANOGPT[s["preset"]]["eval_iters"]
    return "nanoGPT's eval_iters" if s["eval_iters"] == theirs else f"nanoGPT's eval_iters is {theirs}"


def _pm(mean, std, f=".4f"):
    return report.fmt(mean, f) + ("" if math.isnan(std) else f" ± {std:{f}}")


def findings(result):
    s, a = result["settings"], result["analysis"]
    lines = []
    if shortened(result):
        warm = s["warmup_iters"] >= s["max_iters"]
        peak = s["learning_rate"] * s["max_iters"] / (s["warmup_iters"] + 1)
        lines.append(f"SHORTENED: {s['max_iters']} of the recipe's {NANOGPT[s['preset']]['max_iters']} iterations "
                     + (f"(all of them in the {s['warmup_iters']}-step warm-up: the rate peaks at {peak:.2g})" if warm
                        else f"(the cosine over {s['max_iters']})")
                     + f": not comparable with nanoGPT's {PUBLISHED[s['preset']]}")
    for label, x in a.items():
        lines.append(f"{label}: val {_pm(x['val'], x['val_std'])} nats/char over {_seeds(len(x['runs']))} "
                     f"({s['eval_iters']} batches of {s['batch_size']}, {_sample(s)}), whole val split "
                     f"{_pm(x['val_whole'], x['val_whole_std'])}; nanoGPT published {x['published']} "
                     f"(one run, 65-character vocabulary): {x['gap']:+.4f}")
    if "preln" in a and "espa" in a:
        gap, whole = a["espa"]["val"] - a["preln"]["val"], a["espa"]["val_whole"] - a["preln"]["val_whole"]
        lines.append(f"vanilla E-SPA minus Pre-LN, val: {gap:+.4f} ({s['eval_iters']} batches), {whole:+.4f} (whole split)")
    return lines


def markdown(result):
    """table.md: provenance, the settings, one row per method beside nanoGPT's number, one per seed."""
    s, a, d = result["settings"], result["analysis"], result["data"]
    preset = s["preset"]
    lines = report.header_lines(result)
    lines += [f"- Data: {d['name']} ({d['train_tokens']:,} training / {d['val_tokens']:,} validation bytes, the "
              f"first 90% / last 10%: nanoGPT's split); losses in nats per byte = per character (ASCII)",
              f"- Recipe: nanoGPT's {preset} preset: {s['n_layer']} layers, {s['n_head']} heads, width {s['n_embd']}, "
              f"T {s['block_size']}, batch {s['batch_size']}, {s['max_iters']} iterations"
              + (" (SHORTENED)" if shortened(result) else "")
              + f", AdamW lr {s['learning_rate']:g} (warm-up {s['warmup_iters']}, cosine to {s['min_lr']:g}), "
              f"betas ({s['beta1']}, {s['beta2']}), weight decay {s['weight_decay']}, clip {s['grad_clip']}, "
              f"dropout {s['dropout']}, bias {s['bias']}; {_seeds(s['seeds'])}", "",
              "| method | model | parameters | val (eval_iters batches) | val (whole split) | train | "
              f"nanoGPT's published val | val - published | s per run | tokens/s |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for label, x in a.items():
        lines.append(f"| {label} | {result['methods'][label]['description']} | {x['params']:,} | "
                     f"{_pm(x['val'], x['val_std'])} | {_pm(x['val_whole'], x['val_whole_std'])} | "
                     f"{_pm(x['train'], x['train_std'])} | {x['published']} | {x['gap']:+.4f} | "
                     f"{report.fmt(x['seconds'], '.0f')} | {report.fmt(x['tokens_per_s'], ',.0f')} |")
    lines += ["", "Per seed:", "", "| method | seed | val | val (whole split) | train | s | tokens/s |",
              "|---|---|---|---|---|---|---|"]
    for label, x in a.items():
        lines += [f"| {label} | {r['seed']} | {report.fmt(r['val'], '.4f')} | {report.fmt(r['val_whole'], '.4f')} | "
                  f"{report.fmt(r['train'], '.4f')} | {report.fmt(r['seconds'], '.0f')} | "
                  f"{report.fmt(r['tokens_per_s'], ',.0f')} |" for r in x["runs"]]
    lines += ["", f"Means ± sample standard deviations (n - 1) over seeds. \"val\": {s['eval_iters']} fixed batches "
              f"of {s['batch_size']} random windows ({_sample(s)}; the same batches for every run); "
              "\"whole split\": every validation target once, in non-overlapping windows. s per run and "
              "tokens/s: the training steps' wall-clock, on a shared machine (see the load averages).",
              "", "## What nanoGPT reports", "", result["paper"], "", "## What nanospa measured", ""]
    lines += [f"- {line}" for line in result["findings"]]
    return "\n".join(lines) + "\n"


def main(argv=None):
    return runner.main(sys.modules[__name__], argv)
