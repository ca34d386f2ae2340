"""Keep freed memory in the process, so that NumPy's temporaries do not page-fault each step.

A training step allocates and frees the same arrays over and over (attention's (B, H, T, T)
scores, the activations and their gradients). glibc's malloc serves a block above its mmap
threshold (128 KiB at first, raised as such blocks are freed, at most 32 MiB) with a fresh
mapping that it unmaps on free, and gives the top of its heap back to the OS once more than
its trim threshold is free: the next step's arrays then start on untouched pages, and every
4 KiB page costs a page fault and zeroing. On one long sequence (python -m nanospa.bench
--config=long --block_size=256) that was about 4,000 faults and a quarter of a step's time;
with both thresholds set high it is none (docs/performance.md, "Freed memory kept").

    keep_freed_memory()     set both thresholds (glibc only); True where applied

What it costs: memory a process has freed stays in it (up to TRIM_THRESHOLD at the heap's
top) instead of going back to the OS; the resident set's high-water mark, which is what
limits a run, is unchanged. What it does not change: any value computed. train.py and the
benchmark call it; a Python user may call it before a loop of their own.
"""
import ctypes

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3   # mallopt's parameters, from glibc's malloc.h
MMAP_THRESHOLD = 32 << 20                     # glibc's largest: blocks below it come from the heap
TRIM_THRESHOLD = 128 << 20                    # free bytes kept at the heap's top


def keep_freed_memory():
    """Raise glibc's mmap and trim thresholds (mallopt) for the rest of the process; False,
    doing nothing, where the C library is not glibc (macOS, musl, Windows)."""
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version                 # glibc's own symbol: no other library has it
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
