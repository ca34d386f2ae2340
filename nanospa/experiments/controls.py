"""The positional controls of the speed comparison (issue 16, docs/positions.md): the Pre-LN
transformer with each positional scheme in place of its learned positions, so that a gap
between Pre-LN and vanilla E-SPA can be read against what positions alone do.

    POSITION_CONTROLS     {label: pos}: Pre-LN + ALiBi, + RoPE, + E-SPA's fixed prior B_l, no positions
    control_methods()     the runner's Methods for them (fig2.py and longer.py add them as rows)
    controls_line(result) one findings line: every Pre-LN variant's final loss beside E-SPA's

Pre-LN + E-SPA's prior (pos="spa_prior") adds to its softmax logits exactly the B_l of the
vanilla E-SPA model of the same depth and T, without D_l; its queries stay random, as in
Pre-LN. Not here: the runs and reports (runner.py, report.py).
"""
from . import report
from .runner import PRE_LN, Method

POSITION_CONTROLS = dict(pre_ln_alibi="alibi", pre_ln_rope="rope", pre_ln_spa_prior="spa_prior",
                         pre_ln_nopos="none")
DESCRIPTIONS = dict(alibi="ALiBi", rope="RoPE", spa_prior="E-SPA's fixed prior B_l (no D_l)", none="no positions")


def control_methods(steps_factor=1):
    """{label: Method}: Pre-LN (standard attention, GeLU, LayerNorm) with each control."""
    return {label: Method(dict(PRE_LN, pos=pos), f"Pre-LN, {DESCRIPTIONS[pos]} instead of learned positions",
                          steps_factor=steps_factor)
            for label, pos in POSITION_CONTROLS.items()}


def controls_line(result, espa="espa"):
    """'final train loss of Pre-LN with learned positions X, ALiBi Y, ...; vanilla E-SPA Z', or
    None when Pre-LN and no control ran."""
    labels = ["pre_ln"] + list(POSITION_CONTROLS)
    got = [(label, report.summary(result, label)) for label in labels]
    got = [(label, s) for label, s in got if s and s["best_lr"] is not None]
    if len(got) < 2:
        return None
    names = dict(pre_ln="learned", **{k: DESCRIPTIONS[v] for k, v in POSITION_CONTROLS.items()})
    text = ", ".join(f"{names[label]} {s['final_train']:.3f}" for label, s in got)
    e = report.summary(result, espa)
    tail = f"; vanilla E-SPA {e['final_train']:.3f}" if e and e["best_lr"] is not None else ""
    return f"positional controls, final train loss of Pre-LN with: {text}{tail}"
