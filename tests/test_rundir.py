"""nanospa/run/rundir.py: the out_dir checks, the one-run lock (flock, and the pid fallback
without fcntl), the log's healing on resume and its failed writes. train.py's use of them
(a second run refused, SIGTERM, full disks, kills at every write) is tested in
tests/test_train_faults.py."""
import errno
import json
import os
import socket
import subprocess
import sys

import pytest

from nanospa.run import rundir
from nanospa.run.rundir import Log, RunDirError, RunLock, check_run_dir, heal_log, held_files
from nanospa.run.settings import SettingsError


def records(*iters, partial=b""):
    return b"".join(json.dumps({"iter": i, "train_loss": 1.0}).encode() + b"\n" for i in iters) + partial


def dead_pid():
    """The pid of a process that has finished and been reaped."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


# ----------------------------------------------------------------------------- the folder

def test_check_run_dir_refuses_files_where_folders_go_and_the_reverse(tmp_path):
    check_run_dir(tmp_path / "new" / "deeper")             # can be made: fine, and nothing is made
    assert not (tmp_path / "new").exists()
    (tmp_path / "file").write_text("x")
    with pytest.raises(SettingsError, match="is a file, not a folder"):
        check_run_dir(tmp_path / "file")
    with pytest.raises(SettingsError, match="is a file, so no folder can be made under it"):
        check_run_dir(tmp_path / "file" / "out")
    (tmp_path / "run" / "ckpt.npz").mkdir(parents=True)
    with pytest.raises(SettingsError, match=r"ckpt.npz is a folder, not a file"):
        check_run_dir(tmp_path / "run")
    (tmp_path / "run2").mkdir()
    (tmp_path / "run2" / "log.jsonl").symlink_to(tmp_path / "nowhere")
    with pytest.raises(SettingsError, match="log.jsonl is a dangling link"):
        check_run_dir(tmp_path / "run2")
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    with pytest.raises(SettingsError, match="dangling link"):
        check_run_dir(tmp_path / "link")


def test_held_files_are_the_checkpoint_and_the_log_not_the_lock(tmp_path):
    assert held_files(tmp_path) == []
    (tmp_path / "run.lock").write_text("{}")
    assert held_files(tmp_path) == []
    (tmp_path / "log.jsonl").write_text("")
    assert held_files(tmp_path) == ["log.jsonl"]
    (tmp_path / "ckpt.npz").write_bytes(b"")
    assert held_files(tmp_path) == ["ckpt.npz", "log.jsonl"]


# ----------------------------------------------------------------------------- the lock

def test_a_second_lock_on_the_same_folder_is_refused_and_names_the_owner(tmp_path):
    out = tmp_path / "out"
    first = RunLock(out).acquire()
    assert out.is_dir() and first.notes == []
    owner = json.loads((out / "run.lock").read_text())
    assert owner["pid"] == os.getpid() and owner["host"] == socket.gethostname()
    with pytest.raises(RunDirError) as e:
        RunLock(out).acquire()
    msg = str(e.value)
    assert f"is in use by pid {os.getpid()} on {socket.gethostname()}" in msg and "\n" not in msg
    assert str(out / "run.lock") in msg
    first.release()
    assert not out.exists()                 # it made the folder and nothing else was written there
    with RunLock(out) as again:             # free again
        (out / "log.jsonl").write_text("")
        assert again.fd is not None
    assert out.is_dir() and not (out / "run.lock").exists()


def test_a_lock_left_by_a_killed_run_is_taken_over_with_a_note(tmp_path):
    (tmp_path / "run.lock").write_text(json.dumps(dict(pid=dead_pid(), host="elsewhere", started="then",
                                                       command="python train.py")))
    with RunLock(tmp_path) as lock:          # no process holds its flock: stale, whatever it says
        assert len(lock.notes) == 1 and "ended without releasing it" in lock.notes[0]
        assert "python train.py" in lock.notes[0]
        assert json.loads((tmp_path / "run.lock").read_text())["pid"] == os.getpid()


def test_a_lock_held_by_another_process_is_refused(tmp_path):
    """A real second process holds the lock; this one is refused and names it."""
    code = ("import sys, time; from nanospa.run.rundir import RunLock; RunLock(sys.argv[1]).acquire(); "
            "print('held', flush=True); time.sleep(60)")
    p = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        assert p.stdout.readline().strip() == "held"
        with pytest.raises(RunDirError, match=f"in use by pid {p.pid} on "):
            RunLock(tmp_path).acquire()
    finally:
        p.kill()
        p.wait()
    with RunLock(tmp_path) as lock:          # the kernel dropped its flock when it died
        assert "ended without releasing it" in lock.notes[0]


def test_without_fcntl_a_stale_lock_is_one_whose_process_is_gone(tmp_path, monkeypatch):
    monkeypatch.setattr(rundir, "fcntl", None)
    host = socket.gethostname()
    lock_file = tmp_path / "run.lock"
    lock_file.write_text(json.dumps(dict(pid=dead_pid(), host=host)))
    with RunLock(tmp_path) as lock:
        assert "removed the stale" in lock.notes[0]
        with pytest.raises(RunDirError, match=f"in use by pid {os.getpid()}"):
            RunLock(tmp_path).acquire()      # this process runs: not stale
    lock_file.write_text(json.dumps(dict(pid=dead_pid(), host="another-host")))
    with pytest.raises(RunDirError, match="in use by pid .* on another-host"):
        RunLock(tmp_path).acquire()          # another host's pid cannot be checked: refused


# ----------------------------------------------------------------------------- the log

def test_heal_log_cuts_a_partial_last_record_and_names_file_and_line(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_bytes(records(0, 10, 20, partial=b'{"iter": 30, "train_lo'))
    kept, notes = heal_log(path, 20)
    assert kept == 3 and path.read_bytes() == records(0, 10, 20)
    assert len(notes) == 1 and f"{path} line 4 is a partial record" in notes[0]
    assert heal_log(path, 20) == (3, [])     # nothing left to heal


def test_heal_log_cuts_records_newer_than_the_checkpoint(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_bytes(records(0, 10, 20, 30, partial=b'{"it'))
    kept, notes = heal_log(path, 10)
    assert kept == 2 and path.read_bytes() == records(0, 10)
    assert "lines 3.. hold iters 20.. written after the checkpoint (iter 10)" in notes[0]
    path.write_bytes(records(0, 10) + b"\0\0\0\0")           # zeros after a crash: a partial record
    assert heal_log(path, 10)[0] == 2 and path.read_bytes() == records(0, 10)
    assert heal_log(tmp_path / "missing.jsonl", 10) == (0, [])


def test_heal_log_refuses_a_damaged_record_followed_by_others(tmp_path):
    path = tmp_path / "log.jsonl"
    data = records(0) + b"garbage\n" + records(10)
    path.write_bytes(data)
    with pytest.raises(RunDirError, match=f"{path} line 2 is not a complete log record, and records follow"):
        heal_log(path, 10)
    assert path.read_bytes() == data         # nothing guessed at, nothing cut


class FullDisk:
    """rundir's view of `os`: write(2) writes the first `room` bytes, then fails with ENOSPC."""

    def __init__(self, room):
        self.room = room

    def __getattr__(self, name):
        return getattr(os, name)

    def write(self, fd, data):
        if self.room <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = os.write(fd, bytes(data[:self.room]))
        self.room -= n
        return n


