"""One optimiser step, as train.py and the experiments take it.

    train_step(model, optimizer, x, y, grad_clip, accum=1, world=None, gradients=None)
        -> (loss, grad_norm)

On the batch (x, y) of N sequences (host arrays (N, T)), in order:

    1. the gradient of the batch's mean loss: ``accum`` micro-batches of N / accum sequences
       (gradient accumulation: only one micro-batch's activations are held at a time), each
       back-propagated in run/threads.threads() slices on worker threads and, under MPI,
       from this rank's share of it (run/distributed.py), with weight n_micro / N, so that

           L = sum_j (n_j / N) L_j,    dL/dtheta = sum_j (n_j / N) dL_j/dtheta

       is the loss and gradient of the whole batch, to the rounding of a sum in another order;
    2. K-FAC's curvature pass on the batch (the optimiser's update_curvature; AdamW has none):
       this rank's share of its first sequences, in pieces no larger than a micro-batch's;
    3. the mean gradient over ranks; global-norm clipping to grad_clip (0: off);
    4. the update (optimizer.step, zero_grad, the model's after_step), only when the loss and
       the gradient norm are finite: a caller that sees a non-finite value stops with the
       state it had.

On a GPU the step reads one pair of numbers back to the host (the loss and the gradient norm,
together) and copies one array to the device per micro-batch (its token ids and targets:
model.GPT.forward); nothing else crosses, whatever the depth or length (tests/test_gpu.py).

Step 1 changes no state but the parameters' .grad: it runs inside the context manager
`gradients` when one is given (train.py's: a signal abandons the step there, at once).

Not here: the batch (data.get_batch), the learning rate (the caller sets optimizer.lr), what
a run does with a non-finite value (train.py: exit 1; the experiments: the run diverged).
"""
import contextlib
import math

from .. import backend
from ..optim import clip_grad_norm
from .distributed import World
from .threads import sharded_backward, slice_bounds

SINGLE = World()     # one process: every collective is the identity


def train_step(model, optimizer, x, y, grad_clip=0.0, accum=1, world=SINGLE, gradients=None):
    n = len(x)
    if not isinstance(accum, int) or isinstance(accum, bool) or not 1 <= accum <= n:
        raise ValueError(f"accum must be an integer in [1, {n}] (the batch's sequences), got {accum!r}")
    loss = 0.0                                                # on the model's device until the read below
    bounds = slice_bounds(n, accum)
    with gradients or contextlib.nullcontext():
        for lo, hi in zip(bounds, bounds[1:]):                   # micro-batches, in order
            xs, ys = world.shard(x[lo:hi]), world.shard(y[lo:hi])  # this rank's share of each
            part = sharded_backward(lambda a, b: model(a, b)[1], xs, ys, weight=(hi - lo) / n)
            loss = loss + part.data.astype("float64")         # float64, added in order
    update_curvature = getattr(optimizer, "update_curvature", None)
    if update_curvature is not None:                          # K-FAC: leaves .grad alone
        update_curvature(x, y, rank=world.rank, size=world.size, max_rows=max(1, n // accum // world.size))
    params = model.parameters()
    world.allreduce_grads(params)                             # the global batch's mean gradient
    norm = clip_grad_norm(params, grad_clip)
    xp = backend.xp_of(norm)
    loss, norm = (float(v) for v in backend.to_numpy(xp.stack([loss, norm])))   # the step's one read
    loss = world.mean(loss)
    if math.isfinite(loss) and math.isfinite(norm):
        optimizer.step()
        optimizer.zero_grad()
        model.after_step()                                    # schemes with per-step state (nGPT, PRepBN)
    return loss, norm
