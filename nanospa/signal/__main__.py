"""python -m nanospa.signal [--key=value ...]: the signal-propagation derivation at init.

Prints, per layer, what docs/method.md §13 asks to see before training (signal/table.py):
the schedule value (gamma_l for E-SPA, rho_l for U-SPA), the range of the rescaling D_l, the
smallest entry of A_l and the construction error max |A_l Sigma_{l-1} A_l^T - Sigma_l|; the
attention-only target kernel (§3.2, §6, §7; for standard attention the uniform-attention
recursion of §3.4); the combined prediction of the whole model with its MLPs (§10,
nanospa.predict.predict_kernels); and, with --empirical=True, the same statistics measured on a wide
float64 GPT at init (nanospa/measure.py). With --plot=PATH.png it writes Figure-1-style
heatmaps of the normalised kernels C_l of standard attention, U-SPA and E-SPA at --depths
(§3.1; nanospa/experiments/fig1.py; matplotlib needed: pip install -e .[plot]).

The only module of nanospa/signal/ that imports from outside it: the model's configuration
(its fields are the settings), the walks through the model's variants (nanospa/predict.py),
the measured model and the figure live above signal/.

Notation (docs/method.md §1)

    T, L         block_size, n_layer
    Sigma_l      (T, T) kernel after block l (Sigma_0: the input kernel)
    C_l          normalised kernel; "C_min" is its smallest entry, "C_mean" its mean
                 off-diagonal entry (1 = rank collapse)
    q            the q-values diag(Sigma_l), per position; the table shows their range
    A_l, B_l, D_l  attention matrix, bias and rescaling of block l: A_l = diag(D_l) softmax(B_l)
    gamma_l, rho_l  E-SPA / U-SPA schedules

Every GPTConfig field is a setting (--attention=uspa, --n_layer=36, --block_size=256, ...),
plus the ones in SETTINGS below. Bad settings, data or output paths (checked before any work):
one `error:` line on stderr, exit status 2.
"""
import sys
from collections.abc import Mapping
from dataclasses import fields

from .budget import make_plan
from .table import check_depths, format_table, layer_table

SETTINGS = dict(
    empirical=False,    # also measure a wide float64 GPT at init on a token batch
    width=512,          # n_embd of the measured model (n_head is kept)
    batch=4,            # sequences in the measured batch
    tokens="distinct",  # distinct (each sequence: T different byte ids, Sigma_0 = I) | data
    data="default",     # dataset for --tokens=data (see data.py)
    seed=0,             # seed of the measured model and of its token batch
    plot="",            # write Figure-1-style heatmaps to this PNG
    depths=(),          # depths of the heatmaps; empty: 1, L/4, L/2, L
    every=1,            # print every N-th layer (and the last)
)
NOTES = {
    "empirical": "also measure a wide float64 GPT at init on a token batch",
    "width": "n_embd of the measured model (n_head is kept)",
    "batch": "sequences in the measured batch",
    "tokens": "distinct (T different byte ids per sequence: Sigma_0 = I) | data (windows of --data)",
    "data": "dataset for --tokens=data: default | PATH | shakespeare[:FILE] | ...",
    "seed": "seed of the measured model and its tokens",
    "plot": "write Figure-1-style heatmaps of C_l to this PNG (needs matplotlib)",
    "depths": "depths of the heatmaps, e.g. 1,4,12; empty: 1, L/4, L/2, L",
    "every": "print every N-th layer (and the last)",
}


def show(value, nested=False):
    """A plan.info value as text: sequences as [...], mappings as {...}."""
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(show(v, True) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k!r}: {show(v, True)}" for k, v in value.items()) + "}"
    return repr(value) if nested else str(value)


