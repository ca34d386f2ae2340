"""The measuring of ``python -m nanospa.bench``: named configurations, the FLOP count of a
training step, the timed steps of nanospa and of the PyTorch yardstick, the GEMM peak.

    CONFIGS, make_config(name, overrides, dtype)   the benchmarked models
    model_flops(cfg, batch_size)                   model FLOPs of one training step
    kfac_flops(cfg, batch_size, settings)          what a K-FAC step adds (docs/kfac.md §10)
    NanospaStep, KfacStep, TorchStep               one timed training step each
    Yardstick                                      the PyTorch rows (eager, compiled) of a model
    paired_ratios(pairs)                           t_row / t_nanospa per round; the headline row
    time_fresh(export, ...)                        the yardstick alone in a fresh process
    GemmProbe                                      FLOP/s of n x n products, as nanospa runs them
    time_steps(runners, gemm, ...)                 alternating timed rounds -> times, peaks

Model FLOPs per step (forward + backward = 3 x forward, as in PaLM's MFU):

    N     = L (4 C^2 + 2 m C^2) + C V      weights that multiply activations: q, k, v, proj,
                                           MLP fc and proj (m = mlp_ratio), the head;
                                           embeddings are lookups and are not counted
    FLOPs = B T (6 N + 12 L T C)           6 N: a multiply-add per weight, 3 passes;
                                           12 L T C: Q K^T and P V, 2 T C each per token and
                                           layer forward, times 3; the full T x T square is
                                           counted (dense attention computes it; blockwise
                                           attention and SDPA skip most of the masked half, so
                                           their MFU at long T is overstated up to 2x there)

Elementwise work, softmax, the loss and the optimiser are not counted.

Not here: settings, threads and the run of one configuration (command.py), peak memory
(memory.py), the printed report (report.py), the PyTorch model (yardstick.py).
"""
import json
import os
import time

import numpy as np

from .. import backend
from ..config import GPTConfig
from ..optim import AdamW
from ..run.threads import parallel_map, sharded_backward, threads

# name -> (GPTConfig fields, batch size). "ref" is the reference configuration of the README.
CONFIGS = {
    "ref": (dict(vocab_size=256, block_size=256, n_layer=12, n_head=4, n_embd=256), 8),
    "ref512": (dict(vocab_size=256, block_size=256, n_layer=12, n_head=4, n_embd=512), 8),
    "gpu": (dict(vocab_size=256, block_size=512, n_layer=12, n_head=8, n_embd=512), 32),
    "tiny": (dict(vocab_size=256, block_size=16, n_layer=2, n_head=2, n_embd=32), 2),
    # long context (vary --block_size from 256 to 8192): width 64, depth 8, one sequence
    "long": (dict(vocab_size=256, block_size=2048, n_layer=8, n_head=4, n_embd=64), 1),
    "long8k": (dict(vocab_size=256, block_size=8192, n_layer=8, n_head=4, n_embd=64), 1),
}
ARCH = dict(attention="espa", activation="tat_lrelu", residual="none", norm="none", pos="none")
OPTIM = dict(lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)  # nanoGPT-like; same in both frameworks
BATCH_SEED, GEMM_SEED = 0, 1   # the random token batch and the GEMM probe's matrices


def model_flops(cfg, batch_size):
    """Model FLOPs of one training step (see the module docstring for what is counted)."""
    L, C, T, V = cfg.n_layer, cfg.n_embd, cfg.block_size, cfg.vocab_size
    n_matmul = L * (4 * C * C + 2 * cfg.mlp_ratio * C * C) + C * V
    per_token = 6 * n_matmul + 12 * L * T * C
    return dict(n_matmul_params=n_matmul, per_token=per_token, per_step=per_token * batch_size * T,
                formula="B*T*(6*N + 12*L*T*C), N = L*(4+2*mlp_ratio)*C^2 + C*V")


