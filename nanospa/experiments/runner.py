"""The shared runner of the training experiments (python -m nanospa.experiments NAME).

One experiment module (fig2.py, table1.py, fig3.py, table2.py, longer.py) declares

    NAME, TITLE, PAPER         its name, a one-line title, what the paper reports (docs/method.md §12)
    PRESETS                    {preset: {setting: value}} on top of the runner's presets
    methods(settings)          {label: Method}: the model variants it compares
    findings(result)           lines setting the measured numbers beside the paper's claim
    analysis(result) (optional) more numbers for result.json's "analysis", before the findings
    PANELS (optional)          [(panel title, [labels])] for the plot
    OWN_PRESETS (optional)     True: PRESETS replaces the runner's presets (recipes: cpu, gpu)
    prepare(s) (optional)      checks and derives its own settings, before the runner's checks
    markdown(result) (optional)  table.md (default: report.markdown)

and the runner does the rest: methods x learning-rate grid x seeds (a process pool of
`workers` processes, each single-threaded), the best rate per method from the same grid
(lowest mean final training loss over the seeds every rate ran; a diverged run counts as +inf),
then writes

    result.json   settings, command, date, machine, time; every run with its loss history
    table.md      the command, date, machine and time; one row per method; the findings
    plot.png      training-loss curves of each method at its best rate (mean over seeds),
                  with the unigram entropy as a dashed line (needs matplotlib)

Every GPTConfig field is also a setting; set explicitly, it applies to every method (after
the method's own fields), e.g. --kernel_budget=independent or --residual_beta=0.2.

One command writes --out at a time (holding(out): out/run.lock for the whole command). A
rerun into a folder merges into its result.json after checking every run there
(records.check: a changed or duplicated run is refused, a run without a key is keyed and
kept), or refuses with one line (another experiment, other settings) unless --replace=True.

Not here: how the outputs are written and how a stall is read (report.py: provenance,
JSON, Markdown, plots, STALL_MARGIN, the findings' helpers); one training run (common.py);
a run's record, its checksum and the checks (records.py).
"""
import contextlib
import datetime
import json
import math
import multiprocessing
import os
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np

from ..run.fits import check_fits
from ..run.rundir import RunLock
from ..run.settings import check_output_dir, help_text, parse_settings, run_command, stop_on_signals, wants_help
from ..run.tokenizer import check as check_tokenizer
from . import records, reuse
from .report import (STALL_MARGIN, duration, fmt, load_average, markdown, per_byte, plot, provenance, write_json,
                     write_text)

STOPPED = "stopped: result.json holds the finished runs; the running ones were stopped"
LOSS_DECIMALS = 5     # loss histories in result.json: float32 losses, 5 decimals suffice
CURVE_POINTS = 1000   # at most about this many training-loss records per run
BATCHES = "data.get_batch"   # the batch sampler, in every job's key (experiments/common.py)

