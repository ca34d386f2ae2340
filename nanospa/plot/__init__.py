"""A picture of training runs: python -m nanospa.plot OUT_DIR [OUT_DIR ...] --out=run.png

One column per run (an out_dir of train.py): its training loss (smoothed) and validation
loss against the step, then the per-layer signal statistics train.py logs at every
evaluation (docs/method.md §13) as heatmaps over layer x step: cos[l], the mean correlation
between the positions of a sequence after block l (1: rank collapse), and q[l], the mean
squared activation. The view of signal propagation during training that the log holds. Needs matplotlib (the
plot extra); a folder without a log, a log without records and a record that is not one
train.py writes (a hand-edited log: a field of the wrong type, statistics of two lengths) are
one error line (exit 2), checked before anything is drawn. A log whose iterations go back
holds several runs (appended to one file): each is drawn as a run of its own, "NAME (run k
of n)", and a note says so. A resume that changed settings (--allow_changed) is a dotted
line at its iteration.

    runs(paths)       -> [(name, records)] read from each out_dir/log.jsonl, one per run
    check_picture(path)  the file name of the picture: a type matplotlib writes, in a folder
                      that exists (savefig appends .png to a name without one, so --out=DIR
                      wrote DIR.png while the command said it wrote DIR)
    draw(runs, path)  the figure, written exactly at path
"""
import json
import math
import sys
from pathlib import Path

import numpy as np

from ..run.rundir import LOG_FILE
from ..run.settings import SettingsError, check_output_file

SMOOTH = 25          # the training loss is averaged over about 1/SMOOTH of its records
DPI = 100


def _number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _bad(r, width):
    """What is wrong with a log record (None when it is one train.py writes); width: the length
    of the per-layer statistics seen so far in its run, or None."""
    if not isinstance(r, dict):
        return f"a {type(r).__name__}, not a record"
    it = r.get("iter")
    if not (isinstance(it, int) and not isinstance(it, bool) and it >= 0):
        return f"iter={it!r}, not a whole number >= 0"
    for key in ("train_loss", "val_loss", "lr"):
        if r.get(key) is not None and not _number(r[key]):
            return f"{key}={r[key]!r}, not a number"
    for key in ("cos", "q"):
        if key in r:
            v = r[key]
            if not (isinstance(v, list) and v and all(x is None or _number(x) for x in v)):
                return f"{key} is not a list of numbers"
            if width is not None and len(v) != width:
                return f"{key} has {len(v)} layers, the run's earlier records {width}"
    return None


def _read(p):
    """The records of out_dir p's log, each checked; a torn last line (a kill) is skipped."""
    log = Path(p) / LOG_FILE
    if not log.is_file():
        raise SettingsError(f"{p} holds no {LOG_FILE}: name the out_dir of a train.py run")
    records, width = [], None
    with open(log, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            try:
                r = json.loads(line)
            except ValueError:
                if line.endswith("\n"):
                    raise SettingsError(f"{log}: line {n} is not a JSON record") from None
                continue
            if records and isinstance(r, dict) and isinstance(r.get("iter"), int) and r["iter"] < records[-1]["iter"]:
                width = None                                # another run starts here (split below)
            bad = _bad(r, width)
            if bad:
                raise SettingsError(f"{log}: line {n} is not a record train.py writes ({bad})")
            width = len(r["cos"]) if "cos" in r else width
            records.append(r)
    if not records:
        raise SettingsError(f"{log} holds no records yet")
    return log, records


def runs(paths):
    """[(name, records)] of the out_dirs, one per run: a log whose iterations go back holds
    several (NAME (run k of n), with a note); SettingsError naming a folder without a usable log."""
    out = []
    for p in paths:
        log, records = _read(p)
        parts, start = [], 0
        for i in range(1, len(records) + 1):
            if i == len(records) or records[i]["iter"] < records[i - 1]["iter"]:
                parts.append(records[start:i])
                start = i
        name = Path(p).name or str(p)
        if len(parts) > 1:
            print(f"note: {log} holds {len(parts)} runs (its iterations go back at "
                  + ", ".join(f"record {sum(map(len, parts[:k])) + 1}" for k in range(1, len(parts)))
                  + "): each is drawn as a run of its own", file=sys.stderr)
        out += [(name if len(parts) == 1 else f"{name} (run {k} of {len(parts)})", part)
                for k, part in enumerate(parts, 1)]
    return out


PICTURES = ("png", "pdf", "svg", "jpg", "jpeg")    # what --out may name


def check_picture(path):
    """SettingsError unless `path` names a picture file matplotlib writes as it is named, in a
    folder that exists: the type is its suffix, never appended."""
    check_output_file(path, "out")
    kind = Path(path).suffix.lower().lstrip(".")
    if kind not in PICTURES:
        raise SettingsError(f"--out={path}: name the picture file with its type, one of "
                            f"{', '.join('.' + k for k in PICTURES)} (e.g. --out={Path(path).with_suffix('.png')})")
    return kind


def _smooth(y, w):
    if w <= 1 or len(y) < w:
        return np.asarray(y)
    return np.convolve(y, np.ones(w) / w, mode="valid")


def draw(runs, path):
    """One column per run: losses, cos[l] and q[l] over layer x evaluation step."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(3, len(runs), figsize=(5.2 * len(runs), 10), squeeze=False, constrained_layout=True)
    for col, (name, records) in enumerate(runs):
        train = [(r["iter"], r["train_loss"]) for r in records
                 if r["iter"] > 0 and _number(r.get("train_loss")) and math.isfinite(r["train_loss"])]
        evals = [r for r in records if "cos" in r]
        ax = axes[0][col]
        for r in records:                               # a resume that changed settings (--allow_changed)
            if "changed_on_resume" in r:
                ax.axvline(r["iter"], color="grey", ls=":", lw=1)
                ax.text(r["iter"], 1, " " + ", ".join(map(str, r["changed_on_resume"])), transform=ax.get_xaxis_transform(),
                        fontsize=7, va="top", color="grey")
        if train:
            it, loss = np.array(train).T
            w = max(1, len(loss) // SMOOTH)
            ax.plot(it[w - 1:], _smooth(loss, w), label="train (smoothed)")
        val = [(r["iter"], r["val_loss"]) for r in evals if _number(r.get("val_loss"))]
        if val:
            ax.plot(*np.array(val).T, "o-", label="validation")
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.set_ylabel("loss (nats per token)")
        ax.legend(fontsize=8)
        for row, key, label in ((1, "cos", "cos[l]: mean correlation between positions"), (2, "q", "q[l]: mean q-value")):
            ax = axes[row][col]
            if not evals:
                ax.set_axis_off()
                continue
            grid = np.array([r[key] for r in evals], dtype=float).T          # (layers, evaluations)
            steps = [r["iter"] for r in evals]
            im = ax.imshow(grid, aspect="auto", origin="lower", cmap="viridis",
                           extent=(-0.5, len(steps) - 0.5, -0.5, grid.shape[0] - 0.5),
                           vmin=0 if key == "cos" else None, vmax=1 if key == "cos" else None)
            ax.set_xticks(range(len(steps)))
            ax.set_xticklabels(steps, rotation=90, fontsize=7)
            ax.set_xlabel("step (evaluations)")
            ax.set_ylabel("layer l (0: embedding)")
            ax.set_title(label, fontsize=9)
            ax.set_yticks(range(0, grid.shape[0], max(1, grid.shape[0] // 12)))
            fig.colorbar(im, ax=ax)
    try:
        fig.savefig(path, dpi=DPI, format=check_picture(path))   # exactly this file: the type is its suffix
    finally:
        plt.close(fig)
