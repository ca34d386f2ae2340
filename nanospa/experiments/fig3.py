"""Figure 3: transformers with normalised residual connections and no normalisation layers
against the Pre-LN transformer (docs/method.md §2.2, §12).

    python -m nanospa.experiments fig3 [--preset=quick|full|tiny] [--key=value ...]

A normalised residual block is X' = a X + b f(X) with a^2 + b^2 = 1 (b = GPTConfig
residual_beta, nanospa's default 0.1; the paper's value is not known: sweep it with
--residual_beta=...). The shaped activation is TAT leaky ReLU, shaped for the residual
network. Standard attention with the same residuals is a control: it shows how much of
the result comes from the residual branch and how much from the attention change.
"""
import sys

from . import report, runner
from .runner import NAMES, PRE_LN, Method

NAME = "fig3"
TITLE = "normalised residual connections, no normalisation: Value-SkipInit, U-SPA, E-SPA vs Pre-LN"
PAPER = ("Figure 3: with normalised residual connections (and no normalisation layers) the "
         "modified-attention models match the standard Pre-LN transformer's training loss, "
         "without needing more iterations.")
KINDS = ("softmax", "value_skipinit", "uspa", "espa")


def methods(settings):
    out = {}
    for kind in KINDS:
        out[kind + "+NR"] = Method(dict(attention=kind, residual="normalised", norm="none", pos="none",
                                        activation="tat_lrelu"),
                                   f"normalised residuals, no norm, {NAMES[kind]}"
                                   + (" (control)" if kind == "softmax" else ""))
    out["pre_ln"] = Method(dict(PRE_LN), "Pre-LN, standard attention, GeLU")
    return out


def findings(result):
    lines = [report.loss_line(result, label) for label in result["methods"]]
    pre = report.summary(result, "pre_ln")
    if pre and pre["best_lr"]:
        for kind in ("value_skipinit", "uspa", "espa"):
            m = report.summary(result, kind + "+NR")
            if m and m["best_lr"]:
                gap = m["final_train"] - pre["final_train"]
                verdict = (f"matches Pre-LN (within {report.MATCH_MARGIN} nats)" if abs(gap) <= report.MATCH_MARGIN
                           else "better than Pre-LN" if gap < 0 else "behind Pre-LN")
                lines.append(f"{kind}+NR minus Pre-LN final train loss: {gap:+.3f}: {verdict}")
    return lines


def main(argv=None):
    return runner.main(sys.modules[__name__], argv)
