"""Reporting the training experiments (python -m nanospa.experiments NAME): what a run
writes and how its numbers are read.

    provenance     command, date, machine, load averages, wall time, git commit
    write_json     result.json (indented, loss curves on one line each), written atomically
    write_text     table.md and the like, written atomically
    naming(path)   a failed write (a full disk) inside names the file it was writing
    markdown       table.md: provenance, one row per method, the paper's claim, the findings
    per_byte       a method's final losses per byte too (subword tokens: data.Dataset.bytes_per_token)
    plot           plot.png: training-loss curves at each method's best rate (matplotlib), the
                   mean over seeds with a band of +- one standard deviation when there are several
    loss_line, ranking, loss_at, summary   helpers for each experiment's findings()

The unigram entropy of the training split is the loss of the best predictor that ignores
context (data.unigram_entropy). A run "stalls" when its final training loss stays within
STALL_MARGIN of it; this is how the paper's "untrainable" (loss stuck near 7.5 nats on its
tokeniser) is read at nanospa's byte-level scale.

Not here: settings, jobs, the process pool and the choice of the best learning rate
(runner.py); the compact training run (common.py). This module imports neither: it only
reads the plain result dicts they produce.
"""
import functools
import json
import math
import os
import platform
import re
import shlex
import subprocess
import textwrap
import time
from collections.abc import Mapping
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from ..run.settings import PLOT_HINT

STALL_MARGIN = 0.1   # nats/token; see the module docstring. Quick-preset Pre-LN ends ~0.8 below.
MATCH_MARGIN = 0.05  # nats/token: two final training losses closer than this count as level
GIT_TIMEOUT_S = 10   # seconds git may take to name the commit before it is recorded as unknown
LOSS_WINDOW = 0.1    # loss_at: mean of the curve over this fraction of the run around a point
SMOOTH_POINTS = 25   # plot: the moving average spans 1/SMOOTH_POINTS of a curve's records
PANEL_INCHES = (6.2, 4.2)   # plot: width and height of one panel
PLOT_DPI = 100
Y_MARGIN = (0.15, 0.2)      # plot: nats below the lowest curve, above log(vocab_size) (uniform)


# ------------------------------------------------------------------ provenance

def machine(device="cpu"):
    """A one-line description of this machine."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    text = f"{cpu}, {os.cpu_count()} CPU cores, {platform.system()} {platform.release()}, " \
           f"Python {platform.python_version()}, NumPy {np.__version__}"
    if device == "cuda":
        try:
            from .. import backend  # the only module that imports CuPy
            props = backend.use("cuda").cuda.runtime.getDeviceProperties(0)
            text += f", GPU {props['name'].decode() if isinstance(props['name'], bytes) else props['name']}"
        except Exception:
            text += ", GPU (name unknown)"
    return text


def load_average():
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def command_line(name, argv):
    return " ".join(["python -m nanospa.experiments", name] + [shlex.quote(a) for a in argv])


def duration(seconds):
    m, s = divmod(int(round(seconds)), 60)
    return f"{m} min {s:02d} s" if m else f"{s} s"


@functools.lru_cache(maxsize=None)                 # once per process
def git_commit():
    """The checkout's commit (with '+dirty' when tracked files differ), or None."""
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True,
                              text=True, timeout=GIT_TIMEOUT_S).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=GIT_TIMEOUT_S).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (head + ("+dirty" if dirty else "")) or None


def provenance(name, argv, s, started, t0):
    """Where a result came from: s holds the settings' device and _load_start (the load
    averages when the run started); started: its ISO date; t0: its time.time() start."""
    return dict(command=command_line(name, argv), date=started, machine=machine(s["device"]),
                load_average_start=s.get("_load_start"), load_average_end=load_average(),
                seconds=round(time.time() - t0, 1),
                commit=git_commit())


def header_lines(result):
    p = result["provenance"]
    lines = [f"# {result['name']}: {result['title']}", "",
             f"- Command: `{p['command']}`",
             f"- Date: {p['date']}",
             f"- Machine: {p['machine']} (shared; 1/5/15-minute load averages at start "
             f"{p.get('load_average_start')}, at the end {p.get('load_average_end')})",
             f"- Time taken: {duration(p['seconds'])} (wall clock)",
             f"- Code: commit {p.get('commit') or 'unknown'}"]
    reused = [r["reused"] for m in result.get("methods", {}).values() for r in m.get("runs", ()) if r.get("reused")]
    origins = [(o["from"], o.get("commit") or "unknown", bool(o.get("legacy"))) for o in reused]
    for origin in sorted(set(origins)):
        how = ("written before job keys: matched by method, rate, seed, config and settings; warm-up not recorded there"
               if origin[2] else "identical jobs")
        lines.append(f"- Reused: {origins.count(origin)} runs from {origin[0]} (commit {origin[1]}; {how}), not retrained")
    return lines