def kfac_flops(cfg, batch_size, stats_fraction, inv_interval):
    """FLOPs a K-FAC step adds to the training step (docs/kfac.md §10), per Linear (n_in,
    n_out) with R_s = stats_fraction B T rows in the curvature pass: the pass itself
    (stats_fraction x the step's model FLOPs), statistics 2 R_s (n_in^2 + n_out^2),
    preconditioning 4 n_in n_out (n_in + n_out), eigendecompositions about
    9 (n_in^3 + n_out^3) every inv_interval steps."""
    C, M, V, L = cfg.n_embd, cfg.mlp_ratio * cfg.n_embd, cfg.vocab_size, cfg.n_layer
    shapes = L * [(C, C)] * 4 + L * [(C, M), (M, C)] + [(C, V)]
    rows = stats_fraction * batch_size * cfg.block_size
    out = dict(curvature_pass=stats_fraction * model_flops(cfg, batch_size)["per_step"],
               statistics=sum(2 * rows * (a * a + b * b) for a, b in shapes),
               preconditioning=sum(4 * a * b * (a + b) for a, b in shapes),
               eigh_per_refresh=sum(9 * (a ** 3 + b ** 3) for a, b in shapes))
    out["per_step"] = (out["curvature_pass"] + out["statistics"] + out["preconditioning"]
                       + out["eigh_per_refresh"] / inv_interval)
    return out


def make_config(name, overrides, dtype):
    """CONFIGS[name] with the vanilla E-SPA architecture, dtype and overrides (GPTConfig
    fields, or batch_size) -> (GPTConfig, batch size)."""
    fields, batch = CONFIGS[name]
    fields = {**fields, **ARCH, "dtype": dtype, **overrides}
    batch = int(fields.pop("batch_size", batch))
    return GPTConfig(**fields), batch


def make_batch(cfg, batch_size, seed=BATCH_SEED):
    """Random tokens (B, T) and their left shift as targets: the data do not change the cost."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, cfg.vocab_size, (batch_size, cfg.block_size))
    return idx, np.roll(idx, -1, axis=1)


class NanospaStep:
    """One nanospa training step: forward, backward, AdamW, zero_grad."""
    name = "nanospa"

    def __init__(self, model, idx, targets):
        self.model = model
        self.opt = AdamW(model.parameters(), **OPTIM)
        self.idx, self.targets = backend.asarray(idx), backend.asarray(targets)

    def loss(self, idx, targets):
        return self.model(idx, targets)[1]

    def __call__(self):
        backend.synchronize()
        t = time.perf_counter()
        sharded_backward(self.loss, self.idx, self.targets)  # loss.backward() with one thread
        self.opt.step()
        self.opt.zero_grad()
        self.model.after_step()
        backend.synchronize()
        return time.perf_counter() - t


class KfacStep(NanospaStep):
    """One nanospa K-FAC training step on its own copy of the model: forward, backward, the
    curvature pass, K-FAC's update (the inverses every inv_interval steps), zero_grad."""
    name = "nanospa_kfac"

    def __init__(self, cfg, idx, targets, settings):
        from ..model import GPT
        from ..beyond.optimizers import OPTIMIZER_DEFAULTS, make_optimizer
        super().__init__(GPT(cfg, seed=0), idx, targets)
        s = {**OPTIMIZER_DEFAULTS, **settings, "optimizer": "kfac", "learning_rate": OPTIM["lr"],
             "beta1": OPTIM["betas"][0], "beta2": OPTIM["betas"][1], "weight_decay": OPTIM["weight_decay"]}
        self.opt = make_optimizer(s, self.model)

    def __call__(self):
        backend.synchronize()
        t = time.perf_counter()
        sharded_backward(self.loss, self.idx, self.targets)
        self.opt.update_curvature(self.idx, self.targets)
        self.opt.step()
        self.opt.zero_grad()
        self.model.after_step()
        backend.synchronize()
        return time.perf_counter() - t


