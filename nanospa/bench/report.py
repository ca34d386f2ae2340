"""The report of ``python -m nanospa.bench``: the machine it ran on and the printed table.

    machine_info(started, load_start, device, torch, threads_info)   date, command, CPU, GPU,
                       library versions, thread variables, load averages at start and end
    format_report(report)                                          the human-readable text
                       (--json prints the report dict itself)

Not here: the numbers themselves (bench_measure.py, bench_memory.py, bench.run_config).
"""
import os
import platform
import sys

import numpy as np

from .. import backend

THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
OPENBLAS_VARS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")   # read by OpenBLAS when it loads
MIB = 2 ** 20
GIGA = 1e9


def machine_info(started, load_start, device, torch, threads_info):
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    info = dict(date=started,
                command="python -m nanospa.bench " + " ".join(sys.argv[1:]),
                platform=platform.platform(), cpu=cpu, cpu_count=os.cpu_count(),
                python=platform.python_version(), numpy=np.__version__,
                torch=getattr(torch, "__version__", None),
                env={v: os.environ.get(v) for v in THREAD_VARS + OPENBLAS_VARS})
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
        lines.append(f"  model FLOPs/step {f['per_step'] / GIGA:.2f} G ({f['formula']}); "
                     f"GEMM peak {r['gemm_peak_flops'] / GIGA:.1f} GFLOP/s (n={r['gemm_n']})")
        lines.append(f"  {'framework':10s} {'tokens/s':>10s} {'ms/step':>9s} {'MFU':>6s} {'peak mem':>10s}")
        for name, d in r["frameworks"].items():
            lines.append(f"  {name:10s} {d['tokens_per_s']:10.0f} {1e3 * d['step_s_median']:9.1f} "
                         f"{100 * d['mfu']:5.1f}% {_mib(d.get('peak_mem_bytes')):>10s}")
        if "ratio_nanospa_over_pytorch" in r:
            q = r["ratio_nanospa_over_pytorch"]
            lines.append(f"  speed nanospa/pytorch: {q['median']:.2f} (median of {r['steps']} paired steps, "
                         f"quartiles {q['q25']:.2f}-{q['q75']:.2f})")
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
