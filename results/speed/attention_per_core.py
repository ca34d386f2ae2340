"""Attention's forward and backward for one sequence, per core: what the long configuration's
ratio to PyTorch is made of at T <= 1024 (docs/performance.md, "Why 0.9 is out of reach").

One layer's causal attention with a fixed (T, T) logit bias, as E-SPA has: batch 1, 4 heads
of 16, float32, the forward and the backward of q, k and v from a random upstream gradient.
Each row is one fresh process, timed REPS times after a warm-up (the median); the rows of a
round alternate, ROUNDS rounds, and the table gives each row's median over the rounds:

    nanospa           model.dense_attention on the engine's ops (fused.softmax), Tensor.backward
    torch sdpa        F.scaled_dot_product_attention with the bias as a float mask (the
                      benchmark's yardstick writes attention this way)
    torch written     nanoGPT's written-out attention: q k^T * scale + bias, softmax, @ v
    numba rows        (only where numba is installed; not a nanospa dependency) the same
                      products through NumPy's BLAS, the softmax and its backward as one
                      compiled pass per row each: the plainest compiled kernel

    OPENBLAS_NUM_THREADS=1 python results/speed/attention_per_core.py [T ...]

writes attention_per_core.json beside this file. Needs torch (the bench extra).
"""
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
REPS, ROUNDS, HEADS, HEAD_SIZE = 20, 3, 4, 16
ROWS = [("nanospa", 1), ("torch sdpa", 1), ("torch sdpa", 2), ("torch written", 1), ("torch written", 2),
        ("numba rows", 1), ("numba rows", 2)]


def inputs(T):
    rng = np.random.default_rng(0)
    q, k, v, dy = (rng.standard_normal((1, HEADS, T, HEAD_SIZE)).astype(np.float32) for _ in range(4))
    bias = np.tril(rng.standard_normal((T, T))).astype(np.float32)   # 0 above the diagonal, as a stored B_l
    return q, k, v, dy, bias, 1.0 / math.sqrt(HEAD_SIZE)


def nanospa_step(T, threads):
    sys.path.insert(0, str(ROOT))
    from nanospa.model import dense_attention
    from nanospa.tensor import Tensor
    q, k, v, dy, bias, scale = inputs(T)

    def step():
        tq, tk, tv = (Tensor(x, requires_grad=True) for x in (q, k, v))
        y, _ = dense_attention(tq, tk, tv, scale, (bias, None))
        y.backward(dy)
    return step


def torch_step(T, threads, written):
    import torch
    torch.set_num_threads(threads)
    q, k, v, dy, bias, scale = inputs(T)
    q, k, v = (torch.tensor(x, requires_grad=True) for x in (q, k, v))
    mask = torch.tensor(np.where(np.tril(np.ones((T, T), bool)), bias, -np.inf).astype(np.float32))
    dy = torch.tensor(dy)

    def step():
        if written:
            y = torch.softmax(q @ k.transpose(-2, -1) * scale + mask, dim=-1) @ v
        else:
            y = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        y.backward(dy)
        for x in (q, k, v):
            x.grad = None
    return step


def numba_kernels():
    """The two compiled row passes (numba imported here: it is not a nanospa dependency)."""
    import numba

    @numba.njit(parallel=True, fastmath=True, cache=True)
    def softmax_rows(S, bias, scale, P):          # P = softmax(scale S + bias), causal, row by row
        G, T, _ = S.shape
        for r in numba.prange(G * T):
            g, i = r // T, r % T
            m = -np.inf
            for j in range(i + 1):
                x = S[g, i, j] * scale + bias[i, j]
                P[g, i, j] = x
                if x > m:
                    m = x
            s = 0.0
            for j in range(i + 1):
                e = math.exp(P[g, i, j] - m)
                P[g, i, j] = e
                s += e
            inv = 1.0 / s
            for j in range(i + 1):
                P[g, i, j] *= inv
            for j in range(i + 1, T):
                P[g, i, j] = 0.0

    @numba.njit(parallel=True, fastmath=True, cache=True)
    def softmax_grad_rows(P, dP, scale, dS):      # dS = scale P (dP - rowsum(P dP))
        G, T, _ = P.shape
        for r in numba.prange(G * T):
            g, i = r // T, r % T
            d = 0.0
            for j in range(i + 1):
                d += P[g, i, j] * dP[g, i, j]
            for j in range(i + 1):
                dS[g, i, j] = P[g, i, j] * (dP[g, i, j] - d) * scale
            for j in range(i + 1, T):
                dS[g, i, j] = 0.0
    return softmax_rows, softmax_grad_rows


def numba_step(T, threads):
    import numba
    numba.set_num_threads(threads)
    softmax_rows, softmax_grad_rows = numba_kernels()
    q, k, v, dy, bias, scale = inputs(T)
    q, k, v, dy = q[0], k[0], v[0], dy[0]                # (H, T, hs): the heads are the batch of products

    def step():
        S = q @ k.transpose(0, 2, 1)
        P = np.empty_like(S)
        softmax_rows(S, bias, scale, P)
        y = P @ v
        dP = dy @ v.transpose(0, 2, 1)
        dv = P.transpose(0, 2, 1) @ dy
        dS = np.empty_like(P)
        softmax_grad_rows(P, dP, scale, dS)
        return y, dS @ k, dS.transpose(0, 2, 1) @ q, dv
    return step


def one(name, T, threads):
    """Median ms of REPS steps of one row, in this process."""
    make = {"nanospa": nanospa_step, "numba rows": numba_step,
            "torch sdpa": lambda T, n: torch_step(T, n, False),
            "torch written": lambda T, n: torch_step(T, n, True)}[name]
    step = make(T, threads)
    step()
    times = []
    for _ in range(REPS):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def cpu_name():
    """The CPU's model name (/proc/cpuinfo on Linux), else what platform knows."""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(argv):
    if argv and argv[0] == "--one":
        print(one(argv[1], int(argv[2]), int(argv[3])))
        return 0
    Ts = [int(a) for a in argv] or [256, 512, 1024]
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    try:
        import numba  # noqa: F401
        rows = ROWS
    except ImportError:
        rows = [r for r in ROWS if r[0] != "numba rows"]
    got = {}
    for _ in range(ROUNDS):
        for T in Ts:
            for name, n in rows:
                out = subprocess.run([sys.executable, __file__, "--one", name, str(T), str(n)], env=env,
                                     capture_output=True, text=True, check=True).stdout
                got.setdefault(f"{name}|{n}|{T}", []).append(float(out.split()[-1]))
    table = {k: statistics.median(v) for k, v in got.items()}
    print("| T | " + " | ".join(f"{name}, {n} thread{'s' * (n > 1)}" for name, n in rows) + " |")
    print("|---" * (len(rows) + 1) + "|")
    for T in Ts:
        print(f"| {T} | " + " | ".join(f"{table[f'{name}|{n}|{T}']:.2f}" for name, n in rows) + " |")
    import torch
    (HERE / "attention_per_core.json").write_text(json.dumps(dict(
        command="OPENBLAS_NUM_THREADS=1 python results/speed/attention_per_core.py " + " ".join(argv),
        cpu=f"{cpu_name()} ({os.cpu_count()} cores)", numpy=np.__version__, torch=torch.__version__,
        ms_per_layer_median=table, runs=got), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
