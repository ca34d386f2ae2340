"""nanospa/run/distributed.py: data parallelism over MPI processes (and NCCL on GPUs).

The MPI tests launch real `mpiexec -n 2` (and -n 1) jobs of tests/mpi_worker.py, a tiny
float64 GPT trained as train.py trains, and skip cleanly when mpi4py or mpiexec is
missing (pip install -e ".[mpi]"). The NCCL test needs a GPU and skips without one. The
unit tests at the top need neither.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from nanospa import GPT, GPTConfig, Tensor, backend
from nanospa.run import distributed
from nanospa.run.distributed import DistributedError, World, buckets, launched_size

pytestmark = pytest.mark.slow       # the full suite only: python -m pytest -m 'not slow' skips it

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "mpi_worker.py"
RTOL = 1e-10          # float64 losses of N = 1 and N = 2 (the bound; seen: about 3e-16)
FLOAT32_RTOL = 1e-5   # float32: about 100 float32 epsilons
FAULT_BOUND_S = 30    # a failed rank must end the whole job within this


def _mpiexec():
    """The mpiexec beside this Python (the mpich wheel installs it there), else on PATH."""
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if os.access(here, os.X_OK) else shutil.which("mpiexec")


def _has_mpi4py():
    try:
        import mpi4py  # noqa: F401
        return True
    except ImportError:
        return False


MPIEXEC = _mpiexec()
needs_mpi = pytest.mark.skipif(not (MPIEXEC and _has_mpi4py()), reason="mpi4py or mpiexec missing (extra [mpi])")


def env():
    e = {k: v for k, v in os.environ.items() if k not in distributed.LAUNCHER_VARS}
    e.update(PYTHONPATH=str(ROOT), OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return e


def launch(n, *args, timeout=2 * FAULT_BOUND_S):
    """Run the worker on n processes (n = 0: plain python, no mpiexec) -> (process, seconds).
    A job still running after `timeout` is ended by SIGTERM to mpiexec (which ends its ranks)
    and the test fails."""
    cmd = ([MPIEXEC, "-n", str(n)] if n else []) + [sys.executable, str(WORKER), *args]
    t0 = time.monotonic()
    with subprocess.Popen(cmd, cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.terminate()
            proc.communicate(timeout=10)
            pytest.fail(f"mpiexec -n {n} ... {' '.join(args)} still running after {timeout} s")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err), time.monotonic() - t0


def train(tmp_path, n, *args, name="out"):
    out = tmp_path / f"{name}.json"
    proc, _ = launch(n, f"--out={out}", *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text())


def assert_same_run(a, b, rtol=RTOL):
    for key in ("losses", "evals", "norms"):
        np.testing.assert_allclose(b[key], a[key], rtol=rtol, atol=0, err_msg=key)


# ----------------------------------------------------------------------------- no MPI needed

def test_buckets_keep_order_and_split_by_size_and_dtype():
    ps = [Tensor(np.zeros(n, dt)) for n, dt in [(4, "f8"), (4, "f8"), (3, "f8"), (10, "f8"), (2, "f4"), (1, "f4")]]
    groups = buckets(ps, limit_bytes=8 * 8)            # 8 float64 per bucket
    assert [[ps.index(p) for p in g] for g in groups] == [[0, 1], [2], [3], [4, 5]]
    assert [p for g in groups for p in g] == ps        # every parameter once, in order


def test_single_process_world_is_the_identity():
    w = World()
    assert (w.rank, w.size, w.local_rank, w.is_main) == (0, 1, 0, True)
    x = np.arange(6)
    assert w.shard(x) is x
    w.check_batch(3)
    p = Tensor(np.ones(3), requires_grad=True)
    p.grad = g = np.arange(3.0)
    w.allreduce_grads([p])
    assert p.grad is g
    assert w.mean(2.5) == 2.5 and w.max(3) == 3 and w.any(True) and not w.any(False)
    assert w.bcast({"a": 1}) == {"a": 1} and w.in_sync([x]) and w.exit(2) == 2


def test_shard_is_the_ranks_contiguous_slice_and_batch_must_divide():
    w = World()
    w.rank, w.size = 1, 2
    assert w.shard(np.arange(8)).tolist() == [4, 5, 6, 7]
    with pytest.raises(DistributedError) as e:
        w.check_batch(5)
    assert str(e.value) == ("batch_size 5 is not a multiple of the 2 processes "
                            "(each trains batch_size / 2 sequences of the global batch)")


def test_launcher_detection_from_the_environment():
    assert launched_size({}) is None
    assert launched_size({"PMI_RANK": "0", "PMI_SIZE": "4"}) == 4
    assert launched_size({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}) == 2
    assert launched_size({"PMIX_RANK": "0"}) == 0          # launched, size from MPI


def test_without_a_launcher_mpi4py_is_not_imported():
    code = ("import sys; from nanospa.run import distributed as d; w = d.world(); "
            "print(w.size, 'mpi4py' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env(), capture_output=True, text=True)
    assert out.stdout.split() == ["1", "False"], out.stderr


def test_launched_without_mpi4py_is_a_one_line_error(monkeypatch):
    monkeypatch.setattr(distributed, "_world", None)
    monkeypatch.setitem(sys.modules, "mpi4py", None)       # import mpi4py now fails
    monkeypatch.setenv("PMI_RANK", "0")
    monkeypatch.setenv("PMI_SIZE", "2")
    with pytest.raises(DistributedError, match=r"one of 2 processes, but mpi4py is not installed: pip install"):
        distributed.world()
    assert distributed.run(lambda: 0) == 2                 # train.py's sys.exit(distributed.run(main))
    monkeypatch.setenv("PMI_SIZE", "1")                    # mpiexec -n 1 without mpi4py: one process
    assert distributed.world().size == 1


# ----------------------------------------------------------------------------- real mpiexec jobs

@needs_mpi
def test_two_ranks_train_exactly_as_one_process(tmp_path):
    """float64: N = 1 (no mpiexec), N = 1 through the real collectives, N = 2, and N = 2
    with 2 threads per rank give the same losses, evaluation losses and gradient norms."""
    one = train(tmp_path, 0, name="one")
    assert one["size"] == 1 and len(one["losses"]) == 6
    assert one["losses"][-1] < one["losses"][0] - 0.5                      # it trains
    for n, args in [(1, ["--force_comm=true"]), (2, []), (2, ["--threads=2"])]:
        res = train(tmp_path, n, *args, name=f"n{n}{''.join(args)}")
        assert res["size"] == n and res["in_sync"]
        assert_same_run(one, res)


@needs_mpi
def test_float32_agrees_within_rounding(tmp_path):
    """float32: the two runs sum in another order; seen 2.6e-7 relative after 6 steps."""
    one = train(tmp_path, 0, "--dtype=float32", name="one")
    two = train(tmp_path, 2, "--dtype=float32", name="two")
    assert_same_run(one, two, rtol=FLOAT32_RTOL)


@needs_mpi
def test_planted_errors_break_the_equality(tmp_path):
    """The equality test has teeth: a summed gradient not scaled by 1/N doubles the norm
    (Adam and clipping nearly hide it in the losses: 2e-9 relative, still above RTOL), and
    skipping the all-reduce lets the ranks drift apart."""
    one = train(tmp_path, 0, name="one")
    unscaled = train(tmp_path, 2, "--plant=sum_not_mean", name="unscaled")
    np.testing.assert_allclose(unscaled["norms"], 2 * np.array(one["norms"]), rtol=1e-6)
    with pytest.raises(AssertionError):
        assert_same_run(one, unscaled)
    alone = train(tmp_path, 2, "--plant=no_allreduce", name="alone")
    assert not alone["in_sync"]
    with pytest.raises(AssertionError):
        assert_same_run(one, alone)


@needs_mpi
@pytest.mark.parametrize("first, second", [(2, 1), (1, 2)])
def test_resume_under_another_number_of_processes(tmp_path, first, second):
    straight = train(tmp_path, 2, name="straight")
    ckpt = tmp_path / "ckpt.npz"
    head = train(tmp_path, first, f"--ckpt={ckpt}", "--steps=3", "--save_at=3", name="head")
    tail = train(tmp_path, second, f"--ckpt={ckpt}", "--resume=true", name="tail")
    joined = {k: head[k] + tail[k] for k in ("losses", "evals", "norms")}
    assert_same_run(straight, joined)


@needs_mpi
def test_indivisible_batch_is_one_line_on_every_rank(tmp_path):
    proc, seconds = launch(2, "--batch=3")
    assert proc.returncode == 2
    line = ("error: batch_size 3 is not a multiple of the 2 processes "
            "(each trains batch_size / 2 sequences of the global batch)")
    # one line from each rank and nothing else; mpiexec forwards each rank's writes as they
    # come, so settings.fail's two writes (the text, then the newline) may interleave
    assert proc.stderr.count(line) == 2 and not proc.stderr.replace(line, "").strip(), proc.stderr
    assert seconds < FAULT_BOUND_S


@needs_mpi
@pytest.mark.parametrize("how, status", [("raise", 1), ("exit2", 2), ("kill", None)])
def test_a_failed_rank_ends_the_job(tmp_path, how, status):
    """Rank 1 raises, returns status 2, or is SIGKILLed at step 5 of 10,000; rank 0 saved a
    checkpoint at step 2. The job ends with a non-zero status within FAULT_BOUND_S (without
    the fault handling rank 0 would wait in its all-reduce for ever), and the checkpoint loads."""
    ckpt = tmp_path / "ckpt.npz"
    proc, seconds = launch(2, "--steps=10000", "--save_at=2", f"--ckpt={ckpt}", "--fail_rank=1",
                           "--fail_step=5", f"--fail={how}")
    assert seconds < FAULT_BOUND_S
    assert proc.returncode == status if status else proc.returncode != 0
    if how != "kill":                                   # SIGKILL: mpiexec kills rank 0 itself
        assert f"error: rank 1 of 2 failed (exit status {status}); stopping this rank too" in proc.stderr
    with np.load(ckpt, allow_pickle=False) as z:
        assert json.loads(str(z["state"]))["step"] == 2
        GPT(GPTConfig(vocab_size=13, block_size=8, n_layer=2, n_head=2, n_embd=8, dtype="float64")).load_state_dict(
            {k[6:]: z[k] for k in z.files if k.startswith("model/")})


@needs_mpi
def test_ctrl_c_saves_once_and_stops_every_rank(tmp_path):
    ckpt = tmp_path / "ckpt.npz"
    cmd = [MPIEXEC, "-n", "2", sys.executable, str(WORKER), "--steps=10000", "--wait_sigint=true", f"--ckpt={ckpt}"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:                        # rank 0 prints "step n" after each step
            if line.startswith("step 2"):
                break
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)                 # what a terminal's Ctrl-C sends mpiexec
        out, err = proc.communicate(timeout=FAULT_BOUND_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert time.monotonic() - t0 < FAULT_BOUND_S
    assert "saved 1 time(s)" in out
    with np.load(ckpt, allow_pickle=False) as z:
        assert json.loads(str(z["state"]))["step"] >= 2


@needs_mpi
@pytest.mark.skipif(not backend.cuda_available(), reason="no GPU (CuPy)")
def test_nccl_on_one_gpu_trains_as_the_cpu(tmp_path):
    """World(MPI.COMM_WORLD) of one process on the GPU: gradients go through NCCL (a unique
    id broadcast over MPI, a communicator of one rank); float64 losses match the CPU's."""
    cpu = train(tmp_path, 0, name="cpu")
    gpu = train(tmp_path, 1, "--force_comm=true", "--device=cuda", name="gpu")
    assert_same_run(cpu, gpu, rtol=1e-9)