DEFAULTS = dict(
    preset="quick",
    data="default",
    tokenizer="byte",
    out="",
    seeds=1,
    lrs=(1e-3, 3e-3),
    steps=400,
    batch_size=8,
    block_size=64,
    n_layer=24,
    n_head=2,
    n_embd=64,
    dtype="float32",
    device="cpu",
    workers=2,
    warmup=0,
    min_lr_ratio=0.1,
    weight_decay=0.0,
    grad_clip=1.0,
    eval_batches=8,
    methods="",
    reuse="",
    replace=False,
)
NOTES = dict(
    preset="tiny (CI, seconds) | quick (2-core CPU, <= ~15 min) | study (quick, 3 seeds, every method) | full (one GPU)",
    data="dataset: default (embedded corpus) | PATH | shakespeare[:FILE] | wikitext2[:...]",
    tokenizer="byte | bpe:N (byte-level BPE of N tokens trained on the train split; extra [bpe]; losses also per byte)",
    out="output folder (default out/NAME)",
    seeds="seeds per (method, learning rate): 0 .. seeds-1",
    lrs="learning-rate grid shared by every method, e.g. 1e-3,3e-3",
    steps="optimiser steps per run",
    batch_size="sequences per step",
    block_size="tokens per sequence (T)",
    n_layer="blocks (L)",
    n_head="attention heads",
    n_embd="width",
    dtype="float32 | float64",
    device="cpu | cuda",
    workers="parallel training processes (each single-threaded); 0 = in this process",
    warmup="linear warm-up steps; 0 = steps // 10",
    min_lr_ratio="cosine decay ends at lr * min_lr_ratio",
    weight_decay="AdamW decoupled weight decay",
    grad_clip="global gradient-norm clip",
    eval_batches="fixed batches for the final train / val losses",
    methods="comma-separated subset of the methods to run (default: the preset's)",
    reuse="result.json files (or their folders), comma-separated, whose runs of an identical job are taken, not retrained (reuse.py)",
    replace="discard the results --out already holds (by default a rerun merges into them: their identical runs are kept, not retrained)",
)
PRESETS = dict(
    tiny=dict(n_layer=4, n_embd=16, n_head=2, block_size=16, batch_size=2, steps=3, lrs=(1e-3,),
              seeds=1, workers=0, eval_batches=1, device="cpu"),
    quick=dict(n_layer=24, n_embd=64, n_head=2, block_size=64, batch_size=8, steps=400,
               lrs=(1e-3, 3e-3), seeds=1, workers=2, eval_batches=8, device="cpu"),
    # study: the quick scale with 3 seeds (mean ± std in tables, bands in plots) and the
    # experiment's full method list (fig2, longer: the positional controls; docs/positions.md)
    study=dict(n_layer=24, n_embd=64, n_head=2, block_size=64, batch_size=8, steps=400,
               lrs=(1e-3, 3e-3), seeds=3, workers=2, eval_batches=8, device="cpu"),
    # full: the paper's depth with a width and context one GPU trains at ~0.28 s/step (train.py's
    # gpu preset, H200); there E-SPA diverged at lr >= 3e-4, hence the low end of the grid.
    # Not run by nanospa yet: about 40 runs x 2000 steps x 0.28 s = 6 h for fig2. The 2 MB
    # default corpus overfits at this size: pass --data=wikitext103 (the paper's data set).
    full=dict(n_layer=36, n_embd=512, n_head=8, block_size=256, batch_size=32, steps=2000,
              lrs=(3e-5, 1e-4, 3e-4, 1e-3), seeds=2, workers=0, eval_batches=20, device="cuda"),
)

# Building blocks of the compared models (docs/method.md §2.2, §12).
VANILLA = dict(residual="none", norm="none", pos="none", activation="tat_lrelu")
PRE_LN = dict(attention="softmax", residual="standard", norm="layernorm", pos="learned",
              activation="gelu")
NAMES = dict(softmax="standard attention", value_skipinit="Value-SkipInit", uspa="U-SPA",
             espa="E-SPA")


@dataclass
class Method:
    """One compared model: GPTConfig fields on top of the base (depth, width, T, dtype),
    a description for the table, a multiple of the run length, optionally its own
    learning-rate grid (default: the shared --lrs) and optimiser settings (the keys of
    nanospa.beyond.optimizers.OPTIMIZER_DEFAULTS, e.g. optimizer="kfac"; default AdamW)."""
    config: dict
    description: str
    steps_factor: int = 1
    extra: dict = field(default_factory=dict)
    lrs: tuple = ()
    optimizer: dict = field(default_factory=dict)
    warmup: int = None          # warm-up steps of this method; None: the runner's --warmup (0 = none here)
    whole_val: bool = False     # also the loss over the whole validation split (common.train_run)

    def grid(self, settings):
        return tuple(self.lrs) or tuple(settings["lrs"])


# ------------------------------------------------------------------ settings

def _config_fields():
    from ..config import GPTConfig
    base = GPTConfig()
    return {f.name: getattr(base, f.name) for f in fields(GPTConfig)}


BASE_FIELDS = ("n_layer", "n_head", "n_embd", "block_size", "dtype")


def presets_of(spec):
    """{preset: settings} of experiment `spec`: the runner's presets with its own on top, or
    its own alone when it declares OWN_PRESETS."""
    own = getattr(spec, "PRESETS", {})
    if getattr(spec, "OWN_PRESETS", False):
        return {name: dict(p) for name, p in own.items()}
    return {name: {**p, **own.get(name, {})} for name, p in PRESETS.items()}


