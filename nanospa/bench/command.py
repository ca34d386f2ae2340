"""python -m nanospa.bench [--key=value ...]: how fast a nanospa training step is, beside PyTorch.

For each named configuration (--config=ref,ref512,...) it times a full training step
(forward, backward, AdamW update) and reports

    tokens/s       B * T / (median step time over ``--steps`` steps after ``--warmup``)
    GEMM peak      FLOP/s of a large float32 (or the model's dtype) matrix product,
                   measured in the same run, with the same threads, between the steps
    model FLOPs    per step, by the formula in nanospa/bench/measure.py
    MFU            model FLOPs per second / GEMM peak
    peak memory    CPU: the resident set's high-water mark of a fresh process that builds the
                   model and trains a few steps, minus its resident set after imports;
                   GPU: CuPy's memory pool and torch.cuda.max_memory_reserved()
                   (nanospa/bench/memory.py)

When PyTorch imports (optional, never a dependency), the same model (nanospa's weights, see
nanospa/bench/yardstick.py, a yardstick only: nn.Linear layers, scaled_dot_product_attention,
fused AdamW, as a PyTorch user writes it) is stepped in PyTorch with the same configuration,
thread count and dtype, in the rows ``--torch`` names:

    pytorch            eager mode
    pytorch_compiled   the model through torch.compile (inductor, static shapes); its
                       compile time (the first step) is reported apart, and a compilation
                       that fails on this machine makes the row "unavailable" with the reason

Steps alternate between the frameworks (in alternating order), and the reported ratio is
the median over rounds of t_pytorch / t_nanospa: a speed ratio, > 1 when nanospa is faster,
in which drift of a shared machine cancels. The compiled row is built and timed after the
eager rounds, in rounds of its own beside nanospa: a compiled model in the process slowed
the eager steps timed beside it (measure.Yardstick). The headline ratio is against the
faster of the PyTorch rows (by median step time); each row's own ratio is reported too. A configuration
the yardstick does not implement exactly (yardstick.check) has no PyTorch rows: the report
says which setting, and gives no ratio.

With ``--torch_fresh`` (default) each PyTorch row is timed once more alone, in a fresh
process that imports only torch and yardstick.py (none of nanospa, no NumPy, none of the
thread variables below: PyTorch's threads are torch.set_num_threads(n) alone), and reported
beside the in-process figure: the two should agree within a few percent, or the in-process
yardstick is disturbed by the benchmark around it.

Threads (CPU): ``--threads=n`` (default 2). nanospa runs n worker threads, each training a
slice of the batch (run/threads.sharded_backward: same loss and gradients, summed in a fixed
order), with single-threaded BLAS, as train.py does; ``--cpu_threading=blas`` runs one thread
with an n-thread BLAS instead: what a user's own loop ``model(idx, targets);
loss.backward(); opt.step()`` gets. BLAS threads are set through OPENBLAS_NUM_THREADS, by re-running the command
with it set before NumPy loads (or, when main() is called from Python, with threadpoolctl if
installed). PyTorch gets torch.set_num_threads(n), and nothing else: its BLAS (MKL in the
x86 wheels) does not read OPENBLAS_NUM_THREADS (the report shows PyTorch's BLAS and
threads; the fresh-process row is the check). The GEMM peak is measured the same way as
nanospa runs: n single-threaded products at once, or one n-thread product. OpenBLAS also
reads OPENBLAS_CORETYPE (and OPENBLAS_L2_SIZE) when it loads; the report shows them and,
with threadpoolctl, the kernel OpenBLAS chose, so a run with them unset (``env -u
OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python -m nanospa.bench``) can be told apart. Like
train.py, the benchmark keeps freed memory in the process (run/malloc.py, glibc only): PyTorch
in the same process shares it, PyTorch in the fresh process does not.

Settings are nanospa's --key=value (nanospa/run/settings.py; --help lists them). Every GPTConfig
field (and batch_size) is a setting too: set explicitly, it overrides every configuration,
e.g. --n_layer=24 --batch_size=4. Bad settings: one ``error:`` line, exit status 2.

The benchmark is not a test: tests/test_bench.py runs it once on a tiny configuration.
Not here: the timing and FLOP count (measure.py), memory probes (memory.py), the printed
report (report.py), the PyTorch model (yardstick.py).
"""
import datetime
import gc
import importlib.util
import json
import os
import sys
from dataclasses import fields

