"""python -m nanospa.signal [--key=value ...]: the signal-propagation derivation at init.

Prints, per layer, what docs/method.md §13 asks to see before training: the schedule value
(gamma_l for E-SPA, rho_l for U-SPA), the range of the rescaling D_l, the smallest entry of
A_l and the construction error max |A_l Sigma_{l-1} A_l^T - Sigma_l|; the attention-only
target kernel (§3.2, §6, §7; for standard attention the uniform-attention recursion of
§3.4); the combined prediction of the whole model with its MLPs (§10, signal.predict_kernels);
and, with --empirical=True, the same statistics measured on a wide float64 GPT at init.
With --plot=PATH.png it writes Figure-1-style heatmaps of the normalised kernels C_l of
standard attention, U-SPA and E-SPA at --depths (§3.1; matplotlib needed: pip install -e .[plot]).

Notation (docs/method.md §1)

    T, L         block_size, n_layer
    Sigma_l      (T, T) kernel after block l (Sigma_0: the input kernel)
    C_l          normalised kernel; "C_min" is its smallest entry, "C_mean" its mean
                 off-diagonal entry (1 = rank collapse)
    q            the q-values diag(Sigma_l), per position; the table shows their range
    A_l, B_l, D_l  attention matrix, bias and rescaling of block l: A_l = diag(D_l) softmax(B_l)
    gamma_l, rho_l  E-SPA / U-SPA schedules

Every GPTConfig field is a setting (--attention=uspa, --n_layer=36, --block_size=256, ...),
plus the ones in SETTINGS below. Bad settings: one line on stderr, exit status 2.
The functions `attention_only_kernels`, `layer_table`, `figure1` and `plot_heatmaps` are
also used by `python -m nanospa.experiments fig1`.
"""
import sys
from dataclasses import fields, replace

import numpy as np

from .kernels import (espa_kernel, kernel_matrix, kernel_stats, normalised_kernel,
                      uniform_causal_attention, uspa_kernel)

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
FIG1_KINDS = ("softmax", "uspa", "espa")
PLOT_HINT = "pip install -e .[plot]  (or: pip install matplotlib)"


def _predict_kernels():
    """signal.predict_kernels when this installation has it, else None."""
    from nanospa import signal
    fn = getattr(signal, "predict_kernels", None)
    if fn is None:
        try:
            from .predict import predict_kernels as fn
        except ImportError:
            return None
    return fn


def _plan(cfg):
    from .budget import make_plan
    return make_plan(cfg)


# ------------------------------------------------------------------ kernels per layer

def _spa_matrix(spec, T):
    """A_l = diag(D_l) softmax(B_l) of one plan layer, (T, T)."""
    with np.errstate(under="ignore"):
        return np.tril(np.exp(spec["B"][:T, :T])) * spec["D"][:T, None]


def schedule_targets(cfg, plan, T):
    """[I, Sigma_1, ..., Sigma_L]: the SPA schedule's target kernels (method §6, §7), or None."""
    if cfg.attention == "espa" and plan.layers:
        return [np.eye(T)] + [espa_kernel(T, layer["gamma"]) for layer in plan.layers]
    if cfg.attention == "uspa" and plan.layers:
        return [np.eye(T)] + [uspa_kernel(T, layer["rho"]) for layer in plan.layers]
    return None


def attention_only_kernels(cfg, plan=None, T=None):
    """[Sigma_0 = I, Sigma_1, ..., Sigma_L] of the attention-only network (method §3.2),
    Sigma_l = A_l Sigma_{l-1} A_l^T with the model's A_l at init: D_l softmax(B_l) for
    E-SPA / U-SPA (the schedule's targets when the plan builds A_l from them), the uniform
    causal matrix for softmax (§3.4: exact with W^Q = 0, the zero-query picture otherwise)
    and I for Value-SkipInit (beta = 0)."""
    T = T or cfg.block_size
    plan = plan or _plan(cfg)
    out = [np.eye(T)]
    for l in range(1, cfg.n_layer + 1):
        if cfg.attention in ("espa", "uspa"):
            A = _spa_matrix(plan.layers[l - 1], T)
        elif cfg.attention == "softmax":
            A = uniform_causal_attention(T)
        else:
            A = np.eye(T)
        out.append(A @ out[-1] @ A.T)
    return out


