"""Does an optimiser close the vanilla gap? Vanilla E-SPA against Pre-LN at several depths,
each trained with AdamW, Muon and K-FAC at its own best learning rate, then more seeds at
that rate; how many steps (and CPU seconds) vanilla E-SPA needs to reach Pre-LN-with-AdamW's
final loss (the paper's iterations ratio, Figure 4(b)).

    python -m nanospa.experiments optimisers [--preset=full|quick|tiny] [--depths=4,12,24] [--key=value ...]

Presets: full (and study, the same): the design of docs/results.md, about 4 hours on 2 cores;
quick: depth 4 only, 200 steps, one seed, no extension (about 11 minutes, estimated from the
measured step costs); tiny: seconds.

Methods: KIND_OPT_dDEPTH for KIND in espa (vanilla E-SPA), pre_ln (Pre-LN, learned
positions), OPT in adamw, muon, kfac (nanospa/beyond/optimizers.py, each with its defaults
spelled out in the job), DEPTH in --depths; width, heads, T and batch are the settings'
(the full preset: nanoGPT's CPU recipe for tiny Shakespeare, width 128, 4 heads, T 64, batch
12). Vanilla E-SPA runs espa_factor x --steps (its own warm-up and cosine decay over its
length), so that a ratio above 1 can be measured; Pre-LN runs --steps.

One command, two phases into one --out (one lock, one result.json):

    grid    every method over its own grid (GRIDS), grid_seeds seeds (seeds 0 .. grid_seeds-1);
            a method whose best rate (lowest mean final training loss over those seeds) is at
            an edge of its grid gets the next rate of the half-decade ladder beyond that edge,
            trained in another round, up to --extend rounds; a best still at an edge then is
            flagged in the findings ("not interior: extend the grid")
    seeds   each method at its grid best for seeds 0 .. seeds-1 (the grid's seeds are kept,
            not retrained)

Every round merges into --out's result.json (runner.merge_held), so a command stopped at any
point and run again trains only what is missing; --reuse takes runs of other results too.
runner.best_rate compares rates on the seeds they all ran, so the seeds added at the best do
not move the choice, unless one of them diverges: then the method is reported at another rate,
and the findings say so and call the verdict provisional.

Findings (analysis() in result.json, and table.md): per depth and optimiser, vanilla E-SPA's
iterations ratio against Pre-LN with AdamW (longer.iterations_ratio at 100% of Pre-LN's run:
the steps E-SPA's smoothed training loss needs to reach Pre-LN's smoothed loss at its last
step, / Pre-LN's steps; per seed, mean over seeds; "not reached" when it never does, i.e. >
espa_factor); the same in CPU seconds (each method's median CPU seconds per step at its best
rate; single-threaded workers); each optimiser's CPU cost per step relative to AdamW's on the
same model and depth; and the verdict, computed: at which depths each optimiser brings vanilla
E-SPA within WITHIN x of Pre-LN-with-AdamW's steps (every seed reached it, mean ratio <= WITHIN).

Not here: the optimisers (optim.py, beyond/kfac.py, beyond/muon.py), the runner (runner.py),
the ratio's smoothing (longer.py). The design and its CPU budget: docs/results.md, "Does an
optimiser close the vanilla gap?".
"""
import datetime
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

from ..beyond.optimizers import KFAC_KEYS, MUON_KEYS, OPTIMIZER_DEFAULTS
from ..run.settings import run_command, wants_help
from . import longer, report, runner
from .runner import PRE_LN, VANILLA, Method

NAME = "optimisers"
TITLE = "vanilla E-SPA against Pre-LN across depth under AdamW, Muon and K-FAC: the iterations ratio"
PAPER = ("Figure 4(b) and the abstract: with Adam, deep vanilla transformers with E-SPA reach the loss of "
         "standard (Pre-LN) ones after about 5 times more iterations. The paper asks whether better optimisers "
         "close this gap and leaves it open; DKS and TAT (Martens et al. 2021, Zhang et al. 2022) found that "
         "with K-FAC deep vanilla convolutional networks train about as fast per step as residual ones.")
