"""Runs one experiment can take from another's result.json instead of training them again
(--reuse=PATH[,PATH]), e.g. longer's 400-step Pre-LN, control and E-SPA runs from fig2's.

    job_key(job)            the identity of a run: every field of its job but the method's label
    load(paths)             {key: (run, source)} from earlier results' runs that carry a key
    take(jobs, reusable)    (runs to reuse, jobs still to train)

A run is reused only when its job is identical: the full GPTConfig, steps, learning rate,
seed, warm-up, optimiser settings, batch, evaluation batches, logging interval, data,
tokenizer and device. What the key cannot see is the code: a reused run records the
result and commit it came from ("reused": {"from", "commit"}), and reuse is never
implicit. Runs written before keys existed carry none and are never reused.
"""
import json
from pathlib import Path

SKIP = ("label",)     # one run may serve several experiments under another label


def job_key(job):
    return json.dumps({k: v for k, v in job.items() if k not in SKIP}, sort_keys=True)


def load(paths):
    """{key: (run, source)} of every keyed run in the result.json files (or folders holding
    one) that paths names; a missing or unreadable file is a ValueError naming it."""
    out = {}
    for p in paths:
        path = Path(p) / "result.json" if Path(p).is_dir() else Path(p)
        try:
            result = json.loads(path.read_text(encoding="utf-8"))
            runs = [r for m in result["methods"].values() for r in m["runs"]]
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"reuse: cannot read runs from {path} ({type(e).__name__})") from None
        commit = (result.get("provenance") or {}).get("commit")
        for r in runs:
            if r.get("key"):       # a run reused there keeps pointing at where it was trained
                origin = r.get("reused") or {"from": str(path), "commit": commit}
                out.setdefault(r["key"], (r, origin))
    return out


def take(jobs, reusable):
    """([(job, run)] reused, [job] to train): each reused run relabelled to its job's label."""
    reused, todo = [], []
    for job in jobs:
        hit = reusable.get(job_key(job))
        if hit is None:
            todo.append(job)
            continue
        run, origin = hit
        reused.append((job, dict(run, label=job["label"], reused=dict(origin))))
    return reused, todo
