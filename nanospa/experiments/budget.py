"""The kernel-budget study (docs/kernel_budget.md; docs/method.md §10): deep vanilla E-SPA
with shaped MLPs under each budget policy, against vanilla standard attention and Pre-LN.

    python -m nanospa.experiments budget [--preset=quick|full|tiny] [--seeds=N] [--lrs=a,b,c]
                                         [--steps=N] [--data=PATH] [--out=DIR] [--key=value ...]

Two parts, both written to --out (default results/budget):

1. At initialisation, for every method: the predicted (wide-limit, predict.predict_kernels)
   kernel statistics after every block next to those measured on the same model at width
   --measure_width in float64 (distinct tokens, Sigma_0 = I, and a batch of real text,
   each row predicted from its own input kernel): init.json and init.md.
2. Training: every method on the same learning-rate grid and seeds (the shared runner,
   runner.py): result.json, table.md (with the init table appended), plot.png.

The methods: E-SPA under the policies independent, joint, qpreserve, joint_qpreserve (all
with the TAT leaky ReLU) and mlp_aware (with the DKS leaky ReLU, the activation for which
its pre-image is realisable; "independent_dks" is its control); vanilla standard attention
(same MLPs, kernel budget joint: eta only); Pre-LN.
"""
import sys
from pathlib import Path

import numpy as np

from . import report, runner
from .runner import PRE_LN, Method
from ..run.settings import run_command
from ..measure import measure_config, measured_kernels, token_batch
from ..model import GPT
from ..predict import predict_kernels
from ..signal import kernel_stats, make_plan, normalised_kernel
from ..predict import predicted_kernels

NAME = "budget"
TITLE = "kernel budget: deep vanilla E-SPA with shaped MLPs under each budget policy"
PAPER = ("The paper trains deep vanilla transformers (no skips, no normalisation) with E-SPA and "
         "shaped activations; they reach standard transformers' performance after about 5 times "
         "more iterations, while vanilla standard attention does not train. How it shares the "
         "kernel budget between attention and MLPs was not recovered (docs/method.md §10).")
EXTRA = dict(out="results/budget", measure_width=1024, measure_batch=4, train=True)
EXTRA_NOTES = dict(measure_width="width of the model measured at init (0 = skip the init check)",
                   measure_batch="rows of real text in the init check",
                   train="run the training part (False: the init check only, appended to an existing table.md)")
PRESETS = dict(tiny=dict(measure_width=32, measure_batch=1, n_layer=16),   # eta = 0.9 needs L >= 13
               quick=dict(lrs=(3e-4, 1e-3, 3e-3), seeds=2, eval_batches=16),
               full=dict(measure_width=1024))

VANILLA = dict(attention="espa", residual="none", norm="none", pos="none", activation="tat_lrelu")
POLICIES = ("independent", "joint", "qpreserve", "joint_qpreserve")
INIT_HEADING = "## At initialisation: predicted (wide limit) against measured"


def methods(settings):
    out = {p: Method(dict(VANILLA, kernel_budget=p), f"vanilla E-SPA, TAT-LReLU, budget {p}")
           for p in POLICIES}
    out["mlp_aware"] = Method(dict(VANILLA, activation="dks_lrelu", kernel_budget="mlp_aware"),
                              "vanilla E-SPA, DKS-LReLU, budget mlp_aware")
    out["independent_dks"] = Method(dict(VANILLA, activation="dks_lrelu", kernel_budget="independent"),
                                    "vanilla E-SPA, DKS-LReLU, budget independent")
    out["softmax"] = Method(dict(VANILLA, attention="softmax", kernel_budget="joint"),
                            "vanilla standard attention, TAT-LReLU")
    out["pre_ln"] = Method(dict(PRE_LN), "Pre-LN, standard attention, GeLU")
    return out


def findings(result):
    lines = [report.loss_line(result, label) for label in result["methods"]]
    order = report.ranking(result, list(result["methods"]))
    if order:
        lines.append("ranking by final training loss: " + " < ".join(order))
    return lines


# ------------------------------------------------------------------ the init check

def _block_stats(K):
    s = kernel_stats(K)
    return dict(q_min=s["q_min"], q_max=s["q_max"], C_mean=s["mean_offdiag"],
                C_adj=s["adjacent_mean"], C_min=s["min_entry"])


