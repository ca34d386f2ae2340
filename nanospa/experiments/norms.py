"""Every residual and normalisation scheme of the seed explainer beside the paper's models,
at depth (docs/norms.md, docs/residuals.md).

    python -m nanospa.experiments norms [--preset=quick|full|tiny] [--key=value ...]

Methods (all with standard attention, GeLU and learned positions unless the label says
otherwise; the schemes' own choices are in docs/norms.md and docs/residuals.md):

    pre_ln            Pre-LN with LayerNorm
    post_ln           Post-LN, with the runner's warm-up (steps // 10)
    post_ln_nowarmup  Post-LN without warm-up
    deepnorm          DeepNet's Post-LN, x' = LN(alpha x + f(x)), beta-scaled init
    realformer        Pre-LN with residual attention scores (RealFormer)
    ngpt              the normalised transformer (nGPT), weights renormalised every step
    pre_rmsnorm, pre_dyt, pre_batchnorm, pre_prepbn, pre_groupnorm   Pre-LN with that norm
    pre_prepbn_eta0   PRepBN with RepBN's eta initialised to 0 (nanospa's control, not SLAB's)
    espa              the paper's vanilla E-SPA (no skips, no norms, TAT leaky ReLU)
    espa_nr           E-SPA with normalised residuals (Figure 3), no norms

One learning-rate grid, GRID; each method runs the three rates of it around its expected
best (WINDOWS, from results/fig2 and fig3 where the model was run there), and a best at
the window's edge is flagged in the table. Recorded for each method before training
(at_init): the mean off-diagonal normalised kernel ("cos") and mean q-value of the last
block's output in evaluation mode (BatchNorm, PRepBN: their initial running statistics),
measured on a fixed batch of validation sequences at init and predicted by
nanospa.signal where the wide-limit map is known (else "no map"). Findings: final loss,
loss around 25% and 50% of the run, and what the seed explainer says of each scheme beside
what nanospa saw.
"""
import math
import sys

import numpy as np

from . import report, runner
from .runner import PRE_LN, VANILLA, Method

NAME = "norms"
TITLE = "residual and normalisation schemes at depth: Pre-LN, Post-LN, DeepNorm, RealFormer, nGPT, norms; vanilla E-SPA"
PAPER = ("The paper compares vanilla E-SPA (no skips, no normalisation) and E-SPA with normalised "
         "residuals against Pre-LN only. The seed explainer (residuals and normalisation in "
         "transformers) says: Post-LN is hard to train deep without learning-rate warm-up and DeepNorm "
         "fixes it; Pre-LN trains stably deep; RMSNorm matches LayerNorm at lower cost; BatchNorm suits "
         "transformers poorly (batch statistics over variable text) and PRepBN's progressive switch "
         "from LayerNorm makes it usable; RealFormer's residual scores help; nGPT (hypersphere) trains "
         "in fewer steps; DyT replaces the norm by an elementwise tanh.")
GRID = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2)
HIGH, MID, LOW = GRID[3:6], GRID[2:5], GRID[0:3]
EXPLAINER = dict(
    post_ln_nowarmup="hard to train deep without warm-up",
    deepnorm="fixes deep Post-LN",
    pre_rmsnorm="matches LayerNorm",
    pre_batchnorm="poorly suited to transformers",
    pre_prepbn="makes BatchNorm usable",
    pre_prepbn_eta0="makes BatchNorm usable",
    realformer="residual scores help",
    ngpt="faster convergence per step",
    pre_dyt="matches the norm it replaces",
)
EARLY = (0.25, 0.5)
PROBE_ROWS = 4       # validation sequences of the at-init kernels
PREPBN_FRACTION = 0.16   # PRepBN's LayerNorm -> RepBN schedule as a share of the run (SLAB's 60k of 375k)


def _methods():
    ln = dict(PRE_LN)
    return {
        "pre_ln": (Method(dict(ln), "Pre-LN, LayerNorm"), HIGH),
        # Post-LN stalled at 1e-3 .. 1e-2 in the first (partial) run: the low window here
        "post_ln": (Method(dict(ln, norm_position="post"), "Post-LN, LayerNorm, warm-up"), LOW),
        "post_ln_nowarmup": (Method(dict(ln, norm_position="post"), "Post-LN, LayerNorm, no warm-up", warmup=0), LOW),
        "deepnorm": (Method(dict(ln, residual="deepnorm", norm_position="post"), "DeepNorm (Post-LN, alpha, beta)"), MID),
        "realformer": (Method(dict(ln, residual_attention=True), "Pre-LN + residual attention (RealFormer)"), HIGH),
        # nGPT: no norm layers, positions only inside attention (none here), no warm-up (as published)
        "ngpt": (Method(dict(ln, residual="ngpt", norm="none", pos="none"), "nGPT (normalised transformer), no warm-up",
                        warmup=0), HIGH),
        "pre_rmsnorm": (Method(dict(ln, norm="rmsnorm"), "Pre-LN, RMSNorm"), HIGH),
        "pre_dyt": (Method(dict(ln, norm="dyt"), "Pre-LN, DyT"), MID),   # best 3e-3 of HIGH in the first run
        # the causal forms (statistics over positions <= t): the published ones see the future
        # while training (python -m nanospa.experiments causality), so their loss is not a language model's
        "pre_batchnorm": (Method(dict(ln, norm="batchnorm", norm_causal=True), "Pre-LN, causal BatchNorm"), MID),
        # SLAB's eta = 1 passes the unnormalised stream on: it blows up at depth (docs/norms.md §3)
        "pre_prepbn": (Method(dict(ln, norm="prepbn", norm_causal=True), "Pre-LN, causal PRepBN (LN -> RepBN)"), MID),
        "pre_prepbn_eta0": (Method(dict(ln, norm="prepbn", norm_causal=True, prepbn_eta=0.0),
                                   "Pre-LN, causal PRepBN, RepBN's eta from 0"), MID),   # best 3e-3 of HIGH
        "pre_groupnorm": (Method(dict(ln, norm="groupnorm"), "Pre-LN, GroupNorm"), HIGH),
        "espa": (Method(dict(VANILLA, attention="espa"), "vanilla E-SPA"), LOW),
        "espa_nr": (Method(dict(VANILLA, attention="espa", residual="normalised"), "E-SPA, normalised residuals, no norm"),
                    HIGH),   # best 1e-2 of MID in the first complete run
    }