WITHIN = 1.5        # the verdict's threshold: E-SPA within 1.5x of Pre-LN-with-AdamW's steps
KINDS = dict(espa=(dict(VANILLA, attention="espa"), "vanilla E-SPA"),
             pre_ln=(dict(PRE_LN), "Pre-LN, standard attention, GeLU, learned positions"))
# Each optimiser's settings, spelled out in every job (a later change of a default is another job for --reuse).
OPTIMISERS = dict(adamw=(dict(optimizer="adamw"), "AdamW"),
                  muon=(dict(optimizer="muon", **{k: OPTIMIZER_DEFAULTS[k] for k in MUON_KEYS}), "Muon"),
                  kfac=(dict(optimizer="kfac", **{k: OPTIMIZER_DEFAULTS[k] for k in KFAC_KEYS}), "K-FAC"))
# Learning-rate grids, (kind, optimiser) -> {depth: grid}; a depth not listed takes the nearest
# listed one's (the shallower at a tie). Half-decade ladders (1, 3, 10, ...), four points placed so that the expected best
# is inside:
#   AdamW, E-SPA: the width study's fit (docs/results.md, issue 29), 3.5e-4 (width/64)^-1.10
#     (depth/24)^-1.31, at width 128 1.7e-3, 4.0e-4, 1.6e-4 at depths 4, 12, 24 (nanoGPT's
#     recipe: 1e-3 at depth 4);
#   AdamW, Pre-LN: 8.2e-3 (width/64)^-1.03 (depth/24)^-0.64: 1.3e-2, 6.2e-3, 4.0e-3;
#   Muon: its authors' 0.02 (spectral units) and docs/muon.md's better 5e-3 on vanilla E-SPA;
#   K-FAC: results/kfac at depth 24 (damping 1e-2): E-SPA best at 0.03, Pre-LN at 0.3, each at an
#     edge of {0.03, 0.1, 0.3}, so the grids move a point outwards.
GRIDS = {
    ("espa", "adamw"): {4: (3e-4, 1e-3, 3e-3, 1e-2), 12: (1e-4, 3e-4, 1e-3, 3e-3), 24: (3e-5, 1e-4, 3e-4, 1e-3)},
    ("pre_ln", "adamw"): {4: (3e-3, 1e-2, 3e-2, 1e-1), 12: (1e-3, 3e-3, 1e-2, 3e-2), 24: (1e-3, 3e-3, 1e-2, 3e-2)},
    ("espa", "muon"): {24: (3e-3, 1e-2, 3e-2, 1e-1)},
    ("pre_ln", "muon"): {24: (3e-3, 1e-2, 3e-2, 1e-1)},
    ("espa", "kfac"): {24: (1e-2, 3e-2, 1e-1, 3e-1)},
    ("pre_ln", "kfac"): {24: (3e-2, 1e-1, 3e-1, 1.0)},
}
EXTRA = dict(depths=(4, 12, 24), grid_seeds=1, extend=1, espa_factor=2)
EXTRA_NOTES = dict(depths="depths trained (each with every model and optimiser)",
                   grid_seeds="seeds per rate of the grid phase (the seeds phase runs --seeds at each best)",
                   extend="grid rounds that add the next half-decade rate beyond a best at a grid's edge",
                   espa_factor="vanilla E-SPA runs espa_factor x --steps (a ratio up to it can be measured)")
STUDY = dict(n_embd=128, n_head=4, block_size=64, batch_size=12, steps=300, seeds=3, workers=2, device="cpu",
             eval_batches=8, depths=(4, 12, 24))
PRESETS = dict(
    tiny=dict(depths=(2,), seeds=2, extend=1),          # two-point grids (the real ones' middle), seconds
    quick=dict(STUDY, depths=(4,), steps=200, seeds=1, extend=0),
    study=dict(STUDY), full=dict(STUDY),
)


def label(kind, opt, depth):
    return f"{kind}_{opt}_d{depth}"


def grid(kind, opt, depth, tiny=False):
    table = GRIDS[kind, opt]
    g = table[min(table, key=lambda d: (abs(d - depth), d))]
    return g[1:3] if tiny else g