def token_batch(cfg, batch, tokens="distinct", data="default", seed=0):
    """(batch, T) int64 token ids: T distinct ids per row (Sigma_0 = I in the wide limit), or
    random windows of a dataset."""
    T = cfg.block_size
    rng = np.random.default_rng(seed)
    if tokens == "distinct":
        if T > cfg.vocab_size:
            raise ValueError(f"--tokens=distinct needs block_size <= vocab_size={cfg.vocab_size}, "
                             f"got {T}; use --tokens=data")
        return np.stack([rng.permutation(cfg.vocab_size)[:T] for _ in range(batch)]).astype(np.int64)
    if tokens == "data":
        import data as nanospa_data
        ds = nanospa_data.load_dataset(data)
        nanospa_data.check_length(ds, T)
        x, _ = nanospa_data.get_batch(ds.train, batch, T, rng)
        return np.asarray(x, dtype=np.int64)
    raise ValueError(f"tokens={tokens!r} is not one of ['distinct', 'data']")


def predicted_kernels(cfg, plan=None, idx=None):
    """[Sigma_0, ..., Sigma_L] of the whole model (block outputs) predicted by
    signal.predict_kernels, averaged over the rows of idx (each row's own input kernel);
    None when predict_kernels is not available."""
    predict = _predict_kernels()
    if predict is None:
        return None
    plan = plan or _plan(cfg)
    distinct = idx is None or all(len(set(row.tolist())) == len(row) for row in idx)
    if distinct and cfg.pos != "sinusoidal":
        pred = predict(cfg, plan=plan)            # distinct tokens: the default Sigma_0 = I
        return [pred.kernel(l) for l in range(cfg.n_layer + 1)]
    from .predict import input_kernel
    total = None
    for row in idx:
        S0 = input_kernel(tokens=row, pos=cfg.pos, n_embd=cfg.n_embd)
        pred = predict(cfg, sigma_0=S0, plan=plan)
        ks = [pred.kernel(l) for l in range(cfg.n_layer + 1)]
        total = ks if total is None else [a + b for a, b in zip(total, ks)]
    return [k / len(idx) for k in total]


def measured_kernels(cfg, idx, seed=0):
    """[Sigma_0, ..., Sigma_L] measured on GPT(cfg) at init (cfg as given: set n_embd and
    dtype before), each the batch mean of X_l X_l^T / d."""
    from nanospa.model import GPT
    model = GPT(cfg, seed=seed)
    tr = model.trace(idx)
    return [kernel_matrix(h, mean=True) for h in tr.hidden]


def measure_config(cfg, width):
    """The configuration measured for --empirical: the same model, n_embd = width, float64."""
    if width % cfg.n_head:
        raise ValueError(f"width={width} is not divisible by n_head={cfg.n_head}")
    return replace(cfg, n_embd=width, dtype="float64")


def _summary(Sigma):
    """The four numbers the table shows of one kernel."""
    s = kernel_stats(Sigma)
    return dict(q_min=s["q_min"], q_max=s["q_max"], C_min=s["min_entry"], C_mean=s["mean_offdiag"])


def layer_table(cfg, plan=None, measured=None, predicted="auto", T=None):
    """One dict per layer l = 0..L: schedule value, D_l range, min A_l, the error
    max |A_l Sigma_{l-1} A_l^T - Sigma_l| against the schedule's targets (rounding for the
    independent and joint budgets; the MLP-aware ones aim elsewhere on purpose), and
    {q_min, q_max, C_min, C_mean} of the attention-only network ("target"), of the
    combined prediction ("model", or None) and of `measured` (a list of kernels, or None)."""
    T = T or cfg.block_size
    plan = plan or _plan(cfg)
    chain = attention_only_kernels(cfg, plan, T)
    targets = schedule_targets(cfg, plan, T)
    model = predicted_kernels(cfg, plan) if isinstance(predicted, str) else predicted
    rows = []
    for l in range(cfg.n_layer + 1):
        row = dict(layer=l, schedule=None, D_min=None, D_max=None, A_min=None, err=None,
                   target=_summary(chain[l]),
                   model=None if model is None else _summary(model[l]),
                   measured=None if measured is None else _summary(measured[l]))
        if l and plan.layers:
            spec = plan.layers[l - 1]
            row["schedule"] = spec.get("gamma", spec.get("rho"))
            D, A = spec["D"][:T], _spa_matrix(spec, T)
            row.update(D_min=float(D.min()), D_max=float(D.max()),
                       A_min=float(A[np.tril_indices(T)].min()),
                       err=float(np.abs(A @ targets[l - 1] @ A.T - targets[l]).max()))
        rows.append(row)
    return rows