import numpy as np

from .. import backend
from ..run.malloc import keep_freed_memory
from ..run.heads import share_heads
from ..run.threads import set_threads, threads
from .measure import (CONFIGS, ROWS, GemmProbe, KfacStep, NanospaStep, TorchStep, Yardstick, kfac_flops,
                      make_batch, make_config, model_flops, paired_ratios, time_fresh, time_steps)
from .profile import profile_runners
from .memory import gpu_peaks, measure_cpu, probe_line, reset_gpu, status_bytes
from .report import format_report, machine_info
from ..config import GPTConfig
from ..model import GPT
from ..beyond.optimizers import KFAC_KEYS, OPTIMIZER_DEFAULTS, check_optimizer
from ..run.fits import check_fits
from ..run.settings import SettingsError, help_text, parse_settings, run_command, source_notes, wants_help

# ----------------------------------------------------------------------------- settings
# The comment beside each key is its --help line.
BENCH_DEFAULTS = dict(
    config=("ref",),           # comma-separated configurations: ref, ref512, gpu, tiny (measure.CONFIGS)
    device="cpu",              # cpu | cuda
    dtype="float32",           # float32 | float64
    threads=2,                 # CPU threads for both frameworks
    cpu_threading="shards",    # shards: n threads on batch slices, 1-thread BLAS (train.py) | blas: one thread, n-thread BLAS (a plain loop)
    steps=10,                  # timed steps per framework
    warmup=2,                  # untimed steps per framework first
    gemm_n=0,                  # GEMM peak matrix size; 0 = 2048 on the CPU, 8192 on a GPU
    settle=0.2,                # seconds idle before each timed call, so that threads left spinning do not compete
    gemm_reps=2,               # GEMM samples per round (the best counts)
    torch="both",              # PyTorch rows: both (eager and torch.compile, the headline the faster) | eager | compile | no
    torch_fresh=True,          # also time the PyTorch rows alone in a fresh process (torch and yardstick.py only)
    profile=False,             # also print where a step's time goes per kind of op, nanospa beside PyTorch eager (profile.py)
    kfac=False,                # also time a nanospa K-FAC step (--kfac_* settings of train.py) beside AdamW's
    no_memory=False,           # skip the CPU memory probes
    json=False,                # print machine-readable results
    batch_size=0,              # sequences per step; unset: the configuration's
)
PROBE_DEFAULTS = dict(         # internal: the fresh process of a CPU memory probe
    memory_probe="",           # the framework a fresh process measures (set by memory.measure_cpu)
    memory_steps=3,            # training steps of a memory probe
)
MODEL_KEYS = [f.name for f in fields(GPTConfig) if f.name != "dtype"]   # dtype is a bench key
KFAC_DEFAULTS = {k: OPTIMIZER_DEFAULTS[k] for k in KFAC_KEYS}   # --kfac_*: as train.py's
DEFAULTS = {**BENCH_DEFAULTS, **PROBE_DEFAULTS, **KFAC_DEFAULTS, **{f.name: f.default for f in fields(GPTConfig)
                                                  if f.name in MODEL_KEYS}}
PROBED = ("nanospa", "pytorch", "nanospa_kfac")   # the frameworks of --memory_probe (not the compiled row)
CHOICES = dict(device=("cpu", "cuda"), dtype=("float32", "float64"), cpu_threading=("shards", "blas"),
               torch=tuple(ROWS), memory_probe=("",) + PROBED)
GEMM_N = dict(cpu=2048, cuda=8192)   # --gemm_n=0: the GEMM probe's size per device
# settings that are gone: their one-line error says what replaced them
RENAMED = {"--set": "--set KEY=VALUE is now --KEY=VALUE, e.g. --n_layer=24 or --batch_size=4",
           "--torch_sdpa": "--torch_sdpa is gone: the PyTorch yardstick always runs scaled_dot_product_attention "
                           "(--torch=eager|compile|both picks its rows)"}
RENAMED_VALUES = {("torch", "auto"): "--torch=auto is now --torch=both (the default: eager and torch.compile rows, "
                                     "when torch imports); or --torch=eager, compile, no"}


