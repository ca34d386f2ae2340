"""Where a training step's time goes, per kind of op: ``python -m nanospa.bench --profile``.

nanospa: while profiling, every Function's forward and backward (the engine's ops) are
wrapped with a timer, and the optimiser step is timed apart; the kinds are below (KINDS). A
MatMul whose second input is a 2-D weight is a linear layer's GEMM, else it is one of
attention's batched per-head products (Q K^T, P V). An op is timed on the thread that calls
it (a blockwise attention op that shares its blocks among the workers counts its wall
time); the times of the threads that ran ops (train.py's slices of the batch: as many as
there are sequences, at most --threads) are summed and divided by their number, so each kind
is the share of a step's wall time one of them spends on it. What no op accounts for
(Python, building and walking the graph, adding the slices' gradients, threads waiting) is
"the rest". The wrappers are removed afterwards.

PyTorch: torch.profiler over the same number of steps of the yardstick's eager step, each
aten op's self time put into the same kinds (torch_kind); SDPA's fused attention is one
kind of its own, since its GEMMs and softmax happen inside one kernel, and the autograd
engine's own nodes count as "the rest".

Timing with the wrappers costs a little (two clock reads per op); the wall time of the
profiled steps is printed beside the step time of an unprofiled run.
"""
import threading
import time
from collections import defaultdict

from .. import backend
from ..tensor import Function

ELEMENTWISE = ("Add", "Sub", "Mul", "Div", "Neg", "Pow")
KINDS = dict(
    **{name: "elementwise (+ - * / exp ...)" for name in ELEMENTWISE},
    Shaped="activation (phi_hat)", Activation="activation (phi_hat)",
    Softmax="softmax", BlockwiseAttention="blockwise attention (fused)",
    CrossEntropy="cross-entropy",
    LayerNorm="norms", RMSNorm="norms", BatchNormOp="norms",
    Reshape="copies and transposes", Transpose="copies and transposes", GetItem="copies and transposes",
    Sum="reductions", Mean="reductions",
    Embedding="embedding",
)
LINEAR, BATCHED = "GEMM: linear layers", "GEMM: attention, batched per head"
OPTIMIZER, REST = "optimiser (AdamW)", "the rest (Python, graph, threads)"


def kind(cls_name, shapes):
    if cls_name == "MatMul":
        return LINEAR if len(shapes[1]) == 2 else BATCHED
    return KINDS.get(cls_name, "other ops")


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


class _Timers:
    """Wraps forward and backward of every Function subclass defining them; undo() restores."""

    def __init__(self):
        self.seconds, self.lock, self.saved, self.threads = defaultdict(float), threading.Lock(), [], set()
        for sub in set(_subclasses(Function)):
            for method in ("forward", "backward"):
                if method in sub.__dict__:
                    self.saved.append((sub, method, sub.__dict__[method]))
                    setattr(sub, method, self._wrap(sub.__name__, method, sub.__dict__[method]))

    def _wrap(self, name, method, f):
        timers = self

        def timed(ctx, *args, **kw):
            t = time.perf_counter()
            out = f(ctx, *args, **kw)
            dt = time.perf_counter() - t
            shapes = [a.shape for a in args] if method == "forward" else ctx.shapes
            with timers.lock:
                timers.seconds[kind(name, shapes)] += dt
                timers.threads.add(threading.get_ident())
            return out
        return timed

    def undo(self):
        for sub, method, f in self.saved:
            setattr(sub, method, f)


def profile_nanospa(step, steps):
    """{kind: seconds per step} of `steps` calls of a measure.NanospaStep, op times summed
    over the threads that ran ops and divided by their number; -> (kinds, wall seconds per
    step, that number)."""
    step()                                           # warm: buffers and pools exist
    opt_step = step.opt.step
    timers = _Timers()
    optimiser = [0.0]

    def timed_opt_step():
        t = time.perf_counter()
        opt_step()
        backend.synchronize()
        optimiser[0] += time.perf_counter() - t
    step.opt.step = timed_opt_step
    try:
        wall = sum(step() for _ in range(steps)) / steps
    finally:
        timers.undo()
        del step.opt.step                            # the bound method again
    n = max(1, len(timers.threads))
    kinds = {k: v / steps / n for k, v in timers.seconds.items()}
    kinds[OPTIMIZER] = optimiser[0] / steps
    kinds[REST] = max(wall - sum(kinds.values()), 0.0)
    return kinds, wall, n


