"""The out_dir of a training run (train.py): who owns it, what it holds, its log, and the
signals that end the run.

    check_run_dir(out_dir)      SettingsError unless out_dir is (or can become) a folder whose
                                ckpt.npz and log.jsonl, where present, are files
    held_files(out_dir)         which of ckpt.npz and log.jsonl exist: a scratch run refuses
                                an out_dir that holds either unless told to replace them
    RunLock(out_dir)            one run per out_dir: acquire() / release(), or `with`; the new
                                owner removes the unfinished checkpoint files of a killed run
    heal_log(path, last_iter)   on resume: cut a partial last record, and the records written
                                after the checkpoint; -> (records kept, notes)
    Log(path)                   the append-only log: write(record), sync(), close()
    RunFiles(out_dir)           ckpt.npz and log.jsonl of a run: save(n, write), log(record),
                                last_good(); a failed write (a full disk) is a RunDirError that
                                says what stopped and that the last checkpoint is intact
    Interrupts, StopNow, Abandoned   SIGINT / SIGTERM: save and stop; a second one stops at once
    RunDirError                 one-line message naming the file (exit status 2)

The lock is the file out_dir/run.lock, held with flock(2) while the run lasts and removed at
its end. It holds the owner's pid, host, start time and command, so that a second run can
say who owns the folder. The kernel drops an flock when its process dies, however it dies
(SIGKILL, a crash, a reboot), so a run.lock left behind by a dead run is stale by
construction: the next run takes it and says so. Where fcntl is missing (Windows) the lock
falls back to an exclusive create, and a lock is stale when its host is this one and its pid
no longer runs.

log.jsonl is only ever appended to, one record per write(2) call, and never rewritten. A
run killed in the middle of a record, or whose disk filled up, leaves a last line without
its newline; a run killed after logging step n but before checkpointing it leaves records
newer than the checkpoint. heal_log finds both on resume and truncates the file back to the
last record the checkpoint covers, saying which file and line it cut. A damaged record
before the last one is not guessed at: RunDirError names the line.

Not here: the checkpoint file (nanospa/run/checkpoint.py); when to log and save (train.py).
"""
import contextlib
import datetime
import json
import math
import os
import signal
import socket
import sys
import threading
from pathlib import Path

from .settings import SettingsError, check_output_dir

try:
    import fcntl
except ImportError:            # Windows: exclusive create and a pid check instead
    fcntl = None

CKPT_FILE, LOG_FILE, LOCK_FILE = "ckpt.npz", "log.jsonl", "run.lock"
COMMAND_CHARS = 100    # an owner's command line is shown up to this many characters


class RunDirError(ValueError):
    """An out_dir, lock or log that cannot be used; one-line message naming the file."""


# ----------------------------------------------------------------------------- the folder

def check_run_dir(out_dir, writing=True):
    """Before anything is read or written: out_dir is a folder or can be made one (writing;
    --eval_only only reads), and its ckpt.npz and log.jsonl, where present, are regular files
    (not folders or dangling links)."""
    if writing:
        check_output_dir(out_dir, "out_dir")
    for name in (CKPT_FILE, LOG_FILE, LOCK_FILE):
        p = Path(out_dir) / name
        if p.is_symlink() and not p.exists():
            raise SettingsError(f"--out_dir={out_dir}: {p} is a dangling link (to {os.readlink(p)})")
        if p.exists() and not p.is_file():
            raise SettingsError(f"--out_dir={out_dir}: {p} is a folder, not a file; move it away")


def held_files(out_dir):
    """The run files out_dir holds: [] or some of ckpt.npz, log.jsonl."""
    return [name for name in (CKPT_FILE, LOG_FILE) if (Path(out_dir) / name).exists()]


def remove_temporaries(out_dir, names=(CKPT_FILE,)):
    """Remove the NAME.PID.tmp files (ckpt.npz by default) whose writer was killed (call with
    the lock held: no live run writes one then); -> a note, or None."""
    stale = sorted(p for name in names for p in Path(out_dir).glob(f"{name}.*.tmp"))
    for p in stale:
        p.unlink()
    return f"note: removed {len(stale)} unfinished file(s) of a killed run: {stale[0].name}" if stale else None