def test_a_failed_log_write_names_the_file_and_leaves_no_partial_record(tmp_path, monkeypatch):
    path = tmp_path / "log.jsonl"
    log = Log(path)
    log.write(dict(iter=0, train_loss=float("nan"), cos=[1.0, float("inf")]))
    first = path.read_bytes()
    assert json.loads(first) == dict(iter=0, train_loss=None, cos=[1.0, None])   # JSON has no nan
    monkeypatch.setattr(rundir, "os", FullDisk(room=7))
    with pytest.raises(OSError) as e:
        log.write(dict(iter=1, train_loss=2.0))
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(path)
    monkeypatch.undo()
    assert path.read_bytes() == first        # the 7 bytes that made it were cut back off
    log.write(dict(iter=1, train_loss=2.0))  # space again: the log goes on
    log.close()
    assert [json.loads(x)["iter"] for x in path.read_text().splitlines()] == [0, 1]


def test_heal_log_refuses_two_runs_in_one_file_and_cuts_nothing(tmp_path):
    path = tmp_path / "log.jsonl"
    data = records(0, 10, 20, 0, 10)                          # a second run appended to the first
    path.write_bytes(data)
    with pytest.raises(RunDirError, match=f"{path} line 4 goes back from iter 20 to iter 0: the log holds more "
                                          "than one run"):
        heal_log(path, 10)
    assert path.read_bytes() == data


def test_heal_log_never_empties_a_log_the_checkpoint_does_not_cover(tmp_path):
    """A checkpoint at an iteration below the log's first record (negative: every record is
    newer) truncated log.jsonl to 0 bytes before the resume failed. Now: refused, nothing cut."""
    path = tmp_path / "log.jsonl"
    path.write_bytes(records(0, 10, 20))
    with pytest.raises(RunDirError, match=r"starts at iter 0, after the checkpoint's iter -1: it is not this checkpoint"):
        heal_log(path, -1)
    assert path.read_bytes() == records(0, 10, 20)
    path.write_bytes(records(10, 20))
    with pytest.raises(RunDirError, match="starts at iter 10, after the checkpoint's iter 5"):
        heal_log(path, 5)
    path.write_bytes(records(0, 10, 20, partial=b'{"it'))       # the partial record after the cut: cut too
    assert heal_log(path, 10)[0] == 2 and path.read_bytes() == records(0, 10)