class TorchStep:
    """The same step of the PyTorch yardstick (yardstick.TorchGPT, yardstick.Trainer), eager
    ("pytorch") or through torch.compile ("pytorch_compiled"). ``source``: the nanospa model
    (with its B_l as dense (T, T) masks: a blockwise model generates them for it,
    view.DenseView) or yardstick.export_nanospa's dict of it. A compiled step compiles at
    construction (one training step): compile_s, or ``unavailable`` with the reason."""

    def __init__(self, source, idx, targets, device, compiled=False):
        from .yardstick import TorchGPT, Trainer
        self.name = COMPILED if compiled else EAGER
        self.model = TorchGPT(source, device)
        self.trainer = Trainer(self.model, idx, targets, OPTIM, device, compiled=compiled)
        self.optimizer = self.trainer.optimizer
        self.compile_s = self.unavailable = None
        if compiled:
            self.compile_s, self.unavailable = self.trainer.compile()

    def __call__(self):
        return self.trainer()


EAGER, COMPILED = "pytorch", "pytorch_compiled"   # the yardstick's rows
ROWS = dict(both=(EAGER, COMPILED), eager=(EAGER,), compile=(COMPILED,), no=())   # --torch


class Yardstick:
    """The PyTorch rows of one configuration (rows: names of ROWS), built from one export of
    the model: the eager step at construction (``runners``), the compiled one when asked
    (compiled_step), after the eager rounds are timed: a compiled model in the process slowed
    the eager steps timed beside it by up to 30% (long, T = 1024), while each row timed alone
    agreed with a fresh process. A row that cannot run is in ``unavailable`` with its reason
    in one line: every row when the yardstick does not implement the configuration
    (yardstick.check), the compiled row when torch.compile fails on this machine."""

    def __init__(self, model, idx, targets, device, rows):
        from .yardstick import export_nanospa
        self.rows, self.idx, self.targets, self.device = tuple(rows), idx, targets, device
        self.runners, self.unavailable, self.compile_s, self.optimizer = [], {}, {}, None
        self.export = None
        try:
            self.export = export_nanospa(model)
        except ValueError as e:                          # a configuration it does not implement
            self.unavailable = {row: str(e) for row in rows}
            return
        if EAGER in rows:
            step = TorchStep(self.export, idx, targets, device)
            self.optimizer = step.optimizer
            self.runners.append(step)

    def compiled_step(self):
        """The compiled row's step (compiled now, by one training step), or None when it was
        not asked for or cannot run (the reason in ``unavailable``)."""
        if COMPILED not in self.rows or self.export is None:
            return None
        step = TorchStep(self.export, self.idx, self.targets, self.device, compiled=True)
        self.optimizer = step.optimizer
        if step.compile_s is not None:
            self.compile_s[COMPILED] = step.compile_s
        if step.unavailable is not None:
            self.unavailable[COMPILED] = step.unavailable
            return None
        self.runners.append(step)
        return step

    def summary(self):
        return dict(rows=[r.name for r in self.runners], unavailable=self.unavailable, compile_s=self.compile_s,
                    optimizer=self.optimizer and f"torch.optim.AdamW({self.optimizer}=True)",
                    attention="F.scaled_dot_product_attention", compile="torch.compile(model, dynamic=False), inductor")


def paired_ratios(pairs):
    """pairs: {row: (the row's step times, nanospa's step times of the same rounds)}. Per
    row, the quartiles over rounds of t_row / t_nanospa (> 1: nanospa is faster); ->
    (headline, {row: dict(median, q25, q75)}), headline the row of the smallest median step
    time (the faster of eager and compiled)."""
    ratios = {}
    for row, (t_row, t_ref) in pairs.items():
        r = np.asarray(t_row) / np.asarray(t_ref)
        ratios[row] = dict(median=float(np.median(r)), q25=float(np.quantile(r, 0.25)),
                           q75=float(np.quantile(r, 0.75)))
    headline = min(pairs, key=lambda row: float(np.median(pairs[row][0]))) if pairs else None
    return headline, ratios


# thread variables a fresh yardstick process does not inherit: PyTorch's threads are set by
# torch.set_num_threads alone (nanospa's bench sets OPENBLAS_NUM_THREADS for NumPy)
FRESH_DROPPED_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "GOTO_NUM_THREADS",
                     "BLIS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")
