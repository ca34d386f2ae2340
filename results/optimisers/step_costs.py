"""The optimisers study's cost, measured before the run (docs/results.md, "Does an optimiser
close the vanilla gap?"): CPU seconds per training step of each (model, optimiser, depth) cell
of the full preset (width 128, 4 heads, T 64, batch 12, byte tokens of tiny Shakespeare),
STEPS steps each in one single-threaded process, through the experiments' own train_run.
The first step and one K-FAC refresh (every 10 steps) are included.

    OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 python results/optimisers/step_costs.py

writes step_costs.json beside this file (CPU seconds per step by method label).
"""
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))              # the checkout: data.py and nanospa

import data as nanospa_data                           # noqa: E402
from nanospa.config import GPTConfig                  # noqa: E402
from nanospa.experiments import optimisers            # noqa: E402
from nanospa.experiments.common import train_run      # noqa: E402

STEPS = 10
LRS = dict(adamw=1e-3, muon=1e-2, kfac=3e-2)          # any rate that trains: the cost does not depend on it
ds = nanospa_data.load_dataset("/work/shared/data/tinyshakespeare.txt")
out = {}
for depth in (4, 12, 24):
    for kind, (config, _) in optimisers.KINDS.items():
        for opt, (settings, _) in optimisers.OPTIMISERS.items():
            cfg = GPTConfig(vocab_size=ds.vocab_size, n_layer=depth, n_head=4, n_embd=128, block_size=64, **config)
            r = train_run(cfg, ds.train, ds.val, steps=STEPS, lr=LRS[opt], batch_size=12, eval_batches=1,
                          optimizer=settings)
            label = optimisers.label(kind, opt, depth)
            out[label] = round(r["cpu_seconds"] / STEPS, 4)
            print(f"{label:18s} {out[label]:.3f} CPU s/step ({r['seconds'] / STEPS:.3f} wall)", flush=True)
(HERE / "step_costs.json").write_text(json.dumps(out, indent=1) + "\n")
