"""Figure 1: normalised kernels C_l at init for standard attention, U-SPA and E-SPA at
several depths, predicted by nanospa.signal and measured on a wide GPT (docs/method.md
§3.1, §3.4, §6, §7, §10).

    python -m nanospa.experiments fig1 [--preset=quick|full|tiny] [--key=value ...]

Three series per attention kind, all vanilla (no skips, no norm, the configured MLP
activation; every other GPTConfig field at its default unless set):

    attention-only     the attention-only network of the paper's analysis (method §3.2):
                       the SPA target kernels, or the uniform-attention recursion (§3.4)
    model, predicted   the whole model with its MLPs, wide limit (predict.predict_kernels)
    model, measured    a float64 GPT of width --width at init, on --batch token sequences

No training, so no learning-rate grid; the device is the CPU. Outputs: result.json (the
statistics of every kernel shown and the mean off-diagonal at every depth), kernels.npz
(the heatmaps' C_l matrices, float16, keys "kind/series/depthN"), table.md, plot.png.
"""
import datetime
import sys
import time
from dataclasses import fields, replace
from pathlib import Path

import numpy as np

from . import report, runner
from ..measure import measure_config, measured_model_kernels, token_batch
from ..run.corpus import atomic_write
from ..run.settings import check_output_dir, help_text, parse_settings, run_command, wants_help
from ..signal import make_plan, normalised_kernel
from ..predict import attention_only_kernels, predicted_kernels
from ..signal.table import check_depths, summary

NAME = "fig1"
TITLE = "normalised kernels at init: standard attention collapses, U-SPA and E-SPA do not"
PAPER = ("Figure 1: the normalised kernel of a deep attention-only vanilla transformer at "
         "initialisation, at several depths. With standard attention it collapses in rank (every "
         "entry goes to 1: all tokens look alike); with U-SPA and E-SPA it does not, even when very deep.")
DEFAULTS = dict(preset="quick", out="", n_layer=24, block_size=64, width=512, n_head=2, batch=4,
                depths=(), tokens="distinct", data="default", seed=0)
NOTES = dict(out="output folder (default out/fig1)", width="width (n_embd) of the measured float64 GPT",
             batch="sequences in the measured batch", depths="depths shown, e.g. 1,4,12,24 (default 1, L/4, L/2, L)",
             tokens="distinct (T different byte ids per sequence, Sigma_0 = I) | data (windows of --data)",
             data="dataset for --tokens=data", seed="seed of the measured models and tokens")
PRESETS = dict(tiny=dict(n_layer=4, block_size=8, width=32, batch=2, depths=(1, 4)),
               quick=dict(n_layer=24, block_size=64, width=512, batch=4, depths=(1, 4, 12, 24)),
               full=dict(n_layer=36, block_size=128, width=1024, batch=4, depths=(1, 6, 18, 36)))
COLLAPSED = 0.99   # mean off-diagonal of C above this: tokens are nearly copies of each other
FIG1_KINDS = ("softmax", "uspa", "espa")


def settings(argv):
    from ..config import GPTConfig
    cfg_fields = {f.name: getattr(GPTConfig(), f.name) for f in fields(GPTConfig)
                  if f.name not in DEFAULTS and f.name not in ("n_embd", "attention", "dtype")}
    defaults = {**DEFAULTS, **PRESETS["quick"], **cfg_fields}
    s = parse_settings(argv, defaults, PRESETS, elements={"depths": 0})
    s["out"] = s["out"] or str(Path("out") / NAME)
    check_output_dir(s["out"], "out")              # before any model is built
    if s["width"] < 1 or s["batch"] < 1:
        raise ValueError(f"width and batch must be >= 1, got {s['width']}, {s['batch']}")
    if s["seed"] < 0:
        raise ValueError(f"--seed must be >= 0, got {s['seed']}")
    cfg = GPTConfig(**{k: s[k] for k in cfg_fields}, n_layer=s["n_layer"], block_size=s["block_size"],
                    n_head=s["n_head"], n_embd=s["width"])
    return s, cfg


