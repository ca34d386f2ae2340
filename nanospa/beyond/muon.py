"""Muon: momentum orthogonalised by a Newton-Schulz iteration, for the hidden weight matrices;
AdamW for every other parameter. Settings, sources and a measured run: docs/muon.md.

Notation: W of shape (n_in, n_out), y = x W (nanospa's orientation; PyTorch stores the
transpose), G its gradient (already the mean over MPI ranks, run/step.py), M its momentum
buffer (from 0), mu the momentum, t the step count:

    M <- mu M + (1 - mu) G
    U  = (1 - mu) G + mu M          (Nesterov; M itself without)
    X  = U / (||U||_F + 1e-7), then ns_steps times, with (a, b, c) = NS_COEFFS:
         A = X X^T;   X <- a X + (b A + c A A) X        (X wide: A is the smaller Gram)
    W <- (1 - lr wd) W - lr sqrt(max(1, n_out / n_in)) X

Which parameters (hidden_matrices): the weight of every Linear inside ``model.blocks``
(attention q, k, v, proj; the MLP's fc, proj; nGPT's fc_u, fc_v). All others take AdamW's
update (optim.adamw_step) at lr * adam_lr_ratio: the token and position embeddings, the
head, norm gains and biases, Linear biases, Value-SkipInit's alpha and beta, a trainable SPA
bias B_l (2-D, inside the blocks, but not a Linear's weight: the split is by where a parameter
sits, not by its shape), nGPT's scalars. Parameters marked no_decay are never decayed.

Defaults and where each comes from (the public description: K. Jordan et al., "Muon: An
optimizer for hidden layers in neural networks", 2024, kellerjordan.github.io/posts/muon, and
its reference code, github.com/KellerJordan/Muon, muon.py and README):

    momentum 0.95, Nesterov on, 5 steps   the reference's defaults; its README: "the default
                                          values of momentum (0.95), nesterov (True), and
                                          ns_steps (5) work well"
    NS_COEFFS (3.4445, -4.7750, 2.0315)   the reference's quintic, chosen for the largest slope
                                          at 0 rather than convergence to 1; NS_EPS = 1e-7 its
                                          Frobenius normalisation's guard
    lr 0.02 (RATES in optimizers.py)      the reference's default, "in units of spectral norm
                                          per update"
    scale sqrt(max(1, n_out / n_in))      the reference's max(1, rows / cols)^0.5 on PyTorch's
                                          (out, in) weight: here shape[1] / shape[0]
    weight decay, decoupled               the reference's "AdamW-style weight decay", W <-
                                          (1 - lr wd) W; wd is the run's weight_decay (train.py:
                                          0, the reference's default too)
    AdamW for the rest, betas (0.9, 0.95) the reference's README (embeddings, classifier head,
                                          gains and biases by AdamW) and its auxiliary Adam's
                                          betas, which are train.py's beta1, beta2; eps 1e-8 is
                                          optim.AdamW's (the reference's: 1e-10)
    adam_lr_ratio 0.1                     nanospa's choice: at Muon's 2e-2 the AdamW side runs
                                          at 2e-3, train.py's AdamW rate for this model

The scale convention: the reference's, sqrt(max(1, fan_out / fan_in)), with lr in spectral
norm per step. It is the spectral condition for feature learning (Yang, Simon & Bernstein
2023: ||dW||_op ~ sqrt(fan_out / fan_in)), so the rate is meant to carry across widths, and
the defaults above are stated in its units. Moonshot's "Muon is scalable for LLM training"
(Liu et al. 2025) scales by 0.2 sqrt(max(n_in, n_out)) instead, to match AdamW's update RMS
and reuse AdamW's lr and weight decay; its rate eta is this module's lr = eta * 0.2
sqrt(max(n_in, n_out)) / sqrt(max(1, n_out / n_in)) (1.6 eta for a 64 x 64 matrix), a
different lr per shape, so it is not offered here. Under the reference's scale the (64, 256)
MLP fc matrix steps 2x as far in spectral norm as the (256, 64) proj, and a square one 1x.

Momentum's form: the reference code's running average (above). The blog's M <- mu M + G,
U = G + mu M is the same U times 1 / (1 - mu), which the normalisation removes (but for
the 1e-7). The reference runs the iteration in bfloat16 on a GPU; here it runs in the
parameters' dtype. After ns_steps = 5 every singular value s of U with s / ||U||_F >= 2e-3
lands in [0.68, 1.21] (measured, tests/test_muon.py); smaller ones grow by at most a^5 ~ 487.

Cost per step and matrix, m = min(n_in, n_out), n = max: ns_steps (4 m^2 n + 2 m^3) FLOPs.
The matrices' iterations run on the worker threads (run/threads.parallel_map; each result is
the same whatever their number). Every MPI rank orthogonalises every matrix from the same
averaged gradient (the reference shares them out among ranks and gathers the results), so
the ranks stay identical. The step reads nothing back to the host: all of it is array
operations on the parameters' device with Python numbers as scalars.

Not here: the settings and the choice of optimiser (optimizers.py), the learning-rate schedule
and clipping (optim.py, applied by the caller exactly as for AdamW), the loop (run/step.py).
"""
import math

