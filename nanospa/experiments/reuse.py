"""Runs one experiment can take from another's result.json instead of training them again
(--reuse=PATH[,PATH]), e.g. longer's 400-step Pre-LN, control and E-SPA runs from fig2's.

    job_key(job)            the identity of a run: every field of its job but the method's label
    load(paths)             the runs of earlier results, by key
    take(jobs, loaded)      (runs to reuse, jobs still to train)

A run is reused only when its job is identical: the full GPTConfig, steps, learning rate,
seed, warm-up, optimiser settings, batch, evaluation batches, logging interval, data,
tokenizer, device and the batch sampler (runner.BATCHES). A GPTConfig field added after a
run was written is filled in with its default (at which, by the project's rule, a new field
changes nothing). What the key cannot see is the code: a reused run records the result and
commit it came from ("reused": {"from", "commit"}), and reuse is never implicit.

Runs of results written before the experiments shared train.py's batches (2026-12-02: their
keys name no sampler, or they have no key) drew other windows than any job today, so none
of them is ever taken: such a folder can be read, and every run of it is trained again.
Every run read is checked first (records.check): a run whose record does not match its
checksum, or a duplicate, is refused by name.
"""
import json
import sys
from pathlib import Path

from .records import RUN_FIELDS, SKIP, check, job_key  # noqa: F401 (job_key, RUN_FIELDS: reuse's API too)


def load(paths):
    """dict(keyed={key: (run, origin)}) of the runs in the result.json files (or folders
    holding one) that paths names; a missing or unreadable file is a ValueError naming it."""
    keyed = {}
    for p in paths:
        path = Path(p) / "result.json" if Path(p).is_dir() else Path(p)
        try:
            result = json.loads(path.read_text(encoding="utf-8"))
            methods = [(label, m, list(m["runs"])) for label, m in result["methods"].items()]
        except KeyError as e:
            raise ValueError(f"reuse: cannot read runs from {path} (no field {e})") from None
        except (OSError, ValueError, TypeError, AttributeError) as e:
            raise ValueError(f"reuse: cannot read runs from {path} ({type(e).__name__})") from None
        for note in check(result, path):        # every run as it was written, once each
            print(note, file=sys.stderr)
        here = {"from": str(path), "commit": (result.get("provenance") or {}).get("commit")}
        for label, m, runs in methods:
            for r in runs:
                key = _current_key(r["key"]) if r.get("key") else None
                if key:                # a run reused there keeps pointing at where it was trained
                    keyed.setdefault(key, (r, r.get("reused") or here))
    return dict(keyed=keyed)


def _current_key(key):
    """A stored key with today's GPTConfig defaults filled in for fields added since it was
    written (a new field at its default changes no run); None if the config no longer loads."""
    from ..config import GPTConfig
    try:
        job = json.loads(key)
        job["config"] = GPTConfig(**job["config"]).to_dict()
    except (TypeError, ValueError, KeyError):
        return None
    return job_key(job)


def take(jobs, loaded):
    """([(job, run)] reused, [job] to train): each reused run relabelled to its job's label
    and carrying its job's key."""
    reused, todo = [], []
    for job in jobs:
        hit = loaded["keyed"].get(job_key(job))
        if hit is None:
            todo.append(job)
            continue
        run, origin = hit
        reused.append((job, dict(run, label=job["label"], key=job_key(job), reused=dict(origin))))
    return reused, todo