def parse_args(argv):
    """Settings from the command line; SettingsError names a bad one."""
    for old, message in RENAMED.items():
        if any(a == old or a.startswith(old + "=") for a in argv):
            raise SettingsError(message)
    s = parse_settings(argv, DEFAULTS)
    explicit = s.pop("_explicit")
    for (key, value), message in RENAMED_VALUES.items():
        if s[key] == value:
            raise SettingsError(message)
    s["overrides"] = {k: s[k] for k in MODEL_KEYS + ["batch_size"] if k in explicit}
    if "batch_size" in explicit and s["batch_size"] < 1:  # unset: the configuration's own batch size
        raise SettingsError(f"--batch_size must be >= 1, got {s['batch_size']} (leave it unset for the "
                            "configuration's own)")
    for name in s["config"]:
        if name not in CONFIGS:
            raise SettingsError(f"unknown configuration {name!r}; choose among {', '.join(CONFIGS)}")
    if not s["config"]:
        raise SettingsError(f"--config needs a configuration: {', '.join(CONFIGS)}")
    for key, allowed in CHOICES.items():
        if s[key] not in allowed:
            raise SettingsError(f"--{key}={s[key]}: one of {', '.join(allowed)}")
    if "torch" in explicit and s["torch"] != "no" and importlib.util.find_spec("torch") is None:
        raise SettingsError(f"--torch={s['torch']} needs PyTorch (pip install torch); --torch=no runs without it")
    for key, low in (("threads", 1), ("steps", 1), ("gemm_reps", 1), ("memory_steps", 1),
                     ("warmup", 0), ("gemm_n", 0), ("batch_size", 0), ("settle", 0)):
        if s[key] < low:
            raise SettingsError(f"--{key} must be >= {low}, got {s[key]}")
    for name in s["config"]:
        check_fits(*make_config(name, s["overrides"], s["dtype"]), s["device"])   # GPTConfig's ValueError,
                                                         # or a size this machine cannot hold: before any timing
    try:
        check_optimizer({**s, "optimizer": "kfac"})      # the --kfac_* settings
    except ValueError as e:
        raise SettingsError(str(e)) from None
    return s


def usage():
    """The --help screen: the benchmark's keys with their defaults, then the GPTConfig fields."""
    notes = source_notes(__file__, sys.modules[check_optimizer.__module__].__file__)   # --kfac_*: optimizers.py
    text = help_text(__doc__.splitlines()[0], {**BENCH_DEFAULTS, **KFAC_DEFAULTS}, notes)
    return (text + "\nEvery GPTConfig field is a setting too; set explicitly, it overrides the value of every"
            " configuration: " + ", ".join(f"--{k}" for k in MODEL_KEYS) + ".")


# ----------------------------------------------------------------------------- threads

def _threadpoolctl():
    try:
        import threadpoolctl
        return threadpoolctl
    except ImportError:
        return None


def configure_cpu_threads(n, mode, argv=None):
    """nanospa threads and BLAS threads for ``--threads=n``: mode "shards" is n worker
    threads (run/threads.set_threads) over single-threaded BLAS, mode "blas" one thread over an
    n-thread BLAS. BLAS threads are fixed by OPENBLAS_NUM_THREADS: when ``argv`` (the command
    line) is given and the variable differs, the command is re-run with it set before NumPy
    loads; otherwise threadpoolctl changes them if installed. Freed memory is kept in the
    process (run/malloc.py), as train.py keeps it. Returns what was set."""
    blas = 1 if mode == "shards" else n
    set_threads(n if mode == "shards" else 1)
    how = "OPENBLAS_NUM_THREADS"
    if os.environ.get("OPENBLAS_NUM_THREADS") != str(blas):
        if argv is not None:
            os.environ["OPENBLAS_NUM_THREADS"] = str(blas)
            os.execv(sys.executable, [sys.executable, "-m", "nanospa.bench", *argv])
        tpc = _threadpoolctl()
        how = "threadpoolctl" if tpc is not None else "not set (no threadpoolctl)"
        if tpc is not None:
            tpc.ThreadpoolController().select(internal_api="openblas").limit(limits=blas)
    info = dict(mode=mode, nanospa_threads=threads(), blas_threads=blas, blas_threads_set_by=how,
                freed_memory_kept=keep_freed_memory())
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


# ----------------------------------------------------------------------------- one configuration

