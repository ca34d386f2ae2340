"""Table 1: which activations let a deep vanilla E-SPA transformer train, with and without
LayerNorm (docs/method.md §12; the shaped activations are docs/activations.md).

    python -m nanospa.experiments table1 [--preset=quick|full|tiny] [--key=value ...]

The paper's depth is 36; the quick preset uses depth 24 on a CPU (the full preset 36).
Every model: E-SPA attention, no skips; "+LN" puts a LayerNorm before each sublayer
(residual="none", norm="layernorm"), as in docs/method.md §2.2.
"""
import sys

from . import report, runner
from .runner import Method

NAME = "table1"
TITLE = "vanilla E-SPA at depth: DKS-GeLU, TAT-LReLU, GeLU, Sigmoid, each with and without LayerNorm"
PAPER = ("Table 1 (depth 36, SPA attention, no skips): training works well with the DKS-transformed "
         "GeLU, the TAT-transformed leaky ReLU and plain GeLU, but not with plain Sigmoid. "
         "LayerNorm matters little for training speed, and is even harmful with the transformed "
         "activations, because SPA already controls the activation norms.")
ACTIVATIONS = ("dks_gelu", "tat_lrelu", "gelu", "sigmoid")
ACT_NAMES = dict(dks_gelu="DKS-GeLU", tat_lrelu="TAT-LReLU", gelu="GeLU", sigmoid="Sigmoid")
PANELS = [("E-SPA, no LayerNorm", list(ACTIVATIONS)),
          ("E-SPA with LayerNorm", [a + "+LN" for a in ACTIVATIONS])]


def methods(settings):
    out = {}
    for act in ACTIVATIONS:
        base = dict(attention="espa", activation=act, residual="none", pos="none")
        out[act] = Method(dict(base, norm="none"), f"E-SPA, {ACT_NAMES[act]}, no norm")
        out[act + "+LN"] = Method(dict(base, norm="layernorm"), f"E-SPA, {ACT_NAMES[act]}, Pre-LayerNorm")
    return out


def findings(result):
    depth = result["settings"]["n_layer"]
    lines = [f"depth {depth}" + (" (the paper's Table 1 uses depth 36)" if depth != 36 else "")]
    lines += [report.loss_line(result, label) for label in result["methods"]]
    trains = [a for a in ACTIVATIONS if report.summary(result, a) and report.summary(result, a)["stalled"] is False]
    stalls = [a for a in ACTIVATIONS if report.summary(result, a) and report.summary(result, a)["stalled"]]
    if trains or stalls:
        expect_ok, expect_bad = {"dks_gelu", "tat_lrelu", "gelu"}, {"sigmoid"}
        agree = set(trains) >= (expect_ok & set(trains + stalls)) and not (set(trains) & expect_bad)
        lines.append(f"without LayerNorm, below the unigram level: {', '.join(trains) or 'none'}; "
                     f"stalled: {', '.join(stalls) or 'none'} -> "
                     + ("agrees with the paper (GeLU variants and TAT-LReLU train, Sigmoid does not)" if agree
                        else "differs from the paper (it has DKS-GeLU, TAT-LReLU and GeLU training, Sigmoid not)"))
    deltas = []
    for a in ACTIVATIONS:
        m, n = report.summary(result, a), report.summary(result, a + "+LN")
        if m and n and m["best_lr"] and n["best_lr"]:
            deltas.append(f"{a} {n['final_train'] - m['final_train']:+.3f}")
    if deltas:
        lines.append("effect of LayerNorm on the final train loss (with LN minus without; negative = LN helps): "
                     + ", ".join(deltas))
    return lines


def main(argv=None):
    return runner.main(sys.modules[__name__], argv)
