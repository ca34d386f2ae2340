"""Does K-FAC close the deep vanilla transformer's gap? Vanilla E-SPA, vanilla standard
attention and Pre-LN, each trained with AdamW and with K-FAC (nanospa.beyond.kfac.KFAC,
docs/kfac.md), at each one's best learning rate (and, for K-FAC, damping) from a grid.

    python -m nanospa.experiments kfac [--preset=quick|full|tiny] [--dampings=a,b] [--key=value ...]

Methods: MODEL_adamw and MODEL_kfac_dDAMPING for MODEL in espa, softmax, pre_ln (the first
of --dampings for every model, every one of them for vanilla E-SPA). AdamW runs
the model's ADAM_LRS grid, K-FAC the KFAC_LRS grid (K-FAC's steps are preconditioned: its
learning rates are not AdamW's); every other setting (steps, schedule, clipping, batch,
seeds) is the same. The findings compare each model's best K-FAC damping with AdamW per
step (final and early losses) and per second (the loss each reaches after the same CPU
time, from each method's median CPU seconds per step: each worker is single-threaded, so
its CPU time does not depend on what else shares the machine). plot.png: loss against
steps and against CPU seconds.

Not here: the optimiser (nanospa/beyond/kfac.py), the runner (runner.py), the per-step cost on the
ref configuration (python -m nanospa.bench --optimizer=kfac, docs/performance.md).
"""
import math
import sys
import textwrap

import numpy as np

from . import report, runner
from .runner import PRE_LN, VANILLA, Method

NAME = "kfac"
TITLE = "K-FAC vs AdamW on vanilla E-SPA, vanilla standard attention and Pre-LN"
PAPER = ("The transformer paper trains with Adam only. DKS (Martens et al. 2021) and TAT (Zhang et "
         "al. 2022) report that with K-FAC, deep vanilla (skipless, normless) convolutional networks "
         "with shaped activations train about as fast per step as residual networks, while with Adam "
         "they stay behind. Whether K-FAC closes a deep vanilla transformer's gap to Pre-LN is, as far "
         "as we know, untested; it should not rescue standard attention, whose rank collapse is a "
         "property of the architecture, not of the optimiser.")
MODELS = dict(espa=(dict(VANILLA, attention="espa"), "vanilla E-SPA"),
              softmax=(dict(VANILLA, attention="softmax"), "vanilla, standard attention"),
              pre_ln=(dict(PRE_LN), "Pre-LN, standard attention, GeLU"))
# AdamW grids around each model's best rate in results/fig2 (E-SPA 3e-4, Pre-LN 1e-2 there);
# K-FAC's around the best of a 100-step calibration on vanilla E-SPA (0.1 of 0.01..0.3).
ADAM_LRS = dict(espa=(1e-4, 3e-4, 1e-3), softmax=(1e-4, 3e-4, 1e-3), pre_ln=(3e-3, 1e-2, 3e-2))
KFAC_LRS = (0.03, 0.1, 0.3)
EXTRA = dict(dampings=(1e-2, 1e-3), kfac_inv_interval=10, kfac_ema=0.95, kfac_momentum=0.5, kfac_kl_clip=1e-3)
EXTRA_NOTES = dict(dampings="K-FAC dampings: the first for every model, the others for vanilla E-SPA too",
                   kfac_inv_interval="K-FAC steps between eigendecompositions",
                   kfac_ema="K-FAC factor decay", kfac_momentum="K-FAC momentum",
                   kfac_kl_clip="K-FAC KL clipping (0 = off)")
PRESETS = dict(tiny=dict(dampings=(1e-2,)), quick=dict(seeds=2))
EARLY = (0.25, 0.5)


def kfac_label(model, damping):
    return f"{model}_kfac_d{damping:g}"