def settings_for(spec, argv):
    """Parse argv for experiment `spec`: runner defaults < spec extras < preset < argv."""
    cfg_fields = {k: v for k, v in _config_fields().items() if k not in DEFAULTS and k != "vocab_size"}
    defaults = {**DEFAULTS, **getattr(spec, "EXTRA", {}), **cfg_fields}
    presets = presets_of(spec)
    keys = set().union(*presets.values())          # a preset sets every key any preset sets
    presets = {name: {k: p.get(k, defaults[k]) for k in keys} for name, p in presets.items()}
    defaults.update(presets[defaults["preset"]])
    s = parse_settings(argv, defaults, presets)
    s["config_overrides"] = {k: s[k] for k in cfg_fields if k in s["_explicit"]}
    if hasattr(spec, "prepare"):
        spec.prepare(s)                            # its own settings' checks and derived values
    check_tokenizer(s["tokenizer"])                # bpe:N: a bad spec or a missing package, before any work
    for key in ("seeds", "steps", "batch_size", "eval_batches"):
        if s[key] < 1:
            raise ValueError(f"{key} must be >= 1, got {s[key]}")
    if s["workers"] < 0 or s["warmup"] < 0:
        raise ValueError(f"workers and warmup must be >= 0, got {s['workers']}, {s['warmup']}")
    for key, ok, what in (("min_lr_ratio", lambda v: 0 <= v <= 1, "in [0, 1] (the decay ends at lr * min_lr_ratio)"),
                          ("weight_decay", lambda v: 0 <= v < math.inf, "finite and >= 0"),
                          ("grad_clip", lambda v: 0 <= v < math.inf, "finite and >= 0 (0 = off)")):
        if not ok(s[key]):
            raise ValueError(f"{key} must be {what}, got {s[key]!r}")
    if not s["lrs"] or any(not (math.isfinite(lr) and lr > 0) for lr in s["lrs"]):
        raise ValueError(f"lrs must be positive numbers, got {s['lrs']}")
    if s["device"] not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {s['device']!r}")
    s["out"] = s["out"] or os.path.join("out", spec.NAME)
    check_output_dir(s["out"], "out")              # a file there: refused before any data or training
    return s


def selected_methods(spec, s):
    """spec.methods(s), or the subset --methods names, in the order it names them."""
    methods = spec.methods(s)
    if s["methods"]:
        wanted = [m.strip() for m in s["methods"].split(",") if m.strip()]
        unknown = [m for m in wanted if m not in methods]
        if unknown:
            raise ValueError(f"unknown method {unknown[0]!r} for {spec.NAME}; methods: {', '.join(methods)}")
        methods = {k: methods[k] for k in wanted}
    return methods


def model_config(s, method, vocab_size):
    """The GPTConfig of one method: base fields, the method's fields, explicit overrides."""
    from ..config import GPTConfig
    d = {k: s[k] for k in BASE_FIELDS}
    d.update(method.config)
    d.update(s["config_overrides"])
    return GPTConfig(vocab_size=vocab_size, **d)


# ------------------------------------------------------------------ runs

_DATA = {}


def _dataset(spec, tokenizer="byte"):
    import data as nanospa_data
    if (spec, tokenizer) not in _DATA:
        _DATA[spec, tokenizer] = nanospa_data.load_dataset(spec, tokenizer=tokenizer)
    return _DATA[spec, tokenizer]


def train_job(job):
    """Train one (method, lr, seed); runs in a worker process or in this one."""
    from .. import backend
    from ..config import GPTConfig
    from .common import train_run
    from ..run.malloc import keep_freed_memory
    backend.use(job["device"])
    keep_freed_memory()                    # as train.py: no page faults from each step's arrays
    ds = _dataset(job["data"], job.get("tokenizer", "byte"))
    cfg = GPTConfig(**job["config"])
    r = train_run(cfg, ds.train, ds.val, steps=job["steps"], lr=job["lr"], seed=job["seed"],
                  batch_size=job["batch_size"], warmup=job["warmup"],
                  min_lr_ratio=job["min_lr_ratio"], weight_decay=job["weight_decay"],
                  grad_clip=job["grad_clip"], eval_batches=job["eval_batches"],
                  log_every=job["log_every"], optimizer=job["optimizer"], whole_val=job.get("whole_val", False))
    r["label"] = job["label"]
    r["history"] = [(it, round(loss, LOSS_DECIMALS)) for it, loss in r["history"]]
    return r


def _pool(workers):
    """Spawned, single-threaded workers: BLAS threads would fight over the few cores."""
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_one_thread)