def methods(settings):
    depths, tiny = settings["depths"], settings["preset"] == "tiny"
    if not depths or any(d < 1 for d in depths) or len(set(depths)) != len(depths):
        raise ValueError(f"depths must be distinct positive integers, got {depths}")
    if settings["grid_seeds"] < 1 or settings["extend"] < 0 or settings["espa_factor"] < 1:
        raise ValueError(f"grid_seeds must be >= 1, extend >= 0 and espa_factor >= 1, got {settings['grid_seeds']}, "
                         f"{settings['extend']}, {settings['espa_factor']}")
    extra, best = settings.get("_extra_lrs", {}), settings.get("_best_lrs")
    out = {}
    for depth in depths:
        for kind, (config, name) in KINDS.items():
            for opt, (optimizer, opt_name) in OPTIMISERS.items():
                key = label(kind, opt, depth)
                if best is not None and key not in best:      # the seeds phase: a method that diverged everywhere
                    continue
                lrs = (best[key],) if best is not None else tuple(grid(kind, opt, depth, tiny)) + tuple(extra.get(key, ()))
                out[key] = Method(dict(config, n_layer=depth), f"{name}, {opt_name}, depth {depth}",
                                  steps_factor=settings["espa_factor"] if kind == "espa" else 1,
                                  lrs=lrs, optimizer=dict(optimizer), extra=dict(kind=kind, opt=opt, depth=depth))
    return out


# ------------------------------------------------------------------ the two phases

def next_rate(lr, up):
    """The next rate of the half-decade ladder (1, 3, 10, 30, ... x 10^k) above (up) or below lr."""
    i = math.floor(2 * math.log10(lr)) - 2
    while True:
        value = float(f"{3 if i % 2 else 1}e{i // 2}")
        if up and value > lr * 1.01:
            return value
        if not up and value >= lr / 1.01:
            return float(f"{3 if (i - 1) % 2 else 1}e{(i - 1) // 2}")
        i += 1


def grid_best(method, grid_seeds, lrs=None):
    """(best rate or None, its place: "interior", "low edge", "high edge", "one rate", "diverged")
    of a result's method over the rates `lrs` (default: every rate it ran), from the runs of
    seeds < grid_seeds (runner.best_rate)."""
    lrs = sorted(method["lrs"] if lrs is None else lrs)
    runs = [r for r in method["runs"] if r["seed"] < grid_seeds]
    _, best = runner.best_rate(runs, lrs)
    if best is None:
        return None, "diverged"
    if len(lrs) == 1:
        return best, "one rate"
    return best, "low edge" if best == lrs[0] else "high edge" if best == lrs[-1] else "interior"


def run(spec, argv):
    """The grid rounds, then the seeds at each best: runner._run into the one held --out each
    time. Each round's grid is the method's own plus the rates earlier rounds of this command
    added, never a rate the folder holds from elsewhere: a resumed study makes the same choices."""
    if wants_help(argv):
        return runner.run(spec, argv)
    t0 = time.time()
    started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    s = runner.settings_for(spec, argv)
    runner.selected_methods(spec, s)                  # bad depths or phase settings: refused before any work
    with runner.holding(s["out"]):
        path, extra = Path(s["out"]) / "result.json", {}
        for round_ in range(s["extend"] + 1):
            phase = dict(s, seeds=s["grid_seeds"], phase=f"grid, round {round_ + 1}", _extra_lrs=dict(extra))
            planned = {key: m.lrs for key, m in runner.selected_methods(spec, phase).items()}
            runner._run(spec, argv, phase, t0, started)
            result = json.loads(path.read_text(encoding="utf-8"))
            moved = False
            for key, lrs in planned.items():
                best, where = grid_best(result["methods"][key], s["grid_seeds"], lrs)
                if round_ < s["extend"] and where in ("low edge", "high edge", "diverged"):
                    edge = max(lrs) if where == "high edge" else min(lrs)
                    extra[key] = extra.get(key, ()) + (next_rate(edge, up=where == "high edge"),)
                    moved = True
            if not moved:
                break
        best = {key: grid_best(result["methods"][key], s["grid_seeds"], lrs)[0] for key, lrs in planned.items()}
        best = {key: lr for key, lr in best.items() if lr is not None}
        if not best:
            print(f"{NAME}: every method diverged at every rate of its grid; no seeds phase", flush=True)
            return 0
        print(f"{NAME}: seeds 0..{s['seeds'] - 1} at each method's best rate: "
              + ", ".join(f"{k} {v:g}" for k, v in best.items()), flush=True)
        wanted = ",".join(best) if s["methods"] else ""
        return runner._run(spec, argv, dict(s, phase="seeds", _best_lrs=best, methods=wanted), t0, started)


