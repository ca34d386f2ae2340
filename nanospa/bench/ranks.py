"""python -m nanospa.bench.ranks [--key=value ...]: ranks against threads, side by side.

Runs the same training step (forward, backward, all-reduce, AdamW) of one configuration
(bench_measure.CONFIGS, default "ref": vocab 256, T 256, 12 layers, width 256, batch 8,
vanilla E-SPA, float32) in several layouts, RANKS x THREADS (--layouts=1x1,1x2,2x1: one
process with one thread, one process with two threads as train.py runs today, two MPI
processes with one thread each), one fresh job per layout, in rounds whose order alternates
so that drift of a shared machine hits every layout alike. One rank runs without mpiexec.
Per layout it reports

    tokens/s        B * T / median step time (the whole step, on rank 0)
    all-reduce      median seconds per step in World.allreduce_grads after a barrier, so
                    that waiting for a slower rank is not counted as communication; both
                    the non-blocking requests train.py uses and a plain blocking Allreduce
                    (alternate steps)
    wait            median seconds per step in that barrier (imbalance between the ranks)
    pure all-reduce the gradients' all-reduce alone, no compute: the bus bandwidth
                    2 (N-1)/N * G / t of the machine, G = gradient bytes

and the cost model of docs/distributed.md, t(N) = t_compute(1x1) / N + t_optimiser +
2 (N-1)/N * G / bandwidth, with the measured pure-all-reduce bandwidth, against the
measured multi-rank step, term by term.

BLAS is single-threaded in every layout (the threads are nanospa's batch slices). Not here:
the collectives (distributed.py), the single-process benchmark with MFU and PyTorch (bench/command.py).
"""
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

from .. import backend
from .measure import CONFIGS, OPTIM, make_batch, make_config
from ..run.distributed import world as get_world
from ..model import GPT
from ..optim import AdamW
from ..run.settings import SettingsError, help_text, parse_settings, run_command, source_notes, wants_help
from ..run.threads import set_threads, sharded_backward

DEFAULTS = dict(
    config="ref",              # a configuration of bench_measure.CONFIGS
    dtype="float32",           # float32 | float64
    layouts=("1x1", "1x2", "2x1"),   # RANKSxTHREADS, comma-separated
    steps=4,                   # timed steps per layout and round
    warmup=1,                  # untimed steps first (per job)
    rounds=2,                  # rounds over the layouts, order alternating
    pure_reps=5,               # all-reduces of the gradients alone, per job
    json=False,                # print machine-readable results
    worker=False,              # internal: this process is one job of a layout
    threads=1,                 # internal: the worker's threads
)


def parse_layout(text):
    ranks, sep, threads = text.partition("x")
    if not (sep and ranks.isdigit() and threads.isdigit() and int(ranks) > 0 and int(threads) > 0):
        raise SettingsError(f"layout {text!r} must look like RANKSxTHREADS, e.g. 2x1")
    return int(ranks), int(threads)


def worker(s):
    """One job: time s['steps'] steps on this layout; rank 0 prints one JSON line."""
    world = get_world()
    cfg, B = make_config(s["config"], {}, s["dtype"])
    world.check_batch(B)
    set_threads(s["threads"])
    model = GPT(cfg, seed=0)
    params = model.parameters()
    opt = AdamW(params, **OPTIM)
    idx, targets = (world.shard(a) for a in make_batch(cfg, B))
    loss = lambda x, y: model(x, y)[1]  # noqa: E731
    rows = []
    for step in range(s["warmup"] + s["steps"]):
        world.nonblocking = step % 2 == 0
        t0 = time.perf_counter()
        sharded_backward(loss, idx, targets)
        t1 = time.perf_counter()
        world.barrier()                           # the slower rank's compute is not communication
        t2 = time.perf_counter()
        world.allreduce_grads(params)
        t3 = time.perf_counter()
        opt.step()                                # (no clipping: as bench/measure.py's step)
        opt.zero_grad()
        if step >= s["warmup"]:
            rows.append(dict(step=time.perf_counter() - t0, compute=t1 - t0, wait=t2 - t1, allreduce=t3 - t2,
                             nonblocking=world.nonblocking))
    grad_bytes = sum(p.data.nbytes for p in params)
    pure = []
    for p in params:
        p.grad = np.ones_like(p.data)
    world.nonblocking = True
    for _ in range(s["pure_reps"] if world.size > 1 else 0):
        world.barrier()
        t0 = time.perf_counter()
        world.allreduce_grads(params)
        pure.append(time.perf_counter() - t0)
    if world.is_main:
        print(json.dumps(dict(ranks=world.size, threads=s["threads"], batch=B, tokens=B * cfg.block_size,
                              params=sum(p.data.size for p in params), grad_bytes=grad_bytes, rows=rows,
                              pure=pure)), flush=True)
    return 0