def _one_thread():
    from .. import backend


def make_jobs(s, methods, configs):
    """One job per (method, learning rate, seed): plain dicts, so that they pickle to a worker.
    A method's steps_factor stretches its run and its warm-up alike."""
    jobs = []
    for label, m in methods.items():
        steps = s["steps"] * m.steps_factor
        for lr in m.grid(s):
            for seed in range(s["seeds"]):
                jobs.append(dict(label=label, config=configs[label], steps=steps, lr=lr, seed=seed,
                                 optimizer=dict(m.optimizer),
                                 batch_size=s["batch_size"],
                                 warmup=m.warmup if m.warmup is not None else (s["warmup"] * m.steps_factor or None),
                                 min_lr_ratio=s["min_lr_ratio"], weight_decay=s["weight_decay"],
                                 grad_clip=s["grad_clip"], eval_batches=s["eval_batches"],
                                 log_every=max(1, steps // CURVE_POINTS), data=s["data"], device=s["device"],
                                 tokenizer=s["tokenizer"], batches=BATCHES,
                                 **({"whole_val": True} if m.whole_val else {})))   # not in older jobs' keys
    return jobs


def run_jobs(jobs, workers, on_result):
    """Run jobs (longest first) and call on_result(job, result) as each finishes; a signal
    ends the running jobs too (the caller's stop_on_signals raises KeyboardInterrupt)."""
    jobs = sorted(jobs, key=lambda j: -j["steps"])
    if not jobs:
        return
    if workers <= 0 or len(jobs) == 1:
        for job in jobs:
            on_result(job, train_job(job))
        return
    with _pool(min(workers, len(jobs))) as pool:
        pending = {pool.submit(train_job, job): job for job in jobs}
        try:
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    on_result(pending.pop(fut), fut.result())
        except BaseException:
            for proc in list((getattr(pool, "_processes", None) or {}).values()):
                proc.terminate()                   # the running jobs too: no orphan keeps a core busy
            pool.shutdown(wait=False, cancel_futures=True)
            raise




def best_rate(runs, lrs):
    """{lr: mean final train loss over seeds (inf if any seed diverged)} and the best lr: of the
    rates no seed of which diverged, the lowest mean over the seeds every rate ran (seeds added
    at one rate afterwards, as optimisers.py's seeds at the best, do not move the choice unless
    one diverges; all seeds when no seed is common)."""
    def mean(lr, seeds=None):
        losses = [r["final_train"] for r in runs if r["lr"] == lr and (seeds is None or r.get("seed") in seeds)]
        return (float(np.mean(losses)) if all(math.isfinite(x) for x in losses) else math.inf) if losses else None
    by_lr = {lr: mean(lr) for lr in lrs if mean(lr) is not None}
    common = set.intersection(*({r.get("seed") for r in runs if r["lr"] == lr} for lr in by_lr)) if by_lr else set()
    finite = {lr: mean(lr, common or None) for lr, v in by_lr.items() if math.isfinite(v)}
    return by_lr, (min(finite, key=finite.get) if finite else None)


def summarise_method(runs, lrs, unigram):
    """A method's numbers at its best rate: mean (and std) final losses over seeds, the gap to
    the unigram entropy, stalled (the gap < STALL_MARGIN), the mean training-loss curve."""
    by_lr, lr = best_rate(runs, lrs)
    out = dict(by_lr={repr(k): v for k, v in by_lr.items()}, best_lr=lr)
    if lr is None:
        return dict(out, final_train=math.nan, final_val=math.nan, final_train_std=math.nan,
                    below_unigram=math.nan, stalled=None, curve=[])
    best = [r for r in runs if r["lr"] == lr]
    train = [r["final_train"] for r in best]
    val = [r["final_val"] for r in best]
    its = [it for it, _ in best[0]["history"]]
    curve = [[it, round(float(np.mean([dict(r["history"]).get(it, math.nan) for r in best])), LOSS_DECIMALS)]
             for it in its]
    mean = float(np.mean(train))
    # CPU seconds where recorded: a single-threaded worker's cost, whatever else shares the machine
    times = [r.get("cpu_seconds", r.get("seconds")) for r in best]
    step_seconds = (float(np.median([t / max(1, r["steps_done"]) for t, r in zip(times, best)]))
                    if None not in times else math.nan)
    return dict(out, final_train=mean, final_train_std=float(np.std(train)), step_seconds=step_seconds,
                final_val=float(np.mean(val)), below_unigram=unigram - mean,
                stalled=bool(unigram - mean < STALL_MARGIN), curve=curve)


# ------------------------------------------------------------------ the command

RESULT_FILES = ("result.json", "table.md", "init.json", "init.md")   # written through NAME.PID.tmp (report.py)
_HELD = set()        # the folders this process holds: budget's init check and its training share one lock


@contextlib.contextmanager
def holding(out):
    """One writer per result folder: --out is locked for the whole command (out/run.lock, the
    lock of train.py's out_dir: flock, released by the kernel when its holder dies), so a second
    command into it stops at once with one line naming the holder, before any data is read or
    anything trained; a folder this process already holds is not locked twice."""
    key = os.path.realpath(out)
    if key in _HELD:
        yield
        return
    with RunLock(out, key="out", temporaries=RESULT_FILES) as lock:
        for note in lock.notes:
            print(note, file=sys.stderr)
        _HELD.add(key)
        try:
            yield
        finally:
            _HELD.discard(key)


def run(spec, argv):
    if wants_help(argv):
        defaults = {**DEFAULTS, **getattr(spec, "EXTRA", {})}
        if getattr(spec, "OWN_PRESETS", False):      # its default preset's values; not what it derives
            defaults.update({k: v for k, v in presets_of(spec)[defaults["preset"]].items() if k in defaults})
            defaults = {k: v for k, v in defaults.items() if k not in getattr(spec, "DERIVED", {})}
        print(help_text(f"python -m nanospa.experiments {spec.NAME} [--key=value ...]: {spec.TITLE}",
                        defaults, {**NOTES, **getattr(spec, "EXTRA_NOTES", {})},
                        presets_of(spec))
              + "\nEvery GPTConfig field is a setting too; set explicitly, it applies to every method.")
        return 0
    t0 = time.time()
    started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    s = settings_for(spec, argv)
    with holding(s["out"]):                       # a second command into --out: one line, nothing trained
        return _run(spec, argv, s, t0, started)


def _run(spec, argv, s, t0, started):
    import data as nanospa_data
    s["_load_start"] = load_average()
    reusable = reuse.load([p for p in s["reuse"].split(",") if p.strip()])   # a bad path: error before any work
    ds = _dataset(s["data"], s["tokenizer"])       # builds the token cache (and BPE) once, before any worker
    nanospa_data.check_length(ds, s["block_size"])
    unigram = float(nanospa_data.unigram_entropy(ds.train, ds.vocab_size))
    methods = selected_methods(spec, s)
    unused = [k for k in BASE_FIELDS if k in s["_explicit"] and all(k in m.config for m in methods.values())]
    if unused:                                     # each method sets its own: say so, the table shows theirs
        print(f"note: {', '.join(f'--{k}={s[k]}' for k in unused)} applies to no method here: each sets its own "
              "(table.md reports what each trained)", file=sys.stderr)
    from ..signal.budget import make_plan
    configs, plans = {}, {}
    for label, m in methods.items():
        cfg = model_config(s, m, ds.vocab_size)
        check_fits(cfg, s["batch_size"], s["device"],  # a size this machine cannot hold: refused now
                   kfac=m.optimizer.get("optimizer") == "kfac")
        plans[label] = dict(make_plan(cfg).info)   # surfaces plan errors before any training
        configs[label] = cfg.to_dict()
    out = Path(s["out"])
    held = held_result(out, spec, s, methods, configs)       # a rerun merges into it (or refuses)
    out.mkdir(parents=True, exist_ok=True)
    public = {k: (list(v) if isinstance(v, tuple) else v) for k, v in s.items() if not k.startswith("_")}
    result = dict(name=spec.NAME, title=spec.TITLE, paper=spec.PAPER, complete=False, settings=public,
                  data=dict(spec=s["data"], name=ds.name, description=ds.description,
                            train_tokens=int(len(ds.train)), val_tokens=int(len(ds.val)),
                            vocab_size=int(ds.vocab_size), unigram_entropy=unigram, tokenizer=s["tokenizer"],
                            bytes_per_token=dict(ds.bytes_per_token)),
                  methods={label: dict(description=m.description, config=configs[label], plan=plans[label],
                                       steps=s["steps"] * m.steps_factor, runs=[], extra=m.extra,
                                       lrs=list(m.grid(s)), optimizer=dict(m.optimizer))
                           for label, m in methods.items()},
                  findings=[])
    if hasattr(spec, "at_init"):                   # e.g. kernels at initialisation, before any training
        result["at_init"] = spec.at_init(s, configs, ds)
    jobs = make_jobs(s, methods, configs)
    own, kept = merge_held(result, held, jobs)     # this folder's identical runs, and its other ones
    taken, todo = reuse.take([j for j in jobs if reuse.job_key(j) not in own], reusable)
    print(f"{spec.NAME}: {len(methods)} methods x their learning rates x {s['seeds']} seeds "
          f"= {len(jobs)} runs on {s['data']} (unigram entropy {unigram:.3f})"
          + (f", {len(own)} of them already in {out / 'result.json'}" if own else "")
          + (f" (and {kept} more runs kept there)" if kept else "")
          + (f", {len(taken)} of them reused" if taken else "") + f"; writing {out}/")
    done = [0]

    def on_result(job, r, stopper=None, was_held=False):
        """Record a finished run, sealed with its checksum (records.py): in result.json (an
        atomic write) before the line that says so, and a signal that comes meanwhile waits
        until both are done."""
        with stopper.held() if stopper else contextlib.nullcontext():
            done[0] += 1
            r.setdefault("key", reuse.job_key(job))
            result["methods"][job["label"]]["runs"].append(records.seal(r))
            result["provenance"] = provenance(spec.NAME, argv, s, started, t0)
            write_json(out / "result.json", result)    # partial results survive an interruption
            print(f"[{done[0]}/{len(jobs)}] {job['label']:<16} lr={job['lr']:<8g} seed={job['seed']} "
                  f"train {fmt(r['final_train'])} val {fmt(r['final_val'])}"
                  f"{' DIVERGED' if r['diverged'] else ''} "
                  + ("(kept)" if was_held else f"(reused from {r['reused']['from']})" if r.get("reused") else
                     f"({r['seconds']:.0f} s)"), flush=True)

    if s["device"] != "cpu":
        from .. import backend
        backend.use(s["device"])                   # fail here, not in a worker
    for job in jobs:
        if reuse.job_key(job) in own:
            on_result(job, dict(own[reuse.job_key(job)]), was_held=True)
    for job, r in taken:
        on_result(job, r)
    with stop_on_signals(STOPPED) as stopper:
        run_jobs(todo, s["workers"], lambda job, r: on_result(job, r, stopper))
    for label, m in result["methods"].items():
        m["runs"].sort(key=lambda r: (r["lr"], r["seed"]))
        runs = records.check_unique(m["runs"], label)            # a duplicate is not another seed
        m["summary"] = per_byte(summarise_method(runs, m["lrs"], unigram), ds.bytes_per_token)
    result["analysis"] = spec.analysis(result) if hasattr(spec, "analysis") else {}   # e.g. longer's ratios
    result["findings"] = list(spec.findings(result))
    result["complete"] = True
    result["provenance"] = provenance(spec.NAME, argv, s, started, t0)
    write_json(out / "result.json", result)
    write_text(out / "table.md", getattr(spec, "markdown", markdown)(result))
    wrote = draw(spec, result, out)
    print("\n".join(f"  {line}" for line in result["findings"]))
    print(f"wrote {out / 'result.json'}, {out / 'table.md'}" + (f", {out / 'plot.png'}" if wrote else "")
          + f" in {duration(time.time() - t0)}")
    return 0


RUN_SETTINGS = ("data", "tokenizer", "batch_size", "min_lr_ratio", "weight_decay", "grad_clip", "eval_batches",
                "warmup", "device")   # settings that enter every run: a folder's runs must share them


def held_result(out, spec, s, methods, configs):
    """The result.json out already holds, or None (none, or --replace=True). One line, and no
    training, when it cannot take this command's runs: unreadable, another experiment, or
    runs made with other settings of a method both have."""
    path = out / "result.json"
    if s["replace"] or not path.exists():
        return None
    try:
        held = json.loads(path.read_text(encoding="utf-8"))
        name, old_methods, old = held["name"], held["methods"], held["settings"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path} cannot be read ({type(e).__name__}): choose another --out, or pass "
                         "--replace=True to write over it") from None
    try:
        notes = records.check(held, path)        # a changed or duplicated run: refused by name
    except (KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{path} cannot be read ({type(e).__name__}: {e}): choose another --out, or pass "
                         "--replace=True to write over it") from None
    for note in notes:
        print(note, file=sys.stderr)
    why = []
    if name != spec.NAME:
        why.append(f"it holds {name}, not {spec.NAME}")
    why += [f"{k}={old.get(k)!r} there, {s[k]!r} here" for k in RUN_SETTINGS if old.get(k, s[k]) != s[k]]
    for label, m in methods.items():
        if label in old_methods and (old_methods[label].get("config") != configs[label]
                                     or old_methods[label].get("steps") != s["steps"] * m.steps_factor
                                     or dict(old_methods[label].get("optimizer") or {}) != dict(m.optimizer)):
            why.append(f"method {label} is another model there")
    if why:
        raise ValueError(f"{path} holds results this command would not merge with ({'; '.join(why)}): choose "
                         "another --out, or pass --replace=True to discard them")
    return held


