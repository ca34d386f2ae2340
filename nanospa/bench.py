"""python -m nanospa.bench: how fast a nanospa training step is, beside PyTorch.

For each named configuration it times a full training step (forward, backward, AdamW
update) and reports

    tokens/s       B * T / (median step time over ``--steps`` steps after ``--warmup``)
    GEMM peak      FLOP/s of a large float32 (or the model's dtype) matrix product,
                   measured in the same run, with the same threads, between the steps
    model FLOPs    per step, by the formula below
    MFU            model FLOPs per second / GEMM peak
    peak memory    CPU: the resident set's high-water mark of a fresh process that builds the
                   model and trains a few steps, minus its resident set after imports (so
                   PyTorch's larger library is not counted against it); the whole process's
                   peak is reported too. GPU: bytes held by CuPy's memory pool
                   (backend.memory_pool_bytes()) and torch.cuda.max_memory_reserved().

Model FLOPs per step (forward + backward = 3 x forward, as in PaLM's MFU):

    N     = L (4 C^2 + 2 m C^2) + C V      weights that multiply activations: q, k, v, proj,
                                           MLP fc and proj (m = mlp_ratio), the head;
                                           embeddings are lookups and are not counted
    FLOPs = B T (6 N + 12 L T C)           6 N: a multiply-add per weight, 3 passes;
                                           12 L T C: Q K^T and P V, 2 T C each per token and
                                           layer forward, times 3; the full T x T square is
                                           counted (both nanospa and PyTorch eager compute it;
                                           counting only the causal half would give 6 L T C)

Elementwise work, softmax, the loss and the optimiser are not counted.

When PyTorch imports (optional, never a dependency), the same model (nanospa's weights, see
nanospa/bench_torch.py, a yardstick only) is stepped in PyTorch eager mode with the same
configuration, thread count and dtype. Steps alternate between the two frameworks (in
alternating order), and the reported ratio is the median over rounds of
t_pytorch / t_nanospa: a speed ratio, > 1 when nanospa is faster, in which drift of a shared
machine cancels.

Threads (CPU): ``--threads=n`` (default 2). nanospa runs n worker threads, each training a
slice of the batch (tensor.sharded_backward: same loss and gradients, summed in a fixed
order), with single-threaded BLAS; ``--cpu_threading=blas`` runs one thread with an n-thread
BLAS instead. BLAS threads are set through OPENBLAS_NUM_THREADS, by re-running the command
with it set before NumPy loads (or, when main() is called from Python, with threadpoolctl if
installed). PyTorch gets torch.set_num_threads(n). The GEMM peak is measured the same way as
nanospa runs: n single-threaded products at once, or one n-thread product. OpenBLAS also
reads OPENBLAS_CORETYPE (and OPENBLAS_L2_SIZE) when it loads; the report shows them and,
with threadpoolctl, the kernel OpenBLAS chose, so a run with them unset (``env -u
OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python -m nanospa.bench``) can be told apart.

The benchmark is not a test: tests/test_bench.py runs it once on a tiny configuration.
"""
import argparse
import datetime
import gc
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np

from . import backend
from .model import GPT, GPTConfig
from .optim import AdamW
from .tensor import sharded_backward

# name -> (GPTConfig fields, batch size). "ref" is the reference configuration of the README.
CONFIGS = {
    "ref": (dict(vocab_size=256, block_size=256, n_layer=12, n_head=4, n_embd=256), 8),
    "ref512": (dict(vocab_size=256, block_size=256, n_layer=12, n_head=4, n_embd=512), 8),
    "gpu": (dict(vocab_size=256, block_size=512, n_layer=12, n_head=8, n_embd=512), 32),
    "tiny": (dict(vocab_size=256, block_size=16, n_layer=2, n_head=2, n_embd=32), 2),
}
ARCH = dict(attention="espa", activation="tat_lrelu", residual="none", norm="none", pos="none")
OPTIM = dict(lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)  # nanoGPT-like; same in both frameworks
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")  # reported


