"""The measuring of ``python -m nanospa.bench``: named configurations, the FLOP count of a
training step, the timed steps of nanospa and of the PyTorch yardstick, the GEMM peak.

    CONFIGS, make_config(name, overrides, dtype)   the benchmarked models
    model_flops(cfg, batch_size)                   model FLOPs of one training step
    kfac_flops(cfg, batch_size, settings)          what a K-FAC step adds (docs/kfac.md §10)
    NanospaStep, KfacStep, TorchStep               one timed training step each
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

Not here: settings, threads and the run of one configuration (bench.py), peak memory
(bench_memory.py), the printed report (bench_report.py), the PyTorch model (bench_torch.py).
"""
import time
from collections.abc import Mapping

import numpy as np

from .. import backend
from ..config import GPTConfig
from ..optim import AdamW
from ..signal.attn_bias import bias_block
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


class _DenseBiasState(Mapping):
    """model.state_dict() plus, for every blockwise SPA block (which keeps only B_l's O(T)
    parts), its dense tril(B_l) under the dense model's key blocks.i.attn.B, in the model's
    dtype: what bench_torch.TorchGPT reads. Generated when asked for, one layer at a time,
    so PyTorch's peak memory counts its own (T, T) biases but no second copy of them."""

    def __init__(self, model):
        self.state = model.state_dict()
        T, dt = model.config.block_size, model.config.dtype
        self.made = {f"blocks.{i}.attn.B": (lambda a=b.attn: np.tril(bias_block(a.bias_parts, 0, T, 0, T, dt)))
                     for i, b in enumerate(model.blocks) if b.attn.bias_parts is not None}

    def __getitem__(self, key):
        return self.made[key]() if key in self.made else self.state[key]

    def __iter__(self):
        return iter([*self.state, *self.made])

    def __len__(self):
        return len(self.state) + len(self.made)


class _YardstickView:
    """A nanospa model as bench_torch.TorchGPT reads it (config, activation, parameters and
    a state dict with dense B_l, _DenseBiasState)."""

    def __init__(self, model):
        self.model, self.config, self.activation = model, model.config, model.activation

    def named_parameters(self):
        return self.model.named_parameters()

    def state_dict(self):
        return _DenseBiasState(self.model)


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
    """The same step of the PyTorch yardstick (bench_torch.TorchGPT), with the model's B_l
    as dense (T, T) biases (a blockwise nanospa model generates them for it)."""
    name = "pytorch"

    def __init__(self, torch, model, idx, targets, device, sdpa=False):
        from .yardstick import TorchGPT
        self.torch, self.device = torch, device
        self.model = TorchGPT(_YardstickView(model), device=device, sdpa=sdpa)
        self.opt = torch.optim.AdamW(self.model.param_groups(model, OPTIM["weight_decay"]),
                                     lr=OPTIM["lr"], betas=OPTIM["betas"])
        self.idx = torch.as_tensor(idx, device=device)
        self.targets = torch.as_tensor(targets, device=device)

    def sync(self):
        if self.device == "cuda":
            self.torch.cuda.synchronize()

    def __call__(self):
        self.sync()
        t = time.perf_counter()
        _, loss = self.model(self.idx, self.targets)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.sync()
        return time.perf_counter() - t


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