def format_table(cfg, rows, every=1):
    sched = {"espa": "gamma_l", "uspa": "rho_l"}.get(cfg.attention, "-")
    has_model = rows[0]["model"] is not None
    has_meas = rows[0]["measured"] is not None

    def stats(s):
        return (f"{s['q_min']:7.3f}..{s['q_max']:<7.3f} {s['C_min']:7.4f} {s['C_mean']:7.4f}"
                if s else "")

    head = f"{'l':>3} {sched:>8} {'D_l range':>15} {'A_min':>8} {'err':>8} | {'attn-only C_min C_mean':>22}"
    if has_model:
        head += f" | {'model q range':>16} {'C_min':>7} {'C_mean':>7}"
    if has_meas:
        head += f" | {'measured q range':>16} {'C_min':>7} {'C_mean':>7}"
    lines = [head]
    L = len(rows) - 1
    for row in rows:
        l = row["layer"]
        if l not in (0, L) and l % every:
            continue
        num = lambda v, f: format(v, f) if v is not None else "-"
        D = f"{row['D_min']:.4f}..{row['D_max']:.4f}" if row["D_min"] is not None else "-"
        t = row["target"]
        line = (f"{l:>3} {num(row['schedule'], '8.4g'):>8} {D:>15} {num(row['A_min'], '8.2e'):>8} "
                f"{num(row['err'], '8.1e'):>8} | {t['C_min']:11.4f} {t['C_mean']:10.4f}")
        if has_model:
            line += " | " + stats(row["model"])
        if has_meas:
            line += " | " + stats(row["measured"])
        lines.append(line)
    return "\n".join(lines)


# ------------------------------------------------------------------ Figure 1

