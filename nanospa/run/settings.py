"""--key=value settings, the one parser of every nanospa command: train.py,
python -m nanospa.experiments, python -m nanospa.signal and python -m nanospa.bench.

    parse_settings(argv, defaults, presets=None)  -> dict (plus "_explicit": the keys set)
    SettingsError                                   a bad flag (one-line message; exit status 2)
    wants_help(argv)                                -h, --help or help among the arguments
    help_text(title, defaults, notes, presets)      the --help screen
    source_notes(*paths)                            --help notes from a defaults block's comments
    fail(error)                                     print "error: ..." on one line; -> 2
    run_command(fn, *args, diverged=())             fn(*args) -> exit status, every failure one
                                                    `error:` line and status 2 (NANOSPA_DEBUG=1:
                                                    the traceback instead)
    describe(error)                                 the one-line message of a failure
    check_output_dir(path, key), check_output_file(path, key)
                                                    an output path can be written, checked
                                                    before any work starts (SettingsError)
    encode_prompt(encode, text, vocab_size, key)    a prompt's ids (train.py's sample,
                                                    sample.py), checked likewise

Exit status of every command: 0 done, 1 training diverged (train.py only), 2 bad input or an
environment fault (a path that cannot be read or written, a full disk, out of memory, a
malformed checkpoint, a bad setting; one line starting `error:` on stderr), 130 / 143
interrupted by SIGINT / SIGTERM (train.py saves a checkpoint first). With NANOSPA_DEBUG=1 in
the environment a failure raises instead, with its traceback (for bug reports).

A value is read with ast.literal_eval and must have the default's type (a bare word is a
string; an int is accepted where a float is expected); a float must be finite (1e999 reads as
inf, and no setting means anything by it), in every command. A tuple default takes a
comma-separated list of its element type: --depths=1,4,12 or --lrs=1e-3,3e-3. A bare
--flag sets a bool key to True. --preset=NAME is applied before every other setting,
wherever it stands, so explicit settings win over the preset's; an empty preset name
applies nothing.

Not here: what a good value of a key is beyond its type (each command checks its own ranges),
and the defaults themselves (each command owns its defaults block).
"""
import ast
import contextlib
import difflib
import math
import os
import re
import signal
import sys
import threading
from pathlib import Path

import numpy as np

EXIT_DIVERGED, EXIT_BAD_INPUT = 1, 2   # 0 done
EXIT_SIGNAL_BASE, SIGINT = 128, 2     # stopped by signal N: 128 + N (SIGINT 130, SIGTERM 143)
DEBUG_ENV = "NANOSPA_DEBUG"   # set to 1: failures raise with their traceback instead of one error: line
HELP_COLUMN = 30     # --help: the notes start after this many characters of --key=default


class SettingsError(ValueError):
    """A bad command-line setting; the message is one line naming the bad value."""


def _literal(raw):
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return raw