def findings(result):
    lines = []
    last = result["depths"][-1]
    for kind, series in result["stats"].items():
        for label, stats in series.items():
            st = stats[-1]
            state = "collapsed" if st["C_mean"] > COLLAPSED else "not collapsed"
            lines.append(f"{runner.NAMES[kind]}, {label}, depth {last}: mean off-diagonal {st['C_mean']:.4f}, "
                         f"min entry {st['C_min']:.4f} -> {state}")
    verdict = []
    for label in ("attention-only", "model, predicted", "model, measured"):
        got = {k: result["stats"][k][label][-1]["C_mean"] for k in result["stats"] if label in result["stats"][k]}
        if len(got) == 3:
            ok = got["softmax"] > COLLAPSED and got["uspa"] <= COLLAPSED and got["espa"] <= COLLAPSED
            verdict.append(f"{label}: " + ("as in the paper" if ok else "differs from the paper"))
    lines.append(f"paper's contrast (standard collapses, U-SPA and E-SPA do not; threshold {COLLAPSED}): "
                 + "; ".join(verdict))
    return lines


def markdown(result):
    lines = report.header_lines(result)
    s = result["settings"]
    lines += [f"- Setting: depth {s['n_layer']}, T = {s['block_size']}, activation {result['config']['activation']}, "
              f"kernel budget {result['config']['kernel_budget']}, measured at width {s['width']} in float64 "
              f"on {s['batch']} sequences of {'distinct tokens' if s['tokens'] == 'distinct' else 'text'}, seed {s['seed']}",
              "", "Mean off-diagonal entry of the normalised kernel C_l (min entry in brackets); 1 = rank collapse.", ""]
    head = ["attention", "series"] + [f"depth {d}" for d in result["depths"]]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for kind, series in result["stats"].items():
        for label, stats in series.items():
            cells = [f"{st['C_mean']:.4f} ({st['C_min']:.4f})" for st in stats]
            lines.append("| " + " | ".join([runner.NAMES[kind], label] + cells) + " |")
    lines += ["", "## What the paper reports", "", result["paper"], "", "## What nanospa measured", ""]
    lines += [f"- {line}" for line in result["findings"]]
    return "\n".join(lines) + "\n"


def figure1(cfg, depths=(), kinds=FIG1_KINDS, empirical=False, width=512, batch=4,
            tokens="distinct", data="default", seed=0):
    """Normalised kernels C_l at `depths` for each attention kind (cfg with attention
    replaced; every other field as given). Returns dict(depths, T, kinds={kind: {label:
    [C at each depth]}}, stats={kind: {label: [summary at each depth]}}, per_layer={kind:
    {label: [C_mean for l = 0..L]}}) with labels "attention-only", "model, predicted"
    and "model, measured" (with empirical=True)."""
    depths = check_depths(depths, cfg.n_layer)
    out = dict(depths=list(depths), T=cfg.block_size, kinds={}, stats={}, per_layer={})
    idx = None
    for kind in kinds:
        c = replace(cfg, attention=kind)
        if empirical:
            c = measure_config(c, width)
            if idx is None:
                idx = token_batch(c, batch, tokens, data, seed)
        plan = make_plan(c)
        series = {"attention-only": attention_only_kernels(c, plan),
                  "model, predicted": predicted_kernels(c, plan, idx)}
        if empirical:
            series["model, measured"] = measured_model_kernels(c, idx, seed)
        out["kinds"][kind] = {k: [normalised_kernel(v[d]) for d in depths] for k, v in series.items()}
        out["stats"][kind] = {k: [summary(v[d]) for d in depths] for k, v in series.items()}
        out["per_layer"][kind] = {k: [summary(s)["C_mean"] for s in v] for k, v in series.items()}
    return out