# ----------------------------------------------------------------------------- the benchmark

def test_cost_model_is_compute_over_n_plus_ring_all_reduce():
    from nanospa.bench.ranks import cost_model
    summary = {"1x1": dict(ranks=1, threads=1, step_s=2.1, compute_s=2.0, bus_bandwidth=0.0, grad_bytes=4e8),
               "4x1": dict(ranks=4, threads=1, step_s=1.3, compute_s=0.6, wait_s=0.05, allreduce_s=0.5,
                           bus_bandwidth=1e9, grad_bytes=4e8)}
    c = cost_model(summary)["4x1"]
    assert c["predicted"] == pytest.approx(dict(compute=2.0 / 4, optimiser=0.1, allreduce=2 * 3 / 4 * 4e8 / 1e9))
    assert c["predicted_step_s"] == pytest.approx(0.5 + 0.1 + 0.6) and c["measured_step_s"] == 1.3
    assert c["measured"] == pytest.approx(dict(compute=0.6, optimiser=0.15, allreduce=0.5, wait=0.05))


@needs_mpi
def test_benchmark_measures_ranks_and_threads_side_by_side():
    cmd = [sys.executable, "-m", "nanospa.bench.ranks", "--config=tiny", "--steps=2", "--rounds=1",
           "--pure_reps=2", "--json"]
    out = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=2 * FAULT_BOUND_S)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    s = res["summary"]
    assert list(s) == ["1x1", "1x2", "2x1"]
    assert s["2x1"]["ranks"] == 2 and s["2x1"]["allreduce_s"] > 0 and s["2x1"]["bus_bandwidth"] > 0
    assert s["1x2"]["allreduce_s"] < 1e-4 and s["1x2"]["threads"] == 2     # one process: nothing to reduce
    assert s["1x1"]["grad_bytes"] == 4 * s["1x1"]["params"]                  # float32 gradients
    assert list(res["cost_model"]) == ["2x1"]


