"""The per-layer derivation at initialisation that `python -m nanospa.signal` prints (docs/
method.md §13): per block the schedule value (gamma_l or rho_l), the range of D_l, the
smallest entry of A_l and the construction error max |A_l Sigma_{l-1} A_l^T - Sigma_l|,
then q-values and normalised-kernel statistics of the attention-only network, of the whole
model as predicted and, when the caller measured them, of a real model.

Not here: the command line (__main__.py), the walks that give the attention-only and the
whole-model kernels (nanospa/predict.py, which reads the model's variants), measuring a real
model (nanospa/measure.py), Figure 1's heatmaps (nanospa/experiments/fig1.py). The
configuration is read by duck typing (GPTConfig's fields).
"""
import numpy as np

from .cholesky import dense_layer_bias, realise
from .collapse import kernel_stats
from .walks import spa_kernel


def default_depths(L):
    """The depths shown when none are asked for: 1, L/4, L/2, L."""
    return tuple(sorted({1, max(1, L // 4), max(1, L // 2), L}))


def check_depths(depths, L):
    """depths as a tuple (default_depths when empty); ValueError for a depth outside 0..L."""
    for d in depths:
        if not 0 <= d <= L:
            raise ValueError(f"depth {d} is outside 0..n_layer={L}")
    return tuple(depths) or default_depths(L)


def schedule_targets(plan, T):
    """[I, Sigma_1, ..., Sigma_L]: the SPA schedule's target kernels (method §6, §7), or None."""
    if plan.kind is None:
        return None
    return [np.eye(T)] + [spa_kernel(plan.kind, T, v) for v in plan.schedule[1:]]


def summary(Sigma):
    """The four numbers the table shows of one kernel."""
    s = kernel_stats(Sigma)
    return dict(q_min=s["q_min"], q_max=s["q_max"], C_min=s["min_entry"], C_mean=s["mean_offdiag"])


def layer_table(cfg, plan, chain, model, measured=None, T=None):
    """One dict per layer l = 0..L: schedule value, D_l range, min A_l, the error
    max |A_l Sigma_{l-1} A_l^T - Sigma_l| against the schedule's targets (rounding for the
    independent and joint budgets; the MLP-aware ones aim elsewhere on purpose), and
    {q_min, q_max, C_min, C_mean} of the attention-only network (`chain`, predict's
    attention_only_kernels), of the whole model as predicted (`model`, predict's
    predicted_kernels) and of `measured` (a list of kernels, or None)."""
    T = T or cfg.block_size
    targets = schedule_targets(plan, T)
    rows = []
    for l in range(cfg.n_layer + 1):
        row = dict(layer=l, schedule=None, D_min=None, D_max=None, A_min=None, err=None,
                   target=summary(chain[l]), model=summary(model[l]),
                   measured=None if measured is None else summary(measured[l]))
        if l and plan.kind is not None:
            B, D = dense_layer_bias(plan, l, T)
            A = realise(B, D)
            row.update(schedule=plan.schedule[l], D_min=float(D.min()), D_max=float(D.max()),
                       A_min=float(A[np.tril_indices(T)].min()),
                       err=float(np.abs(A @ targets[l - 1] @ A.T - targets[l]).max()))
        rows.append(row)
    return rows


def format_table(cfg, rows, every=1):
    """The rows of layer_table as text, every `every`-th layer (and the first and last)."""
    sched = {"espa": "gamma_l", "uspa": "rho_l"}.get(cfg.attention, "-")
    has_meas = rows[0]["measured"] is not None

    def stats(s):
        return f"{s['q_min']:7.3f}..{s['q_max']:<7.3f} {s['C_min']:7.4f} {s['C_mean']:7.4f}"

    head = f"{'l':>3} {sched:>8} {'D_l range':>15} {'A_min':>8} {'err':>8} | {'attn-only C_min C_mean':>22}"
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
        line += " | " + stats(row["model"])
        if has_meas:
            line += " | " + stats(row["measured"])
        lines.append(line)
    return "\n".join(lines)
