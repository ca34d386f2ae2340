"""Figure 4(b): the vanilla E-SPA transformer trained about 5 times longer against the
Pre-LN transformer (docs/method.md §12), and the iterations ratio behind the claim.

    python -m nanospa.experiments longer [--preset=quick|study|full|tiny] [--factor=5] [--key=value ...]

Methods: Pre-LN and vanilla E-SPA for --steps, and vanilla E-SPA for factor x --steps
(espa_long); the study and full presets also run Pre-LN for factor x --steps
(pre_ln_long), the quick one leaves it out to fit a CPU budget (add it with --methods=...).
The study preset gives each kind three rates of its own (controls.STUDY_WINDOWS). The positional
controls (controls.py: Pre-LN with ALiBi, RoPE, E-SPA's fixed prior, no positions) run
for --steps in the study, tiny and full presets. Each run has its own warm-up and cosine
schedule over its own length.

The iterations ratio (analysis(), in result.json's "analysis" and the findings): for each
checkpoint S = CHECKPOINTS x its steps of a Pre-LN run (plain, each control, and the long
one), the number
of steps vanilla E-SPA's longest run needs until its smoothed training loss first reaches
that Pre-LN run's smoothed loss at S, divided by S; per seed (seed s of each at its best
learning rate), then the mean and standard deviation over the seeds that got there. The
smoothing [choice] is a trailing window of SMOOTH_FRACTION of the step count: at step t,
the mean over [(1 - f) t, t] of the loss curve (linear between records). Relative, so that
a curve stretched k-fold in steps is smoothed into the same curve stretched k-fold, and a
run whose loss is exactly Pre-LN's stretched by k gives ratio k at every S. Steps count updates done (a record at iteration
it is the loss after it updates, step it + 1); the crossing is interpolated linearly
between records. A seed whose E-SPA never gets there is censored: "> factor x steps / S".
"""
import sys

import numpy as np

from . import report, runner
from .controls import POSITION_CONTROLS, control_methods, controls_line, study_window
from .runner import PRE_LN, VANILLA, Method

NAME = "longer"
TITLE = "vanilla E-SPA trained longer vs Pre-LN"
PAPER = ("Figure 4(b) and the abstract: deep vanilla transformers (no skips, no normalisation) "
         "with E-SPA reach the performance of standard ones after about 5 times more iterations "
         "(WikiText-103 and C4).")
EXTRA = dict(factor=5, long_lrs=(0.0,))
EXTRA_NOTES = dict(factor="the long runs take factor x steps",
                   long_lrs="pre_ln_long's learning rates; 0 = the middle of Pre-LN's window (study) or --lrs")
STUDY_METHODS = ",".join(["pre_ln", *POSITION_CONTROLS, "espa", "espa_long", "pre_ln_long"])
PRESETS = dict(tiny=dict(factor=2), quick=dict(steps=300, methods="pre_ln,espa,espa_long"),
               study=dict(steps=400, factor=5, methods=STUDY_METHODS), full=dict(methods=""))
CHECKPOINTS = (0.1, 0.25, 0.5, 1.0)   # fractions of the Pre-LN run at which the ratio is read
SMOOTH_FRACTION = 0.2                 # trailing window: the last 20% of the steps so far


def methods(settings):
    k = settings["factor"]
    if k < 1:
        raise ValueError(f"factor must be >= 1, got {k}")
    espa = dict(VANILLA, attention="espa")
    vanilla, pre = study_window(settings, "vanilla"), study_window(settings, "pre_ln")
    given = tuple(settings.get("long_lrs", (0.0,)))
    if any(lr < 0 for lr in given) or (0.0 in given and len(given) > 1):
        raise ValueError(f"long_lrs must be positive rates, or 0 alone for the default, got {given}")
    long_lrs = pre[1:2] if given == (0.0,) else given
    return {
        "pre_ln": Method(dict(PRE_LN), "Pre-LN, standard attention, GeLU", lrs=pre),
        "espa": Method(espa, "vanilla E-SPA", lrs=vanilla),
        "espa_long": Method(espa, f"vanilla E-SPA, {k}x steps", steps_factor=k, lrs=vanilla),
        # by default the study runs it at the middle of Pre-LN's window only (its one-seed
        # best, 1e-2): 3 rates x 3 seeds x 5x steps are a second hour of CPU (docs/results.md);
        # --long_lrs=3e-3,1e-2,3e-2 --reuse=... adds the other two
        "pre_ln_long": Method(dict(PRE_LN), f"Pre-LN, {k}x steps", steps_factor=k, lrs=long_lrs),
        **control_methods(lrs=study_window(settings, "control")),
    }