# ------------------------------------------------------------------ train.py itself under mpiexec

TRAIN = [str(ROOT / "train.py"), "--dtype=float64", "--n_layer=2", "--n_embd=16", "--n_head=2",
         "--block_size=16", "--batch_size=4", "--max_iters=6", "--eval_interval=3", "--eval_iters=2",
         "--log_interval=1", "--checkpoint_interval=3", "--sample_tokens=0", "--threads=1", "--warmup_iters=2"]


def run_train(n, out_dir, *args, timeout=2 * FAULT_BOUND_S):
    cmd = ([MPIEXEC, "-n", str(n)] if n else []) + [sys.executable, *TRAIN, f"--out_dir={out_dir}", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=timeout)


def log_losses(out_dir):
    records = [json.loads(line) for line in (out_dir / "log.jsonl").read_text().splitlines()]
    return [r["train_loss"] for r in records], [r["val_loss"] for r in records if "val_loss" in r]


@needs_mpi
def test_train_py_on_two_ranks_is_the_one_process_run(tmp_path):
    """mpiexec -n 2 python train.py: the same float64 run as one process (batch_size is the
    global batch), one log and one checkpoint written by rank 0, and a resume under N = 1."""
    one, two = tmp_path / "one", tmp_path / "two"
    p1, p2 = run_train(0, one), run_train(2, two)
    assert p1.returncode == 0, p1.stderr
    assert p2.returncode == 0, p2.stderr
    (t1, v1), (t2, v2) = log_losses(one), log_losses(two)
    np.testing.assert_allclose(t2, t1, rtol=RTOL, atol=0)
    np.testing.assert_allclose(v2, v1, rtol=RTOL, atol=0)
    assert p2.stdout.count("done: iter 6") == 1                   # rank 0 alone prints
    assert sorted(f.name for f in two.iterdir() if not f.name.startswith(".")) == \
        sorted(f.name for f in one.iterdir() if not f.name.startswith("."))
    p3 = run_train(0, two, "--init_from=resume", "--max_iters=6")
    assert p3.returncode == 0 and "nothing to do" in (p3.stdout + p3.stderr).lower(), p3.stderr