def launch(ranks, threads, s):
    """One job of a layout -> its JSON record (rank 0's)."""
    cmd = [sys.executable, "-m", "nanospa.bench.ranks", "--worker", f"--threads={threads}",
           f"--config={s['config']}", f"--dtype={s['dtype']}", f"--steps={s['steps']}",
           f"--warmup={s['warmup']}", f"--pure_reps={s['pure_reps']}"]
    if ranks > 1:
        cmd = [mpiexec(), "-n", str(ranks)] + cmd
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}): {out.stderr.strip()[-500:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def summarise(records):
    """{layout: summary} from the jobs' records of every round."""
    out = {}
    for name, recs in records.items():
        rows = [r for rec in recs for r in rec["rows"]]
        med = lambda key, rs=rows: float(np.median([r[key] for r in rs])) if rs else 0.0  # noqa: E731
        rec = recs[0]
        pure = [t for r in recs for t in r["pure"]]
        n = rec["ranks"]
        out[name] = dict(ranks=n, threads=rec["threads"], params=rec["params"], grad_bytes=rec["grad_bytes"],
                         step_s=med("step"), tokens_per_s=rec["tokens"] / med("step"), compute_s=med("compute"),
                         wait_s=med("wait"), allreduce_s=med("allreduce"),
                         allreduce_nonblocking_s=med("allreduce", [r for r in rows if r["nonblocking"]]),
                         allreduce_blocking_s=med("allreduce", [r for r in rows if not r["nonblocking"]]),
                         pure_allreduce_s=float(np.median(pure)) if pure else 0.0,
                         bus_bandwidth=(2 * (n - 1) / n * rec["grad_bytes"] / np.median(pure)) if pure else 0.0)
    return out


def cost_model(summary):
    """The model t(N) = t_compute(1x1) / N + t_optimiser + 2 (N-1)/N G / bandwidth for each
    multi-rank layout, against its measurement, term by term; bandwidth is the layout's pure
    all-reduce bus bandwidth, t_optimiser the 1x1 step less its compute. -> {layout: dict}."""
    one = next((v for v in summary.values() if v["ranks"] == 1 and v["threads"] == 1), None)
    checks = {}
    for name, v in summary.items():
        if one and v["ranks"] > 1 and v["bus_bandwidth"]:
            n = v["ranks"]
            parts = dict(compute=one["compute_s"] / n, optimiser=one["step_s"] - one["compute_s"],
                         allreduce=2 * (n - 1) / n * v["grad_bytes"] / v["bus_bandwidth"])
            measured = dict(compute=v["compute_s"], optimiser=v["step_s"] - v["compute_s"] - v["wait_s"] - v["allreduce_s"],
                            allreduce=v["allreduce_s"], wait=v["wait_s"])
            checks[name] = dict(predicted=parts, measured=measured, predicted_step_s=sum(parts.values()),
                                measured_step_s=v["step_s"])
    return checks


def report(summary, checks):
    lines = ["layout (ranks x threads) | tokens/s | step s | compute s | wait s | all-reduce s (non-blocking / "
             "blocking) | pure all-reduce s | bus GB/s"]
    for name, v in summary.items():
        lines.append(f"{name} | {v['tokens_per_s']:.0f} | {v['step_s']:.3f} | {v['compute_s']:.3f} | {v['wait_s']:.3f} | "
                     f"{v['allreduce_nonblocking_s']:.4f} / {v['allreduce_blocking_s']:.4f} | "
                     f"{v['pure_allreduce_s']:.4f} | {v['bus_bandwidth'] / 1e9:.2f}")
    any_v = next(iter(summary.values()))
    lines.append(f"gradient: {any_v['params']:,} parameters, {any_v['grad_bytes']:,} bytes per step")
    for name, c in checks.items():
        p, m = c["predicted"], c["measured"]
        lines.append(f"cost model {name}: predicted {c['predicted_step_s']:.3f} s/step = compute {p['compute']:.3f} "
                     f"+ optimiser {p['optimiser']:.3f} + all-reduce {p['allreduce']:.4f}; measured "
                     f"{c['measured_step_s']:.3f} = compute {m['compute']:.3f} + optimiser {m['optimiser']:.3f} + "
                     f"all-reduce {m['allreduce']:.4f} + wait {m['wait']:.3f} "
                     f"({100 * (c['measured_step_s'] / c['predicted_step_s'] - 1):+.0f}%)")
    return "\n".join(lines)


CHECKS = [  # (key, test, what a good value is)
    ("steps", lambda v: v >= 1, "at least 1"), ("warmup", lambda v: v >= 0, ">= 0"),
    ("rounds", lambda v: v >= 1, "at least 1"), ("pure_reps", lambda v: v >= 0, ">= 0"),
    ("threads", lambda v: v >= 1, "at least 1"), ("dtype", lambda v: v in ("float32", "float64"), "float32 or float64"),
    ("layouts", lambda v: len(v) > 0, "at least one RANKSxTHREADS layout"),
]


def settings(argv):
    """The checked settings; SettingsError names the first bad one."""
    s = parse_settings(argv, DEFAULTS)
    for key, ok, what in CHECKS:
        if not ok(s[key]):
            raise SettingsError(f"--{key} must be {what}, got {s[key]!r}")
    if s["config"] not in CONFIGS:
        raise SettingsError(f"unknown config {s['config']!r}; configurations: {', '.join(CONFIGS)}")
    s["layouts"] = [(name, *parse_layout(name)) for name in s["layouts"]]
    if any(ranks > 1 for _, ranks, _ in s["layouts"]) and not s["worker"] and mpiexec() is None:
        raise SettingsError("layouts with several ranks need mpiexec and mpi4py: pip install -e .[mpi]")
    return s


def mpiexec():
    """The mpiexec beside this Python (the mpich wheel's), else one on PATH, else None."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return here if os.access(here, os.X_OK) else shutil.which("mpiexec")


def run(argv):
    s = settings(argv)
    if s["worker"]:
        return get_world().run(worker, s)
    records = {name: [] for name, _, _ in s["layouts"]}
    for r in range(s["rounds"]):
        for name, ranks, threads in (s["layouts"] if r % 2 == 0 else s["layouts"][::-1]):
            records[name].append(launch(ranks, threads, s))
    summary = summarise(records)
    checks = cost_model(summary)
    print(json.dumps(dict(summary=summary, cost_model=checks), indent=1) if s["json"] else report(summary, checks))
    return 0


def main(argv=None):
    """-> the exit status: 0, or 2 after one error: line (a bad setting, a failed job)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if wants_help(argv):
        print(help_text(__doc__.splitlines()[0], DEFAULTS, source_notes(__file__)))
        return 0
    return run_command(run, argv)


if __name__ == "__main__":
    sys.exit(main())
