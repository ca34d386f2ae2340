"""How vanilla E-SPA's learning rate and its lead over Pre-LN scale with width and depth.

    python -m nanospa.experiments scaling --preset=study --data=shakespeare:FILE [--reuse=...]

Widths 64, 128, 256 at depth 24 and depths 24, 48, 72 at width 64 (head width 32, so 2, 4
and 8 heads; T 64, batch 8, 400 steps, byte tokens), vanilla E-SPA and Pre-LN, each over a
half-decade learning-rate grid placed so that its best rate is inside and the divergence
edge is seen, 2 seeds; and the same two models at widths 128 and 256 with muP's width rule
for Adam (AdamW's rate of every Linear weight times 64 / width, beyond/optimizers.py), on the
width-64 grid. The design, the grids and the time they take: docs/results.md, "How the
learning rate scales".

What it reports (analysis, findings, plot.png):
    best rate      per method, interpolated: the vertex of a parabola through the mean final
                   loss at the grid's best rate and its two neighbours, in log10(lr); per seed
                   too, which gives the fits their scatter
    edge           the largest rate at which every seed still trains (finite, below the
                   unigram entropy by STALL_MARGIN); ">= top" when the grid's top still trains
    exponents      log best rate = a + b log width (and log depth), least squares over the
                   seeds' best rates, b with its standard error
    lead           Pre-LN's best final loss minus E-SPA's at each width and depth (> 0: E-SPA
                   ahead), with the seeds' spread
    transfer       the muP runs' best rate against the width-64 best, beside plain AdamW's
    at init        the kernels predicted in the wide limit against a real model's at each
                   width (the finite-width gap should shrink as the width grows)
"""
import math
import sys

import numpy as np

from . import report, runner
from .runner import PRE_LN, VANILLA, Method

NAME = "scaling"
TITLE = "vanilla E-SPA and Pre-LN across width and depth: best learning rate, divergence edge, lead"
PAPER = ("The paper trains at one width per experiment and gives no learning-rate rule across widths. "
         "nanospa's width-64 results put vanilla E-SPA's best AdamW rate at 3e-4 against Pre-LN's 1e-2, and the "
         "gpu preset (width 512, depth 36) trains at 4e-5: the hypothesis tested here is that E-SPA's stable "
         "rate falls as 1/width, as muP predicts for hidden matrices under Adam, and Pre-LN's more slowly.")
HEAD_WIDTH = 32
WIDTHS, DEPTHS, BASE = (64, 128, 256), (24, 48, 72), (64, 24)
MUP_WIDTHS = (128, 256)
# half-decade grids, placed on the 1/width hypothesis from the width-64 bests (E-SPA 3e-4,
# Pre-LN 1e-2), wide enough on both sides to see the best inside and the divergence edge
GRIDS = {
    ("espa", 64, 24): (1e-4, 3e-4, 1e-3, 3e-3, 1e-2),
    ("espa", 128, 24): (3e-5, 1e-4, 3e-4, 1e-3, 3e-3),
    ("espa", 256, 24): (1e-5, 3e-5, 1e-4, 3e-4, 1e-3),
    ("espa", 64, 48): (3e-5, 1e-4, 3e-4, 1e-3, 3e-3),
    ("espa", 64, 72): (3e-5, 1e-4, 3e-4, 1e-3, 3e-3),
    ("pre_ln", 64, 24): (1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1),
    ("pre_ln", 128, 24): (1e-3, 3e-3, 1e-2, 3e-2, 1e-1),
    ("pre_ln", 256, 24): (3e-4, 1e-3, 3e-3, 1e-2, 3e-2),
    ("pre_ln", 64, 48): (1e-3, 3e-3, 1e-2, 3e-2, 1e-1),
    ("pre_ln", 64, 72): (1e-3, 3e-3, 1e-2, 3e-2, 1e-1),
}
MUP_GRIDS = {"espa": (1e-4, 3e-4, 1e-3, 3e-3), "pre_ln": (3e-3, 1e-2, 3e-2, 1e-1)}
KINDS = {"espa": (dict(VANILLA, attention="espa"), "vanilla E-SPA"), "pre_ln": (dict(PRE_LN), "Pre-LN")}
EXTRA = dict(mup=True)
EXTRA_NOTES = dict(mup="also train the muP-rule runs at widths 128 and 256")
PRESETS = dict(
    tiny=dict(methods="espa_w64_d24,pre_ln_w64_d24,espa_mup_w128_d24"),
    quick=dict(seeds=2), study=dict(seeds=2),
)
TINY_SHAPE = dict(block_size=16, batch_size=2)