# ----------------------------------------------------------------------------- the lock

def _proc_start(pid):
    """The process's start time in clock ticks since boot (Linux /proc), or None: together
    with the pid it names one process, even after the pid is reused."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return None if fields[0] == "Z" else int(fields[19])   # a zombie has finished
    except (OSError, IndexError, ValueError):
        return None


def _running(owner):
    """Whether the process named in a lock's contents still runs (this host only)."""
    pid = owner.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    if os.path.isdir("/proc"):
        start = _proc_start(pid)
        return start is not None and owner.get("proc_start") in (None, start)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True            # it exists but belongs to someone else
    return True


def _describe(owner):
    when = f" since {owner['started']}" if owner.get("started") else ""
    command = str(owner.get("command", "?"))
    command = command if len(command) <= COMMAND_CHARS else command[:COMMAND_CHARS - 3] + "..."
    return f"pid {owner.get('pid', '?')} on {owner.get('host', '?')}{when} ({command})"


class RunLock:
    """One run per out_dir. acquire() creates out_dir if needed and takes out_dir/run.lock, or
    raises RunDirError naming the owner; release() removes it, and out_dir too when this lock
    created it and nothing else was written there. key: the setting that named the folder (the
    experiments' --out); temporaries: the files whose NAME.PID.tmp a killed owner may have left."""

    def __init__(self, out_dir, key="out_dir", temporaries=(CKPT_FILE,)):
        self.out_dir, self.key, self.temporaries = Path(out_dir), key, temporaries
        self.path = self.out_dir / LOCK_FILE
        self.fd, self.created, self.notes = None, False, []

    def _info(self):
        return dict(pid=os.getpid(), host=socket.gethostname(), proc_start=_proc_start(os.getpid()),
                    started=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                    command=" ".join(["python"] + sys.argv) if sys.argv and sys.argv[0] else "python")

    def _read(self, fd=None):
        try:
            if fd is None:
                text = self.path.read_text(encoding="utf-8")
            else:
                os.lseek(fd, 0, os.SEEK_SET)
                text = os.read(fd, 1 << 16).decode("utf-8")
            owner = json.loads(text)
            return owner if isinstance(owner, dict) else {}
        except (OSError, ValueError):
            return {}

    def _busy(self, owner):
        who = _describe(owner) if owner else "another run (starting up)"
        return RunDirError(f"--{self.key}={self.out_dir} is in use by {who}: one run per "
                           f"{'out_dir' if self.key == 'out_dir' else 'folder'}; wait for it, stop it, or choose "
                           f"another --{self.key} (its lock: {self.path})")

    def acquire(self):
        if not self.out_dir.exists():
            self.out_dir.mkdir(parents=True)
            self.created = True
        if fcntl is None:
            return self._acquire_by_create()
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                owner = self._read(fd)
                os.close(fd)
                raise self._busy(owner) from None
            try:                               # the file may have been removed by its last owner
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        stale = self._read(fd)
        if stale:
            self.notes.append(f"note: took over {self.path}, left by {_describe(stale)}, which ended "
                              "without releasing it (killed?)")
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, json.dumps(self._info()).encode())
        self.fd = fd
        return self._taken()

    def _taken(self):
        note = remove_temporaries(self.out_dir, self.temporaries)   # no live run writes one now
        self.notes += [note] if note else []
        return self

    def _acquire_by_create(self):
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                owner = self._read()
                if owner.get("host") == socket.gethostname() and not _running(owner):
                    self.notes.append(f"note: removed the stale {self.path} of {_describe(owner)}")
                    self.path.unlink()
                    continue
                raise self._busy(owner) from None
            os.write(fd, json.dumps(self._info()).encode())
            self.fd = fd
            return self._taken()
        raise self._busy(self._read())

    def release(self):
        if self.fd is None:
            return
        try:
            self.path.unlink()                 # while still holding it: no one can take a removed file
        except OSError:
            pass
        os.close(self.fd)
        self.fd = None
        if self.created:
            try:
                self.out_dir.rmdir()           # only if empty: a run refused before writing anything
            except OSError:
                pass

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()


