"""The parts of one optimiser step that train.py's loop calls by name, and the whole step as
one call for the experiments.

train.py's loop shows the step (forward, backward, clip, update); what makes it a step of a
parallel run sits behind these calls:

    micro_batches(x, y, accum, world)   -> (xs, ys, weight) for each of ``accum`` micro-batches
                             of the batch (gradient accumulation: one micro-batch's activations
                             held at a time), under MPI this rank's share of each
                             (run/distributed.py); weight = n_j / N, its share of the batch.
                             While the caller's loop body runs, the micro-batch's rows are
                             known as rows lo.. of the batch (run/threads.batch_rows): the dropout masks
                             of a step do not depend on how it is split
    forward(model, x, y)     -> the model's mean loss on (x, y), its slices' forwards on the
                             run/threads.threads() worker threads: a threads.SlicedLoss, whose
                             backward() runs each slice's backward on its thread and adds the
                             gradients into .grad in slice order (the same bits whatever the
                             timing); ``loss * weight`` scales it
    update_curvature(optimizer, x, y, accum, world)   K-FAC's curvature pass on the batch (the
                             optimiser's update_curvature; AdamW has none): this rank's share of
                             its first sequences, in pieces no larger than a micro-batch's;
                             leaves .grad alone
    read(losses, norm, world)   -> (loss, norm) as floats: the step's one device read

so that, with the micro-batches' losses L_j and weights n_j / N,

    L = sum_j (n_j / N) L_j,    dL/dtheta = sum_j (n_j / N) dL_j/dtheta

are the loss and gradient of the whole batch, to the rounding of a sum in another order.

    train_step(model, optimizer, x, y, grad_clip, accum=1, world=None) -> (loss, grad_norm)

is the same step as one call (nanospa/experiments): the micro-batches' forward and backward,
K-FAC's curvature, the mean gradient over ranks, global-norm clipping to grad_clip (0: off),
the read, and the update (optimizer.step, zero_grad, the model's after_step) only when the
loss and the gradient norm are finite: a caller that sees a non-finite value stops with the
state it had. tests/test_train.py holds train.py's loop and train_step to the same weights.

On a GPU a step reads one pair of numbers back to the host (the loss and the gradient norm,
together, in read) and copies one array to the device per micro-batch (its token ids and
targets: model.GPT.forward); nothing else crosses, whatever the depth or length
(tests/test_gpu.py, tests/test_gpu_commands.py).

Not here: the batch (data.get_batch), the learning rate (the caller sets optimizer.lr), what
a run does with a non-finite value (train.py: exit 1; the experiments: the run diverged), and
what a signal does to a step (run/session.py).
"""
import math

from .. import backend
from ..optim import clip_grad_norm
from .distributed import World
from .threads import batch_rows, slice_bounds, sliced_loss

SINGLE = World()     # one process: every collective is the identity


def micro_batches(x, y, accum=1, world=SINGLE):
    """(xs, ys, weight) for each of ``accum`` micro-batches of the batch (x, y) (host arrays
    (N, T)), in order: under MPI this rank's contiguous share of it; weight = n_j / N."""
    n = len(x)
    if not isinstance(accum, int) or isinstance(accum, bool) or not 1 <= accum <= n:
        raise ValueError(f"accum must be an integer in [1, {n}] (the batch's sequences), got {accum!r}")
    bounds = slice_bounds(n, accum)
    for lo, hi in zip(bounds, bounds[1:]):
        with batch_rows(lo + world.rank * ((hi - lo) // world.size)):   # where this rank's rows start:
            yield world.shard(x[lo:hi]), world.shard(y[lo:hi]), (hi - lo) / n   # their dropout masks


def forward(model, x, y):
    """The model's mean loss on (x, y), one slice per worker thread: a threads.SlicedLoss."""
    return sliced_loss(lambda a, b: model(a, b)[1], x, y)


def update_curvature(optimizer, x, y, accum=1, world=SINGLE):
    """K-FAC's curvature pass on the step's batch; nothing for an optimiser without one."""
    update = getattr(optimizer, "update_curvature", None)
    if update is not None:
        update(x, y, rank=world.rank, size=world.size, max_rows=max(1, len(x) // accum // world.size))


def read(losses, norm, world=SINGLE):
    """The step's one device read: the batch's mean loss (the micro-batches' weighted losses,
    added in float64 in order; under MPI the mean over ranks) and the gradient norm. -> floats."""
    loss = 0.0
    for part in losses:
        loss = loss + part.astype("float64")
    xp = backend.xp_of(norm)
    loss, norm = (float(v) for v in backend.to_numpy(xp.stack([loss, norm])))
    return world.mean(loss), norm


def train_step(model, optimizer, x, y, grad_clip=0.0, accum=1, world=SINGLE):
    """train.py's step as one call -> (loss, grad_norm); the update only when both are finite."""
    losses = []
    for xs, ys, weight in micro_batches(x, y, accum, world):
        loss = forward(model, xs, ys) * weight
        loss.backward()
        losses.append(loss.data)
    update_curvature(optimizer, x, y, accum, world)
    params = model.parameters()
    world.allreduce_grads(params)                             # the global batch's mean gradient
    norm = clip_grad_norm(params, grad_clip)
    loss, norm = read(losses, norm, world)
    if math.isfinite(loss) and math.isfinite(norm):
        optimizer.step()
        optimizer.zero_grad()
        model.after_step()                                    # schemes with per-step state (nGPT, PRepBN)
    return loss, norm