def run_config(name, s, argv, torch):
    """Time configuration `name` in nanospa (and PyTorch when given); -> its result dict."""
    cfg, batch = make_config(name, s["overrides"], s["dtype"])
    flops = model_flops(cfg, batch)
    tokens = batch * cfg.block_size
    if s["device"] == "cuda":  # count this configuration's memory only
        gc.collect()
        reset_gpu(torch)
    model = GPT(cfg, seed=0)
    shared = share_heads(model) if s["device"] == "cpu" and threads() > batch else 0   # as train.py does
    idx, targets = make_batch(cfg, batch)
    runners = [NanospaStep(model, idx, targets)]
    yard = None
    if torch is not None and ROWS[s["torch"]]:
        yard = Yardstick(model, idx, targets, s["device"], ROWS[s["torch"]])   # the eager row
        runners += yard.runners
    if s["kfac"]:
        runners.append(KfacStep(cfg, idx, targets, {k: s[k] for k in KFAC_KEYS}))
    gemm = GemmProbe(s["gemm_n"], cfg.dtype)
    times, peaks = time_steps(runners, gemm, s["steps"], s["warmup"], s["settle"], s["gemm_reps"])
    pairs = {r.name: (times[r.name], times["nanospa"]) for r in runners if yard and r in yard.runners}
    compiled = yard.compiled_step() if yard is not None else None
    if compiled is not None:   # after the eager rounds (Yardstick), in rounds of its own beside nanospa
        more, _ = time_steps([runners[0], compiled], gemm, s["steps"], s["warmup"], s["settle"], 1)
        times[compiled.name] = more[compiled.name]
        pairs[compiled.name] = (more[compiled.name], more["nanospa"])
        runners.append(compiled)
    peak = float(np.median(peaks))
    cpu = s["device"] == "cpu"
    result = dict(config=name, gpt_config=cfg.to_dict(), batch_size=batch, tokens_per_step=tokens,
                  device=s["device"], threads=s["threads"] if cpu else None,
                  cpu_threading=s["cpu_threading"] if cpu else None, heads_shared=shared,
                  dtype=cfg.dtype, steps=s["steps"], warmup=s["warmup"],
                  model_flops=flops, gemm_n=s["gemm_n"], gemm_peak_flops=peak, frameworks={})
    for r in runners:
        t = np.asarray(times[r.name])
        med = float(np.median(t))
        result["frameworks"][r.name] = dict(
            step_s_median=med, step_s_min=float(t.min()), step_s_max=float(t.max()),
            tokens_per_s=tokens / med, model_flops_per_s=flops["per_step"] / med,
            mfu=flops["per_step"] / med / peak)
    if yard is not None:
        result["yardstick"] = yard.summary()
        rows = result["yardstick"]["rows"]
        for row, seconds in yard.compile_s.items():
            result["frameworks"].get(row, {})["compile_s"] = seconds
        headline, ratios = paired_ratios(pairs)
        if headline is not None:   # against the faster PyTorch row; each row's own ratio beside it
            result["ratio_nanospa_over_pytorch"] = dict(ratios[headline], yardstick=headline)
            result["ratios_nanospa_over"] = ratios
        if s["torch_fresh"] and rows:   # each row in a process of its own, as in-process (Yardstick)
            fresh, failed = {}, {}
            for row in rows:
                one = time_fresh(yard.export, idx, targets, (row,), s["threads"], s["device"],
                                 s["steps"], s["warmup"], s["settle"])
                if "unavailable" in one:
                    failed[row] = dict(unavailable=one["unavailable"])
                else:
                    fresh = {**one, "rows": {**fresh.get("rows", {}), **one["rows"]}}
            if fresh:
                fresh["rows"].update(failed)
            else:
                fresh = dict(unavailable=next(iter(failed.values()))["unavailable"])
            for row, d in fresh.get("rows", {}).items():
                if "times" in d:
                    t = np.asarray(d.pop("times"))
                    med = float(np.median(t))
                    d.update(step_s_median=med, step_s_min=float(t.min()), step_s_max=float(t.max()),
                             tokens_per_s=tokens / med,
                             over_in_process=med / result["frameworks"][row]["step_s_median"] - 1.0)
            result["yardstick"]["fresh_process"] = fresh
        yard.export = None
    if s["profile"]:
        result["profile"] = profile_runners(runners, s["steps"])
    if s["kfac"]:
        pair = np.asarray(times["nanospa_kfac"]) / np.asarray(times["nanospa"])
        result["kfac"] = dict(
            step_over_adamw_median=float(np.median(pair)),
            step_over_adamw_mean=float(np.sum(times["nanospa_kfac"]) / np.sum(times["nanospa"])),
            inv_interval=s["kfac_inv_interval"], stats_fraction=s["kfac_stats_fraction"],
            flops=kfac_flops(cfg, batch, s["kfac_stats_fraction"], s["kfac_inv_interval"]))
    if not cpu:
        for framework, nbytes in gpu_peaks(torch, gemm.nbytes).items():
            result["frameworks"][framework]["peak_mem_bytes"] = nbytes
        result["memory_kind"] = "CuPy memory pool bytes / torch.cuda.max_memory_reserved"
    elif not s["no_memory"]:
        probe_argv = [a for a in argv if not a.startswith("--config=")] + [f"--config={name}"]
        for r in runners:
            if r.name not in PROBED:      # the compiled row: no probe (it would compile again)
                continue
            m = measure_cpu(r.name, probe_argv)
            result["frameworks"][r.name]["peak_mem_bytes"] = m["peak_bytes"]
            result["frameworks"][r.name]["process_peak_rss_bytes"] = m["process_peak_bytes"]
        result["memory_kind"] = "peak RSS of a fresh process minus its RSS after imports"
    return result