def merge_held(result, held, jobs):
    """-> ({job key: run} of held runs of this command's jobs, count of other held runs kept):
    methods held but not run now are carried over, and so are held runs of another rate or
    seed of a method run now (its grid becomes the union of both)."""
    if not held:
        return {}, 0
    keys = {reuse.job_key(j) for j in jobs}
    slots = {(j["label"], j["lr"], j["seed"]) for j in jobs}
    own, kept = {}, 0
    for label, m in held["methods"].items():
        runs = [dict(r) for r in m.get("runs", ())]     # every one has a key (records.check)
        # every rate a held run has is in the grid: the summary reads the grid's rates only (a
        # method written before per-method grids has none: the settings' grid was its own)
        grid = set(m.get("lrs") or held["settings"].get("lrs") or ()) | {r["lr"] for r in runs}
        mine = result["methods"].get(label)
        if mine is None:                           # a method of the held results only
            result["methods"][label] = dict(m, runs=runs, lrs=sorted(grid))
            kept += len(runs)
            continue
        mine["lrs"] = sorted(set(mine["lrs"]) | grid)
        for r in runs:
            key = reuse._current_key(r["key"]) or r["key"]
            if key in keys:
                own[key] = r
            elif (label, r["lr"], r["seed"]) in slots:
                raise ValueError(f"{result['settings']['out']}/result.json holds a run of {label} at lr {r['lr']:g}, "
                                 f"seed {r['seed']} made differently (another batch sampler, or settings that "
                                 "changed): choose another --out, or pass --replace=True to discard them")
            else:
                mine["runs"].append(r)
                kept += 1
    return own, kept


