"""Which optimiser a run trains with: the settings train.py and the experiments share, and
the one function that builds the optimiser from them.

    --optimizer=adamw   AdamW (optim.py): learning_rate, beta1, beta2, weight_decay
    --optimizer=kfac    K-FAC (kfac.py, docs/kfac.md): learning_rate is K-FAC's lr, the
                        kfac_* settings below are its constructor's arguments; beta1 and
                        beta2 are the betas of its Adam fallback (embeddings, gains, scalars)

Both follow the same learning-rate schedule and clipping (the caller sets ``.lr`` each
step; run/step.py clips the gradients and calls K-FAC's update_curvature between the
training backward and the clipping).

Not here: the optimisers themselves (optim.py, kfac.py), the training step (run/step.py).
"""
OPTIMIZERS = ("adamw", "kfac")

# Each key is a --key=value setting of train.py and the experiments; the comment is its --help line.
OPTIMIZER_DEFAULTS = dict(
    optimizer="adamw",          # adamw | kfac (docs/kfac.md); learning_rate is the chosen one's peak lr
    kfac_damping=1e-3,          # K-FAC Tikhonov damping lambda
    kfac_damping_mode="factored",  # K-FAC damping: factored (pi-split) | exact (a_i c_j + lambda)
    kfac_ema=0.95,              # K-FAC decay of the factors' moving averages
    kfac_inv_interval=10,       # K-FAC steps between eigendecompositions of the factors
    kfac_inverse_dtype="float64",  # K-FAC dtype of the eigendecompositions: float64 | float32
    kfac_momentum=0.5,          # K-FAC momentum of the preconditioned update
    kfac_kl_clip=1e-3,          # K-FAC KL clipping of the update (0 = off)
    kfac_fisher="sampled",      # K-FAC Fisher: sampled (true Fisher) | empirical | exact (every class)
    kfac_stats_fraction=0.25,   # K-FAC share of the batch's sequences in the curvature pass
    kfac_adam_lr_ratio=0.05,    # K-FAC Adam fallback's lr / learning_rate
)
KFAC_KEYS = [k for k in OPTIMIZER_DEFAULTS if k.startswith("kfac_")]


def check_optimizer(s):
    """ValueError naming a bad optimiser setting, before any data is read or model built
    (K-FAC's own checks, run on its settings alone)."""
    if s["optimizer"] not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {list(OPTIMIZERS)}, got {s['optimizer']!r}")
    from .kfac import SETTINGS
    for key in KFAC_KEYS:
        ok, what = SETTINGS[key[len("kfac_"):]]
        if not ok(s[key]):
            raise ValueError(f"{key} must be {what}, got {s[key]!r}")


def make_optimizer(s, model, seed=0, rank=0, allreduce=None):
    """The optimiser `s` names for `model`: AdamW or KFAC. ``allreduce`` (K-FAC): the
    World's allreduce_grads when several ranks train (the factors are averaged over them);
    each rank draws its own sampled targets (seed + 1000 rank)."""
    from ..optim import AdamW
    from .kfac import KFAC
    check_optimizer(s)
    betas = (s["beta1"], s["beta2"])
    if s["optimizer"] == "adamw":       # parameters marked no_decay are never decayed
        return AdamW(model.parameters(), lr=s["learning_rate"], betas=betas, weight_decay=s["weight_decay"])
    return KFAC(model, lr=s["learning_rate"], adam_betas=betas, weight_decay=s["weight_decay"],
                seed=seed + 1000 * rank, allreduce=allreduce,
                **{k[len("kfac_"):]: s[k] for k in KFAC_KEYS})
