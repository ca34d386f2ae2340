"""train.py under faults: one run per out_dir, scratch runs that would replace a run,
SIGTERM, a second signal, divergence after the update, full disks (simulated ENOSPC, and a
real tiny tmpfs where this machine lets a test mount one), out of memory, bad output paths,
resume semantics, another corpus, and the fault injection: 20 SIGKILL / SIGTERM moments
during checkpoint and log writes, after each of which the run resumes to the uninterrupted
run's log, record for record.

The fault-injection runs fork this process (POSIX only): the child trains with one write
wrapped to signal itself at one moment, the parent then checks what the child left on disk
and resumes in-process. Forking keeps the imports, so twenty runs take seconds.
"""
import errno
import io
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

import train
from nanospa.run import step
from nanospa.run import checkpoint, rundir
from nanospa.run.checkpoint import load_checkpoint

pytestmark = pytest.mark.slow       # the full suite only: python -m pytest -m 'not slow' skips it

ROOT = Path(__file__).resolve().parents[1]
WORDS = "the model attention layer kernel signal deep network token sequence learns".split()
TINY = ["--n_layer=2", "--n_embd=16", "--n_head=2", "--block_size=16", "--batch_size=4", "--eval_iters=1",
        "--sample_tokens=0", "--warmup_iters=2", "--threads=1", "--log_interval=1", "--eval_interval=3",
        "--checkpoint_interval=2"]
MAX = 8   # records: iters 0..8; checkpoints: iters 0, 2, 4, 6, 8; the cosine ends at max_iters


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOSPA_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("NANOSPA_DEBUG", raising=False)