@needs_mpi
def test_train_py_indivisible_batch_is_one_line_on_every_rank(tmp_path):
    p = run_train(2, tmp_path / "out", "--batch_size=3")
    assert p.returncode == 2
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    assert lines and all(l.startswith("error:") for l in lines) and "batch_size" in p.stderr


@needs_mpi
def test_a_signal_stops_train_py_on_every_rank_and_the_resumed_run_is_the_whole_one(tmp_path):
    """mpiexec -n 2 python train.py and Ctrl-C: every rank stops after the same step (each asks
    the others before every step: a collective), the state is saved once and said once
    (status 130), and the run resumed on two ranks is the uninterrupted one, record for record."""
    out, whole = tmp_path / "out", tmp_path / "whole"
    long = ["--max_iters=100000", "--lr_decay_iters=100000", "--eval_interval=100000",
            "--checkpoint_interval=100000"]
    cmd = [MPIEXEC, "-n", "2", sys.executable, *TRAIN, f"--out_dir={out}", *long]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        log, deadline = out / "log.jsonl", time.monotonic() + FAULT_BOUND_S
        while time.monotonic() < deadline and not (log.exists() and len(log.read_text().splitlines()) >= 4):
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=FAULT_BOUND_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-3000:]
    assert err.count("SIGINT: stopped at iter") == 1 and "Traceback" not in err
    k = json.loads(str(np.load(out / "ckpt.npz")["state"]))["iter"]
    assert k >= 3 and max(json.loads(line)["iter"] for line in log.read_text().splitlines()) == k
    for args in ((out, "--init_from=resume"), (whole,)):
        p = run_train(2, args[0], *long[1:], f"--max_iters={k + 2}", *args[1:])
        assert p.returncode == 0, p.stderr[-3000:]
    records = lambda folder: [{key: v for key, v in json.loads(line).items() if key != "tokens_per_s"}
                              for line in (folder / "log.jsonl").read_text().splitlines()]
    assert records(out) == records(whole)