def rerender(spec, out):
    """Rewrite table.md and plot.png (and the findings in result.json) of a finished run from
    its result.json, e.g. after a change to the findings' wording. No training."""
    with holding(out):                            # one writer per result folder
        return _rerendered(spec, Path(out))


def _rerendered(spec, out):
    result = json.loads((out / "result.json").read_text(encoding="utf-8"))
    for note in records.check(result, out / "result.json"):   # a changed or duplicated run: refused
        print(note, file=sys.stderr)
    result["analysis"] = spec.analysis(result) if hasattr(spec, "analysis") else {}
    result["findings"] = list(spec.findings(result))
    write_json(out / "result.json", result)
    write_text(out / "table.md", getattr(spec, "markdown", markdown)(result))
    draw(spec, result, out)
    return result


def draw(spec, result, out):
    """plot.png of `result` -> whether it was drawn. Without matplotlib, a plot.png of the
    folder's earlier results is removed (it would stand beside a table it does not show)."""
    path = Path(out) / "plot.png"
    wrote = getattr(spec, "plot", plot)(result, path, getattr(spec, "PANELS", None))
    if not wrote and path.exists():
        path.unlink()
        print(f"removed {path}: it drew the results before this command's, and cannot be drawn again here "
              "(rerender it where matplotlib is installed)")
    return wrote


def main(spec, argv=None):
    """Entry point of one experiment module: bad settings, data, device or output folder, a
    full disk, out of memory -> one error: line on stderr, exit 2 (settings.run_command)."""
    return run_command(run, spec, sys.argv[1:] if argv is None else list(argv))