# ------------------------------------------------------------------ outputs

def _plain(x):
    """JSON for NumPy scalars and arrays (plan.info may hold them); anything else as text."""
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    return str(x)


def write_json(path, obj):
    """Indented JSON with innermost lists of numbers on one line (loss histories stay short),
    written to a temporary name and renamed."""
    compact = []

    def fold(x):                                   # lists of numbers / number pairs: one line
        if isinstance(x, Mapping):                 # dicts, and read-only views such as Plan.info
            return {k: fold(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            if x and all(isinstance(v, (list, tuple)) and all(isinstance(u, (int, float)) for u in v)
                         for v in x) or all(isinstance(v, (int, float)) for v in x):
                compact.append(json.dumps(x, allow_nan=True, default=_plain, separators=(",", ":")))
                return f"@@{len(compact) - 1}@@"
            return [fold(v) for v in x]
        return x

    text = json.dumps(fold(obj), indent=1, allow_nan=True, default=_plain)
    text = re.sub(r'"@@(\d+)@@"', lambda m: compact[int(m.group(1))], text)
    write_text(path, text + "\n")


@contextmanager
def naming(path):
    """Re-raise an OSError that names no file (a write to an open file on a full disk) as one
    that names `path`, so that the command's one error: line says which file failed."""
    try:
        yield
    except OSError as e:
        if e.filename is not None:
            raise
        raise OSError(e.errno, e.strerror or str(e), str(path)) from None


def write_text(path, text):
    """Write text to path through a temporary file beside it (PATH.PID.tmp: one per process,
    so that two writers never share one), renamed at the end."""
    tmp = Path(f"{path}.{os.getpid()}.tmp")
    try:
        with naming(path):
            tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def fmt(x, f=".3f"):
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else \
        ("diverged" if isinstance(x, float) and math.isinf(x) else format(x, f))


def grid_union(result):
    """Every learning rate any method ran (a method may have its own grid, e.g. K-FAC's)."""
    grids = [m.get("lrs") or result["settings"]["lrs"] for m in result["methods"].values()]
    return sorted({float(lr) for g in grids for lr in g} or result["settings"]["lrs"])


def per_byte(summary, bytes_per_token):
    """summary with final_train_per_byte and final_val_per_byte: the losses in nats per token
    divided by the bytes per token of their split."""
    return dict(summary, final_train_per_byte=summary["final_train"] / bytes_per_token["train"],
                final_val_per_byte=summary["final_val"] / bytes_per_token["val"])


SHAPE = (("n_layer", "depth {}"), ("n_embd", "width {}"), ("n_head", "{} heads"), ("block_size", "T = {}"),
         ("dtype", "{}"))   # what the Setting line says of the model, from what each method trained


def trained_shape(result):
    """{field: the value every method trained} and [fields whose value differs among the
    methods]: read from each method's own config (a method may set its width or depth, which
    then is not the --n_embd or --n_layer the command was given)."""
    s, same, differ = result["settings"], {}, []
    for key, _ in SHAPE:
        values = {m["config"].get(key, s[key]) for m in result["methods"].values()} or {s[key]}
        if len(values) == 1:
            same[key] = values.pop()
        else:
            differ.append(key)
    return same, differ


def markdown(result):
    s = result["settings"]
    same, differ = trained_shape(result)
    shape = {key: what.format(same[key]) if key in same else what.format("per method").replace("per method heads",
             "heads per method") for key, what in SHAPE}
    lines = header_lines(result)
    bpt = result["data"].get("bytes_per_token")        # absent in results written before it existed
    tokens = (f"{result['data'].get('tokenizer', 'byte')} tokens, {bpt['train']:.3f} bytes per token"
              if bpt else "byte tokens")
    lines += [f"- Data: {result['data']['name']} ({result['data']['train_tokens']:,} training {tokens}); "
              f"unigram entropy {result['data']['unigram_entropy']:.3f} nats/token",
              f"- Setting: {shape['n_layer']}, {shape['n_embd']}, {shape['n_head']}, {shape['block_size']}"
              + (f" (each method's in the column {' x '.join(differ)})" if differ else "") + ", "
              f"batch {s['batch_size']}, {s['steps']} steps, "
              + ("AdamW" if not any(m.get("optimizer") for m in result["methods"].values()) else "each method's optimiser")
              + f" with warm-up and cosine decay, learning rates {', '.join(map(str, s['lrs']))} (best per method"
              + ("" if all(not m.get("lrs") or list(m["lrs"]) == list(s["lrs"]) for m in result["methods"].values())
                 else "; some methods have their own grid, see the columns") + "), "
              f"seeds {s['seeds']}, {shape['dtype']}, preset {s['preset']}", ""]
    lrs = grid_union(result)
    head = (["method", "model"] + ([" x ".join(differ)] if differ else []) + ["steps", "best lr", "final train loss",
                                                                           "final val loss"]
            + (["train nats/byte", "val nats/byte"] if bpt else []) + ["unigram - train"]
            + [f"train @ lr {lr:g}" for lr in lrs])
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, m in result["methods"].items():
        by_lr = m["summary"]["by_lr"]
        sm = m["summary"]
        std = f" ± {sm['final_train_std']:.3f}" if s["seeds"] > 1 and sm["best_lr"] else ""
        row = [label, m["description"]] + ([" x ".join(str(m["config"].get(k, s[k])) for k in differ)] if differ else [])
        row += [str(m["steps"]), fmt(sm["best_lr"], "g"),
               fmt(sm["final_train"]) + std, fmt(sm["final_val"])]
        row += [fmt(sm.get("final_train_per_byte")), fmt(sm.get("final_val_per_byte"))] if bpt else []
        row += [fmt(sm["below_unigram"], "+.3f")]
        row += [fmt(by_lr.get(repr(lr))) for lr in lrs]
        lines.append("| " + " | ".join(row) + " |")
    plans = []
    for label, m in result["methods"].items():
        info = m.get("plan") or {}
        c = m["config"]
        relevant = dict(gamma_final=c["attention"] == "espa", rho_final=c["attention"] == "uspa",
                        eta=c["activation"].startswith("tat_lrelu"))
        keys = [k for k, used in relevant.items() if used and isinstance(info.get(k), (int, float))]
        if keys:
            plans.append(f"{label}: budget {info.get('policy')}"
                         + "".join(f", {k} {info[k]:.4g}" for k in keys))
    if plans:
        lines += ["", "Kernel-budget plans at init (GPTConfig defaults unless the command sets them): "
                  + "; ".join(plans) + "."]
    if len(lrs) > 1:
        edge = [f"{label} ({m['summary']['best_lr']:g})" for label, m in result["methods"].items()
                if len(m.get("lrs", lrs)) > 1 and m["summary"]["best_lr"] in (min(m.get("lrs", lrs)), max(m.get("lrs", lrs)))]
        if edge:
            lines += ["", "Best learning rate at an edge of the grid (a wider grid could lower these "
                      "losses): " + ", ".join(edge) + "."]
        single = [f"{label} ({m['lrs'][0]:g})" for label, m in result["methods"].items() if len(m.get("lrs") or lrs) == 1]
        if single:
            lines += ["", "One learning rate only, no search (its best rate is not known): " + ", ".join(single) + "."]
    lines += ["", "Final losses are means over fixed batches after training (train and validation "
              "split), averaged over seeds at the best learning rate"
              + (" (± the standard deviation over seeds)" if s["seeds"] > 1 else "") + ", in nats per token"
              + (" and per UTF-8 byte (nats/token divided by the split's bytes per token)" if bpt else "")
              + f". \"unigram - train\" > {STALL_MARGIN} means the model learnt more than "
              + ("byte" if not bpt or result["data"].get("tokenizer", "byte") == "byte" else "token")
              + " frequencies.", "",
              "## What the paper reports", "", result["paper"], "", "## What nanospa measured", ""]
    lines += [f"- {line}" for line in result["findings"]]
    return "\n".join(lines) + "\n"


def smooth(y, window):
    if window <= 1 or len(y) < window:
        return np.asarray(y)
    kernel = np.ones(window) / window
    return np.convolve(y, kernel, mode="valid")


def seed_spread(method, window):
    """The standard deviation over seeds of the smoothed training-loss curves at the method's
    best rate, point by point (the plot's band around the mean curve); None with one seed."""
    lr = method["summary"]["best_lr"]
    runs = [dict(r["history"]) for r in method.get("runs", []) if r["lr"] == lr]
    its = [it for it, _ in method["summary"]["curve"]]
    if len(runs) < 2 or not its:
        return None
    curves = [smooth(np.array([h.get(it, math.nan) for it in its], dtype=float), window) for h in runs]
    return np.std(np.array(curves), axis=0)


def pyplot(path):
    """matplotlib.pyplot (the Agg backend: files only), or None after a line saying that the
    picture at `path` is skipped because matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"skipped {path}: matplotlib is not installed ({PLOT_HINT})")
        return None
    return plt


def plot(result, path, panels=None):
    plt = pyplot(path)
    if plt is None:
        return False
    methods = result["methods"]
    panels = panels or [("", list(methods))]
    fig, axes = plt.subplots(1, len(panels), figsize=(PANEL_INCHES[0] * len(panels), PANEL_INCHES[1]), squeeze=False,
                             constrained_layout=True)
    unigram = result["data"]["unigram_entropy"]
    for ax, (title, labels) in zip(axes[0], panels):
        lows = [unigram]
        for label in labels:
            if label not in methods:
                continue
            curve = methods[label]["summary"]["curve"]
            if not curve:
                continue
            it, loss = np.array(curve).T
            w = max(1, len(loss) // SMOOTH_POINTS)
            y = smooth(loss, w)
            x = it[w - 1:] if w > 1 else it
            line, = ax.plot(x, y, label=f"{label} (lr {methods[label]['summary']['best_lr']:g})")
            spread = seed_spread(methods[label], w)
            if spread is not None and len(spread) == len(y):
                ax.fill_between(x, y - spread, y + spread, color=line.get_color(), alpha=0.2, lw=0)
            lows.append(np.nanmin(y))
        ax.axhline(unigram, color="k", ls="--", lw=1, label="unigram entropy")
        ax.set_ylim(min(lows) - Y_MARGIN[0], math.log(result["data"]["vocab_size"]) + Y_MARGIN[1])
        ax.set_xlabel("iteration")
        ax.set_ylabel("training loss (nats/token, moving average)")
        ax.set_title(textwrap.fill(title or f"{result['name']}: {result['title']}", 60), fontsize=9)
        ax.legend(fontsize=7)
    try:
        with naming(path):
            fig.savefig(path, dpi=PLOT_DPI)
    finally:
        plt.close(fig)
    return True


# ------------------------------------------------------------------ helpers for findings

def summary(result, label):
    return result["methods"][label]["summary"] if label in result["methods"] else None


def loss_line(result, label):
    m = summary(result, label)
    if m is None or m["best_lr"] is None:
        return f"{label}: {'not run' if m is None else 'diverged at every learning rate'}"
    gap = m["below_unigram"]
    if gap >= STALL_MARGIN:
        unit = "byte" if result.get("data", {}).get("tokenizer", "byte") == "byte" else "token"
        state = f"{gap:.3f} nats below the unigram entropy: it learnt more than {unit} frequencies"
    elif gap > -STALL_MARGIN:
        state = f"within {STALL_MARGIN} nats of the unigram entropy ({gap:+.3f} below): stalled"
    else:
        state = f"{-gap:.3f} nats above the unigram entropy: stalled above it"
    return f"{label}: final train loss {m['final_train']:.3f}, {state}"


def ranking(result, labels):
    """Labels that ran, ordered by final training loss (best first)."""
    got = [(summary(result, l)["final_train"], l) for l in labels
           if summary(result, l) and summary(result, l)["best_lr"] is not None]
    return [l for _, l in sorted(got)]


def loss_at(result, label, fraction):
    """Mean training loss of the best-lr curve around `fraction` of the run (a LOSS_WINDOW window)."""
    m = summary(result, label)
    if not m or not m["curve"]:
        return math.nan
    it, loss = np.array(m["curve"]).T
    n = max(it)
    half = LOSS_WINDOW / 2
    sel = (it >= (fraction - half) * n) & (it <= (fraction + half) * n)
    return float(np.nanmean(loss[sel])) if sel.any() else math.nan
