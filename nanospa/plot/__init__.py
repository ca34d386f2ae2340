"""A picture of training runs: python -m nanospa.plot OUT_DIR [OUT_DIR ...] --out=run.png

One column per run (an out_dir of train.py): its training loss (smoothed) and validation
loss against the step, then the per-layer signal statistics train.py logs at every
evaluation (docs/method.md §13) as heatmaps over layer x step: cos[l], the mean correlation
between the positions of a sequence after block l (1: rank collapse), and q[l], the mean
squared activation. The view of signal propagation during training that the log holds. Needs matplotlib (the
plot extra); a folder without a log, or a log without records, is one error line (exit 2),
checked before anything is drawn.

    runs(paths)       -> [(name, records)] read from each out_dir/log.jsonl
    draw(runs, path)  the figure
"""
import json
import math
from pathlib import Path

import numpy as np

from ..run.rundir import LOG_FILE
from ..run.settings import SettingsError

SMOOTH = 25          # the training loss is averaged over about 1/SMOOTH of its records
DPI = 100


def runs(paths):
    """[(name, records)] of the out_dirs; SettingsError naming a folder without a usable log."""
    out = []
    for p in paths:
        log = Path(p) / LOG_FILE
        if not log.is_file():
            raise SettingsError(f"{p} holds no {LOG_FILE}: name the out_dir of a train.py run")
        records = []
        with open(log, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                try:
                    records.append(json.loads(line))
                except ValueError:
                    if line.endswith("\n"):                  # a torn last line (a kill) is skipped
                        raise SettingsError(f"{log}: line {n} is not a JSON record") from None
        if not records:
            raise SettingsError(f"{log} holds no records yet")
        out.append((Path(p).name or str(p), records))
    return out


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
        train = [(r["iter"], r["train_loss"]) for r in records if r["iter"] > 0 and math.isfinite(r.get("train_loss", math.nan))]
        evals = [r for r in records if "cos" in r]
        ax = axes[0][col]
        if train:
            it, loss = np.array(train).T
            w = max(1, len(loss) // SMOOTH)
            ax.plot(it[w - 1:], _smooth(loss, w), label="train (smoothed)")
        val = [(r["iter"], r["val_loss"]) for r in evals if "val_loss" in r]
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
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