# ------------------------------------------------------------------ the iterations ratio

def smoothed(steps, loss, fraction=SMOOTH_FRACTION):
    """Trailing relative moving average: at each record's step t, the mean over
    [max((1 - fraction) t, first step), t] of the curve through the records (linear between
    them; the record itself where that window is empty). Relative and continuous, so that
    stretching a curve k-fold in steps, at any logging interval, stretches its smoothed curve
    k-fold (to the interpolation error). steps increasing, (n,)."""
    s, y = np.asarray(steps, dtype=float), np.asarray(loss, dtype=float)
    F = np.concatenate([[0.0], np.cumsum(np.diff(s) * (y[1:] + y[:-1]) / 2)])   # integral to each record
    a = np.maximum((1.0 - fraction) * s, s[0])                                  # window starts
    k = np.clip(np.searchsorted(s, a, side="right") - 1, 0, len(s) - 1)
    Fa = F[k] + (a - s[k]) * (y[k] + np.interp(a, s, y)) / 2
    width = s - a
    out = y.copy()
    ok = width > 0
    out[ok] = (F[ok] - Fa[ok]) / width[ok]
    return out


def steps_to_reach(steps, loss, target):
    """The first step at which the curve (steps, loss) is at or below target, linearly
    interpolated between the records around the crossing; None when it never is."""
    below = np.flatnonzero(np.asarray(loss) <= target)
    if not below.size:
        return None
    i = below[0]
    if i == 0:
        return float(steps[0])
    (s0, s1), (l0, l1) = steps[i - 1:i + 1], loss[i - 1:i + 1]
    return float(s0 + (s1 - s0) * (l0 - target) / (l0 - l1))


def _curve(history):
    """(steps done, loss) of a run's history [(iteration, loss)]: step = iteration + 1."""
    h = np.asarray(history, dtype=float).reshape(-1, 2)
    ok = np.isfinite(h[:, 1])
    return h[ok, 0] + 1.0, h[ok, 1]


def iterations_ratio(reference, other, checkpoints, fraction=SMOOTH_FRACTION):
    """For each checkpoint step S: (steps `other` needs to reach the smoothed loss of
    `reference` at S) / S, or None (censored). reference, other: histories [(iteration,
    loss)]; a checkpoint past the reference's last step is None too."""
    rs, rl = _curve(reference)
    os_, ol = _curve(other)
    if not len(rs) or not len(os_):
        return [None] * len(checkpoints)
    r_sm, o_sm = smoothed(rs, rl, fraction), smoothed(os_, ol, fraction)
    out = []
    for S in checkpoints:
        if S > rs[-1] or S < rs[0]:
            out.append(None)
            continue
        reached = steps_to_reach(os_, o_sm, float(np.interp(S, rs, r_sm)))
        out.append(None if reached is None else reached / S)
    return out


def _best_runs(result, label):
    """{seed: history} of a method's runs at its best learning rate, or {}."""
    m = result["methods"].get(label)
    if not m or m["summary"]["best_lr"] is None:
        return {}
    return {r["seed"]: r["history"] for r in m["runs"] if r["lr"] == m["summary"]["best_lr"] and not r["diverged"]}


