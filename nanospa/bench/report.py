"""The report of ``python -m nanospa.bench``: the machine it ran on and the printed table.

    machine_info(started, load_start, device, torch, threads_info)   date, command, CPU model
                       and core count, GPU, library versions, PyTorch's threads and BLAS,
                       thread variables, load averages at start and end
    cpu_model()        /proc/cpuinfo's "model name" (platform.processor() elsewhere)
    format_report(report)                                          the human-readable text
                       (--json prints the report dict itself)

Not here: the numbers themselves (measure.py, memory.py, command.run_config).
"""
import os
import platform
import sys

import numpy as np

from .. import backend
from .profile import profile_lines

THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
OPENBLAS_VARS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")   # read by OpenBLAS when it loads
FRESH_AGREEMENT = 0.05   # fresh-process and in-process PyTorch figures further apart than this are flagged
MIB = 2 ** 20
GIGA = 1e9


def cpu_model():
    """The CPU's model name: /proc/cpuinfo's "model name" (x86 Linux), else
    platform.processor(), else the machine type (e.g. aarch64), so that figures from two
    machines are never read as one."""
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    return cpu or platform.processor() or platform.machine() or "unknown"


def _torch_blas(torch):
    """PyTorch's BLAS (BLAS_INFO of torch.__config__.show(): mkl, openblas, ...) or None."""
    try:
        text = torch.__config__.show()
    except Exception:       # a nice-to-have: never fail a benchmark over it
        return None
    tail = text.split("BLAS_INFO=", 1)
    return tail[1].split(",", 1)[0].strip() if len(tail) == 2 else None


def machine_info(started, load_start, device, torch, threads_info):
    info = dict(date=started,
                command="python -m nanospa.bench " + " ".join(sys.argv[1:]),
                platform=platform.platform(), cpu=cpu_model(), cpu_count=os.cpu_count(),
                python=platform.python_version(), numpy=np.__version__,
                torch=getattr(torch, "__version__", None),
                env={v: os.environ.get(v) for v in THREAD_VARS + OPENBLAS_VARS})
    if hasattr(os, "sched_getaffinity"):
        info["cpu_usable"] = len(os.sched_getaffinity(0))   # the cores this process may run on
    if torch is not None:
        info["torch_threads"] = torch.get_num_threads()
        info["torch_blas"] = _torch_blas(torch)
    try:  # other users of a shared machine show here: at the start and at the end of the run
        info["load_average"] = os.getloadavg()
        info["load_average_start"] = load_start
    except OSError:
        pass
    if threads_info:
        info["threads"] = threads_info
    if device == "cuda":
        xp = backend.xp()  # CuPy, reached through backend (the only module that imports it)
        info["cupy"] = xp.__version__
        try:
            name = xp.cuda.runtime.getDeviceProperties(xp.cuda.Device().id)["name"]
            info["gpu"] = name.decode() if isinstance(name, bytes) else str(name)
        except Exception:  # a name is nice to have; never fail a benchmark over it
            info["gpu"] = "unknown"
    return info


def _mib(b):
    return "-" if b is None else f"{b / MIB:.0f} MiB"


def _pct(x):
    return f"{100 * x:+.1f}%"


def yardstick_lines(r):
    """The PyTorch rows' extra lines: the other rows' ratios, compile time, rows that could
    not run, the fresh-process figures."""
    y, lines = r.get("yardstick"), []
    if not y:
        return lines
    head = r.get("ratio_nanospa_over_pytorch", {}).get("yardstick")
    for row, q in r.get("ratios_nanospa_over", {}).items():
        if row != head:
            lines.append(f"  speed nanospa/{row}: {q['median']:.2f} (quartiles {q['q25']:.2f}-{q['q75']:.2f})")
    for row, seconds in y.get("compile_s", {}).items():
        lines.append(f"  {row}: {seconds:.1f} s to compile (its first step, not timed)")
    for row, why in y.get("unavailable", {}).items():
        lines.append(f"  {row}: unavailable ({why})")
    fresh = y.get("fresh_process")
    if fresh is not None:
        if "unavailable" in fresh:
            lines.append(f"  fresh process: unavailable ({fresh['unavailable']})")
        else:
            ours = r["frameworks"]["nanospa"]["step_s_median"]
            parts = [f"{row} unavailable ({d['unavailable']})" if "unavailable" in d else
                     f"{row} {1e3 * d['step_s_median']:.1f} ms/step ({_pct(d['over_in_process'])} vs in-process; "
                     f"nanospa's speed over it {d['step_s_median'] / ours:.2f})"
                     for row, d in fresh["rows"].items()]
            lines.append(f"  alone in a fresh process (torch + yardstick.py, torch threads "
                         f"{fresh['torch_threads']}): " + ", ".join(parts))
            if any(abs(d.get("over_in_process", 0.0)) > FRESH_AGREEMENT for d in fresh["rows"].values()):
                lines.append(f"  (fresh and in-process differ by more than {100 * FRESH_AGREEMENT:.0f}%: "
                             "the in-process PyTorch figure is disturbed, or the machine is busy)")
    return lines


