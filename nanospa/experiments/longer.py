"""Figure 4(b): the vanilla E-SPA transformer trained about 5 times longer against the
Pre-LN transformer (docs/method.md §12).

    python -m nanospa.experiments longer [--preset=quick|full|tiny] [--factor=5] [--key=value ...]

Methods: Pre-LN and vanilla E-SPA for --steps, and vanilla E-SPA for factor x --steps
(espa_long); the full preset also runs Pre-LN for factor x --steps (pre_ln_long), the
quick one leaves it out to fit a CPU budget (add it with --methods=...). Each run has its
own warm-up and cosine schedule over its own length.
"""
import sys

from . import report, runner
from .runner import PRE_LN, VANILLA, Method

NAME = "longer"
TITLE = "vanilla E-SPA trained longer vs Pre-LN"
PAPER = ("Figure 4(b) and the abstract: deep vanilla transformers (no skips, no normalisation) "
         "with E-SPA reach the performance of standard ones after about 5 times more iterations "
         "(WikiText-103 and C4).")
EXTRA = dict(factor=5)
EXTRA_NOTES = dict(factor="the long runs take factor x steps")
PRESETS = dict(tiny=dict(factor=2), quick=dict(steps=300, methods="pre_ln,espa,espa_long"),
               full=dict(methods=""))


def methods(settings):
    k = settings["factor"]
    if k < 1:
        raise ValueError(f"factor must be >= 1, got {k}")
    espa = dict(VANILLA, attention="espa")
    return {
        "pre_ln": Method(dict(PRE_LN), "Pre-LN, standard attention, GeLU"),
        "espa": Method(espa, "vanilla E-SPA"),
        "espa_long": Method(espa, f"vanilla E-SPA, {k}x steps", steps_factor=k),
        "pre_ln_long": Method(dict(PRE_LN), f"Pre-LN, {k}x steps", steps_factor=k),
    }


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
    return lines


def main(argv=None):
    return runner.main(sys.modules[__name__], argv)