def memory_probe(s, reexec_argv):
    """The fresh process of a CPU memory probe (--memory_probe=FRAMEWORK): build one
    framework's model, train --memory_steps steps, print memory.probe_line."""
    configure_cpu_threads(s["threads"], s["cpu_threading"], reexec_argv)
    torch = _torch() if s["memory_probe"] == "pytorch" else None
    if torch is not None:
        torch.set_num_threads(s["threads"])
    gc.collect()
    base = status_bytes("VmRSS")
    cfg, batch = make_config(s["config"][0], s["overrides"], s["dtype"])
    model = GPT(cfg, seed=0)
    idx, targets = make_batch(cfg, batch)
    if s["memory_probe"] == "pytorch":
        step = TorchStep(model, idx, targets, "cpu")
        del model
        gc.collect()
    elif s["memory_probe"] == "nanospa_kfac":
        del model
        step = KfacStep(cfg, idx, targets, {k: s[k] for k in KFAC_KEYS})
    else:
        if threads() > batch:                     # as run_config and train.py
            share_heads(model)
        step = NanospaStep(model, idx, targets)
    for _ in range(s["memory_steps"]):
        step()
    print(probe_line(base))


# ----------------------------------------------------------------------------- the command

def run(s, argv, reexec):
    """The benchmark with parsed settings; -> the report dict (printed as text or JSON)."""
    started = datetime.datetime.now().isoformat(timespec="seconds")
    load_start = os.getloadavg() if hasattr(os, "getloadavg") else None
    reexec_argv = argv if reexec else None     # only the command line may be re-run with new variables
    if s["memory_probe"]:
        memory_probe(s, reexec_argv)
        return None
    threads_info = None
    if s["device"] == "cpu":
        threads_info = configure_cpu_threads(s["threads"], s["cpu_threading"], reexec_argv)
    backend.use(s["device"])
    s["gemm_n"] = s["gemm_n"] or GEMM_N[s["device"]]
    torch = _torch() if s["torch"] != "no" else None
    if torch is not None and s["device"] == "cuda" and not torch.cuda.is_available():
        print("PyTorch sees no GPU (a CPU-only build?): no yardstick", file=sys.stderr)
        torch = None
    if torch is not None and s["device"] == "cpu":
        torch.set_num_threads(s["threads"])
    results = [run_config(name, s, argv, torch) for name in s["config"]]
    report = dict(machine=machine_info(started, load_start, s["device"], torch, threads_info), results=results)
    print(json.dumps(report, indent=1) if s["json"] else format_report(report))
    return report


def bench(argv, reexec):
    run(parse_args(argv), argv, reexec)
    return 0


def main(argv=None):
    """-> exit status: 0 done, 2 bad settings, no such device, out of memory (one error: line;
    settings.run_command, NANOSPA_DEBUG=1 for a traceback)."""
    reexec = argv is None
    argv = sys.argv[1:] if argv is None else list(argv)
    if wants_help(argv):
        print(usage())
        return 0
    previous = threads()                              # run() sets its own; restored for callers
    try:
        return run_command(bench, argv, reexec)
    finally:
        set_threads(previous)


if __name__ == "__main__":
    sys.exit(main())