import numpy as np

from .. import backend
from ..nn import Linear
from ..optim import _check_betas, adamw_step, check_lr
from ..run.threads import parallel_map

NS_COEFFS = (3.4445, -4.7750, 2.0315)   # the reference's quintic (a, b, c)
NS_EPS = 1e-7                           # guard of the Frobenius normalisation


def _finite(v):
    return not isinstance(v, bool) and isinstance(v, (int, float, np.floating, np.integer)) and math.isfinite(v)


SETTINGS = {  # the constructor's checks: name -> (test, what a good value is)
    "momentum": (lambda v: _finite(v) and 0 <= v < 1, "in [0, 1)"),
    "nesterov": (lambda v: isinstance(v, bool), "True or False"),
    "ns_steps": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1, "a positive integer"),
    "adam_lr_ratio": (lambda v: _finite(v) and v >= 0, "finite and >= 0"),
    "weight_decay": (lambda v: _finite(v) and v >= 0, "finite and >= 0"),
}


def newton_schulz(G, steps=5, coeffs=NS_COEFFS, eps=NS_EPS):
    """The approximate orthogonalisation of a 2-D array G (the module docstring's X), in G's
    dtype, on G's device: U S' V^T for G = U S V^T, S' in the quintic's band. A tall G is
    iterated as its transpose, which gives the transpose of the same result (X p(X^T X) =
    p(X X^T) X), at the cost of the smaller Gram matrix."""
    xp = backend.xp_of(G)
    tall = G.shape[0] > G.shape[1]
    X = G.T if tall else G
    X = X / (xp.sqrt((X * X).sum()) + eps)              # a device scalar: no host read
    a, b, c = coeffs
    for _ in range(steps):
        A = X @ X.T                                     # (m, m), m = min(n_in, n_out)
        B = A @ A
        B *= c
        B += b * A
        X = a * X + B @ X
    return X.T if tall else X


def update_scale(shape):
    """sqrt(max(1, fan_out / fan_in)) of a weight stored (n_in, n_out), as nanospa's Linear is."""
    n_in, n_out = shape
    return math.sqrt(max(1.0, n_out / n_in))


def hidden_matrices(model):
    """[(index in model.parameters(), name)] of Muon's parameters: the weight of every Linear
    inside model.blocks. By position in the model, not by shape: the embeddings and the head
    (2-D, outside the blocks) and a trainable B_l (2-D, inside, not a Linear) are AdamW's."""
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, (list, tuple)):
        raise ValueError("Muon: the model has no list of blocks (model.blocks) to find its hidden matrices in")
    hidden, todo = set(), list(blocks)
    while todo:
        m = todo.pop()
        if isinstance(m, Linear):
            hidden.add(id(m.weight))
        todo.extend(child for _, child in m.children())
    return [(i, name) for i, (name, p) in enumerate(model.named_parameters()) if id(p) in hidden]