def model_flops(cfg, batch_size):
    """Model FLOPs of one training step (see the module docstring for what is counted)."""
    L, C, T, V = cfg.n_layer, cfg.n_embd, cfg.block_size, cfg.vocab_size
    n_matmul = L * (4 * C * C + 2 * cfg.mlp_ratio * C * C) + C * V
    per_token = 6 * n_matmul + 12 * L * T * C
    return dict(n_matmul_params=n_matmul, per_token=per_token, per_step=per_token * batch_size * T,
                formula="B*T*(6*N + 12*L*T*C), N = L*(4+2*mlp_ratio)*C^2 + C*V")


# ----------------------------------------------------------------------------- threads


def _threadpoolctl():
    try:
        import threadpoolctl
        return threadpoolctl
    except ImportError:
        return None


def configure_cpu_threads(n, mode, argv=None):
    """nanospa threads and BLAS threads for ``--threads=n``: mode "shards" is n worker
    threads (backend.set_threads) over single-threaded BLAS, mode "blas" one thread over an
    n-thread BLAS. BLAS threads are fixed by OPENBLAS_NUM_THREADS: when ``argv`` (the command
    line) is given and the variable differs, the command is re-run with it set before NumPy
    loads; otherwise threadpoolctl changes them if installed. Returns what was set."""
    blas = 1 if mode == "shards" else n
    backend.set_threads(n if mode == "shards" else 1)
    how = "OPENBLAS_NUM_THREADS"
    if os.environ.get("OPENBLAS_NUM_THREADS") != str(blas):
        if argv is not None:
            os.environ["OPENBLAS_NUM_THREADS"] = str(blas)
            os.execv(sys.executable, [sys.executable, "-m", "nanospa.bench", *argv])
        tpc = _threadpoolctl()
        how = "threadpoolctl" if tpc is not None else "not set (no threadpoolctl)"
        if tpc is not None:
            tpc.ThreadpoolController().select(internal_api="openblas").limit(limits=blas)
    info = dict(mode=mode, nanospa_threads=backend.threads(), blas_threads=blas, blas_threads_set_by=how)
    tpc = _threadpoolctl()
    if tpc is not None:
        info["libraries"] = [{k: d.get(k) for k in ("internal_api", "version", "architecture", "num_threads")}
                             for d in tpc.threadpool_info()]
    return info


def _torch():
    try:
        import torch
        return torch
    except ImportError:
        return None


# ----------------------------------------------------------------------------- runners


def make_config(name, overrides, dtype):
    fields, batch = CONFIGS[name]
    fields = {**fields, **ARCH, "dtype": dtype, **overrides}
    batch = int(fields.pop("batch_size", batch))
    return GPTConfig(**fields), batch


def make_batch(cfg, batch_size, seed=0):
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
        backend.synchronize()
        return time.perf_counter() - t


class TorchStep:
    """The same step of the PyTorch yardstick (bench_torch.TorchGPT)."""
    name = "pytorch"

    def __init__(self, torch, model, idx, targets, device, sdpa=False):
        from .bench_torch import TorchGPT
        self.torch, self.device = torch, device
        self.model = TorchGPT(model, device=device, sdpa=sdpa)
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
        rng = np.random.default_rng(1)
        self.a = backend.asarray(rng.standard_normal((n, n)).astype(dtype))  # no device temporary
        self.b = backend.asarray(rng.standard_normal((n, n)).astype(dtype))
        self.outs = [xp.empty((n, n), dtype=dtype) for _ in range(backend.threads())]
        self.flops = 2.0 * n ** 3 * len(self.outs)
        self.nbytes = (2 + len(self.outs)) * self.a.nbytes
        self.xp = xp

    def __call__(self):
        backend.synchronize()
        t = time.perf_counter()
        backend.parallel_map(lambda out: self.xp.matmul(self.a, self.b, out=out), self.outs)
        backend.synchronize()
        return self.flops / (time.perf_counter() - t)


# ----------------------------------------------------------------------------- memory