@pytest.fixture
def text_file(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "tiny.txt"
    path.write_text(" ".join(rng.choice(WORDS, size=1500)) + "\n", encoding="utf-8")
    return path


def args(text_file, out, *extra):
    return TINY + [f"--data={text_file}", f"--out_dir={out}", f"--max_iters={MAX}", *extra]


def read_log(out):
    return [json.loads(line) for line in (Path(out) / "log.jsonl").read_text().splitlines()]


def key(log):
    """What a resumed run must reproduce exactly (tokens_per_s is a measurement)."""
    return [(r["iter"], r["train_loss"], r["lr"], r.get("val_loss")) for r in log]


def error_line(capsys):
    err = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")]
    assert len(err) == 1, err
    return err[0]


def env(tmp_path):
    return dict(os.environ, NANOSPA_CACHE=str(tmp_path / "cache"), OMP_NUM_THREADS="1",
                OPENBLAS_NUM_THREADS="1", PYTHONUNBUFFERED="1")


# ----------------------------------------------------------------------------- one run per out_dir

def test_a_second_run_stops_at_once_and_sigterm_saves_the_current_state(tmp_path, text_file, capsys):
    """Two real processes: the second run on the same out_dir is refused with the owner's
    pid; SIGTERM stops the first after saving its current state (status 143); resume goes on."""
    cmd = [sys.executable, str(ROOT / "train.py"), *args(text_file, "out"), "--max_iters=100000",
           "--checkpoint_interval=100000", "--eval_interval=100000", "--lr_decay_iters=100000"]
    p = subprocess.Popen(cmd, cwd=tmp_path, env=env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    log, deadline = tmp_path / "out" / "log.jsonl", time.time() + 30
    while time.time() < deadline and not (log.exists() and len(log.read_text().splitlines()) >= 4):
        time.sleep(0.05)
    t0 = time.time()
    assert train.main(args(text_file, tmp_path / "out", "--init_from=resume")) == 2
    assert time.time() - t0 < 2                                   # at once: no data, no model
    line = error_line(capsys)
    assert f"is in use by pid {p.pid} on " in line and "one run per out_dir" in line
    assert train.main(args(text_file, tmp_path / "out", "--overwrite=True")) == 2   # not even to overwrite it
    capsys.readouterr()
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 143, err[-2000:]
    assert "SIGTERM: stopped at iter" in err and "checkpoint saved to" in err and "Traceback" not in err
    k = load_checkpoint(str(tmp_path / "out" / "ckpt.npz"))["state"]["iter"]
    assert k >= 3 and read_log(tmp_path / "out")[-1]["iter"] == k    # the state when the signal came
    assert not (tmp_path / "out" / "run.lock").exists()
    resumed = args(text_file, tmp_path / "out", "--init_from=resume", f"--max_iters={k + 2}")
    assert train.main(resumed) == 0
    assert [r["iter"] for r in read_log(tmp_path / "out")] == list(range(k + 3))


def test_scratch_refuses_an_out_dir_holding_a_run_unless_told_to_replace_it(tmp_path, text_file, capsys):
    out = tmp_path / "out"
    assert train.main(args(text_file, out, "--max_iters=2")) == 0
    before = (out / "ckpt.npz").read_bytes(), (out / "log.jsonl").read_bytes()
    capsys.readouterr()
    assert train.main(args(text_file, out, "--seed=1")) == 2
    line = error_line(capsys)
    assert line == (f"error: --out_dir={out} holds a run (ckpt.npz, log.jsonl): continue it with "
                    "--init_from=resume, choose another --out_dir, or replace it with --overwrite=True")
    assert ((out / "ckpt.npz").read_bytes(), (out / "log.jsonl").read_bytes()) == before   # untouched
    (out / "ckpt.npz").unlink()
    assert train.main(args(text_file, out)) == 2                 # a log alone is a run too
    assert "holds a run (log.jsonl)" in error_line(capsys)
    assert train.main(args(text_file, out, "--overwrite=True", "--max_iters=3")) == 0
    assert [r["iter"] for r in read_log(out)] == [0, 1, 2, 3]    # a new log, not appended to the old
    assert load_checkpoint(str(out / "ckpt.npz"))["state"]["iter"] == 3


# ----------------------------------------------------------------------------- divergence

def test_a_divergence_in_the_update_never_replaces_the_last_good_checkpoint(tmp_path, text_file, capsys,
                                                                          monkeypatch):
    """The 6th update makes a weight nan, after the 6th loss and gradient were found finite:
    the checkpoint of iter 6 is not written, iter 3's stays, and the message names it."""
    from nanospa import optim

    class Blowup(optim.AdamW):
        def step(self):
            super().step()
            if self.t == 6:
                self.params[0].data[...] = np.nan

    monkeypatch.setattr(optim, "AdamW", Blowup)                  # what optimizers.make_optimizer builds
    out = tmp_path / "out"
    assert train.main(args(text_file, out, "--checkpoint_interval=3", "--eval_interval=100")) == 1
    line = error_line(capsys)
    assert "non-finite model/" in line and "at iter 6" in line and f"{out / 'ckpt.npz'} (iter 3)" in line
    assert load_checkpoint(str(out / "ckpt.npz"))["state"]["iter"] == 3
    assert not list(out.glob("*.tmp"))


def test_max_iters_zero_writes_what_it_announces(tmp_path, text_file, capsys):
    out = tmp_path / "out"
    assert train.main(args(text_file, out, "--max_iters=0")) == 0
    printed = capsys.readouterr().out
    assert f"checkpoint: {out / 'ckpt.npz'} (iter 0)" in printed and "done: iter 0" in printed
    assert load_checkpoint(str(out / "ckpt.npz"))["state"]["iter"] == 0
    assert [r["iter"] for r in read_log(out)] == [0]
    assert train.main(args(text_file, out, "--init_from=resume", "--max_iters=2")) == 0   # resumable
    assert [r["iter"] for r in read_log(out)] == [0, 1, 2]


# ----------------------------------------------------------------------------- full disks, memory

class FullDisk:
    """A module's view of `os` in which one call (write or fsync) fails with ENOSPC from the
    n-th log record on (write: after writing `room` bytes of it)."""

    def __init__(self, call, n, room=0):
        self.call, self.n, self.room, self.seen = call, n, room, 0

    def __getattr__(self, name):
        return getattr(os, name)

    def write(self, fd, data):
        if self.call == "write" and bytes(data[:8]) == b'{"iter":':
            self.seen += 1
            if self.seen >= self.n:
                os.write(fd, bytes(data[:self.room]))
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return os.write(fd, data)

    def fsync(self, fd):
        self.seen += self.call == "fsync"
        if self.call == "fsync" and self.seen >= self.n:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return os.fsync(fd)


@pytest.mark.parametrize("where", ["log", "checkpoint"])
def test_a_full_disk_ends_the_run_with_one_line_and_the_run_resumes(where, tmp_path, text_file, capsys,
                                                                     monkeypatch):
    out = tmp_path / "out"
    whole = tmp_path / "whole"
    assert train.main(args(text_file, whole)) == 0
    if where == "log":                    # record 6 half written, then ENOSPC: the last checkpoint is iter 4's
        monkeypatch.setattr(rundir, "os", FullDisk("write", n=7, room=20))
        last = 4
    else:                                 # the checkpoint of iter 4 fails at its fsync (the 5th: file, folder
        monkeypatch.setattr(checkpoint, "os", FullDisk("fsync", n=5))     # for iters 0 and 2): iter 2's stays
        last = 2
    capsys.readouterr()
    assert train.main(args(text_file, out)) == 2
    line = error_line(capsys)
    path = out / ("log.jsonl" if where == "log" else "ckpt.npz")
    assert line.startswith(f"error: cannot write {path} (No space left on device) at iter ")
    assert f"the last checkpoint {out / 'ckpt.npz'} (iter {last}) is intact" in line
    assert load_checkpoint(str(out / "ckpt.npz"))["state"]["iter"] == last
    assert "--init_from=resume" in line and not list(out.glob("*.tmp"))
    monkeypatch.undo()                    # room again
    assert train.main(args(text_file, out, "--init_from=resume")) == 0
    assert key(read_log(out)) == key(read_log(whole))


def mount_tmpfs(folder, size):
    """Mount a tmpfs of `size` on folder; False where this machine does not let a test do so."""
    folder.mkdir()
    if not shutil.which("mount"):
        return False
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                       capture_output=True, text=True)
    return r.returncode == 0


@pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0, reason="needs root on Linux")
def test_a_real_full_disk_on_a_tiny_tmpfs(tmp_path, text_file, capsys):
    """96 kB: the checkpoint of iter 0 (57 kB, AdamW has no moments yet) fits, then the log fills it."""
    disk = tmp_path / "disk"
    if not mount_tmpfs(disk, "96k"):
        pytest.skip("cannot mount a tmpfs here")
    try:
        out = disk / "out"
        long = args(text_file, out, "--max_iters=100000", "--checkpoint_interval=100000",
                    "--eval_interval=100000", "--lr_decay_iters=100000")
        assert train.main(long) == 2
        line = error_line(capsys)
        assert line.startswith(f"error: cannot write {out / 'log.jsonl'} (No space left on device) at iter ")
        assert f"the last checkpoint {out / 'ckpt.npz'} (iter 0) is intact" in line
        subprocess.run(["mount", "-o", "remount,size=8m", str(disk)], check=True)   # room again
        assert train.main(long + ["--init_from=resume", "--max_iters=3"]) == 0
        assert [r["iter"] for r in read_log(out)] == [0, 1, 2, 3]
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)