class Muon:
    """Muon for model's hidden matrices, AdamW for the rest (the module docstring). lr (the
    caller sets ``.lr`` each step, as for AdamW): Muon's rate; the AdamW side's is lr *
    adam_lr_ratio. momentum, nesterov, ns_steps: Muon's; adam_betas, adam_eps: the AdamW
    side's; weight_decay: decoupled, both sides, never on no_decay parameters."""

    def __init__(self, model, lr=0.02, momentum=0.95, nesterov=True, ns_steps=5, weight_decay=0.0,
                 adam_betas=(0.9, 0.95), adam_eps=1e-8, adam_lr_ratio=0.1):
        values = dict(momentum=momentum, nesterov=nesterov, ns_steps=ns_steps,
                      adam_lr_ratio=adam_lr_ratio, weight_decay=weight_decay)
        bad = [f"{k} must be {SETTINGS[k][1]}, got {v!r}" for k, v in values.items() if not SETTINGS[k][0](v)]
        if not (_finite(adam_eps) and adam_eps > 0):
            bad.append(f"adam_eps must be finite and > 0, got {adam_eps!r}")
        if bad:
            raise ValueError("Muon: " + "; ".join(bad))
        for k, v in values.items():
            setattr(self, k, v)
        self.lr = lr
        (self.b1, self.b2), self.adam_eps = _check_betas(adam_betas), adam_eps
        self.params = model.parameters()
        if not self.params:
            raise ValueError("Muon: the model has no parameters")
        named = hidden_matrices(model)
        self.matrices = [i for i, _ in named]               # Muon's side, in parameter order
        self.names = dict(named)
        mine = set(self.matrices)
        self.others = [i for i in range(len(self.params)) if i not in mine]   # AdamW's side
        self.t = 0
        self.mom = [None] * len(self.params)                # Muon's momentum buffers
        self.m = [None] * len(self.params)                  # the AdamW side's moments
        self.v = [None] * len(self.params)

    lr = property(lambda self: self._lr, lambda self, value: setattr(self, "_lr", check_lr(value)),
                  doc="Muon's learning rate; setting it checks it (finite and >= 0).")

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    def directions(self):
        """{parameter index: orthogonalised direction} after folding this step's gradients
        into the momentum buffers (which it changes): the X of the module docstring."""
        mu, todo, inputs = self.momentum, [], []
        for i in self.matrices:
            p = self.params[i]
            if p.grad is None:
                continue
            xp = backend.xp_of(p.data)
            if self.mom[i] is None:
                self.mom[i] = xp.zeros_like(p.data)
            M = self.mom[i]
            g = xp.multiply(p.grad, 1.0 - mu, dtype=p.dtype)    # not in place: .grad may be shared
            M *= mu
            M += g
            if self.nesterov:
                g += mu * M                                     # (1 - mu) G + mu M
            todo.append(i)
            inputs.append(g if self.nesterov else M)
        outputs = parallel_map(lambda u: newton_schulz(u, self.ns_steps), inputs)
        return dict(zip(todo, outputs))

    def step(self):
        self.t += 1
        lr = self.lr
        for i, X in self.directions().items():
            p = self.params[i]
            if self.weight_decay and not getattr(p, "no_decay", False):
                p.data *= 1.0 - lr * self.weight_decay
            X *= lr * update_scale(p.shape)
            p.data -= X
        adamw_step(self, self.others, self.lr * self.adam_lr_ratio, self.adam_eps)   # AdamW for the rest

    # ---- checkpoints -----------------------------------------------------------------
    def state_dict(self):
        """{name: host array}: t; muon.matrices (the indices of Muon's parameters: what marks
        the state as Muon's, and the split it was taken with); per parameter j Muon's momentum
        muon.mom.j or the AdamW side's muon.m.j, muon.v.j. train.py's npz checkpoint stores it."""
        out = {"t": np.asarray(self.t), "muon.matrices": np.asarray(self.matrices, dtype=np.int64)}
        for name in ("mom", "m", "v"):
            out.update({f"muon.{name}.{j}": backend.to_numpy(a).copy()
                        for j, a in enumerate(getattr(self, name)) if a is not None})
        return out

    def load_state_dict(self, state):
        if "muon.matrices" not in state:
            raise ValueError("optimiser state is not Muon's (no muon.matrices): resume with the "
                             "optimiser that wrote the checkpoint")
        if np.asarray(state["muon.matrices"]).tolist() != self.matrices:
            raise ValueError("Muon state was taken with other hidden matrices (muon.matrices) than "
                             "this model's")
        known = {"t", "muon.matrices"}

        def take(key, p):
            known.add(key)
            if key not in state:
                return None
            if tuple(state[key].shape) != tuple(p.shape):
                raise ValueError(f"Muon state {key!r}: shape {tuple(state[key].shape)}, expected {tuple(p.shape)}")
            return backend.asarray(state[key], dtype=p.dtype)

        loaded = {name: [take(f"muon.{name}.{j}", p) for j, p in enumerate(self.params)]
                  for name in ("mom", "m", "v")}
        unexpected = sorted(set(state) - known)
        if unexpected:
            raise ValueError(f"Muon state has keys this model does not: {unexpected[:5]}")
        for name, arrays in loaded.items():
            getattr(self, name)[:] = arrays
        self.t = int(state["t"])