# ------------------------------------------------------------------ the findings

def _cell(result, kind, opt, depth):
    key = label(kind, opt, depth)
    return key if key in result["methods"] else None


def _depths(result):
    return sorted({m["extra"]["depth"] for m in result["methods"].values() if m.get("extra")})


def ratio(result, other, reference):
    """Vanilla E-SPA method `other` against the Pre-LN method `reference` (labels): dict(per_seed
    [steps ratio or None], mean, std (over the seeds that reached it), reached, seeds, limit (the
    largest ratio the runs can show), seconds (the mean times the CPU cost per step of `other` over
    `reference`'s), cost) or None when either has no run at its best rate."""
    ref, oth = longer._best_runs(result, reference), longer._best_runs(result, other)
    seeds = sorted(set(ref) & set(oth))
    if not seeds:
        return None
    S = result["methods"][reference]["steps"]
    per_seed = [longer.iterations_ratio(ref[k], oth[k], [S])[0] for k in seeds]
    got = [x for x in per_seed if x is not None]
    a, b = report.summary(result, other), report.summary(result, reference)
    cost = a["step_seconds"] / b["step_seconds"] if a.get("step_seconds") and b.get("step_seconds") else math.nan
    mean = float(np.mean(got)) if got else None
    return dict(per_seed=per_seed, mean=mean, std=float(np.std(got)) if got else None, reached=len(got),
                seeds=len(seeds), limit=result["methods"][other]["steps"] / S,
                seconds=None if mean is None else mean * cost, cost=cost)


def analysis(result):
    """{"ratios": {depth: {opt: ratio() against Pre-LN with AdamW, opt + "_same": against Pre-LN
    with the same optimiser}}, "grid": {label: {best (the grid seeds'), where, reported (the
    summary's best rate: another when a seed added at the grid's best diverged)}}, "cost":
    {label: CPU s/step / AdamW's on the same model and depth}}."""
    grid_seeds = result["settings"].get("grid_seeds", 1)
    out = dict(ratios={}, grid={}, cost={}, within=WITHIN)
    for key, m in result["methods"].items():
        best, where = grid_best(m, grid_seeds)
        out["grid"][key] = dict(best=best, where=where, reported=(m.get("summary") or {}).get("best_lr"))
        e = m.get("extra") or {}
        adam = _cell(result, e.get("kind"), "adamw", e.get("depth"))
        a, b = report.summary(result, key), report.summary(result, adam) if adam else None
        if a and b and a.get("step_seconds") and b.get("step_seconds"):
            out["cost"][key] = a["step_seconds"] / b["step_seconds"]
    for depth in _depths(result):
        ref = _cell(result, "pre_ln", "adamw", depth)
        row = {}
        for opt in OPTIMISERS:
            espa, same = _cell(result, "espa", opt, depth), _cell(result, "pre_ln", opt, depth)
            if espa and ref:
                row[opt] = dict(against=ref, espa=espa, **(ratio(result, espa, ref) or dict(seeds=0)))
            if espa and same and same != ref:
                row[opt + "_same"] = dict(against=same, espa=espa, **(ratio(result, espa, same) or dict(seeds=0)))
        out["ratios"][str(depth)] = row
    return out


def within(r, key="mean"):
    """Whether a ratio() brings E-SPA within WITHIN x: every seed reached it and the mean ratio
    (key="seconds": in CPU seconds) is at most WITHIN."""
    return bool(r and r.get("seeds") and r["reached"] == r["seeds"] and r[key] <= WITHIN)


def depths_text(depths):
    return f"depths {', '.join(map(str, depths))}" if depths else "no depth"


def ratio_text(r):
    if not r or not r.get("seeds"):
        return "no runs to compare"
    if not r["reached"]:
        return f"not reached (> {r['limit']:.3g})"
    text = f"{r['mean']:.2f}" + (f" ± {r['std']:.2f}" if r["reached"] > 1 else "")
    if r["reached"] < r["seeds"]:
        text += f" ({r['seeds'] - r['reached']} of {r['seeds']} seeds not reached, > {r['limit']:.3g})"
    return text


