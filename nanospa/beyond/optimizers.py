"""Which optimiser a run trains with: the settings train.py and the experiments share, and
the one function that builds the optimiser from them.

    --optimizer=adamw   AdamW (optim.py): learning_rate, beta1, beta2, weight_decay
    --optimizer=kfac    K-FAC (kfac.py, docs/kfac.md): learning_rate is K-FAC's lr, the
                        kfac_* settings below are its constructor's arguments; beta1 and
                        beta2 are the betas of its Adam fallback (embeddings, gains, scalars)
    --optimizer=muon    Muon (muon.py, docs/muon.md) for the blocks' Linear weights: learning_rate
                        is Muon's lr, the muon_* settings its constructor's arguments; AdamW
                        (beta1, beta2, learning_rate * muon_adam_lr_ratio) for all the rest

All follow the same learning-rate schedule and clipping (the caller sets ``.lr`` each
step; run/step.py clips the gradients and calls K-FAC's update_curvature between the
training backward and the clipping).

Not here: the optimisers themselves (optim.py, kfac.py, muon.py; AdamW with muP's rates is
MuPAdamW, below), the training step (run/step.py).
"""
import math

from .. import optim
from ..optim import AdamW, adamw_step

OPTIMIZERS = ("adamw", "kfac", "muon")

# Each key is a --key=value setting of train.py and the experiments; the comment is its --help line.
OPTIMIZER_DEFAULTS = dict(
    optimizer="adamw",          # adamw | kfac (docs/kfac.md) | muon (docs/muon.md); learning_rate is the chosen one's peak lr
    kfac_damping=1e-2,          # K-FAC Tikhonov damping lambda (results/kfac: 1e-3 blew up at lr 3e-2, depth 24)
    kfac_damping_mode="factored",  # K-FAC damping: factored (pi-split) | exact (a_i c_j + lambda)
    kfac_ema=0.95,              # K-FAC decay of the factors' moving averages
    kfac_inv_interval=10,       # K-FAC steps between eigendecompositions of the factors
    kfac_inverse_dtype="float64",  # K-FAC dtype of the eigendecompositions: float64 | float32
    kfac_momentum=0.5,          # K-FAC momentum of the preconditioned update
    kfac_kl_clip=1e-3,          # K-FAC KL clipping of the update (0 = off)
    kfac_fisher="sampled",      # K-FAC Fisher: sampled (true Fisher) | empirical | exact (every class)
    kfac_stats_fraction=0.25,   # K-FAC share of the batch's sequences in the curvature pass
    kfac_adam_lr_ratio=0.05,    # K-FAC Adam fallback's lr / learning_rate
    muon_momentum=0.95,         # Muon momentum of the hidden matrices (Jordan et al. 2024's default)
    muon_nesterov=True,         # Muon: orthogonalise the Nesterov step (1-mu) g + mu M, not M itself
    muon_ns_steps=5,            # Muon Newton-Schulz steps of the quintic (3.4445, -4.7750, 2.0315)
    muon_adam_lr_ratio=0.1,     # Muon: AdamW's lr for embeddings, head, gains, scalars / learning_rate
    mup_base_width=0,           # AdamW: the lr of every Linear weight times mup_base_width / n_embd (muP's width rule); 0 = off
)
KFAC_KEYS = [k for k in OPTIMIZER_DEFAULTS if k.startswith("kfac_")]
MUON_KEYS = [k for k in OPTIMIZER_DEFAULTS if k.startswith("muon_")]
# Each optimiser's own peak and final rate, where a run gives none. AdamW's are train.py's
# defaults; K-FAC's come from results/kfac (vanilla E-SPA, depth 24: best at lr 3e-2 with
# damping 1e-2, final loss 1.985 against AdamW's 2.193; at AdamW's 2e-3 K-FAC barely trains),
# with the same 10:1 decay as AdamW's. Muon's: its authors' default lr 0.02 (muon.py), 10:1 too.
RATES = dict(adamw=dict(learning_rate=2e-3, min_lr=2e-4), kfac=dict(learning_rate=3e-2, min_lr=3e-3),
             muon=dict(learning_rate=2e-2, min_lr=2e-3))


def rates_for(s, given):
    """The chosen optimiser's learning_rate and min_lr (RATES) where `given` (the settings
    the command line or a preset set) has none; an explicit value always wins. For scratch
    runs: a resumed run keeps its own."""
    for key, value in RATES.get(s["optimizer"], {}).items():      # another name: check_optimizer refuses it
        if key not in given:
            s[key] = value
    return s


