"""python -m nanospa.experiments NAME [--key=value ...]: one command per figure and table of
the paper (docs/method.md §12), and the kernel-budget study.

    fig1     normalised kernels at init: standard attention collapses, U-SPA / E-SPA do not
    fig2     vanilla transformers: standard attention, Value-SkipInit, U-SPA, E-SPA; Pre-LN
    table1   E-SPA with DKS-GeLU, TAT-LReLU, GeLU, Sigmoid, with and without LayerNorm
    fig3     normalised residual connections without normalisation vs Pre-LN
    table2   E-SPA with normalised residuals and LayerNorm vs Pre-LN
    longer   vanilla E-SPA trained about 5 times longer vs Pre-LN
    budget   the kernel-budget comparison (nanospa/experiments/budget.py)
    kfac     K-FAC against AdamW on vanilla E-SPA, standard attention and Pre-LN
    norms    every residual and normalisation scheme at depth, beside vanilla E-SPA
    causality  how much a causal LM's loss at t sees tokens after t, per norm (docs/norms.md)
    scaling  vanilla E-SPA and Pre-LN across width and depth: best rate, divergence edge, lead, muP rule
    optimisers  vanilla E-SPA vs Pre-LN at depths 4, 12, 24 under AdamW, Muon, K-FAC: the iterations ratio
    recipes  nanoGPT's tiny Shakespeare recipes (cpu, gpu): Pre-LN as nanoGPT writes it and vanilla E-SPA

Each writes result.json, table.md and plot.png to --out (default out/NAME), which it holds
for the whole command (a second command into it: one error line naming the first). Presets:
--preset=quick (default; a 2-core CPU, about 15 minutes or less), --preset=full (one GPU),
--preset=tiny (seconds; for tests), --preset=study (quick's scale, 3 seeds, every method); recipes
has nanoGPT's cpu (default) and gpu instead. `python -m nanospa.experiments NAME --help` lists the
settings of one command. Bad settings or output folders (checked before any training), missing
data, full disks and the like: one `error:` line, exit status 2 (NANOSPA_DEBUG=1 for a traceback).
"""
import difflib
import importlib
import sys

from ..run.settings import fail

COMMANDS = ("fig1", "fig2", "table1", "fig3", "table2", "longer", "budget", "kfac", "norms", "causality", "scaling",
            "optimisers", "recipes")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(__doc__)
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        close = difflib.get_close_matches(name, COMMANDS, n=1)
        return fail(f"unknown experiment {name!r}" + (f"; did you mean {close[0]}?" if close else "")
                    + f" (one of: {', '.join(COMMANDS)})")
    module = importlib.import_module(f"nanospa.experiments.{name}")  # lazily: only the one asked for
    return module.main(rest)


if __name__ == "__main__":
    sys.exit(main())