def methods(settings):
    tiny = settings["preset"] == "tiny"
    out = {}
    for label, (m, window) in _methods().items():
        m.lrs = () if tiny else window
        if m.config.get("norm") == "prepbn":        # SLAB's share of the run: 16 % (docs/norms.md)
            m.config["prepbn_steps"] = max(1, round(PREPBN_FRACTION * settings["steps"]))
        out[label] = m
    return out


PRESETS = dict(quick=dict(seeds=2))


def _last_layer(stats):
    return dict(cos=stats["cos"][-1], q=stats["q"][-1])


def at_init(settings, configs, ds):
    """{label: dict(measured=..., predicted=... or None, why)} of the last block's output at init."""
    from ..config import GPTConfig
    from ..measure import layer_stats, measured_kernels
    from ..model import GPT
    from ..predict import predicted_kernels
    import data as nanospa_data
    T = settings["block_size"]
    probe, _ = nanospa_data.get_batch(ds.val, PROBE_ROWS, T, np.random.default_rng(0))
    out = {}
    for label, d in configs.items():
        cfg = GPTConfig(**d)
        model = GPT(cfg, seed=0)
        with model.evaluating():            # as predict_kernels without batch=: running statistics
            entry = dict(measured=_last_layer(layer_stats(measured_kernels(model, probe)["hidden"])))
        try:
            entry["predicted"] = _last_layer(layer_stats(predicted_kernels(cfg, model.plan, probe)))
        except (NotImplementedError, ValueError) as e:
            entry["predicted"], entry["why"] = None, " ".join(str(e).split())
        if cfg.norm == "prepbn":            # and at the switch's end (lambda = 0), still at init
            end = GPTConfig(**dict(d, prepbn_steps=0))
            model = GPT(end, seed=0)
            with model.evaluating():
                entry["after_switch"] = dict(
                    measured=_last_layer(layer_stats(measured_kernels(model, probe)["hidden"])),
                    predicted=_last_layer(layer_stats(predicted_kernels(end, model.plan, probe))))
        out[label] = entry
    return out


def findings(result):
    lines = [report.loss_line(result, label) for label in result["methods"]]
    init = result.get("at_init", {})
    for label in result["methods"]:
        e = init.get(label)
        if e:
            m, p = e["measured"], e["predicted"]
            lines.append(f"{label} at init, last block: measured cos {m['cos']:.3f} q {m['q']:.3f}; "
                         + (f"predicted cos {p['cos']:.3f} q {p['q']:.3f}" if p else f"predicted: no map ({e.get('why', '')})"))
            if e.get("after_switch"):
                a = e["after_switch"]
                lines.append(f"{label} at init with lambda = 0 (RepBN alone), last block: measured q {a['measured']['q']:.4g}, "
                             f"predicted q {a['predicted']['q']:.4g} (LayerNorm's at lambda = 1: {m['q']:.3f})")
    pre = report.summary(result, "pre_ln")
    for label in result["methods"]:
        s = report.summary(result, label)
        if label == "pre_ln" or not (s and pre and s["best_lr"] and pre["best_lr"]):
            continue
        early = ", ".join(f"{f:.0%} {report.loss_at(result, label, f) - report.loss_at(result, 'pre_ln', f):+.3f}"
                          for f in EARLY)
        said = f"; the explainer: {EXPLAINER[label]}" if label in EXPLAINER else ""
        lines.append(f"{label} minus Pre-LN: final {s['final_train'] - pre['final_train']:+.3f} (around {early}){said}")
    post, nowarm = report.summary(result, "post_ln"), report.summary(result, "post_ln_nowarmup")
    deep = report.summary(result, "deepnorm")
    if post and nowarm:
        div = [l for l in ("post_ln", "post_ln_nowarmup", "deepnorm")
               if report.summary(result, l) and any(math.isinf(v) for v in report.summary(result, l)["by_lr"].values())]
        lines.append("Post-LN without warm-up vs with: " + (
            f"final {nowarm['final_train'] - post['final_train']:+.3f}" if nowarm["best_lr"] and post["best_lr"]
            else "one of them diverged at every rate")
            + (f"; diverged at some rate: {', '.join(div)}" if div else "; no divergence at any rate of the window")
            + (f"; DeepNorm minus Post-LN (warm-up): {deep['final_train'] - post['final_train']:+.3f}"
               if deep and deep["best_lr"] and post["best_lr"] else ""))
    return lines


def main(argv=None):
    return runner.main(sys.modules[__name__], argv)


if __name__ == "__main__":
    sys.exit(main())
