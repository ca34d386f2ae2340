"""Figure 2: deep vanilla transformers (no skips, no normalisation) with standard attention,
Value-SkipInit, U-SPA and E-SPA, against the Pre-LN transformer (docs/method.md §4, §6,
§7, §12).

    python -m nanospa.experiments fig2 [--preset=quick|study|full|tiny] [--key=value ...]

Every vanilla model uses the same shaped activation (TAT leaky ReLU) and the kernel
budget of GPTConfig's defaults; Pre-LN uses learned positions, LayerNorm and GeLU. The
positional controls (controls.py: Pre-LN with ALiBi, RoPE, E-SPA's fixed prior, or no
positions) are extra rows of the study, tiny and full presets; quick runs the paper's five.
"""
import sys

from . import report, runner
from .controls import control_methods, controls_line, study_window
from .runner import NAMES, PRE_LN, VANILLA, Method

NAME = "fig2"
TITLE = "vanilla transformers (no skips, no norm): standard attention vs Value-SkipInit, U-SPA, E-SPA; Pre-LN reference"
PAPER = ("Figure 2 (WikiText-103, depth 36, 3 seeds): without the attention modifications a deep "
         "vanilla transformer does not train: its training loss stays near 7.5 (nanospa's reading: "
         "about the unigram entropy of a subword tokeniser on English text, i.e. the model learns "
         "token frequencies only). Value-SkipInit, U-SPA and E-SPA train, E-SPA best; the Pre-LN "
         "transformer (skips and LayerNorm) is still faster per step than every vanilla model.")
VANILLA_KINDS = ("softmax", "value_skipinit", "uspa", "espa")
EARLY = (0.25, 0.5)   # fractions of the run at which Pre-LN and E-SPA are also compared
PRESETS = dict(quick=dict(methods="softmax,value_skipinit,uspa,espa,pre_ln"))


def methods(settings):
    vanilla, pre = study_window(settings, "vanilla"), study_window(settings, "pre_ln")
    out = {kind: Method(dict(VANILLA, attention=kind), f"vanilla, {NAMES[kind]}", lrs=vanilla)
           for kind in VANILLA_KINDS}
    out["pre_ln"] = Method(dict(PRE_LN), "Pre-LN, standard attention, GeLU", lrs=pre)
    out.update(control_methods(lrs=study_window(settings, "control")))
    return out


def findings(result):
    lines = [report.loss_line(result, label) for label in result["methods"]]
    order = report.ranking(result, VANILLA_KINDS)
    if order:
        lines.append("vanilla models from best to worst: " + " < ".join(order)
                     + (" (E-SPA best, as in the paper)" if order[0] == "espa"
                        else f" (the paper has E-SPA best; here {order[0]} is)"))
    pre, esp, sm = (report.summary(result, k) for k in ("pre_ln", "espa", "softmax"))
    if pre and esp and pre["best_lr"] and esp["best_lr"]:
        gap = esp["final_train"] - pre["final_train"]
        lines.append(f"E-SPA minus Pre-LN final train loss: {gap:+.3f} -> "
                     + ("Pre-LN ahead, as in the paper" if gap > 0 else
                        "E-SPA ahead of Pre-LN after the same steps (the paper has Pre-LN ahead)"))
        for frac in EARLY:
            p, e = report.loss_at(result, "pre_ln", frac), report.loss_at(result, "espa", frac)
            lines.append(f"training loss around {frac:.0%} of the run ({report.LOSS_WINDOW:.0%} window): "
                         f"Pre-LN {p:.3f}, E-SPA {e:.3f} -> " + ("Pre-LN ahead" if p < e else "E-SPA ahead"))
    if sm and esp and sm["best_lr"] and esp["best_lr"]:
        ok = sm["stalled"] and not esp["stalled"]
        lines.append("central contrast (standard attention stalls near unigram, E-SPA clearly below): "
                     + ("reproduced" if ok else "NOT reproduced"))
    line = controls_line(result)
    return lines + ([line] if line else [])


def main(argv=None):
    return runner.main(sys.modules[__name__], argv)
