"""Peak memory of ``python -m nanospa.bench``.

    CPU: measure_cpu(framework, argv) runs the benchmark again in a fresh process with
         --memory_probe=FRAMEWORK (bench.memory_probe): that process builds one framework's
         model, trains --memory_steps steps and prints probe_line(base): its resident set
         after imports (base) and its high-water mark, both from /proc/self/status. The
         peak is the difference, so PyTorch's larger library is not counted against it;
         the whole process's peak is reported too.
    GPU: gpu_peaks(torch, probe_bytes): the bytes CuPy's memory pool holds (it keeps every
         block it ever handed out, so its size is the peak) less the GEMM probe's, and
         torch.cuda.max_memory_reserved().

Not here: when the probes run (bench/command.py), the timing (bench/measure.py).
"""
import json
import subprocess
import sys

from .. import backend

KIB = 1024   # /proc/self/status counts in kB (KiB)


def status_bytes(field):
    """A field of /proc/self/status in bytes (VmRSS: resident set now, VmHWM: its
    high-water mark), or None off Linux."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * KIB
    except OSError:
        return None
    return None


def probe_line(base):
    """The one JSON line a probe process prints: its base and peak resident set."""
    return json.dumps(dict(base_rss=base, peak_rss=status_bytes("VmHWM")))


def measure_cpu(framework, argv):
    """Peak resident memory of a fresh process training ``framework`` (CPU): dict(peak_bytes,
    process_peak_bytes), None where /proc is missing; RuntimeError if the probe fails."""
    cmd = [sys.executable, "-m", "nanospa.bench", *argv, f"--memory_probe={framework}"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"memory probe for {framework} failed: {out.stderr.strip()[-400:]}")
    d = json.loads(out.stdout.strip().splitlines()[-1])
    if d["peak_rss"] is None or d["base_rss"] is None:
        return dict(peak_bytes=None, process_peak_bytes=None)
    return dict(peak_bytes=d["peak_rss"] - d["base_rss"], process_peak_bytes=d["peak_rss"])


def gpu_peaks(torch, probe_bytes):
    """{framework: peak bytes} on the GPU after a configuration's steps."""
    cp = backend.cupy()
    peaks = dict(nanospa=int(cp.get_default_memory_pool().total_bytes()) - probe_bytes)
    if torch is not None:
        peaks["pytorch"] = int(torch.cuda.max_memory_reserved())
    return peaks


def reset_gpu(torch):
    """Free cached blocks and peak statistics, so that a configuration counts its own memory."""
    cp = backend.cupy()
    if cp is not None:
        cp.get_default_memory_pool().free_all_blocks()
    if torch is not None:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
