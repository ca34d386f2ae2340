"""README.md's commands run as written, so that the documentation cannot drift from the code,
and so do those of the docs pages README's operator manual moved to (DOCS).

Every command of README's code blocks runs in a fresh folder with a fresh cache, as a user
would type it (python, train.py and data.py resolved to this checkout; `mpiexec -n N python
...` with the mpiexec of the mpi extra, skipped without it). Each page runs in a folder of its own. A command that ends
within START_S seconds must exit 0; a longer one must have started without an error (no
`error:` line, no traceback) when it is stopped with SIGTERM: train.py once it announces
its log (it has checked its settings, data, model and output paths and written its first
checkpoint), the others after START_S seconds. The train.py commands run one after another
in one folder, like a reader following the README (the resume needs the first run); the
other commands run beside them, and so do the ```python blocks. Commands that need a
GPU, matplotlib or the network skip when those are absent; pip and pytest are not run.

The experiments' synopsis line (NAME|NAME [--key=a|b] ...) is expanded and each name and
setting is parsed by the command's own settings parser, as are the `python ...` commands
written inline in the prose (the benchmark's, for instance, take minutes to run).
"""
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from nanospa import backend

pytestmark = pytest.mark.slow       # the full suite only: python -m pytest -m 'not slow' skips it

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
DOCS = {name: (ROOT / name).read_text(encoding="utf-8") for name in ("README.md", "docs/running.md", "docs/beyond.md")}
START_S = 4            # a command still running after this long (train.py: after its "log:" line) is stopped
TRAIN_START_S = 60     # at most this long for train.py to announce its log
STOP_S = 60            # after SIGTERM, at most this long to exit
PLACEHOLDERS = {"/path/to/input.txt": "input.txt"}   # README's example paths -> files the test writes


def has(module):
    try:
        __import__(module)
        return True
    except ImportError:
        return False


def block_commands(text):
    """The commands of the indented code blocks (comments removed), in order."""
    out = []
    for line in text.splitlines():
        if line.startswith("    ") and line.strip().startswith(("python ", "pip ", "mpiexec ")):
            out.append(re.split(r"\s+#\s", line.strip(), maxsplit=1)[0].strip())
    return out


def python_blocks(text):
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def inline_commands(text):
    return [c for c in re.findall(r"`(python [^`]+)`", text) if "\n" not in c]


def is_synopsis(cmd):
    return bool(re.search(r"[|\[\]]", cmd))


def mpiexec():
    """The mpiexec beside this Python (the mpich wheel's), else on PATH, else None."""
    import shutil
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else shutil.which("mpiexec")


def skip_reason(cmd):
    if cmd.startswith("pip ") or "pytest" in cmd:
        return "installs packages or runs the test suite"
    if cmd.startswith("mpiexec ") and (mpiexec() is None or not has("mpi4py")):
        return "needs the mpi extra"
    if ("--preset=gpu" in cmd or "--device=cuda" in cmd or "gpu_check" in cmd) and not backend.cuda_available():
        return "needs a GPU with CuPy (tests/test_gpu_commands.py runs it on the CuPy stand-in)"
    if ("--plot=" in cmd or "nanospa.plot" in cmd) and not has("matplotlib"):
        return "needs matplotlib"
    if re.search(r"--data=(shakespeare|wikitext2|wikitext103)(\s|$)", cmd):
        return "downloads its data"
    if "nanospa.experiments recipes" in cmd and "--data=" not in cmd:
        from nanospa.experiments.recipes import shared_data
        if not shared_data().is_file():
            return "needs tiny Shakespeare in ../shared/data (or --data=PATH)"
    return None


def argv_of(cmd, folder):
    for example, name in PLACEHOLDERS.items():
        cmd = cmd.replace(example, str(folder / name))
    words = shlex.split(cmd)
    launcher = []
    if words[0] == "mpiexec":                             # mpiexec -n N python ...
        i = words.index("python")
        launcher, words = [mpiexec()] + words[1:i], words[i:]
    assert words[0] == "python", cmd
    if words[1].endswith(".py"):                          # train.py, data.py: this checkout's
        words[1] = str(ROOT / words[1])
    return launcher + [sys.executable] + words[1:]


def environment(cache):
    return dict(os.environ, NANOSPA_CACHE=str(cache), PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1",
                MPLBACKEND="Agg", NANOSPA_DEBUG="")