def run(argv):
    from nanospa.config import GPTConfig
    from nanospa.model import variant
    from nanospa.predict import attention_only_kernels, predicted_kernels
    from nanospa.run.settings import check_output_file, help_text, need_matplotlib, parse_settings, wants_help
    cfg_defaults = {f.name: getattr(GPTConfig(), f.name) for f in fields(GPTConfig)}
    defaults = {**cfg_defaults, **SETTINGS}
    if wants_help(argv):
        print(help_text(__doc__.splitlines()[0], defaults, NOTES))
        return 0
    s = parse_settings(argv, defaults, elements={"depths": 0})
    for key in ("every", "width", "batch"):
        if s[key] < 1:
            raise ValueError(f"--{key} must be >= 1, got {s[key]}")
    if s["seed"] < 0:
        raise ValueError(f"--seed must be >= 0, got {s['seed']}")
    if s["plot"]:
        check_output_file(s["plot"], "plot")       # before any work: a folder, or a missing folder
        need_matplotlib(f"--plot={s['plot']}")     # and matplotlib there, not after the work

    cfg = GPTConfig(**{k: s[k] for k in cfg_defaults})
    try:
        depths = check_depths(s["depths"], cfg.n_layer)
    except ValueError as e:
        raise ValueError(f"--depths={','.join(map(str, s['depths']))}: {e}") from None
    if s["tokens"] not in ("distinct", "data"):
        raise ValueError(f"--tokens={s['tokens']!r} is not one of ['distinct', 'data']")
    plan = make_plan(cfg)

    print(f"nanospa.signal: attention={cfg.attention} activation={cfg.activation} residual={cfg.residual} "
          f"norm={cfg.norm} pos={cfg.pos} T={cfg.block_size} L={cfg.n_layer} kernel_budget={cfg.kernel_budget}")
    print("plan: " + ", ".join(f"{k}={show(v)}" for k, v in plan.info.items()))
    act = plan.activation
    print(f"activation: {act.get('method') or 'plain'} {act['activation']} "
          + ", ".join(f"{k}={v:.6g}" for k, v in plan.params.items()))
    for note in plan.notes:                           # a target the budget could not meet
        print(f"note: {note}")
    measured, predicted = None, None
    if s["empirical"]:
        from nanospa.measure import measure_config, measured_model_kernels, token_batch
        mcfg = measure_config(cfg, s["width"])
        idx = token_batch(mcfg, s["batch"], s["tokens"], s["data"], s["seed"])
        measured = measured_model_kernels(mcfg, idx, s["seed"])
        predicted = predicted_kernels(mcfg, plan, idx)
        print(f"measured: GPT at init, n_embd={s['width']}, float64, {s['batch']} sequences of "
              f"{'distinct tokens' if s['tokens'] == 'distinct' else 'text from ' + s['data']}, seed {s['seed']}")
    rows = layer_table(cfg, plan, attention_only_kernels(cfg, plan), predicted or predicted_kernels(cfg, plan),
                       measured)
    print(f"attn-only: the attention-only network, {variant('attention', cfg.attention).words(cfg)}; model: the whole "
          "model predicted in the wide limit; measured: the GPT at init\n")
    print(format_table(cfg, rows, s["every"]))
    if s["plot"]:
        from nanospa.experiments.fig1 import figure1, plot_heatmaps
        from nanospa.experiments.runner import NAMES
        fig = figure1(cfg, depths, empirical=s["empirical"], width=s["width"], batch=s["batch"],
                      tokens=s["tokens"], data=s["data"], seed=s["seed"])
        title = f"normalised kernels at init, T={cfg.block_size}, L={cfg.n_layer}, {cfg.activation}"
        if plot_heatmaps(fig, s["plot"], title):
            print(f"\nwrote {s['plot']} (rows: {', '.join(NAMES[k] for k in fig['kinds'])}; "
                  f"columns: depths {', '.join(map(str, depths))})")
    return 0


def main(argv=None):
    """-> exit status: 0 done, 2 bad settings, data or output path (one error: line; see
    nanospa/run/settings.py run_command, and NANOSPA_DEBUG=1 for a traceback)."""
    from nanospa.run.settings import run_command
    return run_command(run, sys.argv[1:] if argv is None else list(argv))


if __name__ == "__main__":
    sys.exit(main())