def test_out_of_memory_is_one_line_naming_the_sizes(tmp_path, text_file, capsys, monkeypatch):
    def no_memory(*a, **k):
        raise MemoryError("Unable to allocate 96.0 GiB for an array with shape (16, 4, 64, 64)")

    monkeypatch.setattr(step, "forward", no_memory)
    assert train.main(args(text_file, tmp_path / "out")) == 2
    line = error_line(capsys)
    assert line.startswith("error: out of memory (Unable to allocate 96.0 GiB") and "batch_size" in line
    assert load_checkpoint(str(tmp_path / "out" / "ckpt.npz"))["state"]["iter"] == 0


def test_debug_switch_shows_the_traceback(tmp_path):
    """NANOSPA_DEBUG=1: the traceback instead of the one line (test_train.py checks the line)."""
    loud = subprocess.run([sys.executable, str(ROOT / "train.py"), "--n_layer=0"], cwd=tmp_path,
                          env=dict(env(tmp_path), NANOSPA_DEBUG="1"), capture_output=True, text=True, timeout=60)
    assert loud.returncode != 0 and "Traceback (most recent call last)" in loud.stderr
    assert "ValueError: GPTConfig.n_layer must be a positive integer" in loud.stderr


# ----------------------------------------------------------------------------- paths and settings

@pytest.mark.parametrize("case", ["out_dir is a file", "out_dir under a file", "ckpt.npz is a folder",
                                  "log.jsonl is a folder", "checkpoint missing a key", "out_dir is empty"])