def check_optimizer(s):
    """ValueError naming a bad optimiser setting, before any data is read or model built
    (K-FAC's and Muon's own checks, run on their settings alone; a Muon setting missing
    from `s` is taken at its default)."""
    if s["optimizer"] not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {list(OPTIMIZERS)}, got {s['optimizer']!r}")
    base = s.get("mup_base_width", 0)
    if isinstance(base, bool) or not isinstance(base, int) or base < 0:
        raise ValueError(f"mup_base_width must be an integer >= 0 (0 = off), got {base!r}")
    if base and s["optimizer"] != "adamw":
        raise ValueError(f"mup_base_width={base} scales AdamW's rates; optimizer={s['optimizer']!r} has its own")
    from .kfac import SETTINGS
    for key in KFAC_KEYS:
        ok, what = SETTINGS[key[len("kfac_"):]]
        if not ok(s[key]):
            raise ValueError(f"{key} must be {what}, got {s[key]!r}")
    from .muon import SETTINGS as MUON
    for key in MUON_KEYS:
        ok, what = MUON[key[len("muon_"):]]
        value = s.get(key, OPTIMIZER_DEFAULTS[key])
        if not ok(value):
            raise ValueError(f"{key} must be {what}, got {value!r}")


def make_optimizer(s, model, seed=0, rank=0, allreduce=None):
    """The optimiser `s` names for `model`: AdamW, KFAC or Muon. ``allreduce`` (K-FAC): the
    World's allreduce_grads when several ranks train (the factors are averaged over them);
    every rank draws the same sampled targets for the whole batch and uses its share (the
    run does not depend on the number of ranks). ``rank`` is kept for callers; unused."""
    check_optimizer(s)
    betas = (s["beta1"], s["beta2"])
    if s["optimizer"] == "adamw":       # parameters marked no_decay are never decayed
        options = dict(lr=s["learning_rate"], betas=betas, weight_decay=s["weight_decay"])
        scales = mup_lr_scales(model, s.get("mup_base_width", 0))
        if scales is None:
            return optim.AdamW(model.parameters(), **options)   # looked up when called (a patched-in subclass applies)
        return MuPAdamW(model.parameters(), scales, **options)
    from .kfac import KFAC              # the optimisers beyond AdamW: imported when named
    from .muon import Muon
    if s["optimizer"] == "muon":        # every rank alike: the gradients are averaged before the step
        return Muon(model, lr=s["learning_rate"], adam_betas=betas, weight_decay=s["weight_decay"],
                    **{k[len("muon_"):]: s.get(k, OPTIMIZER_DEFAULTS[k]) for k in MUON_KEYS})
    return KFAC(model, lr=s["learning_rate"], adam_betas=betas, weight_decay=s["weight_decay"],
                seed=seed, allreduce=allreduce,
                **{k[len("kfac_"):]: s[k] for k in KFAC_KEYS})


def mup_lr_scales(model, base_width):
    """Per-parameter multipliers of AdamW's lr for muP's width transfer (Yang et al., Tensor
    Programs V, Table 3, Adam): a matrix whose fan-in grows with the width, every Linear's
    weight here (q, k, v, the projections, the MLP, the head), gets lr x base_width / n_embd,
    so its per-coordinate update shrinks like 1 / width; embeddings, gains, biases, SPA's B_l
    and SkipInit's scalars keep lr. At n_embd = base_width every multiplier is 1: the plain
    AdamW, bit for bit. None (all 1) when base_width is 0. The initialisation is left as it is
    (nanospa's, not muP's): the rule is tried as a rate transfer alone (docs/results.md)."""
    if not base_width:
        return None
    if model.config.tie_embeddings:
        raise ValueError(f"mup_base_width={base_width} with tie_embeddings=True: muP scales the head's rate "
                         f"and keeps the embedding's, and tied they are one matrix; untie or set mup_base_width=0")
    from ..nn import Linear
    ratio = base_width / model.config.n_embd
    weights, todo = set(), [model]
    while todo:
        m = todo.pop()
        if isinstance(m, Linear):
            weights.add(id(m.weight))
        todo.extend(child for _, child in m.children())
    return [ratio if id(p) in weights else 1.0 for p in model.parameters()]


class MuPAdamW(AdamW):
    """AdamW with one lr multiplier per parameter (``lr_scales``, mup_lr_scales'): parameter i
    steps at lr x lr_scales[i]; at 1 everywhere the update is exactly AdamW's."""

    def __init__(self, params, lr_scales, **options):
        super().__init__(params, **options)
        self.lr_scales = [float(k) for k in lr_scales]
        if len(self.lr_scales) != len(self.params) or not all(k >= 0 and math.isfinite(k) for k in self.lr_scales):
            raise ValueError(f"MuPAdamW: lr_scales must be {len(self.params)} finite numbers >= 0, one per parameter")

    def step(self):
        self.t += 1
        adamw_step(self, range(len(self.params)), [self.lr * s for s in self.lr_scales], self.eps)