def plot_heatmaps(fig1, path, title=""):
    """Write the Figure-1-style grid (one row per kind and series, one column per depth) to
    `path`. Returns True, or False after printing how to install matplotlib."""
    plt = report.pyplot(path)
    if plt is None:
        return False
    rows = [(kind, label) for kind, series in fig1["kinds"].items() for label in series]
    depths = fig1["depths"]
    width, height = 1.9 * len(depths) + 2.6, 1.9 * len(rows) + 0.9
    fig, axes = plt.subplots(len(rows), len(depths), figsize=(width, height), squeeze=False)
    fig.subplots_adjust(left=1.5 / width, right=1 - 1.0 / width, bottom=0.2 / height,
                        top=1 - 0.75 / height, wspace=0.05, hspace=0.08)
    im = None
    for r, (kind, label) in enumerate(rows):
        for c, d in enumerate(depths):
            ax = axes[r][c]
            im = ax.imshow(fig1["kinds"][kind][label][c], vmin=0.0, vmax=1.0, cmap="viridis",
                           interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(f"depth {d}", fontsize=9)
            if c == 0:
                ax.set_ylabel(f"{runner.NAMES.get(kind, kind)}\n{label}", fontsize=8)
    cax = fig.add_axes([1 - 0.8 / width, 0.3, 0.15 / width, 0.4])
    fig.colorbar(im, cax=cax, label="normalised kernel C_l")
    if title:
        fig.suptitle(title, fontsize=10)
    try:
        with report.naming(path):
            fig.savefig(path, dpi=72)
    finally:
        plt.close(fig)
    return True


def run(argv):
    if wants_help(argv):
        print(help_text(f"python -m nanospa.experiments fig1 [--key=value ...]: {TITLE}", DEFAULTS, NOTES, PRESETS)
              + "\nEvery GPTConfig field (activation, kernel_budget, ...) is a setting too.")
        return 0
    t0, load = time.time(), report.load_average()
    started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    s, cfg = settings(argv)
    with runner.holding(s["out"]):                # one writer per result folder
        return _measured(argv, s, cfg, t0, load, started)


def _measured(argv, s, cfg, t0, load, started):
    fig = figure1(cfg, s["depths"], empirical=True, width=s["width"], batch=s["batch"],
                  tokens=s["tokens"], data=s["data"], seed=s["seed"])
    out = Path(s["out"])
    out.mkdir(parents=True, exist_ok=True)
    public = {k: (list(v) if isinstance(v, tuple) else v) for k, v in s.items() if not k.startswith("_")}
    result = dict(name=NAME, title=TITLE, paper=PAPER, settings=public, config=cfg.to_dict(),
                  depths=fig["depths"], stats=fig["stats"], per_layer=fig["per_layer"],
                  kernels_file="kernels.npz")
    with report.naming(out / "kernels.npz"), atomic_write(out / "kernels.npz") as f:   # all or the old file
        np.savez_compressed(f, **{f"{k}/{lab}/depth{d}": m.astype(np.float16)
                                                    for k, v in fig["kinds"].items()
                                                    for lab, mats in v.items()
                                                    for d, m in zip(fig["depths"], mats)})
    result["findings"] = findings(result)
    result["provenance"] = report.provenance(NAME, argv, dict(device="cpu", _load_start=load), started, t0)
    report.write_json(out / "result.json", result)
    report.write_text(out / "table.md", markdown(result))
    title = f"normalised kernels C_l at init (T={cfg.block_size}, L={cfg.n_layer}, {cfg.activation}, vanilla)"
    wrote = plot_heatmaps(fig, out / "plot.png", title)
    print("\n".join(f"  {line}" for line in result["findings"]))
    print(f"wrote {out / 'result.json'}, {out / 'kernels.npz'}, {out / 'table.md'}"
          + (f", {out / 'plot.png'}" if wrote else "")
          + f" in {report.duration(time.time() - t0)}")
    return 0


def main(argv=None):
    return run_command(run, sys.argv[1:] if argv is None else list(argv))