def format_report(report):
    m = report["machine"]
    usable = m.get("cpu_usable")
    lines = [f"nanospa bench  {m['date']}  {m['cpu']} ({m['cpu_count']} cores"
             + (f", {usable} usable" if usable is not None and usable != m["cpu_count"] else "") + ")"
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
                     + f"; OPENBLAS_CORETYPE={m['env']['OPENBLAS_CORETYPE']}"
                     + ("; freed memory kept (run/malloc.py)" if th.get("freed_memory_kept") else "")
                     + (f"; torch {m['torch_threads']} threads, BLAS {m.get('torch_blas')}"
                        if m.get("torch_threads") is not None else ""))
    for r in report["results"]:
        c, f = r["gpt_config"], r["model_flops"]
        lines.append("")
        lines.append(f"[{r['config']}] L={c['n_layer']} C={c['n_embd']} H={c['n_head']} T={c['block_size']} "
                     f"B={r['batch_size']} V={c['vocab_size']} {c['attention']}/{c['activation']} "
                     f"{r['dtype']} {r['device']}"
                     + (f" threads={r['threads']} ({r['cpu_threading']})" if r["threads"] else ""))
        lines.append(f"  model FLOPs/step {f['per_step'] / GIGA:.2f} G ({f['formula']}); "
                     f"GEMM peak {r['gemm_peak_flops'] / GIGA:.1f} GFLOP/s (n={r['gemm_n']})")
        w = max(10, *(len(name) for name in r["frameworks"]))
        lines.append(f"  {'framework':{w}s} {'tokens/s':>10s} {'ms/step':>9s} {'MFU':>6s} {'peak mem':>10s}")
        for name, d in r["frameworks"].items():
            lines.append(f"  {name:{w}s} {d['tokens_per_s']:10.0f} {1e3 * d['step_s_median']:9.1f} "
                         f"{100 * d['mfu']:5.1f}% {_mib(d.get('peak_mem_bytes')):>10s}")
        if "ratio_nanospa_over_pytorch" in r:
            q = r["ratio_nanospa_over_pytorch"]
            several = len(r.get("ratios_nanospa_over", {})) > 1
            lines.append(f"  speed nanospa/{q.get('yardstick', 'pytorch')}: {q['median']:.2f} (median of {r['steps']} "
                         f"paired steps, quartiles {q['q25']:.2f}-{q['q75']:.2f})"
                         + ("; the faster PyTorch row" if several else ""))
        lines += yardstick_lines(r)
        if "profile" in r:
            lines += profile_lines(r["profile"], {n: r["frameworks"][n]["step_s_median"] for n in r["profile"]})
        if "kfac" in r:
            k, kf = r["kfac"], r["kfac"]["flops"]
            lines.append(f"  K-FAC step / AdamW step: {k['step_over_adamw_median']:.2f} (median of paired steps), "
                         f"{k['step_over_adamw_mean']:.2f} (total time: the inverses every {k['inv_interval']} "
                         f"steps included when --steps is a multiple of it)")
            lines.append(f"  K-FAC adds {kf['per_step'] / GIGA:.1f} GFLOP/step ({kf['per_step'] / f['per_step']:.2f}x the "
                         f"step): curvature pass {kf['curvature_pass'] / GIGA:.1f}, statistics "
                         f"{kf['statistics'] / GIGA:.1f}, preconditioning {kf['preconditioning'] / GIGA:.1f}, "
                         f"eigendecompositions {kf['eigh_per_refresh'] / GIGA:.1f} per refresh")
    return "\n".join(lines)