def default_depths(L):
    return tuple(sorted({1, max(1, L // 4), max(1, L // 2), L}))


def check_depths(depths, L):
    for d in depths:
        if not 0 <= d <= L:
            raise ValueError(f"depth {d} is outside 0..n_layer={L}")
    return tuple(depths) or default_depths(L)


def figure1(cfg, depths=(), kinds=FIG1_KINDS, empirical=False, width=512, batch=4,
            tokens="distinct", data="default", seed=0):
    """Normalised kernels C_l at `depths` for each attention kind (cfg with attention
    replaced; every other field as given). Returns dict(depths, T, kinds={kind: {label:
    [C at each depth]}}, stats={kind: {label: [summary at each depth]}}, per_layer={kind:
    {label: [C_mean for l = 0..L]}}) with labels "attention-only", "model, predicted"
    (when predict_kernels exists) and "model, measured" (with empirical=True)."""
    depths = check_depths(depths, cfg.n_layer)
    out = dict(depths=list(depths), T=cfg.block_size, kinds={}, stats={}, per_layer={})
    idx = None
    for kind in kinds:
        c = replace(cfg, attention=kind)
        if empirical:
            c = measure_config(c, width)
            if idx is None:
                idx = token_batch(c, batch, tokens, data, seed)
        plan = _plan(c)
        series = {"attention-only": attention_only_kernels(c, plan)}
        pred = predicted_kernels(c, plan, idx)
        if pred is not None:
            series["model, predicted"] = pred
        if empirical:
            series["model, measured"] = measured_kernels(c, idx, seed)
        out["kinds"][kind] = {k: [normalised_kernel(v[d]) for d in depths] for k, v in series.items()}
        out["stats"][kind] = {k: [_summary(v[d]) for d in depths] for k, v in series.items()}
        out["per_layer"][kind] = {k: [_summary(s)["C_mean"] for s in v] for k, v in series.items()}
    return out


KIND_NAMES = {"softmax": "standard attention", "uspa": "U-SPA", "espa": "E-SPA",
              "value_skipinit": "Value-SkipInit"}


def plot_heatmaps(fig1, path, title=""):
    """Write the Figure-1-style grid (one row per kind and series, one column per depth) to
    `path`. Returns True, or False after printing how to install matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"skipped {path}: matplotlib is not installed ({PLOT_HINT})")
        return False
    rows = [(kind, label) for kind, series in fig1["kinds"].items() for label in series]
    depths = fig1["depths"]
    width, height = 1.9 * len(depths) + 2.6, 1.9 * len(rows) + 0.9
    fig, axes = plt.subplots(len(rows), len(depths), figsize=(width, height), squeeze=False)
    fig.subplots_adjust(left=1.5 / width, right=1 - 1.0 / width, bottom=0.2 / height,
                        top=1 - 0.75 / height, wspace=0.05, hspace=0.08)
    im = None
    for r, (kind, label) in enumerate(rows):
        for c, d in enumerate(depths):
            ax = axes[r][c]
            im = ax.imshow(fig1["kinds"][kind][label][c], vmin=0.0, vmax=1.0, cmap="viridis",
                           interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(f"depth {d}", fontsize=9)
            if c == 0:
                ax.set_ylabel(f"{KIND_NAMES.get(kind, kind)}\n{label}", fontsize=8)
    cax = fig.add_axes([1 - 0.8 / width, 0.3, 0.15 / width, 0.4])
    fig.colorbar(im, cax=cax, label="normalised kernel C_l")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.savefig(path, dpi=72)
    plt.close(fig)
    return True


# ------------------------------------------------------------------ command line

def _config_defaults():
    from nanospa.model import GPTConfig
    return GPTConfig, {f.name: getattr(GPTConfig(), f.name) for f in fields(GPTConfig)}


def run(argv):
    from nanospa.settings import help_text, parse_settings, wants_help
    GPTConfig, cfg_defaults = _config_defaults()
    defaults = {**cfg_defaults, **SETTINGS}
    if wants_help(argv):
        print(help_text(__doc__.splitlines()[0],
                        defaults, NOTES))
        return 0
    s = parse_settings(argv, defaults, elements={"depths": 0})
    if s["every"] < 1 or s["width"] < 1 or s["batch"] < 1:
        raise ValueError(f"every, width and batch must be >= 1, got {s['every']}, {s['width']}, {s['batch']}")
    cfg = GPTConfig(**{k: s[k] for k in cfg_defaults})
    depths = check_depths(s["depths"], cfg.n_layer)
    if s["tokens"] not in ("distinct", "data"):
        raise ValueError(f"tokens={s['tokens']!r} is not one of ['distinct', 'data']")
    plan = _plan(cfg)

    print(f"nanospa.signal: attention={cfg.attention} activation={cfg.activation} residual={cfg.residual} "
          f"norm={cfg.norm} pos={cfg.pos} T={cfg.block_size} L={cfg.n_layer} kernel_budget={cfg.kernel_budget}")
    print("plan: " + ", ".join(f"{k}={v}" for k, v in plan.info.items()))
    act = plan.activation
    print(f"activation: {act.get('method') or 'plain'} {act.get('base')} "
          + ", ".join(f"{k}={v:.6g}" for k, v in (act.get("params") or {}).items()))
    measured, predicted, idx = None, "auto", None
    mcfg = cfg
    if s["empirical"]:
        mcfg = measure_config(cfg, s["width"])
        idx = token_batch(mcfg, s["batch"], s["tokens"], s["data"], s["seed"])
        measured = measured_kernels(mcfg, idx, s["seed"])
        predicted = predicted_kernels(mcfg, plan, idx)
        print(f"measured: GPT at init, n_embd={s['width']}, float64, {s['batch']} sequences of "
              f"{'distinct tokens' if s['tokens'] == 'distinct' else 'text from ' + s['data']}, seed {s['seed']}")
    rows = layer_table(cfg, plan, measured, predicted)
    if rows[0]["model"] is None:
        print("model columns: not shown (nanospa.signal.predict_kernels is not available)")
    target_note = {"softmax": "uniform causal attention (W^Q = 0; method §3.4)",
                   "value_skipinit": "identity (beta = 0 at init)"}.get(cfg.attention, "the plan's A_l = D_l softmax(B_l)")
    print(f"attn-only: the attention-only network, {target_note}; model: the whole model predicted "
          "in the wide limit; measured: the GPT at init\n")
    print(format_table(cfg, rows, s["every"]))
    if s["plot"]:
        fig = figure1(cfg, depths, empirical=s["empirical"], width=s["width"], batch=s["batch"],
                      tokens=s["tokens"], data=s["data"], seed=s["seed"])
        title = f"normalised kernels at init, T={cfg.block_size}, L={cfg.n_layer}, {cfg.activation}"
        if plot_heatmaps(fig, s["plot"], title):
            print(f"\nwrote {s['plot']} (rows: {', '.join(KIND_NAMES[k] for k in fig['kinds'])}; "
                  f"columns: depths {', '.join(map(str, depths))})")
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        return run(argv)
    except ValueError as e:  # SettingsError, GPTConfig, DataError and plan errors are ValueErrors
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
