"""Table 2: E-SPA with normalised residual connections and LayerNorm against the default
Pre-LN transformer (docs/method.md §2.2, §12).

    python -m nanospa.experiments table2 [--preset=quick|full|tiny] [--key=value ...]

Normalised residuals X' = a X + b f(N(X)) with N = LayerNorm before each sublayer and a
final LayerNorm (GPTConfig final_norm="auto"). Standard attention with the same block is
the control that isolates the attention change.
"""
import sys

from . import report, runner
from .runner import PRE_LN, Method

NAME = "table2"
TITLE = "E-SPA with normalised residuals and LayerNorm vs the Pre-LN transformer"
PAPER = ("Table 2: E-SPA with normalised residual connections and LayerNorm outperforms the "
         "default Pre-LN transformer.")


def methods(settings):
    nr = dict(residual="normalised", pos="none", activation="tat_lrelu")
    return {
        "pre_ln": Method(dict(PRE_LN), "Pre-LN, standard attention, GeLU"),
        "espa+NR+LN": Method(dict(nr, attention="espa", norm="layernorm"),
                             "E-SPA, normalised residuals, Pre-LayerNorm"),
        "espa+NR": Method(dict(nr, attention="espa", norm="none"), "E-SPA, normalised residuals, no norm"),
        "softmax+NR+LN": Method(dict(nr, attention="softmax", norm="layernorm"),
                                "standard attention, normalised residuals, Pre-LayerNorm (control)"),
    }


def findings(result):
    lines = [report.loss_line(result, label) for label in result["methods"]]
    pre, best = report.summary(result, "pre_ln"), report.summary(result, "espa+NR+LN")
    if pre and best and pre["best_lr"] and best["best_lr"]:
        gap = best["final_train"] - pre["final_train"]
        lines.append(f"E-SPA+NR+LN minus Pre-LN final train loss: {gap:+.3f} "
                     + ("(E-SPA+NR+LN better, as in the paper)" if gap < 0 else "(Pre-LN better: differs from the paper)"))
        val_gap = best["final_val"] - pre["final_val"]
        lines.append(f"same on the validation split: {val_gap:+.3f}")
    return lines


def main(argv=None):
    return runner.main(sys.modules[__name__], argv)