def _status_kb(field):
    """A field of /proc/self/status in bytes (VmRSS, VmHWM), or None off Linux."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def memory_probe(framework, args):
    """Run in a fresh process (``--memory_probe``): build one framework's model and train
    a few steps; print the resident set after imports and its high-water mark."""
    configure_cpu_threads(args.threads, args.cpu_threading, sys.argv[1:] if args.reexec else None)
    torch = _torch() if framework == "pytorch" else None
    if torch is not None:
        torch.set_num_threads(args.threads)
    gc.collect()
    base = _status_kb("VmRSS")
    cfg, batch = make_config(args.config.split(",")[0], parse_overrides(args.set), args.dtype)
    model = GPT(cfg, seed=0)
    idx, targets = make_batch(cfg, batch)
    if framework == "pytorch":
        step = TorchStep(torch, model, idx, targets, "cpu", sdpa=args.torch_sdpa)
        del model
        gc.collect()
    else:
        step = NanospaStep(model, idx, targets)
    for _ in range(args.memory_steps):
        step()
    print(json.dumps(dict(base_rss=base, peak_rss=_status_kb("VmHWM"))))


def measure_memory_cpu(framework, argv):
    """Peak resident memory of a fresh process training ``framework`` (CPU)."""
    cmd = [sys.executable, "-m", "nanospa.bench", *argv, f"--memory_probe={framework}"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"memory probe for {framework} failed: {out.stderr.strip()[-400:]}")
    d = json.loads(out.stdout.strip().splitlines()[-1])
    if d["peak_rss"] is None or d["base_rss"] is None:
        return dict(peak_bytes=None, process_peak_bytes=None)
    return dict(peak_bytes=d["peak_rss"] - d["base_rss"], process_peak_bytes=d["peak_rss"])


# ----------------------------------------------------------------------------- one config


def run_config(name, args, argv, torch):
    cfg, batch = make_config(name, parse_overrides(args.set), args.dtype)
    flops = model_flops(cfg, batch)
    tokens = batch * cfg.block_size
    if args.device == "cuda":  # count this configuration's memory only
        gc.collect()
        backend.free_memory_pool()
        if torch is not None:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
    model = GPT(cfg, seed=0)
    idx, targets = make_batch(cfg, batch)
    runners = [NanospaStep(model, idx, targets)]
    if torch is not None:
        runners.append(TorchStep(torch, model, idx, targets, args.device, sdpa=args.torch_sdpa))
    gemm = GemmProbe(args.gemm_n, cfg.dtype)
    for _ in range(args.warmup):
        for r in runners:
            r()
        gemm()
    times = {r.name: [] for r in runners}
    peaks = []
    for i in range(args.steps):
        order = runners if i % 2 == 0 else runners[::-1]  # alternate who goes first
        for r in order:
            time.sleep(args.settle)  # let the other library's spinning worker threads go idle
            times[r.name].append(r())
        time.sleep(args.settle)
        peaks.append(max(gemm() for _ in range(args.gemm_reps)))
    peak = float(np.median(peaks))
    result = dict(config=name, gpt_config=cfg.to_dict(), batch_size=batch, tokens_per_step=tokens,
                  device=args.device, threads=args.threads if args.device == "cpu" else None,
                  cpu_threading=args.cpu_threading if args.device == "cpu" else None,
                  dtype=cfg.dtype, steps=args.steps, warmup=args.warmup,
                  model_flops=flops, gemm_n=args.gemm_n, gemm_peak_flops=peak, frameworks={})
    for r in runners:
        t = np.asarray(times[r.name])
        med = float(np.median(t))
        result["frameworks"][r.name] = dict(
            step_s_median=med, step_s_min=float(t.min()), step_s_max=float(t.max()),
            tokens_per_s=tokens / med, model_flops_per_s=flops["per_step"] / med,
            mfu=flops["per_step"] / med / peak)
    if torch is not None:
        ratio = np.asarray(times["pytorch"]) / np.asarray(times["nanospa"])
        result["ratio_nanospa_over_pytorch"] = dict(
            median=float(np.median(ratio)), q25=float(np.quantile(ratio, 0.25)),
            q75=float(np.quantile(ratio, 0.75)))
    # memory
    if args.device == "cuda":
        # the pool keeps every block it ever handed out: its size is the peak (less the probe)
        result["frameworks"]["nanospa"]["peak_mem_bytes"] = backend.memory_pool_bytes() - gemm.nbytes
        if torch is not None:
            result["frameworks"]["pytorch"]["peak_mem_bytes"] = int(torch.cuda.max_memory_reserved())
        result["memory_kind"] = "CuPy memory pool bytes / torch.cuda.max_memory_reserved"
    elif args.memory:
        probe_argv = [a for a in argv if not a.startswith("--config=")] + [f"--config={name}"]
        for r in runners:
            m = measure_memory_cpu(r.name, probe_argv)
            result["frameworks"][r.name]["peak_mem_bytes"] = m["peak_bytes"]
            result["frameworks"][r.name]["process_peak_rss_bytes"] = m["process_peak_bytes"]
        result["memory_kind"] = "peak RSS of a fresh process minus its RSS after imports"
    return result


# ----------------------------------------------------------------------------- report


def machine_info(args, torch, threads_info):
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    info = dict(date=args.started,
                command="python -m nanospa.bench " + " ".join(sys.argv[1:]),
                platform=platform.platform(), cpu=cpu, cpu_count=os.cpu_count(),
                python=platform.python_version(), numpy=np.__version__,
                torch=getattr(torch, "__version__", None),
                env={v: os.environ.get(v) for v in THREAD_VARS + ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")})
    try:  # other users of a shared machine show here: at the start and at the end of the run
        info["load_average"] = os.getloadavg()
        info["load_average_start"] = args.load_start
    except OSError:
        pass
    if threads_info:
        info["threads"] = threads_info
    if args.device == "cuda":
        xp = backend.xp()  # CuPy, reached through backend (the only module that imports it)
        info["cupy"] = xp.__version__
        try:
            name = xp.cuda.runtime.getDeviceProperties(xp.cuda.Device().id)["name"]
            info["gpu"] = name.decode() if isinstance(name, bytes) else str(name)
        except Exception:  # a name is nice to have; never fail a benchmark over it
            info["gpu"] = "unknown"
    return info


def _mib(b):
    return "-" if b is None else f"{b / 2 ** 20:.0f} MiB"


def format_report(report):
    m = report["machine"]
    lines = [f"nanospa bench  {m['date']}  {m['cpu']} ({m['cpu_count']} cores)"
             + (f"  GPU {m['gpu']}" if "gpu" in m else ""),
             f"command: {m['command']}",
             f"numpy {m['numpy']}, torch {m['torch'] or 'not installed'}"
             + (f", load average {m['load_average_start'][0]:.1f} at start, {m['load_average'][0]:.1f} at end"
                if m.get("load_average_start") else "")]
    th = m.get("threads")
    if th:
        blas = [d for d in th.get("libraries", []) if d["internal_api"] == "openblas"]
        lines.append(f"threads: nanospa {th['nanospa_threads']} x BLAS {th['blas_threads']} "
                     f"({th['mode']}; BLAS threads by {th['blas_threads_set_by']})"
                     + (f"; numpy's OpenBLAS {blas[0]['version']} kernel {blas[0]['architecture']}" if blas else "")
                     + f"; OPENBLAS_CORETYPE={m['env']['OPENBLAS_CORETYPE']}")
    for r in report["results"]:
        c, f = r["gpt_config"], r["model_flops"]
        lines.append("")
        lines.append(f"[{r['config']}] L={c['n_layer']} C={c['n_embd']} H={c['n_head']} T={c['block_size']} "
                     f"B={r['batch_size']} V={c['vocab_size']} {c['attention']}/{c['activation']} "
                     f"{r['dtype']} {r['device']}"
                     + (f" threads={r['threads']} ({r['cpu_threading']})" if r["threads"] else ""))
        lines.append(f"  model FLOPs/step {f['per_step'] / 1e9:.2f} G ({f['formula']}); "
                     f"GEMM peak {r['gemm_peak_flops'] / 1e9:.1f} GFLOP/s (n={r['gemm_n']})")
        lines.append(f"  {'framework':10s} {'tokens/s':>10s} {'ms/step':>9s} {'MFU':>6s} {'peak mem':>10s}")
        for name, d in r["frameworks"].items():
            lines.append(f"  {name:10s} {d['tokens_per_s']:10.0f} {1e3 * d['step_s_median']:9.1f} "
                         f"{100 * d['mfu']:5.1f}% {_mib(d.get('peak_mem_bytes')):>10s}")
        if "ratio_nanospa_over_pytorch" in r:
            q = r["ratio_nanospa_over_pytorch"]
            lines.append(f"  speed nanospa/pytorch: {q['median']:.2f} (median of {r['steps']} paired steps, "
                         f"quartiles {q['q25']:.2f}-{q['q75']:.2f})")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- command line


def parse_overrides(items):
    out = {}
    for item in items or []:
        key, _, value = item.partition("=")
        if not value:
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
        try:
            out[key] = int(value)
        except ValueError:
            try:
                out[key] = float(value)
            except ValueError:
                out[key] = value
    return out


def build_parser():
    p = argparse.ArgumentParser(prog="python -m nanospa.bench", description=__doc__.split("\n")[0])
    p.add_argument("--config", default="ref",
                   help=f"comma-separated names among {', '.join(CONFIGS)} (default ref)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a GPTConfig field or batch_size, e.g. --set n_layer=24")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    p.add_argument("--threads", type=int, default=2, help="CPU threads for both frameworks")
    p.add_argument("--cpu_threading", default="shards", choices=("shards", "blas"),
                   help="nanospa's CPU threads: worker threads on batch slices over 1-thread BLAS "
                        "(shards), or one thread over an n-thread BLAS (blas)")
    p.add_argument("--steps", type=int, default=10, help="timed steps per framework")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per framework first")
    p.add_argument("--gemm_n", type=int, default=0, help="GEMM peak matrix size (0: 2048 CPU, 8192 GPU)")
    p.add_argument("--settle", type=float, default=0.2,
                   help="seconds of idle before each timed call, so that BLAS/OpenMP worker threads "
                        "left spinning by the previous call do not compete with it")
    p.add_argument("--gemm_reps", type=int, default=2, help="GEMM samples per round (the best counts)")
    p.add_argument("--torch", default="auto", choices=("auto", "no"), help="run the PyTorch yardstick if installed")
    p.add_argument("--torch_sdpa", action="store_true",
                   help="PyTorch uses scaled_dot_product_attention instead of the manual attention")
    p.add_argument("--no_memory", dest="memory", action="store_false", help="skip the CPU memory probes")
    p.add_argument("--memory_steps", type=int, default=3, help=argparse.SUPPRESS)
    p.add_argument("--memory_probe", default=None, help=argparse.SUPPRESS)
    p.add_argument("--json", action="store_true", help="print machine-readable results")
    return p


def main(argv=None):
    reexec = argv is None  # only the command line may be re-run with new thread variables
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    args.reexec = reexec
    args.started = datetime.datetime.now().isoformat(timespec="seconds")
    args.load_start = os.getloadavg() if hasattr(os, "getloadavg") else None
    for name in args.config.split(","):
        if name not in CONFIGS:
            raise SystemExit(f"unknown configuration {name!r}; choose among {', '.join(CONFIGS)}")
    if args.threads < 1 or args.steps < 1 or args.warmup < 0:
        raise SystemExit("--threads and --steps must be >= 1 and --warmup >= 0")
    if args.memory_probe:
        return memory_probe(args.memory_probe, args)
    threads_info = None
    if args.device == "cpu":
        threads_info = configure_cpu_threads(args.threads, args.cpu_threading, argv if args.reexec else None)
    backend.use(args.device)
    args.gemm_n = args.gemm_n or (8192 if args.device == "cuda" else 2048)
    torch = _torch() if args.torch == "auto" else None
    if torch is not None and args.device == "cuda" and not torch.cuda.is_available():
        print("PyTorch sees no GPU (a CPU-only build?): no yardstick", file=sys.stderr)
        torch = None
    if torch is not None and args.device == "cpu":
        torch.set_num_threads(args.threads)
    results = [run_config(name, args, argv, torch) for name in args.config.split(",")]
    report = dict(machine=machine_info(args, torch, threads_info), results=results)
    print(json.dumps(report, indent=1) if args.json else format_report(report))
    return report


if __name__ == "__main__":
    main()