def findings(result):
    a = result.get("analysis") or analysis(result)
    phase = result["settings"].get("phase", "seeds")
    lines = [report.loss_line(result, key) for key in result["methods"]]
    edges = [f"{k} (best {g['best']:g} at the {g['where']})" if g["best"] else f"{k} (diverged at every rate)"
             for k, g in a["grid"].items() if g["where"] in ("low edge", "high edge", "diverged")]
    if edges:
        lines.append("not interior: extend the grid (a larger --extend, or the grids in optimisers.py): "
                     + ", ".join(edges))
    moved = [k for k, g in a["grid"].items() if g["best"] is not None and g.get("reported", g["best"]) != g["best"]]
    if moved:
        lines.append("a seed added at the grid's best diverged, so the method is reported at another rate: "
                     + ", ".join(f"{k} (grid best {a['grid'][k]['best']:g}, reported "
                                 f"{report.fmt(a['grid'][k]['reported'], 'g')})" for k in moved))
    if not phase.startswith("seeds"):
        return lines + [f"phase: {phase} (the seeds at each best rate and the verdict come after the grid)"]
    verdict = {}
    for depth, row in a["ratios"].items():
        for opt, (_, name) in OPTIMISERS.items():
            r = row.get(opt)
            if r is None:
                continue
            if not r.get("seeds"):
                lines.append(f"depth {depth}, {name}: no runs of vanilla E-SPA and Pre-LN with AdamW to compare")
                continue
            cost = a["cost"].get(r["espa"])
            seconds = "-" if r.get("seconds") is None else f"{r['seconds']:.2f}"
            same = row.get(opt + "_same")
            lines.append(f"depth {depth}, {name}: vanilla E-SPA's iterations ratio against Pre-LN with AdamW "
                         f"{ratio_text(r)} [seeds: {', '.join('-' if x is None else f'{x:.2f}' for x in r.get('per_seed', []))}]; "
                         f"in CPU seconds {seconds} (its step {r.get('cost', math.nan):.2f}x Pre-LN-AdamW's)"
                         + (f"; E-SPA's CPU cost per step {cost:.2f}x AdamW's" if cost is not None and opt != "adamw" else "")
                         + (f"; against Pre-LN with {name} too: {ratio_text(same)}" if same else ""))
            verdict.setdefault(name, {})[int(depth)] = r
    for opt, (_, name) in OPTIMISERS.items():
        costs = [f"depth {d} " + ", ".join(f"{'E-SPA' if k == 'espa' else 'Pre-LN'} {a['cost'][label(k, opt, d)]:.2f}x"
                                           for k in KINDS if label(k, opt, d) in a["cost"])
                 for d in _depths(result) if any(label(k, opt, d) in a["cost"] for k in KINDS)]
        if opt != "adamw" and costs:
            lines.append(f"{name}'s CPU cost per step relative to AdamW's: " + "; ".join(costs))
    parts = []
    for name, by_depth in verdict.items():
        steps = [d for d, r in sorted(by_depth.items()) if within(r)]
        seconds = [d for d, r in sorted(by_depth.items()) if within(r, "seconds")]
        parts.append(f"{name}: within {WITHIN:g}x at {depths_text(steps)} (in CPU seconds at {depths_text(seconds)})")
    if parts:
        involved = [k for k, g in a["grid"].items() if g["where"] != "interior" or k in moved]
        lines.append(f"verdict: vanilla E-SPA against Pre-LN with AdamW, steps to its final loss: " + "; ".join(parts)
                     + (f" (best rates not interior, so these ratios are provisional: {', '.join(involved)})"
                        if involved else ""))
    return lines


def plot(result, path, panels=None):
    """Training-loss curves at each method's best rate, one panel per depth."""
    panels = [(f"depth {d}", [k for k, m in result["methods"].items() if (m.get("extra") or {}).get("depth") == d])
              for d in _depths(result)]
    return report.plot(result, path, panels or None)


def main(argv=None):
    return run_command(run, sys.modules[__name__], sys.argv[1:] if argv is None else list(argv))


if __name__ == "__main__":
    sys.exit(main())