def test_bad_paths_and_checkpoints_are_one_line_before_any_training(case, tmp_path, text_file, capsys):
    out, extra = tmp_path / "out", []
    if case == "out_dir is a file":
        out.write_text("x")
    elif case == "out_dir under a file":
        (tmp_path / "f").write_text("x")
        out = tmp_path / "f" / "out"
    elif case.endswith("is a folder"):
        (out / case.split()[0]).mkdir(parents=True)
    elif case == "out_dir is empty":                              # Path(""): the current folder
        out = ""
    else:
        assert train.main(args(text_file, out, "--max_iters=2")) == 0
        with np.load(out / "ckpt.npz", allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        del arrays[next(k for k in arrays if k.startswith("model/"))]
        np.savez(out / "ckpt.npz", **arrays)
        extra = ["--init_from=resume", "--max_iters=4"]
    capsys.readouterr()
    assert train.main(args(text_file, out, *extra)) == 2
    captured = capsys.readouterr()
    err = [x for x in captured.err.splitlines() if x.startswith("error:")]
    assert len(err) == 1 and ("Traceback" not in captured.err)
    needle = {"out_dir is a file": "is a file, not a folder", "out_dir under a file": "no folder can be made",
              "ckpt.npz is a folder": "ckpt.npz is a folder", "log.jsonl is a folder": "log.jsonl is a folder",
              "checkpoint missing a key": f"checkpoint {Path(out) / 'ckpt.npz'} does not fit this run",
              "out_dir is empty": "--out_dir is empty"}[case]
    assert needle in err[0], err[0]
    if case != "checkpoint missing a key":
        assert "data:" not in captured.out                        # refused before any data or model


def test_settings_are_validated_as_written(tmp_path, text_file, capsys):
    out = tmp_path / "out"
    assert train.main(args(text_file, out, "--learning_rate=1e-4")) == 2
    assert error_line(capsys) == ("error: min_lr=0.0002 (the default) is above learning_rate=0.0001: the learning "
                                  "rate would rise during the decay; set --min_lr to at most --learning_rate")
    assert train.main(args(text_file, out, "--seed=-3")) == 2
    assert error_line(capsys) == "error: seed must be >= 0, got -3"
    assert train.main(args(text_file, out, "--block_size=1")) == 2
    assert "GPTConfig.block_size=1 is too small for attention='espa'" in error_line(capsys)
    assert not out.exists()


# ----------------------------------------------------------------------------- resume semantics

def test_resume_semantics_nothing_to_do_and_no_going_back(tmp_path, text_file, capsys):
    out = tmp_path / "out"
    assert train.main(args(text_file, out, "--lr_decay_iters=0")) == 0     # the schedule: decay ends at 8
    assert load_checkpoint(str(out / "ckpt.npz"))["settings"]["lr_decay_iters"] == MAX   # stored resolved
    before = (out / "log.jsonl").read_bytes()
    capsys.readouterr()
    assert train.main(args(text_file, out, "--init_from=resume")) == 0
    assert capsys.readouterr().out == (f"nothing to do: {out / 'ckpt.npz'} is at iter 8 = max_iters; pass "
                                       "--max_iters=N with N > 8 to train further\n")
    assert train.main(args(text_file, out, "--init_from=resume", "--max_iters=5")) == 2
    assert error_line(capsys) == (f"error: max_iters=5 is below the iteration of {out / 'ckpt.npz'} (8): a resumed "
                                  "run cannot go back; pass a larger --max_iters, or --eval_only=True")
    assert (out / "log.jsonl").read_bytes() == before
    assert train.main(args(text_file, out, "--init_from=resume", "--max_iters=5", "--eval_only")) == 0


def test_a_longer_resumed_run_keeps_the_schedule_and_can_stretch_it(tmp_path, text_file, capsys):
    keep, stretch = tmp_path / "keep", tmp_path / "stretch"
    for out in (keep, stretch):
        assert train.main(args(text_file, out, "--lr_decay_iters=0")) == 0
    first = [r["lr"] for r in read_log(keep)]
    capsys.readouterr()
    assert train.main(args(text_file, keep, "--init_from=resume", "--max_iters=12")) == 0
    assert "note: the schedule is the run's: its cosine decay ends at iter 8" in capsys.readouterr().out
    lrs = [r["lr"] for r in read_log(keep)]
    assert lrs[:9] == first and lrs[9:] == [2e-4] * 4           # the same schedule, then min_lr
    assert train.main(args(text_file, stretch, "--init_from=resume", "--max_iters=12", "--lr_decay_iters=12")) == 2
    assert "lr_decay_iters=12 (checkpoint: 8); pass --allow_changed=lr_decay_iters" in error_line(capsys)
    assert train.main(args(text_file, stretch, "--init_from=resume", "--max_iters=12", "--lr_decay_iters=12",
                           "--allow_changed=lr_decay_iters")) == 0
    assert "note: --allow_changed: from iter 8 on, lr_decay_iters=12 (was 8)" in capsys.readouterr().err
    log = read_log(stretch)
    assert log[9] == dict(iter=8, changed_on_resume=dict(lr_decay_iters=[8, 12]))   # the log says where and how
    lrs = [r["lr"] for r in log if "lr" in r]
    assert lrs[9:] == [train.cosine_lr(it, 2e-3, 2, 12, 2e-4) for it in range(8, 12)]   # re-stretched


def test_resuming_on_another_corpus_is_refused_unless_asked_for(tmp_path, text_file, capsys):
    out = tmp_path / "out"
    assert train.main(args(text_file, out)) == 0
    best = load_checkpoint(str(out / "ckpt.npz"))["state"]["best_val_loss"]
    assert load_checkpoint(str(out / "ckpt.npz"))["state"]["data"]["tokenizer"] == "byte"
    other = tmp_path / "other.txt"
    other.write_text(text_file.read_text().upper())
    capsys.readouterr()
    assert train.main(args(text_file, out, "--init_from=resume", "--max_iters=10", f"--data={other}")) == 2
    line = error_line(capsys)
    assert f"{out / 'ckpt.npz'} was trained on {str(text_file)!r}" in line and "--new_data=True" in line
    text_file.write_text(text_file.read_text() + " more")     # the same path, edited: another corpus too
    assert train.main(args(text_file, out, "--init_from=resume", "--max_iters=10")) == 2
    assert "resuming on another corpus is refused" in error_line(capsys)
    assert train.main(args(text_file, out, "--init_from=resume", "--max_iters=10", f"--data={other}",
                           "--new_data=True")) == 0
    assert "the best validation loss starts afresh" in capsys.readouterr().out
    state = load_checkpoint(str(out / "ckpt.npz"))["state"]
    assert state["data"]["spec"] == str(other) and state["best_val_loss"] != best
    assert load_checkpoint(str(out / "ckpt.npz"))["settings"]["new_data"] is True
    assert train.main(args(text_file, out, "--init_from=resume", "--max_iters=12", f"--data={text_file}")) == 2


# ----------------------------------------------------------------------------- fault injection

def _fire(sig):
    os.kill(os.getpid(), sig)
    if sig == signal.SIGKILL:
        time.sleep(60)                    # never returns


class _LogFault:
    """rundir's `os`: the n-th log record's write(2) (phase "mid": after half of it, "after":
    after all of it) or the n-th fsync of the log (phase "sync") sends `sig`."""

    def __init__(self, n, phase, sig):
        self.n, self.phase, self.sig, self.records, self.syncs = n, phase, sig, 0, 0

    def __getattr__(self, name):
        return getattr(os, name)

    def write(self, fd, data):
        if bytes(data[:8]) != b'{"iter":' or self.phase == "sync":
            return os.write(fd, data)
        self.records += 1
        if self.records != self.n:
            return os.write(fd, data)
        k = os.write(fd, data if self.phase == "after" else data[:len(data) // 2])
        _fire(self.sig)
        return k                          # SIGTERM: Log.write writes the rest

    def fsync(self, fd):
        self.syncs += 1
        if self.phase == "sync" and self.syncs == self.n:
            _fire(self.sig)
        return os.fsync(fd)


class _CheckpointFault:
    """checkpoint's `np` and `os`: the n-th checkpoint sends `sig` half-way through its .npz
    ("npz"), just before its rename ("replace") or just after it ("after")."""

    def __init__(self, n, phase, sig, real):
        self.n, self.phase, self.sig, self.real, self.count = n, phase, sig, real, 0

    def __getattr__(self, name):
        return getattr(self.real, name)

    def savez(self, f, **arrays):
        self.count += 1
        if self.phase != "npz" or self.count != self.n:
            return np.savez(f, **arrays)
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        data = buf.getvalue()
        f.write(data[:len(data) // 2])
        f.flush()
        _fire(self.sig)
        f.write(data[len(data) // 2:])

    def replace(self, src, dst):
        self.count += 1
        hit = self.count == self.n
        if hit and self.phase == "replace":
            _fire(self.sig)
        os.replace(src, dst)
        if hit and self.phase == "after":
            _fire(self.sig)


def _child(argv, where, n, phase, sig):
    """In the forked child: arm one fault, train, exit with train's status (never returns)."""
    rc = 99
    try:
        if where == "log":
            rundir.os = _LogFault(n, phase, sig)
        elif phase == "npz":
            checkpoint.np = _CheckpointFault(n, phase, sig, np)
        else:
            checkpoint.os = _CheckpointFault(n, phase, sig, os)
        rc = train.main(argv)
    finally:
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(rc)


K, T = signal.SIGKILL, signal.SIGTERM
MOMENTS = [  # (signal, file, n-th write, phase): 12 SIGKILL, 8 SIGTERM
    (K, "log", 1, "mid"), (K, "log", 3, "mid"), (K, "log", 3, "after"), (K, "log", 6, "mid"),
    (K, "log", 9, "mid"), (K, "log", 2, "sync"), (K, "ckpt", 1, "npz"), (K, "ckpt", 1, "replace"),
    (K, "ckpt", 1, "after"), (K, "ckpt", 2, "npz"), (K, "ckpt", 3, "replace"), (K, "ckpt", 5, "npz"),
    (T, "log", 1, "mid"), (T, "log", 4, "mid"), (T, "log", 8, "after"), (T, "log", 3, "sync"),
    (T, "ckpt", 1, "npz"), (T, "ckpt", 2, "replace"), (T, "ckpt", 4, "after"), (T, "ckpt", 5, "npz"),
]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_twenty_kills_during_checkpoint_and_log_writes_all_resume_to_the_same_log(tmp_path, text_file, capfd):
    assert len(MOMENTS) == 20
    assert train.main(args(text_file, tmp_path / "whole")) == 0       # also builds the data cache
    whole = key(read_log(tmp_path / "whole"))
    seen = set()
    for i, (sig, where, n, phase) in enumerate(MOMENTS):
        out = tmp_path / f"run{i}"
        argv = args(text_file, out)
        pid = os.fork()
        if pid == 0:
            _child(argv, where, n, phase, sig)
        _, status = os.waitpid(pid, 0)
        label = f"{signal.Signals(sig).name} at {where} write {n} ({phase})"
        if sig == K:
            assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == K, label
        else:
            assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 143, label
        ckpt = out / "ckpt.npz"
        if ckpt.exists():                                  # never half a checkpoint
            k = load_checkpoint(str(ckpt))["state"]["iter"]
            again = argv + ["--init_from=resume"]
        else:                                              # killed writing the first: nothing was written
            assert not (out / "log.jsonl").exists(), label
            k, again = None, argv
        seen.add(k)
        assert train.main(again) == 0, label
        log = read_log(out)                                # every line a complete record
        assert key(log) == whole, label                    # consistent with its checkpoints, and exact
        assert load_checkpoint(str(ckpt))["state"]["iter"] == MAX and not list(out.glob("*.tmp")), label
    assert {None, 0, 2, 4, 6, 8} <= seen                   # the moments hit every checkpoint, and before the first
    capfd.readouterr()


def _evaluated(text_file, out):
    """The val loss of out's checkpoint, by train.py --eval_only (which writes nothing)."""
    import contextlib
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert train.main(args(text_file, out, "--init_from=resume", "--eval_only=True", "--eval_iters=4")) == 0
    line = next(x for x in buf.getvalue().splitlines() if "val " in x and x.startswith(("iter ", "init:")))
    return float(line.split("val ")[1].split()[0].rstrip(","))


def test_an_exploding_loss_stops_the_run_and_the_named_checkpoint_is_good(tmp_path, text_file, capsys, monkeypatch):
    """The 6th update multiplies every weight by 30: the loss stays finite but leaves any
    trained model's range. The state after it scores far above 2 x the best loss on its batch,
    so its checkpoint is not written; step 7's loss is above 10 ln(vocab), so the run stops
    (exit 1) naming iter 5's checkpoint, which evaluates near the run's best."""
    from nanospa import optim

    class Explode(optim.AdamW):
        def step(self):
            super().step()
            if self.t == 6:
                for p in self.params:
                    p.data[...] *= 30.0

    monkeypatch.setattr(optim, "AdamW", Explode)
    out = tmp_path / "out"
    assert train.main(args(text_file, out, "--checkpoint_interval=1", "--eval_interval=100")) == 1
    captured = capsys.readouterr()
    assert "note: the state after iter 6 scores" in captured.err and "not saved" in captured.err
    line = [x for x in captured.err.splitlines() if x.startswith("error:")]
    assert len(line) == 1 and "exploded at iter 7" in line[0] and f"{out / 'ckpt.npz'} (iter 5)" in line[0]
    state = load_checkpoint(str(out / "ckpt.npz"))["state"]
    assert state["iter"] == 5
    monkeypatch.undo()
    assert _evaluated(text_file, out) < 2 * state["best_train_loss"]


def test_kfac_at_a_runaway_rate_stops_at_once_with_a_good_checkpoint(tmp_path, text_file, capsys):
    """The reported run: K-FAC at learning rate 3 without its KL clip reached losses of 1e14 to
    1e18 while overwriting its checkpoint every step; now it stops at the explosion, and the
    checkpoint it names evaluates near the best loss the run saw."""
    out = tmp_path / "out"
    assert train.main(args(text_file, out, "--optimizer=kfac", "--learning_rate=3", "--min_lr=0", "--kfac_kl_clip=0",
                           "--warmup_iters=0", "--checkpoint_interval=1", "--kfac_inv_interval=1",
                           "--max_iters=300")) == 1
    line = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")]
    assert len(line) == 1 and "exploded" in line[0], line
    best = float(line[0].split("(best ")[1].split(")")[0])      # the best training loss the run saw
    assert _evaluated(text_file, out) < 2 * best


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_second_sigterm_during_the_save_stops_at_once_and_keeps_the_previous_checkpoint(tmp_path, text_file,
                                                                                         capfd):
    assert train.main(args(text_file, tmp_path / "whole")) == 0
    out = tmp_path / "out"
    argv = args(text_file, out, "--checkpoint_interval=4")
    pid = os.fork()
    if pid == 0:                           # SIGTERM while logging iter 2, again while saving its checkpoint
        rc = 99
        try:
            rundir.os = _LogFault(3, "mid", T)
            checkpoint.np = _CheckpointFault(2, "npz", T, np)
            rc = train.main(argv)
        finally:
            sys.stderr.flush()
            os._exit(rc)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 143
    err = capfd.readouterr().err
    assert "SIGTERM again: stopped at once, without saving" in err and "Traceback" not in err
    assert load_checkpoint(str(out / "ckpt.npz"))["state"]["iter"] == 0     # the previous one, intact
    assert not list(out.glob("*.tmp")) and not (out / "run.lock").exists()
    assert train.main(argv + ["--init_from=resume"]) == 0
    assert key(read_log(out)) == key(read_log(tmp_path / "whole"))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_signal_before_anything_is_written_stops_at_once(tmp_path, text_file, capfd):
    """SIGTERM while the data load: nothing to save yet, so it stops at once, leaving nothing."""
    out = tmp_path / "out"
    pid = os.fork()
    if pid == 0:
        rc = 99
        try:
            real = train.load_dataset

            def loading(spec, **kw):
                os.kill(os.getpid(), T)
                return real(spec, **kw)

            train.load_dataset = loading
            rc = train.main(args(text_file, out))
        finally:
            sys.stderr.flush()
            os._exit(rc)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 143
    assert "SIGTERM before training started: stopped, nothing written" in capfd.readouterr().err
    assert not out.exists()                    # the lock's folder is gone too


# ----------------------------------------------------------------------------- signals in every phase

def _forked(argv, arm):
    """train.main(argv) in a forked child after arm() -> its exit status (-N when killed by N)."""
    pid = os.fork()
    if pid == 0:
        rc = 99
        try:
            arm()
            rc = train.main(argv)
        finally:
            sys.stdout.flush(), sys.stderr.flush()
            os._exit(rc)
    _, status = os.waitpid(pid, 0)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.parametrize("threads", [1, 2])
def test_a_signal_during_a_step_abandons_it_and_saves_the_state_before_it(tmp_path, text_file, capfd, threads):
    """SIGTERM inside step 5's gradients (on a worker thread with --threads=2, whose slice then
    sleeps 60 s): the step is dropped at once, the state after step 4 saved, the batch
    generator wound back; the resumed run is the uninterrupted one, record for record."""
    argv = lambda out: args(text_file, out, f"--threads={threads}")
    assert train.main(argv(tmp_path / "whole")) == 0
    out = tmp_path / "out"

    def arm():
        real, calls = step.sliced_loss, [0]

        def sliced(loss_fn, *batch, **kw):
            calls[0] += 1
            if calls[0] != 5:
                return real(loss_fn, *batch, **kw)
            fired = []

            def firing(*b):
                if not fired:
                    fired.append(os.kill(os.getpid(), T))
                    time.sleep(60)                  # a slice that would hold the exit up for a minute
                return loss_fn(*b)
            return real(firing, *batch, **kw)
        step.sliced_loss = sliced

    started = time.monotonic()
    assert _forked(argv(out), arm) == 143
    assert time.monotonic() - started < 45                   # it did not wait for the sleeping slice
    err = capfd.readouterr().err
    assert "SIGTERM: step abandoned; saving the state before it" in err and "Traceback" not in err
    assert load_checkpoint(str(out / "ckpt.npz"))["state"]["iter"] == 4
    assert train.main(argv(out) + ["--init_from=resume"]) == 0
    assert key(read_log(out)) == key(read_log(tmp_path / "whole"))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.parametrize("at", [6, MAX])
def test_a_signal_during_an_evaluation_leaves_it_and_the_resumed_run_completes_it(tmp_path, text_file, capfd, at):
    """SIGTERM during the evaluation at iter 6, or at the last one (its first batch): the rest
    is skipped, the state after that step is saved with its record pending, and the resumed run
    evaluates and logs it before its first step: the log is the uninterrupted run's,
    evaluations included, and the checkpoint holds nothing pending any more, so that a further
    resume (at max_iters: nothing to do) does not log the record twice."""
    argv = args(text_file, tmp_path / "whole", "--eval_iters=3")
    assert train.main(argv) == 0
    out = tmp_path / "out"

    def arm():
        real, calls = train.GPT, [0]

        def making(cfg, seed=0):
            model = real(cfg, seed=seed)
            forward = model.forward

            def counted(idx, targets=None, record=None):
                if not model.training and targets is not None:
                    calls[0] += 1                    # 6 per evaluation: 3 batches of each split
                    if calls[0] == {6: 13, MAX: 19}[at]:   # the first of that evaluation's
                        os.kill(os.getpid(), T)
                return forward(idx, targets, record)
            model.forward = counted
            return model
        train.GPT = making

    assert _forked(args(text_file, out, "--eval_iters=3"), arm) == 143
    err = capfd.readouterr().err
    assert "Traceback" not in err and f"stopped at iter {at}" in err
    state = load_checkpoint(str(out / "ckpt.npz"))["state"]
    assert state["iter"] == at and state["pending_record"]["iter"] == at
    assert "val_loss" not in state["pending_record"] and max(r["iter"] for r in read_log(out)) == at - 1
    assert train.main(args(text_file, out, "--eval_iters=3", "--init_from=resume")) == 0
    assert key(read_log(out)) == key(read_log(tmp_path / "whole"))
    assert load_checkpoint(str(out / "ckpt.npz"))["state"]["pending_record"] is None
    capfd.readouterr()
    assert train.main(args(text_file, out, "--eval_iters=3", "--init_from=resume")) == 0
    assert "nothing to do" in capfd.readouterr().out
    assert key(read_log(out)) == key(read_log(tmp_path / "whole"))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_signal_while_sampling_stops_at_once(tmp_path, text_file, capfd):
    out = tmp_path / "out"

    def arm():
        real = train.generate

        def generating(*a, **kw):
            os.kill(os.getpid(), T)
            time.sleep(60)                          # what a long sample would take
            return real(*a, **kw)
        train.generate = generating

    started = time.monotonic()
    assert _forked(args(text_file, out, "--sample_tokens=10"), arm) == 143
    assert time.monotonic() - started < 45
    assert "SIGTERM while sampling: stopped; the run is saved" in capfd.readouterr().err
    assert load_checkpoint(str(out / "ckpt.npz"))["state"]["iter"] == MAX


# ----------------------------------------------------------------------------- checkpoints checked before the log

def spoil_checkpoint(path, state=None, array=None):
    """Rewrite a checkpoint with some of its state's fields replaced, or one array set to nan."""
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    if state:
        arrays["state"] = np.array(json.dumps(dict(json.loads(str(arrays["state"])), **state)))
    if array:
        name = next(k for k in arrays if k.startswith(array))
        arrays[name] = np.full_like(arrays[name], np.nan)
    np.savez(path, **arrays)


@pytest.mark.parametrize("case, words", [
    ("negative iter", "is not a state train.py writes (state.iter=-1, not a whole number >= 0)"),
    ("nan weight", "holds non-finite values (model/"),
    ("nan optimiser moment", "holds non-finite values (optim/"),
    ("inf best loss", "state.best_val_loss=inf, not a finite number"),
    ("another run's log", "starts at iter 9, after the checkpoint's iter 8"),
    ("two runs in the log", "line 10 goes back from iter 8 to iter 0: the log holds more than one run"),
])
def test_a_checkpoint_or_log_that_fails_is_named_before_anything_is_written(case, words, tmp_path, text_file, capsys):
    """A negative iteration cut log.jsonl to 0 bytes before the error; nan weights were resumed
    and called the last good checkpoint. The loader checks the state, the arrays and the log
    whole before it touches either file."""
    out = tmp_path / "out"
    assert train.main(args(text_file, out)) == 0
    ckpt, log = out / "ckpt.npz", out / "log.jsonl"
    if case == "negative iter":
        spoil_checkpoint(ckpt, state=dict(iter=-1))
    elif case == "nan weight":
        spoil_checkpoint(ckpt, array="model/")
    elif case == "nan optimiser moment":
        spoil_checkpoint(ckpt, array="optim/m.")
    elif case == "inf best loss":
        spoil_checkpoint(ckpt, state=dict(best_val_loss=float("inf")))
    elif case == "another run's log":
        log.write_text("".join(json.dumps(dict(r, iter=r["iter"] + 9)) + "\n" for r in read_log(out)))
    else:
        log.write_bytes(log.read_bytes() * 2)
    before = ckpt.read_bytes(), log.read_bytes()
    capsys.readouterr()
    assert train.main(args(text_file, out, "--init_from=resume", "--max_iters=12")) == 2
    line = error_line(capsys)
    assert words in line and "last good" not in line.lower(), line
    assert (ckpt.read_bytes(), log.read_bytes()) == before                # nothing cut, nothing written