def _scalar(key, raw, value, default):
    if isinstance(default, str):
        return value if isinstance(value, str) else raw
    if isinstance(default, bool):
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        ok = isinstance(value, bool)
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(default, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        try:
            value = float(value) if ok else value
        except OverflowError:                  # an int beyond any float
            value = math.inf
        if ok and not math.isfinite(value):    # 1e999 reads as inf: no setting means that
            raise SettingsError(f"--{key}={raw}: must be a finite number")
    else:
        ok = isinstance(value, type(default))
    if not ok:
        raise SettingsError(f"--{key}={raw}: expected {type(default).__name__} like the default {default!r}")
    return value


def convert(key, raw, default, element=None):
    """'--key=raw' -> a value of the default's type. Tuples: comma-separated elements of the
    type of `element` (default: the tuple's first element, else str)."""
    if isinstance(default, tuple):
        proto = element if element is not None else (default[0] if default else "")
        parts = [p.strip() for p in str(raw).strip("()[] ").split(",") if p.strip()]
        return tuple(_scalar(key, raw, _literal(p), proto) for p in parts)
    return _scalar(key, raw, _literal(raw), default)


def parse_settings(argv, defaults, presets=None, elements=None):
    """Apply --key=value overrides to a copy of `defaults`; raises SettingsError.

    presets: {name: {key: value}} for --preset=NAME (only when 'preset' is a key).
    elements: {key: prototype} for tuple keys whose default is empty."""
    settings, pairs = dict(defaults), []
    elements = elements or {}
    for arg in argv:
        key, eq, raw = arg[2:].partition("=")
        if not arg.startswith("--") or not key:
            raise SettingsError(f"unexpected argument {arg!r}: settings look like --key=value")
        if key not in settings:
            close = difflib.get_close_matches(key, list(settings), n=1)
            hint = f"; did you mean --{close[0]}?" if close else "; --help lists the keys"
            raise SettingsError(f"unknown setting --{key}{hint}")
        if not eq and not isinstance(settings[key], bool):
            raise SettingsError(f"--{key} needs a value: --{key}=VALUE")
        pairs.append((key, raw if eq else "True"))
    explicit = set()
    for key, raw in sorted(pairs, key=lambda kv: kv[0] != "preset"):  # stable sort: preset first
        settings[key] = convert(key, raw, defaults[key], elements.get(key))
        explicit.add(key)
        if key == "preset" and settings[key]:
            if not presets or settings[key] not in presets:
                raise SettingsError(f"unknown preset {settings[key]!r}; presets: {', '.join(presets or [])}")
            settings.update(presets[settings[key]])
    settings["_explicit"] = explicit
    return settings


def wants_help(argv):
    return any(a in ("-h", "--help", "help") for a in argv)


def help_text(title, defaults, notes=None, presets=None):
    """The --help screen: every key with its default and a one-line note."""
    notes = notes or {}
    lines = [title, "", "settings (--key=value):"]
    flags = {key: f"--{key}=" + (",".join(str(v) for v in value) if isinstance(value, tuple) else repr(value))
             for key, value in defaults.items()}
    width = min(HELP_COLUMN, max(map(len, flags.values()), default=0))
    for key, flag in flags.items():
        lines.append(f"  {flag:<{width}}  {notes.get(key, '')}".rstrip())
    for name, preset in (presets or {}).items():
        lines.append(f"preset {name}: " + " ".join(f"{k}={v}" for k, v in preset.items()))
    return "\n".join(lines)


NOTE = re.compile(r"^[ \t]+(\w+)(?::[ \t]*\w+)?[ \t]*=.*?#[ \t]*(.+)$", re.M)  # indented: key = value  # note


def source_notes(*paths):
    """{key: comment} from the lines `key=value,  # comment` (dict entries) or
    `key: type = value  # comment` (dataclass fields) of source files, so that a defaults
    block's comments are its --help lines. The first file that has a key wins."""
    notes = {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for key, note in NOTE.findall(f.read()):
                notes.setdefault(key, note.strip())
    return notes


PLOT_HINT = "pip install -e .[plot]  (or: pip install matplotlib)"


def need_matplotlib(what):
    """SettingsError, before any work, when `what` (a setting or command) needs matplotlib
    and it is not installed."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise SettingsError(f"{what} needs matplotlib, which is not installed: {PLOT_HINT}") from None


def fail(error):
    """Print `error: MESSAGE` on one line of stderr; -> the exit status for bad input."""
    # one write of the whole line: under mpiexec the ranks' lines must not interleave
    sys.stderr.write("error: " + " ".join(str(error).split()) + "\n")
    sys.stderr.flush()
    return EXIT_BAD_INPUT


# ----------------------------------------------------------------------------- failures

def debugging():
    """True when NANOSPA_DEBUG is set (to anything but "" or "0"): failures keep their traceback."""
    return os.environ.get(DEBUG_ENV, "").strip() not in ("", "0")


def describe(error):
    """The one-line message of a failure. ValueError and RuntimeError (SettingsError, DataError,
    CheckpointError, DeviceError, GPTConfig's checks) carry their own; an OSError is named by
    its file; anything else is reported as unexpected, with the debug switch."""
    if isinstance(error, MemoryError):          # NumPy's _ArrayMemoryError, CuPy's OutOfMemoryError
        return (f"out of memory ({' '.join(str(error).split()) or type(error).__name__}); use a smaller "
                "batch_size, block_size or model")
    if isinstance(error, OSError):
        where = " -> ".join(str(f) for f in (error.filename, error.filename2) if f is not None)
        what = error.strerror or str(error) or type(error).__name__
        return f"{where}: {what}" if where else f"{type(error).__name__}: {what}"
    if isinstance(error, (ValueError, RuntimeError)) and str(error):
        return str(error)
    return (f"unexpected {type(error).__name__}: {error} (a bug in nanospa? {DEBUG_ENV}=1 shows the "
            "traceback)")


class _Stopper:
    """stop_on_signals' handler: raises at once, or, inside ``held()``, when the block ends."""

    def __init__(self, why):
        self.why, self.depth, self.pending = why, 0, None

    def _raise(self, signum):
        e = KeyboardInterrupt(f"{signal.Signals(signum).name} {self.why}")
        e.signum = signum
        raise e

    def handle(self, signum, frame):
        if self.depth:
            self.pending = self.pending or signum
        else:
            self._raise(signum)

    @contextlib.contextmanager
    def held(self):
        """A block a signal does not interrupt (a finished result being recorded): a signal
        that comes inside it stops the command when the block has ended."""
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            if not self.depth and self.pending:
                signum, self.pending = self.pending, None
                self._raise(signum)


@contextlib.contextmanager
def stop_on_signals(why):
    """SIGINT / SIGTERM inside the block stop at once: a KeyboardInterrupt "SIGTERM why"
    carrying signum, which run_command turns into one line and exit 128 + signum (the
    experiments' worker pool uses it to stop its workers too), except inside the yielded
    object's ``held()`` blocks, which finish first. Main thread only."""
    stopper = _Stopper(why)
    if threading.current_thread() is not threading.main_thread():
        yield stopper
        return
    previous = {sig: signal.signal(sig, stopper.handle) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stopper
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_command(fn, *args, diverged=()):
    """fn(*args) -> its exit status; a failure prints one `error:` line and gives EXIT_BAD_INPUT
    (EXIT_DIVERGED for the exception types `diverged`), Ctrl-C gives 130. With NANOSPA_DEBUG=1
    they raise instead, with their traceback."""
    try:
        return fn(*args)
    except diverged as e:
        if debugging():
            raise
        fail(e)
        return EXIT_DIVERGED
    except KeyboardInterrupt as e:              # Ctrl-C, or train.py's second SIGINT / SIGTERM
        if debugging():
            raise
        print(str(e) or "interrupted", file=sys.stderr)
        return EXIT_SIGNAL_BASE + getattr(e, "signum", SIGINT)
    except Exception as e:                      # noqa: BLE001 -- the one place that turns them into a line
        if debugging():
            raise
        return fail(describe(e))


def _existing_ancestor(p):
    while not (p.exists() or p.is_symlink()) and p != p.parent:
        p = p.parent
    return p


def _check_path_text(path, key):
    """An output path that is empty or blank (Path("") is the current folder: a run would write
    into wherever it was started) or holds a NUL byte (no file system takes one) is refused."""
    if not str(path).strip():
        raise SettingsError(f"--{key} is empty: name a folder or file to write to")
    if "\0" in str(path):
        raise SettingsError(f"--{key}={str(path)!r}: a path cannot hold a NUL byte")


def check_output_dir(path, key):
    """SettingsError naming --key unless `path` is a folder or one can be made there: not a
    file, not a dangling link, not under a file, below a writable folder. Nothing is created."""
    _check_path_text(path, key)
    p = Path(path)
    if p.is_symlink() and not p.exists():
        raise SettingsError(f"--{key}={path}: a dangling link (to {os.readlink(p)}), not a folder")
    if p.exists() and not p.is_dir():
        raise SettingsError(f"--{key}={path}: {path} is a file, not a folder")
    base = _existing_ancestor(p if p.is_absolute() else Path.cwd() / p)
    if not base.is_dir():
        raise SettingsError(f"--{key}={path}: {base} is a file, so no folder can be made under it")
    if not os.access(base, os.W_OK | os.X_OK):
        raise SettingsError(f"--{key}={path}: {base} is not writable")


def check_output_file(path, key):
    """SettingsError naming --key unless a file can be written at `path`: not a folder, its
    folder exists (it is not created) and is writable."""
    _check_path_text(path, key)
    p = Path(path)
    if p.is_dir():
        raise SettingsError(f"--{key}={path}: a folder, not a file")
    folder = p.parent if str(p.parent) else Path(".")
    if not folder.is_dir():
        what = "is a file" if folder.exists() else "does not exist"
        raise SettingsError(f"--{key}={path}: its folder {folder} {what}")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise SettingsError(f"--{key}={path}: its folder {folder} is not writable")


def encode_prompt(encode_fn, text, vocab_size, key="start"):
    """A prompt's ids, (t,) int64, checked before any model is built or trained: SettingsError
    naming --key for text that is not UTF-8 (a lone surrogate: undecodable command-line bytes,
    which no tokenizer can encode), an empty encoding, or an id beyond vocab_size."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise SettingsError(f"--{key}: the prompt is not UTF-8 text ({e.reason}, character {e.start}: "
                            f"{text[e.start]!r}); give it as UTF-8") from None
    idx = np.asarray(encode_fn(text), dtype=np.int64).ravel()
    if idx.size == 0:
        raise SettingsError(f"--{key}: an empty prompt (give at least one character)")
    if idx.min() < 0 or idx.max() >= vocab_size:
        raise SettingsError(f"--{key}: the prompt's token ids reach {idx.max()}, beyond the model's vocabulary "
                            f"of {vocab_size}")
    return idx