TORCH_KINDS = (   # (substring of an aten op's name, kind): the first match wins
    ("index_select", "embedding"),
    ("scaled_dot_product", "SDPA attention (fused)"), ("flash_attention", "SDPA attention (fused)"),
    ("efficient_attention", "SDPA attention (fused)"),
    ("adamw", OPTIMIZER), ("_foreach", OPTIMIZER),
    ("bmm", BATCHED), ("baddbmm", BATCHED), ("addmm", LINEAR), ("aten::mm", LINEAR), ("linear", LINEAR),
    ("matmul", LINEAR),
    ("softmax", "softmax"), ("nll_loss", "cross-entropy"), ("cross_entropy", "cross-entropy"),
    ("leaky_relu", "activation (phi_hat)"), ("gelu", "activation (phi_hat)"), ("relu", "activation (phi_hat)"),
    ("tanh", "activation (phi_hat)"), ("sigmoid", "activation (phi_hat)"), ("softplus", "activation (phi_hat)"),
    ("elu", "activation (phi_hat)"), ("silu", "activation (phi_hat)"),
    ("layer_norm", "norms"), ("rms_norm", "norms"),
    ("copy_", "copies and transposes"), ("clone", "copies and transposes"), ("contiguous", "copies and transposes"),
    ("cat", "copies and transposes"), ("transpose", "copies and transposes"), ("view", "copies and transposes"),
    ("reshape", "copies and transposes"), ("split", "copies and transposes"),
    ("as_strided", "copies and transposes"), ("narrow", "copies and transposes"), ("select", "copies and transposes"),
    ("slice", "copies and transposes"), ("expand", "copies and transposes"), ("permute", "copies and transposes"),
    ("squeeze", "copies and transposes"), ("unbind", "copies and transposes"), ("empty", "copies and transposes"),
    ("zeros", "copies and transposes"), ("_to_copy", "copies and transposes"),
    ("sum", "reductions"), ("mean", "reductions"), ("embedding", "embedding"),
    ("add", "elementwise (+ - * / exp ...)"), ("mul", "elementwise (+ - * / exp ...)"),
    ("div", "elementwise (+ - * / exp ...)"), ("sub", "elementwise (+ - * / exp ...)"),
    ("fill_", "elementwise (+ - * / exp ...)"), ("zero_", "elementwise (+ - * / exp ...)"),
)


def torch_kind(op):
    if op.startswith(("autograd::", "Optimizer.")) or op.rstrip("0123456789").endswith("Backward"):
        return REST             # the autograd engine's nodes and the optimiser's wrapper: bookkeeping
    if op == "aten::t":
        return "copies and transposes"
    name = op.lower()
    return next((k for sub, k in TORCH_KINDS if sub in name), "other ops")


def profile_torch(step, steps):
    """{kind: seconds per step} of `steps` calls of a measure.TorchStep by torch.profiler
    (self CPU time of every op, so nothing is counted twice); -> (kinds, wall seconds per step)."""
    import torch
    step()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        wall = sum(step() for _ in range(steps)) / steps
    kinds = defaultdict(float)
    for ev in prof.key_averages():
        kinds[torch_kind(ev.key)] += ev.self_cpu_time_total / 1e6 / steps
    kinds[REST] += max(wall - sum(kinds.values()), 0.0)   # and what no op's self time covers
    return dict(kinds), wall


def profile_runners(runners, steps):
    """{framework: dict(kinds={kind: seconds per step}, wall_s, op_threads)} for nanospa's
    AdamW step and PyTorch's eager step among the benchmark's runners."""
    out = {}
    for r in runners:
        if r.name == "nanospa":
            kinds, wall, n = profile_nanospa(r, steps)
        elif r.name == "pytorch":
            (kinds, wall), n = profile_torch(r, steps), 1
        else:
            continue
        out[r.name] = dict(kinds=kinds, wall_s=wall, op_threads=n)
    return out


def profile_lines(profile, step_s):
    """The report's table: one row per kind, ms per step and share of the profiled wall time,
    the frameworks side by side; step_s: {framework: unprofiled median step seconds}."""
    names = list(profile)
    kinds = sorted({k for d in profile.values() for k in d["kinds"]},
                   key=lambda k: -max(d["kinds"].get(k, 0.0) for d in profile.values()))
    w = max(len(k) for k in kinds)
    k = profile.get("nanospa", {}).get("op_threads", 1)
    lines = [f"  where a step's time goes (ms per step, share; --profile over the timed steps; nanospa's op "
             f"times per thread of the {k} that ran ops, PyTorch's the self time of its aten ops):",
             f"    {'kind':{w}s} " + " ".join(f"{n:>20s}" for n in names)]
    for k in kinds:
        cells = []
        for n in names:
            v, wall = profile[n]["kinds"].get(k), profile[n]["wall_s"]
            cells.append(f"{'-':>20s}" if v is None else f"{1e3 * v:11.1f} ({100 * v / wall:4.1f}%)")
        lines.append(f"    {k:{w}s} " + " ".join(cells))
    lines.append(f"    {'profiled step (unprofiled)':{w}s} " + " ".join(
        f"{1e3 * profile[n]['wall_s']:8.1f} ({1e3 * step_s[n]:7.1f})  " for n in names))
    return lines