def run_readme_command(cmd, folder, cache):
    """-> (cmd, returncode or 'stopped', stdout, stderr). Waits for train.py's "log:" line (or
    START_S for other commands), then SIGTERMs the command's process group."""
    p = subprocess.Popen(argv_of(cmd, folder), cwd=folder, env=environment(cache), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    out, err = [], []
    readers = [threading.Thread(target=lambda s=s, b=b: b.extend(iter(s.readline, "")), daemon=True)
               for s, b in ((p.stdout, out), (p.stderr, err))]
    for r in readers:
        r.start()
    training = " train.py" in f" {cmd}" and "--help" not in cmd
    deadline = time.time() + (TRAIN_START_S if training else START_S)
    while p.poll() is None and time.time() < deadline:
        if training and any(line.startswith("log: ") for line in out):
            break
        time.sleep(0.05)
    status = p.poll()
    if status is None:
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(STOP_S)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        status = "stopped"
    for r in readers:
        r.join(5)
    return cmd, status, "".join(out), "".join(err)


def check(result):
    cmd, status, out, err = result
    assert "Traceback" not in err and not any(line.startswith("error:") for line in err.splitlines()), \
        f"{cmd}\n{err[-3000:]}"
    if status != "stopped":
        assert status == 0, f"{cmd} exited {status}\n{err[-3000:]}"


def test_readme_lists_the_commands_this_test_runs():
    cmds = block_commands(README)
    assert "python train.py" in cmds and any(c.startswith("python -m nanospa.signal") for c in cmds)
    assert any(c.startswith("python -m nanospa.experiments") for c in cmds) and python_blocks(README)
    assert any(c.startswith("mpiexec -n 2 python train.py") for c in cmds)         # README: Several processes
    assert 'pip install -e ".[mpi]"' in cmds                                       # the mpi extra, in Install
    assert any("--init_from=resume" in c for c in block_commands(DOCS["docs/running.md"]))


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="needs POSIX process groups")
@pytest.mark.parametrize("page", list(DOCS))
def test_every_readme_command_runs_as_written(tmp_path, page):
    text = DOCS[page]
    (tmp_path / "input.txt").write_text("To be, or not to be, that is the question.\n" * 400, encoding="utf-8")
    cache = tmp_path / "cache"
    runnable, skipped = [], []
    for cmd in block_commands(text):
        reason = skip_reason(cmd)
        if reason:
            skipped.append((cmd, reason))
        elif not is_synopsis(cmd):
            runnable.append(cmd)
    training = [c for c in runnable                      # sample.py and nanospa.plot need a run
                if any(word in f" {c}" for word in (" train.py", " sample.py", " -m nanospa.plot"))]
    signal_cmds = [c for c in runnable if "nanospa.signal" in c]
    others = [c for c in runnable if c not in training + signal_cmds]
    assert runnable or skipped or page != "README.md"

    def chain(cmds):
        return [run_readme_command(c, tmp_path, cache) for c in cmds]

    def snippets():                           # the ```python blocks, each in a fresh interpreter
        return [(f"```python block {i}", *_python(code, tmp_path, cache)) for i, code in enumerate(python_blocks(text))]

    with ThreadPoolExecutor(3) as pool:       # train.py's commands in order; the others beside them
        futures = [pool.submit(chain, training), pool.submit(chain, signal_cmds), pool.submit(chain, others),
                   pool.submit(snippets)]
        results = [r for f in futures for r in f.result()]
    for r in results:
        check(r)
    ran = {cmd for cmd, *_ in results}
    if page == "README.md":
        assert "python train.py" in ran
    if page == "docs/running.md":
        assert any("--init_from=resume" in c for c in ran)   # it found the first run's checkpoint


def _python(code, folder, cache):
    p = subprocess.run([sys.executable, "-c", code], cwd=folder, env=environment(cache), capture_output=True,
                       text=True, timeout=120)
    return p.returncode, p.stdout, p.stderr


def expand(cmd):
    """A synopsis like `python -m nanospa.experiments a|b [--preset=x|y] [--data=...]` ->
    command lines naming each choice, placeholders (..., N, a,b) left out."""
    words = shlex.split(cmd)
    head, names, options = words[:3], words[3].split("|"), []
    for w in words[4:]:
        key, _, values = w.strip("[]").partition("=")
        concrete = [v for v in values.split("|") if v and v != "..." and not v.isupper() and v != "a,b"]
        options.append((key, concrete))
    lines = []
    for name in names:
        lines.append(head + [name])
        for key, values in options:
            lines += [head + [name, f"{key}={v}"] for v in values] or [head + [name, f"{key}"]]
    return lines


def parse_only(words):
    """The command's own settings parser on the line's settings (no run); raises on a bad one."""
    from nanospa.run.settings import SettingsError
    if words[:2] == ["python", "train.py"]:
        import train
        from nanospa.run.session import settings_of
        s = settings_of(words[2:], train.DEFAULTS, train.PRESETS)
        train.check_settings(s)
        return
    module, rest = words[2], words[3:]
    if module == "nanospa.bench":
        from nanospa.bench import command as bench
        bench.parse_args(rest)
    elif module == "nanospa.experiments":
        import importlib
        from nanospa.experiments import runner
        from nanospa.experiments.__main__ import COMMANDS
        assert rest[0] in COMMANDS, rest[0]
        spec = importlib.import_module(f"nanospa.experiments.{rest[0]}")
        keys = [w for w in rest[1:] if "=" not in w]          # a key without a concrete value
        for key in keys:
            if key[2:] not in {**runner.DEFAULTS, **getattr(spec, "EXTRA", {})}:
                raise SettingsError(f"unknown setting {key}")
        values = [w for w in rest[1:] if "=" in w]
        if rest[0] == "fig1":
            spec.settings([v for v in values if v.split("=")[0] in ("--preset", "--data")])
        elif rest[0] == "causality":
            spec.settings(values)
        else:
            runner.settings_for(spec, values)
    else:
        raise AssertionError(f"no parser for {' '.join(words)}")


def test_synopsis_and_inline_commands_parse(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    lines = []
    for text in DOCS.values():
        lines += [w for c in block_commands(text) if is_synopsis(c) and not skip_reason(c) for w in expand(c)]
        lines += [shlex.split(c) for c in inline_commands(text)
                  if not is_synopsis(c) and c.split()[1] in ("train.py", "-m") and not skip_reason(c)
                  and (c.split()[1] == "train.py" or c.split()[2] in ("nanospa.bench", "nanospa.experiments"))]
    assert len(lines) >= 5                       # the parser found the pages' commands
    for words in lines:
        try:
            parse_only(words)
        except (ValueError, RuntimeError) as e:
            pytest.fail(f"README: {' '.join(words)}: {e}")
