"""A run's record in result.json, and the checks every reader of one applies before it counts
a run: merging into a folder (runner.held_result), --reuse (reuse.load), rerender.

    job_key(job)           the identity of a run: every field of its job but the label
    checksum(run)          the sha256 of the record's canonical JSON, its "checksum" left out
    seal(run)              -> the record with its checksum (runner.on_result, as it is written)
    legacy_key(result, label, run)   the key of a run written before runs had keys, rebuilt
                           from what its result.json recorded (settings, the method's config,
                           steps and optimiser, the run's rate and seed)
    check(result, path)    -> notes; ValueError naming the first run that cannot be counted

What check refuses, by file, method, rate and seed:

    a run whose record does not match its own checksum: its numbers were edited (by hand, or
        by a merge tool) or damaged after it was written; an average over it would be wrong
    two runs of one method at one rate and seed: a duplicate counted twice would stand for
        two seeds in every mean and standard deviation
    a run that lacks a field every run has (RUN_FIELDS)

and what it repairs, with a note: a run written before keys gets legacy_key (so a merge keeps
it rather than dropping it), and a run written before checksums gets sealed. A rebuilt key
names the former batch sampler (LEGACY_BATCHES), which no job today has: such a run is kept
and counted, never taken for a new job (reuse.py). Runs of results written since keys and
checksums pass unchanged.

Not here: which runs are taken from other results (reuse.py), the merge (runner.merge_held).
"""
import hashlib
import json

import numpy as np

SKIP = ("label",)     # not in a job's key: one run may serve several experiments under another label
RUN_FIELDS = ("lr", "seed", "history", "final_train", "final_val", "diverged")   # what every run holds
CURVE_POINTS = 1000             # runner.CURVE_POINTS: a run logs every max(1, steps // this) steps
LEGACY_BATCHES = "the experiments' own sampler, before 2026-12-02"   # runner.BATCHES before keys
KEY_FROM = "rebuilt from the recorded settings (written before job keys)"


def job_key(job):
    """The identity of a run: every field of its job but the method's label (reuse.py)."""
    return json.dumps({k: v for k, v in job.items() if k not in SKIP}, sort_keys=True)


def _plain(x):
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"a run record holds a {type(x).__name__}")


def checksum(run):
    """sha256 (hex) of the record without "checksum", as canonical JSON: sorted keys, tuples as
    lists, floats as Python writes them (what result.json holds reads back to the same text)."""
    body = {k: v for k, v in run.items() if k != "checksum"}
    text = json.dumps(body, sort_keys=True, allow_nan=True, separators=(",", ":"), default=_plain)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def seal(run):
    """The record with its checksum set (in place; -> run)."""
    run["checksum"] = checksum(run)
    return run


def legacy_key(result, label, run):
    """The job key of a run written before keys, from its result.json: every job field the
    runner uses (runner.make_jobs), with the former sampler. The warm-up is the runner's rule
    from the recorded --warmup (the methods of those results had no warm-up of their own)."""
    s, m = result["settings"], result["methods"][label]
    factor = max(1, m["steps"] // s["steps"])
    steps = m["steps"]
    job = dict(label=label, config=m["config"], steps=steps, lr=run["lr"], seed=run["seed"],
               optimizer=dict(m.get("optimizer") or {}), batch_size=s["batch_size"],
               warmup=s.get("warmup", 0) * factor or None, min_lr_ratio=s["min_lr_ratio"],
               weight_decay=s["weight_decay"], grad_clip=s["grad_clip"], eval_batches=s["eval_batches"],
               log_every=max(1, steps // CURVE_POINTS), data=s["data"], device=s["device"],
               tokenizer=s.get("tokenizer", "byte"), batches=LEGACY_BATCHES)
    return job_key(job)


def _name(label, run):
    lr, seed = run.get("lr"), run.get("seed")
    lr = f"{lr:g}" if isinstance(lr, (int, float)) and not isinstance(lr, bool) else repr(lr)
    return f"the run of {label} at lr {lr}, seed {seed!r}"


def check(result, path):
    """Check every run of `result` (read from `path`) before it is counted; add the key and
    checksum of a run written before them, in place. -> notes (one line each); ValueError
    naming the file and the first run that cannot be counted."""
    notes, keyed, sealed = [], 0, 0
    for label, m in result["methods"].items():
        seen = set()
        for run in m.get("runs", ()):
            if not isinstance(run, dict):
                raise ValueError(f"{path}: a run of {label} is not a record ({type(run).__name__}): "
                                 "repair or remove it, or pass --replace=True")
            missing = [f for f in RUN_FIELDS if f not in run]
            if missing:
                raise ValueError(f"{path}: {_name(label, run)} has no field {missing[0]!r}: repair or remove it, "
                                 "or pass --replace=True")
            if "checksum" in run and run["checksum"] != checksum(run):
                raise ValueError(f"{path}: {_name(label, run)} does not match its checksum: its record was changed "
                                 "after it was written (edited by hand, or damaged); restore it from where it came "
                                 "from, remove it, or pass --replace=True")
            slot = (run["lr"], run["seed"])
            if slot in seen:
                raise ValueError(f"{path}: {_name(label, run)} is there twice: a duplicate would count as another "
                                 "seed in every mean; remove one, or pass --replace=True")
            seen.add(slot)
            if not run.get("key"):
                run["key"], run["key_from"] = legacy_key(result, label, run), KEY_FROM
                keyed += 1
            if "checksum" not in run:
                seal(run)
                sealed += 1
    if keyed:
        notes.append(f"note: {path}: {keyed} run(s) had no key, written before job keys: keyed from the recorded "
                     "settings and kept (never reused for a new job: they drew other batches)")
    if sealed:
        notes.append(f"note: {path}: {sealed} run(s) had no checksum, written before checksums: sealed as they are")
    return notes


def check_unique(runs, label):
    """ValueError when two of a method's runs share a rate and seed (a mean would count one twice)."""
    slots = [(r["lr"], r["seed"]) for r in runs]
    for slot in slots:
        if slots.count(slot) > 1:
            raise ValueError(f"{label} holds two runs at lr {slot[0]:g}, seed {slot[1]}: a duplicate is not "
                             "another seed")
    return runs