def label(kind, width, depth, mup=False):
    return f"{kind}{'_mup' if mup else ''}_w{width}_d{depth}"


def methods(settings):
    tiny = settings.get("preset") == "tiny"
    out = {}
    shapes = [(w, BASE[1]) for w in WIDTHS] + [(BASE[0], d) for d in DEPTHS[1:]]
    for kind, (config, name) in KINDS.items():
        for w, d in shapes:
            shape = dict(n_embd=w, n_layer=4 if tiny else d, n_head=w // HEAD_WIDTH)
            out[label(kind, w, d)] = Method(dict(config, **shape), f"{name}, width {w}, depth {d}",
                                            lrs=() if tiny else GRIDS[kind, w, d], extra=dict(kind=kind, width=w, depth=d))
    if settings.get("mup", True):
        for kind, (config, name) in KINDS.items():
            for w in MUP_WIDTHS:
                shape = dict(n_embd=w, n_layer=4 if tiny else BASE[1], n_head=w // HEAD_WIDTH)
                out[label(kind, w, BASE[1], True)] = Method(
                    dict(config, **shape), f"{name}, width {w}, depth {BASE[1]}, muP rule (base width {BASE[0]})",
                    lrs=() if tiny else MUP_GRIDS[kind], optimizer=dict(mup_base_width=BASE[0]),
                    extra=dict(kind=kind, width=w, depth=BASE[1], mup=True))
    return out


# ------------------------------------------------------------------ analysis

def _parabola_vertex(x, y):
    """The vertex of the parabola through three points (x ascending), or None when it is
    not a minimum."""
    a = np.polyfit(x, y, 2)
    if a[0] <= 0:
        return None
    return -a[1] / (2 * a[0])


def best_log_rate(lrs, losses):
    """log10 of the interpolated best rate from {lr: loss} (inf for a diverged rate): the grid's
    best, moved to the vertex of the parabola through it and its neighbours, kept within them."""
    grid = sorted(lrs)
    finite = [lr for lr in grid if math.isfinite(losses[lr])]
    if not finite:
        return None, "diverged everywhere"
    best = min(finite, key=lambda lr: losses[lr])
    i = grid.index(best)
    if i == 0 or i == len(grid) - 1:
        return math.log10(best), "at the grid's edge"
    x = np.log10(grid[i - 1:i + 2])
    y = np.array([losses[lr] for lr in grid[i - 1:i + 2]])
    if not np.all(np.isfinite(y)):
        return math.log10(best), "a neighbour diverged"
    v = _parabola_vertex(x, y)
    if v is None:
        return math.log10(best), "flat"
    return float(np.clip(v, x[0], x[2])), "interpolated"


def edge(runs, grid, unigram):
    """(the largest rate at which every seed trains, whether a larger rate of the grid failed)."""
    trains = []
    for lr in sorted(grid):
        rs = [r for r in runs if r["lr"] == lr]
        if rs and all(not r["diverged"] and math.isfinite(r["final_train"])
                      and r["final_train"] < unigram - report.STALL_MARGIN for r in rs):
            trains.append(lr)
    if not trains:
        return None, False
    return trains[-1], trains[-1] < max(grid)


def fit_exponent(points):
    """Least squares log10 y = a + b log10 x over [(x, log10 y)]; (b, its standard error, a)."""
    x = np.log10([p[0] for p in points])
    y = np.array([p[1] for p in points])
    if len(set(x)) < 2:
        return None
    A = np.vstack([np.ones_like(x), x]).T
    coef, res, *_ = np.linalg.lstsq(A, y, rcond=None)
    dof = len(x) - 2
    s2 = float(np.sum((y - A @ coef) ** 2) / dof) if dof > 0 else math.nan
    cov = s2 * np.linalg.inv(A.T @ A) if dof > 0 else np.full((2, 2), math.nan)
    return float(coef[1]), float(math.sqrt(cov[1, 1])), float(coef[0])


def analysis(result):
    unigram = result["data"]["unigram_entropy"]
    rows, seeds = {}, sorted({r["seed"] for m in result["methods"].values() for r in m["runs"]})
    for lab, m in result["methods"].items():
        runs, grid = m["runs"], m["lrs"]
        if not runs:
            continue
        mean = {lr: (float(np.mean([r["final_train"] for r in runs if r["lr"] == lr]))
                     if all(math.isfinite(r["final_train"]) for r in runs if r["lr"] == lr) else math.inf)
                for lr in grid if any(r["lr"] == lr for r in runs)}
        logb, how = best_log_rate(list(mean), mean)
        per_seed = []
        for seed in seeds:
            got = {r["lr"]: r["final_train"] if math.isfinite(r["final_train"]) else math.inf
                   for r in runs if r["seed"] == seed}
            if got:
                per_seed.append(best_log_rate(list(got), got)[0])
        e, seen = edge(runs, grid, unigram)
        s = m["summary"]
        rows[lab] = dict(**m["extra"], best_lr=None if logb is None else 10 ** logb, best_how=how,
                         best_lr_seeds=[None if b is None else 10 ** b for b in per_seed],
                         grid_best=s["best_lr"], loss=s["final_train"], loss_std=s.get("final_train_std"),
                         edge=e, edge_seen=seen)
    fits = {}
    for kind in KINDS:
        for axis, key, fixed in (("width", "width", ("depth", BASE[1])), ("depth", "depth", ("width", BASE[0]))):
            pts = [(r[key], math.log10(b)) for r in rows.values()
                   if r["kind"] == kind and not r.get("mup") and r[fixed[0]] == fixed[1]
                   for b in r["best_lr_seeds"] if b]
            fit = fit_exponent(pts)
            if fit:
                fits[f"{kind}_{axis}"] = dict(exponent=fit[0], stderr=fit[1], intercept=fit[2], points=len(pts))
    lead = {}
    for w, d in [(w, BASE[1]) for w in WIDTHS] + [(BASE[0], d) for d in DEPTHS[1:]]:
        e, p = rows.get(label("espa", w, d)), rows.get(label("pre_ln", w, d))
        if e and p and math.isfinite(e["loss"]) and math.isfinite(p["loss"]):
            lead[f"w{w}_d{d}"] = dict(width=w, depth=d, lead=p["loss"] - e["loss"],
                                      spread=math.hypot(e["loss_std"] or 0.0, p["loss_std"] or 0.0))
    transfer = {}
    for kind in KINDS:
        base = rows.get(label(kind, *BASE))
        for w in MUP_WIDTHS:
            plain, mup = rows.get(label(kind, w, BASE[1])), rows.get(label(kind, w, BASE[1], True))
            if base and plain and mup and base["best_lr"] and plain["best_lr"] and mup["best_lr"]:
                transfer[f"{kind}_w{w}"] = dict(
                    kind=kind, width=w, base=base["best_lr"], plain=plain["best_lr"], mup=mup["best_lr"],
                    plain_shift=math.log10(plain["best_lr"] / base["best_lr"]),
                    mup_shift=math.log10(mup["best_lr"] / base["best_lr"]),
                    plain_loss=plain["loss"], mup_loss=mup["loss"])
    return dict(rows=rows, fits=fits, lead=lead, transfer=transfer)


def findings(result):
    a = result["analysis"]
    lines = []
    for lab, r in a["rows"].items():
        best = "-" if r["best_lr"] is None else f"{r['best_lr']:.2g}"
        e = "none" if r["edge"] is None else (f"{r['edge']:g}" if r["edge_seen"] else f">= {r['edge']:g} (grid top)")
        lines.append(f"{lab}: best rate {best} ({r['best_how']}; grid best {r['grid_best']}), final train "
                     f"{report.fmt(r['loss'])}, divergence edge {e}")
    for key, f in a["fits"].items():
        kind, axis = key.rsplit("_", 1)
        lines.append(f"{KINDS[kind][1]}: best rate ~ {axis}^({f['exponent']:+.2f} +- {f['stderr']:.2f}) "
                     f"({f['points']} seed-level points)")
    for key, x in a["lead"].items():
        lines.append(f"width {x['width']}, depth {x['depth']}: Pre-LN minus E-SPA final train loss "
                     f"{x['lead']:+.3f} +- {x['spread']:.3f} ({'E-SPA' if x['lead'] > 0 else 'Pre-LN'} ahead)")
    for key, t in a["transfer"].items():
        moved = abs(t["mup_shift"]) < abs(t["plain_shift"])
        lines.append(f"{KINDS[t['kind']][1]} at width {t['width']}: best rate {t['plain']:.2g} with plain AdamW, "
                     f"{t['mup']:.2g} with the muP rule, against {t['base']:.2g} at width {BASE[0]} "
                     f"(shift {t['plain_shift']:+.2f} vs {t['mup_shift']:+.2f} decades: the rule "
                     + ("moves the best rate less" if moved else "does not move it less") + ")")
    return lines


def at_init(settings, configs, ds):
    """Kernels at init: the last block's mean cosine and q predicted in the wide limit beside a
    real model's (float64, 4 sequences of the data) at each width, E-SPA and Pre-LN."""
    from ..config import GPTConfig
    from ..measure import layer_stats, measured_kernels
    from ..model import GPT
    from ..predict import predicted_kernels
    import data as nanospa_data
    probe, _ = nanospa_data.get_batch(ds.val, 4, settings["block_size"], np.random.default_rng(0))
    out = {}
    for lab, d in configs.items():
        if "_mup_" in lab:
            continue                                     # the same models at init as the plain runs
        cfg = GPTConfig(**dict(d, dtype="float64"))
        model = GPT(cfg, seed=0)
        meas = layer_stats(measured_kernels(model, probe)["hidden"])
        pred = layer_stats(predicted_kernels(cfg, model.plan, probe))
        out[lab] = dict(width=cfg.n_embd, depth=cfg.n_layer, measured=dict(cos=meas["cos"][-1], q=meas["q"][-1]),
                        predicted=dict(cos=pred["cos"][-1], q=pred["q"][-1]),
                        gap=abs(meas["cos"][-1] - pred["cos"][-1]))
    return out


def plot(result, path, panels=None):
    plt = report.pyplot(path)
    if plt is None:
        return False
    a = result.get("analysis") or {}
    rows = a.get("rows", {})
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.4), constrained_layout=True)
    for ax, axis, fixed in ((axes[0], "width", ("depth", BASE[1])), (axes[1], "depth", ("width", BASE[0]))):
        for kind, marker in (("espa", "o"), ("pre_ln", "s")):
            for mup in (False, True):
                pts = sorted((r[axis], r["best_lr"], r["edge"]) for r in rows.values()
                             if r["kind"] == kind and bool(r.get("mup")) == mup and r[fixed[0]] == fixed[1]
                             and r["best_lr"])
                if not pts or (mup and axis == "depth"):
                    continue
                x, b, e = zip(*pts)
                name = KINDS[kind][1] + (" (muP rule)" if mup else "")
                line, = ax.plot(x, b, marker=marker, ls="--" if mup else "-", label=f"{name}: best rate")
                if not mup:
                    ax.plot([p for p, q in zip(x, e) if q], [q for q in e if q], marker="v", ls=":",
                            color=line.get_color(), label=f"{name}: divergence edge")
                fit = a.get("fits", {}).get(f"{kind}_{axis}")
                if fit and not mup:
                    xs = np.array([min(x), max(x)])
                    ax.plot(xs, 10 ** (fit["intercept"] + fit["exponent"] * np.log10(xs)), color=line.get_color(),
                            lw=0.8, alpha=0.6)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(axis)
        ax.set_ylabel("learning rate")
        ax.set_title(f"best rate and edge vs {axis} ({fixed[0]} {fixed[1]})")
        ax.legend(fontsize=7)
    lead = a.get("lead", {})
    for axis, fixed, style in (("width", ("depth", BASE[1]), "o-"), ("depth", ("width", BASE[0]), "s--")):
        pts = sorted((x[axis], x["lead"], x["spread"]) for x in lead.values() if x[fixed[0]] == fixed[1])
        if pts:
            xs, ys, ss = zip(*pts)
            axes[2].errorbar(xs, ys, yerr=ss, fmt=style, label=f"vs {axis}")
    axes[2].axhline(0, color="k", lw=0.8)
    axes[2].set_xscale("log", base=2)
    axes[2].set_xlabel("width or depth")
    axes[2].set_ylabel("Pre-LN minus E-SPA final train loss (nats/byte)")
    axes[2].set_title("E-SPA's lead (> 0: E-SPA ahead)")
    axes[2].legend(fontsize=7)
    fig.savefig(path, dpi=report.PLOT_DPI)
    plt.close(fig)
    return True


def main(argv=None):
    return runner.main(sys.modules[__name__], argv)