def analysis(result):
    """{"iterations_ratio": {pre-LN label: {checkpoints, steps (S), against, against_steps,
    per_seed {seed: [ratio or None per S]}, mean, std (over the seeds that reached it),
    reached, seeds}}, "smooth_fraction"}: vanilla E-SPA's longest run (espa_long, else
    espa) against each Pre-LN run (plain and the controls) that ran."""
    against = next((l for l in ("espa_long", "espa") if _best_runs(result, l)), None)
    out = {}
    for label in ["pre_ln", *POSITION_CONTROLS, "pre_ln_long"]:
        ref = _best_runs(result, label)
        if not ref or against is None:
            continue
        other = _best_runs(result, against)
        Ss = [max(1, round(c * result["methods"][label]["steps"])) for c in CHECKPOINTS]
        per_seed = {seed: iterations_ratio(ref[seed], other[seed], Ss) for seed in sorted(ref) if seed in other}
        cols = list(zip(*per_seed.values())) if per_seed else [()] * len(Ss)
        got = [[x for x in col if x is not None] for col in cols]
        out[label] = dict(checkpoints=list(CHECKPOINTS), steps=Ss, against=against,
                          against_steps=result["methods"][against]["steps"],
                          per_seed={str(k): v for k, v in per_seed.items()},
                          mean=[float(np.mean(g)) if g else None for g in got],
                          std=[float(np.std(g)) if g else None for g in got],
                          reached=[len(g) for g in got], seeds=len(per_seed))
    return {"iterations_ratio": out, "smooth_fraction": SMOOTH_FRACTION}


def ratio_line(label, r):
    """One findings line of analysis()'s numbers for one Pre-LN run."""
    parts = []
    for i, (c, S, mean, std, n) in enumerate(zip(r["checkpoints"], r["steps"], r["mean"], r["std"], r["reached"])):
        seeds = ", ".join("-" if v[i] is None else f"{v[i]:.2f}" for v in r["per_seed"].values())
        if n == 0:
            text = f"> {r['against_steps'] / S:.3g} (not reached)"
        else:
            text = f"{mean:.2f}" + (f" ± {std:.2f}" if n > 1 else "") + (
                f" ({r['seeds'] - n} of {r['seeds']} seeds not reached)" if n < r["seeds"] else "")
        parts.append(f"S = {S} ({c:.0%}): {text} [seeds: {seeds}]")
    return (f"iterations ratio, {r['against']} against {label} (steps to reach its smoothed training loss at S, "
            f"/ S; trailing {SMOOTH_FRACTION:.0%} window; mean ± std over seeds): " + "; ".join(parts))


def findings(result):
    lines = [report.loss_line(result, label) for label in result["methods"]]
    pre, short, long_ = (report.summary(result, k) for k in ("pre_ln", "espa", "espa_long"))
    k = result["settings"]["factor"]
    if pre and short and long_ and pre["best_lr"] and short["best_lr"] and long_["best_lr"]:
        g1 = short["final_train"] - pre["final_train"]
        gk = long_["final_train"] - pre["final_train"]
        head = (f"E-SPA minus Pre-LN ({result['settings']['steps']} steps) final train loss: "
                f"vanilla E-SPA with the same steps {g1:+.3f}, with {k}x steps {gk:+.3f} -> ")
        if g1 <= 0:
            verdict = ("no gap to close at this scale: vanilla E-SPA is already level with or ahead of "
                       "Pre-LN after the same steps (the paper has it behind)")
        elif gk <= report.MATCH_MARGIN:
            verdict = f"the gap closes (within {report.MATCH_MARGIN} nats or better), as in the paper"
        else:
            verdict = f"{'narrower' if gk < g1 else 'not narrower'} but not closed"
        lines.append(head + verdict)
    both = report.summary(result, "pre_ln_long")
    if both and long_ and both["best_lr"] and long_["best_lr"]:
        g = long_["final_train"] - both["final_train"]
        lines.append(f"both trained {k}x as long: vanilla E-SPA minus Pre-LN final train loss {g:+.3f} -> "
                     + ("Pre-LN ahead" if g > 0 else "E-SPA level or ahead"))
    ratios = (result.get("analysis") or {}).get("iterations_ratio", {})
    lines += [ratio_line(label, r) for label, r in ratios.items() if r["seeds"]]
    line = controls_line(result)
    return lines + ([line] if line else [])


def main(argv=None):
    return runner.main(sys.modules[__name__], argv)