# ----------------------------------------------------------------------------- signals

class StopNow(KeyboardInterrupt):
    """SIGINT or SIGTERM that stops at once, without saving: a second one, or one before the
    run has written anything (settings.run_command gives the exit status 128 + signum)."""
    def __init__(self, signum, why="again: stopped at once, without saving"):
        super().__init__(f"{signal.Signals(signum).name} {why}")
        self.signum = signum


class Abandoned(KeyboardInterrupt):
    """The first SIGINT or SIGTERM, ending a training loop: raised at once inside
    Interrupts.abandoning() (the work in progress, a step's gradients or an evaluation, is
    dropped), or where the loop asks (run/session.py's stop_point); the Session saves and stops."""
    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Interrupts:
    """SIGINT and SIGTERM (what timeout, container stops and schedulers send) during a run.
    Before arm(), while nothing is written, one stops at once (StopNow); after it, the first
    asks the loop to save a checkpoint after the current step (or to leave an evaluation) and
    stop, and a second one stops at once; after disarm() (the run is saved and done: the
    sample) one stops at once again. Installed from the main thread only."""

    def __init__(self):
        self.signum, self.armed, self.previous, self.abandon = None, False, {}, False
        self.why = "before training started: stopped, nothing written"

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self.previous = {sig: signal.signal(sig, self.handle) for sig in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def arm(self):
        """From now on the run has a state worth saving."""
        self.armed = True

    def disarm(self, why):
        """The state is saved: from now on a signal stops at once, saying `why`."""
        self.armed, self.why = False, why

    @contextlib.contextmanager
    def abandoning(self):
        """Inside, the first signal raises Abandoned at once instead of waiting for the step."""
        self.abandon = True
        try:
            yield
        finally:
            self.abandon = False

    def handle(self, signum, frame):
        if not self.armed:
            raise StopNow(signum, self.why)
        if self.signum is not None:
            raise StopNow(signum)
        self.signum = signum
        name = signal.Signals(signum).name
        if self.abandon:
            print(f"\n{name}: step abandoned; saving the state before it, then stopping ({name} again stops "
                  "at once)", file=sys.stderr, flush=True)
            raise Abandoned(signum)
        print(f"\n{name}: saving a checkpoint after this step, then stopping ({name} again stops at once)",
              file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- the log

def heal_log(path, last_iter):
    """Cut log.jsonl back to what a checkpoint at iteration `last_iter` covers, in place, by
    truncation: a partial last record (no newline, or not JSON, at the very end) and every
    record with iter > last_iter. -> (number of records kept, notes naming file and line).
    RunDirError, and nothing cut, for a damaged record that is followed by others, a log whose
    iters go back (two runs in one file) and one that starts after the checkpoint (another
    run's: cutting it would empty it)."""
    p = Path(path)
    if not p.exists():
        return 0, []
    data = p.read_bytes()
    pos, line, kept, cut, notes, last = 0, 0, 0, None, [], None
    while pos < len(data):
        line += 1
        end = data.find(b"\n", pos)
        raw = data[pos:] if end < 0 else data[pos:end]
        rest = b"" if end < 0 else data[end + 1:]
        try:
            record = json.loads(raw)
            it = record["iter"]
            ok = end >= 0 and isinstance(it, int)
        except (ValueError, KeyError, TypeError):
            ok, it = False, None
        if not ok:
            if rest.strip(b"\0 \n"):
                raise RunDirError(f"{p} line {line} is not a complete log record, and records follow it: "
                                  "the log is damaged; repair or delete that line")
            if cut is None:
                notes.append(f"note: {p} line {line} is a partial record ({len(raw)} bytes; the run was killed "
                             f"or its disk was full while writing it): cut, the log ends at line {line - 1}")
                cut = pos
            break
        if last is not None and it < last:
            raise RunDirError(f"{p} line {line} goes back from iter {last} to iter {it}: the log holds more than "
                              "one run; move it away (the checkpoint's run then starts a new log)")
        if it > last_iter and cut is None:
            if line == 1:
                raise RunDirError(f"{p} starts at iter {it}, after the checkpoint's iter {last_iter}: it is not "
                                  "this checkpoint's log; move it away (the run then starts a new log)")
            notes.append(f"note: {p} lines {line}.. hold iters {it}.. written after the checkpoint "
                         f"(iter {last_iter}): cut, the resumed run logs them again")
            cut = pos
        kept += cut is None
        last, pos = it, end + 1
    if cut is not None:                        # checked whole first: nothing is cut from a log refused
        os.truncate(p, cut)
    return kept, notes


def last_record(path):
    """The last record of log.jsonl at path (a dict), or None when there is none."""
    p = Path(path)
    lines = p.read_bytes().rstrip(b"\n").rsplit(b"\n", 1) if p.exists() else [b""]
    try:
        return json.loads(lines[-1]) if lines[-1] else None
    except ValueError:
        return None


def _finite(v):
    return None if isinstance(v, float) and not math.isfinite(v) else v


class Log:
    """log.jsonl, opened for appending (created if missing). write() puts one record on one
    line with one write(2) call; a failed write (a full disk) cuts the partial line back off
    where it can and raises OSError naming the file."""

    def __init__(self, path):
        self.path = str(path)
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, record):
        """One JSON line; nan and inf become null (JSON has no such numbers)."""
        data = (json.dumps({k: [_finite(u) for u in v] if isinstance(v, list) else _finite(v)
                            for k, v in record.items()}) + "\n").encode("utf-8")
        size = os.fstat(self.fd).st_size
        try:
            while data:                        # write(2) may write less than asked on a full disk
                data = data[os.write(self.fd, data):]
        except OSError as e:
            try:
                os.ftruncate(self.fd, size)   # needs no space; a later resume would cut it anyway
            except OSError:
                pass
            raise OSError(e.errno, e.strerror, self.path) from None

    def sync(self):
        """To the disk (before a checkpoint that covers these records is written)."""
        try:
            os.fsync(self.fd)
        except OSError as e:
            raise OSError(e.errno, e.strerror, self.path) from None

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class RunFiles:
    """The two files of a run in out_dir, written in the order that keeps them consistent: the
    log records up to iteration n reach the disk before the checkpoint of n is written.
    writer=False (every rank but 0 of a data-parallel run) makes open, write, save and close
    do nothing: one process writes a run's files."""

    def __init__(self, out_dir, saved_iter=None, writer=True):
        self.ckpt, self.log_path = os.path.join(out_dir, CKPT_FILE), os.path.join(out_dir, LOG_FILE)
        self.saved_iter, self.log, self.writer = saved_iter, None, writer
        self.resume = f"python train.py --init_from=resume --out_dir={out_dir}"

    def last_good(self):
        return f"{self.ckpt} (iter {self.saved_iter})" if self.saved_iter is not None else "none written"

    def _failed(self, path, error, n):
        return RunDirError(f"cannot write {path} ({error.strerror or error}) at iter {n}: stopped; the last "
                           f"checkpoint {self.last_good()} is intact: make room, then {self.resume}")

    def open(self):
        if self.writer:
            self.log = Log(self.log_path)

    def write(self, record, sync=False):
        """Append a record (None: none) to the log; sync: fsync it, before a checkpoint."""
        if self.log is None:
            return
        try:
            if record:
                self.log.write(record)
            if sync:
                self.log.sync()
        except OSError as e:
            raise self._failed(self.log_path, e, record["iter"] if record else "-") from None

    def save(self, n, write_checkpoint):
        """write_checkpoint(path) for the state after n steps, once the log is on disk."""
        if not self.writer:
            return
        if self.log is not None:
            self.write(None, sync=True)
        try:
            write_checkpoint(self.ckpt)
        except OSError as e:
            raise self._failed(self.ckpt, e, n) from None
        self.saved_iter = n

    def close(self):
        if self.log is not None:
            self.log.close()