# the fresh process: Python loads yardstick.py by its path, so nothing of nanospa is imported
FRESH_CODE = ("import importlib.util, sys; "
              "spec = importlib.util.spec_from_file_location('nanospa_yardstick', sys.argv[1]); "
              "m = importlib.util.module_from_spec(spec); sys.modules[spec.name] = m; spec.loader.exec_module(m); "
              "sys.exit(m.fresh_main(sys.argv[2:]))")


def time_fresh(export, idx, targets, rows, threads, device, steps, warmup, settle):
    """Time yardstick rows alone in a fresh process that imports only torch and
    yardstick.py, without the thread variables of FRESH_DROPPED_ENV, with
    torch.set_num_threads(threads): -> the child's report (yardstick.fresh_main: rows
    {name: times | unavailable}, torch_threads, nanospa_imported), or dict(unavailable=reason)."""
    import subprocess
    import sys
    import tempfile

    import torch

    from . import yardstick
    with tempfile.TemporaryDirectory(prefix="nanospa_bench_") as tmp:
        job = f"{tmp}/job.pt"
        torch.save(dict(export=export, idx=torch.as_tensor(idx), targets=torch.as_tensor(targets),
                        optim=dict(OPTIM), device=device, rows={r: r == COMPILED for r in rows},
                        steps=steps, warmup=warmup, settle=settle), job)
        env = {k: v for k, v in os.environ.items() if k not in FRESH_DROPPED_ENV}
        out = subprocess.run([sys.executable, "-c", FRESH_CODE, yardstick.__file__, job, str(threads)],
                             cwd=tmp, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        tail = [line for line in out.stderr.strip().splitlines() if line.strip()]
        return dict(unavailable=f"the fresh process failed ({out.returncode}): {tail[-1] if tail else ''}"[:300])
    d = json.loads(out.stdout.strip().splitlines()[-1])
    d["env_dropped"] = [k for k in FRESH_DROPPED_ENV if k in os.environ]
    return d


class GemmProbe:
    """n x n @ n x n products of the model's dtype on the benchmark's device, one per
    nanospa worker thread, run at once: 2 n^3 FLOPs each."""

    def __init__(self, n, dtype):
        xp = backend.xp()
        rng = np.random.default_rng(GEMM_SEED)
        self.a = backend.asarray(rng.standard_normal((n, n)).astype(dtype))  # no device temporary
        self.b = backend.asarray(rng.standard_normal((n, n)).astype(dtype))
        self.outs = [xp.empty((n, n), dtype=dtype) for _ in range(threads())]
        self.flops = 2.0 * n ** 3 * len(self.outs)
        self.nbytes = (2 + len(self.outs)) * self.a.nbytes
        self.xp = xp

    def __call__(self):
        backend.synchronize()
        t = time.perf_counter()
        parallel_map(lambda out: self.xp.matmul(self.a, self.b, out=out), self.outs)
        backend.synchronize()
        return self.flops / (time.perf_counter() - t)


def time_steps(runners, gemm, steps, warmup, settle, gemm_reps):
    """`warmup` untimed rounds, then `steps` timed ones. In each round every runner steps
    once (the order alternates, so drift of a shared machine hits both alike), after
    `settle` seconds of idle, then the GEMM probe runs; the best of `gemm_reps` samples
    counts. -> ({runner name: [step seconds]}, [GEMM FLOP/s per round])."""
    for _ in range(warmup):
        for r in runners:
            r()
        gemm()
    times = {r.name: [] for r in runners}
    peaks = []
    for i in range(steps):
        order = runners if i % 2 == 0 else runners[::-1]  # alternate who goes first
        for r in order:
            time.sleep(settle)  # let the other library's spinning worker threads go idle
            times[r.name].append(r())
        time.sleep(settle)
        peaks.append(max(gemm() for _ in range(gemm_reps)))
    return times, peaks