def methods(settings):
    if not settings["dampings"] or any(not d > 0 for d in settings["dampings"]):
        raise ValueError(f"dampings must be positive numbers, got {settings['dampings']}")
    tiny = settings["preset"] == "tiny"
    kfac = {k: settings[k] for k in ("kfac_inv_interval", "kfac_ema", "kfac_momentum", "kfac_kl_clip")}
    out = {}
    for model, (config, description) in MODELS.items():
        out[f"{model}_adamw"] = Method(dict(config), f"{description}, AdamW",
                                       lrs=() if tiny else ADAM_LRS[model])
        for d in settings["dampings"] if model == "espa" else settings["dampings"][:1]:
            out[kfac_label(model, d)] = Method(dict(config), f"{description}, K-FAC (damping {d:g})",
                                               lrs=(KFAC_LRS[1],) if tiny else KFAC_LRS,
                                               optimizer=dict(kfac, optimizer="kfac", kfac_damping=d))
    return out


def best_kfac(result, model):
    """The label of the model's K-FAC method with the lowest final training loss (its best damping)."""
    labels = [l for l in result["methods"] if l.startswith(f"{model}_kfac_")]
    order = report.ranking(result, labels)
    return order[0] if order else None


def loss_at_seconds(result, label, seconds):
    """The method's mean training-loss curve (best lr) after `seconds` of CPU time, read
    through its median CPU seconds per step; NaN when its run ended earlier."""
    m = report.summary(result, label)
    if not m or not m["curve"] or not m.get("step_seconds"):
        return math.nan
    it, loss = np.array(m["curve"]).T
    step = seconds / m["step_seconds"]
    if step > it[-1]:
        return math.nan
    w = max(1, len(loss) // report.SMOOTH_POINTS)
    return float(np.interp(step, it[w - 1:], report.smooth(loss, w)))


def findings(result):
    lines = [report.loss_line(result, label) for label in result["methods"]]
    best = {model: (f"{model}_adamw", best_kfac(result, model)) for model in MODELS}
    for model, (adam, kfac) in best.items():
        a, k = report.summary(result, adam), report.summary(result, kfac) if kfac else None
        if not (a and k and a["best_lr"] and k["best_lr"]):
            lines.append(f"{model}: K-FAC or AdamW diverged at every learning rate; no comparison")
            continue
        lines.append(f"{model}: final train loss AdamW {a['final_train']:.3f} (lr {a['best_lr']:g}), K-FAC "
                     f"{k['final_train']:.3f} ({kfac}, lr {k['best_lr']:g}) -> K-FAC "
                     f"{'ahead' if k['final_train'] < a['final_train'] else 'behind'} by "
                     f"{abs(k['final_train'] - a['final_train']):.3f} per step; CPU seconds per step "
                     f"{a['step_seconds']:.3f} vs {k['step_seconds']:.3f} ({k['step_seconds'] / a['step_seconds']:.2f}x)")
    pre_adam = report.summary(result, "pre_ln_adamw")
    for opt, index in (("AdamW", 0), ("K-FAC", 1)):
        e_label, p_label = best["espa"][index], best["pre_ln"][index]
        e, p = report.summary(result, e_label) if e_label else None, report.summary(result, p_label) if p_label else None
        if not (e and p and e["best_lr"] and p["best_lr"]):
            continue
        early = ", ".join(f"{f:.0%}: {report.loss_at(result, e_label, f) - report.loss_at(result, p_label, f):+.3f}"
                          for f in EARLY)
        lines.append(f"vanilla E-SPA minus Pre-LN, both with {opt}: final {e['final_train'] - p['final_train']:+.3f} "
                     f"(around {early} of the run)")
    e_adam, e_kfac = report.summary(result, "espa_adamw"), report.summary(result, best["espa"][1]) if best["espa"][1] else None
    if pre_adam and pre_adam["best_lr"] and e_adam and e_adam["best_lr"] and e_kfac and e_kfac["best_lr"]:
        runs = [report.summary(result, l) for l in ("pre_ln_adamw", best["espa"][1], "espa_adamw")]
        budget = min(m["step_seconds"] * m["curve"][-1][0] for m in runs)     # the shortest run's clock
        pa, ek, ea = (loss_at_seconds(result, l, budget) for l in ("pre_ln_adamw", best["espa"][1], "espa_adamw"))
        lines.append(f"per CPU second, after {budget:.0f} s of CPU time each: Pre-LN AdamW {pa:.3f}, vanilla "
                     f"E-SPA AdamW {ea:.3f}, vanilla E-SPA K-FAC {ek:.3f}")
        gap_adam, gap_kfac = e_adam["final_train"] - pre_adam["final_train"], e_kfac["final_train"] - pre_adam["final_train"]
        if gap_adam <= 0:
            lines.append(f"verdict: no gap to close per step at this scale: with AdamW vanilla E-SPA already ends "
                         f"{-gap_adam:.3f} below Pre-LN (AdamW); with K-FAC it ends {gap_kfac:+.3f} from it")
        else:
            lines.append(f"verdict per step: the E-SPA - Pre-LN(AdamW) gap is {gap_adam:+.3f} with AdamW and "
                         f"{gap_kfac:+.3f} with K-FAC -> "
                         + ("closed" if gap_kfac <= report.MATCH_MARGIN else
                            "narrower, not closed" if gap_kfac < gap_adam else "not narrower"))
    s_adam, s_kfac = report.summary(result, "softmax_adamw"), report.summary(result, best["softmax"][1]) if best["softmax"][1] else None
    if s_kfac and s_kfac["best_lr"]:
        rescued = not s_kfac["stalled"]
        lines.append("standard attention with K-FAC: " + ("NOT stalled: K-FAC rescues it (unexpected)" if rescued else
                     f"still stalled (final loss {s_kfac['final_train']:.3f}, {s_kfac['below_unigram']:+.3f} below the unigram entropy): "
                     "K-FAC does not rescue it, as expected of rank collapse")
                     + (f"; AdamW: {s_adam['below_unigram']:+.3f} below" if s_adam and s_adam["best_lr"] else ""))
    return lines


def plot(result, path, panels=None):
    """Loss against steps and against seconds: each model's AdamW and best K-FAC run."""
    plt = report.pyplot(path)
    if plt is None:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(report.PANEL_INCHES[0] * 2, report.PANEL_INCHES[1]), constrained_layout=True)
    unigram = result["data"]["unigram_entropy"]
    lows = [unigram]
    for model in MODELS:
        for label, ls in ((f"{model}_adamw", "-"), (best_kfac(result, model), "--")):
            m = report.summary(result, label) if label else None
            if not m or not m["curve"]:
                continue
            it, loss = np.array(m["curve"]).T
            w = max(1, len(loss) // report.SMOOTH_POINTS)
            y, x = report.smooth(loss, w), it[w - 1:]
            name = f"{label} (lr {m['best_lr']:g})"
            axes[0].plot(x, y, ls=ls, label=name)
            axes[1].plot(x * m["step_seconds"], y, ls=ls, label=name)
            lows.append(np.nanmin(y))
    for ax, xlabel in zip(axes, ("iteration", "CPU seconds (median CPU seconds per step x iteration)")):
        ax.axhline(unigram, color="k", ls=":", lw=1, label="unigram entropy")
        ax.set_ylim(min(lows) - report.Y_MARGIN[0], math.log(result["data"]["vocab_size"]) + report.Y_MARGIN[1])
        ax.set_xlabel(xlabel)
        ax.set_ylabel("training loss (nats/token, moving average)")
        ax.set_title(textwrap.fill(f"{result['name']}: {result['title']}", 60), fontsize=9)
        ax.legend(fontsize=7)
    try:
        with report.naming(path):
            fig.savefig(path, dpi=report.PLOT_DPI)
    finally:
        plt.close(fig)
    return True


def main(argv=None):
    return runner.main(sys.modules[__name__], argv)


if __name__ == "__main__":
    sys.exit(main())