def init_check(cfg, width, batch, tokens, seed=0):
    """Predicted against measured kernels at init for one configuration.

    Returns dict(plan=plan.info, predicted=[stats per block], measured_distinct=[...],
    measured_text=[...], predicted_text=[...], errors={...}); stats per block l = 0..L are
    q_min, q_max, C_mean, C_adj, C_min; errors: the largest |predicted - measured| over
    blocks of C (entrywise, normalised kernels) and of q / q_pred - 1."""
    plan = make_plan(cfg)
    mcfg = measure_config(cfg, width)
    model = GPT(mcfg, seed=seed)
    distinct = token_batch(cfg, batch, "distinct", seed=seed)
    text = np.asarray(tokens[:batch], dtype=np.int64)
    pred = predict_kernels(mcfg, plan=plan)
    P, Pt = [pred.kernel(l) for l in range(cfg.n_layer + 1)], predicted_kernels(mcfg, plan, text)
    M, Mt = measured_kernels(model, distinct)["hidden"], measured_kernels(model, text)["hidden"]

    def errors(pred_k, meas_k):
        c = max(float(np.abs(normalised_kernel(a) - normalised_kernel(b)).max()) for a, b in zip(pred_k, meas_k))
        q = max(float(np.abs(np.diagonal(b) / np.diagonal(a) - 1.0).max()) for a, b in zip(pred_k, meas_k))
        return dict(C_max_abs=c, q_max_rel=q)

    info = {k: v for k, v in plan.info.items() if k != "mlp_aware"}
    return dict(plan=info, width=width, batch=batch,
                predicted=[_block_stats(k) for k in P], measured_distinct=[_block_stats(k) for k in M],
                predicted_text=[_block_stats(k) for k in Pt], measured_text=[_block_stats(k) for k in Mt],
                errors=dict(distinct=errors(P, M), text=errors(Pt, Mt)), notes=pred.notes)


def init_markdown(checks, settings):
    L = settings["n_layer"]
    lines = [INIT_HEADING, "",
             f"Measured on the same model at width {settings['measure_width']} in float64, "
             f"T = {settings['block_size']}, depth {L}; \"distinct\": {settings['measure_batch']} rows of "
             "distinct tokens (Sigma_0 = I), \"text\": as many rows of training text, each predicted "
             "from its own input kernel. C_adj: mean adjacent correlation, C_mean: mean off-diagonal "
             "of the normalised kernel; q_max: the largest q-value; all after the last block. Errors: "
             "the largest entrywise |C_pred - C_meas| and |q_meas / q_pred - 1| over all blocks.", "",
             "| method | gamma_L | eta | C_adj pred / meas | C_mean pred / meas | q_max pred / meas "
             "| text: C_mean pred / meas | max C error (distinct, text) | max q rel. error (distinct, text) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for label, c in checks.items():
        p, m, pt, mt = c["predicted"][L], c["measured_distinct"][L], c["predicted_text"][L], c["measured_text"][L]
        g, e = c["plan"].get("gamma_final"), c["plan"].get("eta")
        ed, et = c["errors"]["distinct"], c["errors"]["text"]
        lines.append(f"| {label} | {report.fmt(g, '.4g')} | {report.fmt(e, '.3f')} "
                     f"| {p['C_adj']:.3f} / {m['C_adj']:.3f} | {p['C_mean']:.3f} / {m['C_mean']:.3f} "
                     f"| {p['q_max']:.2f} / {m['q_max']:.2f} | {pt['C_mean']:.3f} / {mt['C_mean']:.3f} "
                     f"| {ed['C_max_abs']:.3f}, {et['C_max_abs']:.3f} | {ed['q_max_rel']:.3f}, {et['q_max_rel']:.3f} |")
    notes = sorted({n for c in checks.values() for n in c["notes"]})
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def run_init_check(s, argv):
    """Part 1; writes init.json and init.md to s['out'] and returns the markdown."""
    import data as nanospa_data
    from .runner import _dataset, model_config, selected_methods
    ds = _dataset(s["data"])
    rng = np.random.default_rng(0)
    tokens, _ = nanospa_data.get_batch(ds.train, s["measure_batch"], s["block_size"], rng)
    spec = sys.modules[__name__]
    checks = {}
    for label, m in selected_methods(spec, s).items():
        cfg = model_config(s, m, ds.vocab_size)
        checks[label] = init_check(cfg, s["measure_width"], s["measure_batch"], tokens)
        e = checks[label]["errors"]
        print(f"init check {label:<16} max C error {e['distinct']['C_max_abs']:.3f} (distinct) "
              f"{e['text']['C_max_abs']:.3f} (text); max q rel. error {e['distinct']['q_max_rel']:.3f}, "
              f"{e['text']['q_max_rel']:.3f}", flush=True)
    out = Path(s["out"])
    out.mkdir(parents=True, exist_ok=True)
    md = init_markdown(checks, s)
    report.write_json(out / "init.json", dict(command=report.command_line(NAME, argv),
                                              machine=report.machine(), checks=checks))
    report.write_text(out / "init.md", md)
    return md


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    spec = sys.modules[__name__]
    if runner.wants_help(argv):
        return runner.main(spec, argv)
    return run_command(_run, spec, argv)


def _run(spec, argv):
    s = runner.settings_for(spec, argv)
    with runner.holding(s["out"]):                # the init check and the training: one writer
        return _checked_and_trained(spec, argv, s)


def _checked_and_trained(spec, argv, s):
    md = run_init_check(s, argv) if s["measure_width"] > 0 else ""
    rc = runner.run(spec, argv) if s["train"] else 0
    table = Path(s["out"]) / "table.md"
    if rc == 0 and md and table.exists():
        text = table.read_text(encoding="utf-8")
        text = text.split("\n" + INIT_HEADING)[0].rstrip("\n") + "\n"    # replace an older init section
        report.write_text(table, text + "\n" + md)
    return rc


if __name__ == "__main__":
    sys.exit(main())
