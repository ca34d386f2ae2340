"""The architecture rules, checked on the source with `ast` (nothing is imported):

- nanospa/signal/ stands alone: no module there except __main__.py imports anything from
  nanospa outside signal/, nor the top-level data.py / train.py, at module level or inside
  functions (relative imports resolved; importlib.import_module with a constant counts);
- the core (nanospa/*.py and nanospa/signal/) never imports the infrastructure (run/, bench/,
  experiments/, train.py); it reaches the extensions only by name, through the registries'
  lookup (importlib.import_module of nanospa.beyond from model.py and config.py, of
  nanospa.signal.beyond from signal/): never a static import, so the paper's model loads none
  of them (tests/test_architecture.py runs it and looks); beyond/ imports no infrastructure but
  the worker threads;
- no import cycle among nanospa's modules (and data.py, train.py), counting imports inside
  functions, except tensor.py with the primitive modules its operator sugar calls
  (functions.py, shape_ops.py, fused.py, as far as they exist), and the lookups by name of
  the extensions, which sit above the core they extend (beyond/ subclasses model.py's variants);
- README's reading guide lists every core file with its line count and their total, and its
  size table every folder's files and lines, as they are (the size of the project in view,
  where a per-file cap used to stand);
- every one of those modules opens with a docstring.
"""
import ast
import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "nanospa"
TOP_LEVEL = ("data", "train", "sample")       # the repository's top-level modules
SIGNAL = "nanospa.signal"
SIGNAL_CLI = "nanospa.signal.__main__"        # the one module of signal/ that may reach outside
SUGAR_OWNER = "nanospa.tensor"                # its operator sugar imports these inside methods
SUGAR_PRIMITIVES = ("nanospa.functions", "nanospa.shape_ops", "nanospa.fused")


def module_name(path):
    """nanospa/signal/kernels.py -> nanospa.signal.kernels; a package's __init__.py -> the package."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_files():
    """{module name: path} of every module under nanospa/ and the top-level modules."""
    files = {module_name(p): p for p in sorted((ROOT / PACKAGE).rglob("*.py"))}
    files.update({name: ROOT / f"{name}.py" for name in TOP_LEVEL})
    return files


FILES = source_files()


def is_package(name):
    return FILES[name].name == "__init__.py"


def resolve(name, node):
    """The absolute module a `from ... import` refers to (relative levels resolved)."""
    if not node.level:
        return node.module
    base = name.split(".") if is_package(name) else name.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def known(dotted):
    """The longest prefix of `dotted` that is one of our modules, or None (third party)."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in FILES:
            return candidate
    return None


@functools.lru_cache(maxsize=None)
def parsed(name):
    """The parsed source of one of our modules, read once per session (the tests only read it)."""
    return ast.parse(FILES[name].read_text(encoding="utf-8"))


@functools.lru_cache(maxsize=None)
def _imports_on_disk(name, by_name):
    return tuple(_imports(name, parsed(name), by_name))


def imports(name, tree=None, by_name=False):
    """[(imported module, line)] of every import of one of our modules anywhere in `name`'s
    source (the file, or `tree` when given): module level, inside functions and classes, and
    importlib.import_module("...") (by_name=True: only those)."""
    return list(_imports_on_disk(name, by_name)) if tree is None else _imports(name, tree, by_name)


def _imports(name, tree, by_name=False):
    out = []
    for node in ast.walk(tree):
        lookup = (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr == "import_module" and node.args
                  and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str))
        if by_name and not lookup:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = resolve(name, node)
            # `from P import x`: the submodule P.x where x is one, else P itself
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in FILES else base for a in node.names]
        elif lookup:
            targets = [node.args[0].value]
        else:
            continue
        out += [(m, node.lineno) for m in map(known, targets) if m is not None]
    return out


EXTENSIONS = ("nanospa.beyond", "nanospa.signal.beyond")   # reached from the core by name only


def is_extension(target):
    return any(target == e or target.startswith(e + ".") for e in EXTENSIONS)


def graph(trees=None):
    """{module: {imported module: first line}} over all our modules. lookups(g): the edges
    that are lookups by name (importlib) of an extension from outside the extensions."""
    trees = trees or {}
    g = {}
    for name in FILES:
        edges = {}
        for target, line in imports(name, trees.get(name)):
            if target != name:
                edges.setdefault(target, line)
        g[name] = edges
    g["__lookups__"] = set()
    for name in FILES:
        if not is_extension(name):
            looked_up = set(imports(name, trees.get(name), by_name=True))           # {(target, line)}
            static = {t for t, line in imports(name, trees.get(name)) if (t, line) not in looked_up}
            g["__lookups__"] |= {(name, t) for t, _ in looked_up if is_extension(t) and t not in static}
    return g


def signal_violations(g):
    """['module:line imports target'] for signal modules (not __main__) importing outside signal/."""
    bad = []
    for name, edges in g.items():
        if not (name == SIGNAL or name.startswith(SIGNAL + ".")) or name == SIGNAL_CLI:
            continue
        for target, line in edges.items():
            if not (target == SIGNAL or target.startswith(SIGNAL + ".")):
                bad.append(f"{FILES[name].relative_to(ROOT)}:{line} imports {target}")
    return bad


def cycles(g):
    """The strongly connected components with more than one module (Tarjan), after removing
    the allowed edges tensor -> its sugar's primitives."""
    lookups = g.get("__lookups__", set())
    g = {m: {t for t in edges if not (m == SUGAR_OWNER and t in SUGAR_PRIMITIVES) and (m, t) not in lookups}
         for m, edges in g.items() if m != "__lookups__"}
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def planted(name, source):
    """The parsed trees with `name`'s source replaced: to check the checks."""
    return {name: ast.parse(source)}


# ------------------------------------------------------------------ the rules

def test_signal_stands_alone():
    bad = signal_violations(graph())
    assert not bad, "nanospa/signal/ must not import from outside it:\n" + "\n".join(bad)


def cycle_path(g, comp):
    """One concrete cycle through the strongly connected component `comp`: a -> b -> ... -> a
    (breadth-first, so the shortest one back to its first module)."""
    start, inside = comp[0], set(comp)
    prev, todo = {start: None}, [start]
    while todo:
        v = todo.pop(0)
        for w in sorted(g[v]):
            if w == start:                                # back: start -> ... -> v -> start
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return " -> ".join(path[::-1] + [start])
            if w in inside and w not in prev:
                prev[w] = v
                todo.append(w)
    return " <-> ".join(comp)


def test_no_import_cycles():
    g = graph()
    found = cycles(g)
    assert not found, "import cycles (each the shortest through its first module):\n" + "\n".join(
        cycle_path(g, c) + f"   [component: {', '.join(c)}]" for c in found)


README = (ROOT / "README.md").read_text(encoding="utf-8")
CORE_EXTRA = ("data.py", "train.py")                       # the core outside nanospa/
SIGNAL_COMMAND = ("__init__.py", "__main__.py", "table.py")   # signal/'s package and command
FOLDERS = {"nanospa/": "nanospa/*.py", "nanospa/signal/": "nanospa/signal/*.py",
           "nanospa/signal/beyond/": "nanospa/signal/beyond/*.py", "nanospa/beyond/": "nanospa/beyond/*.py",
           "nanospa/run/": "nanospa/run/*.py", "nanospa/bench/": "nanospa/bench/*.py",
           "nanospa/experiments/": "nanospa/experiments/*.py", "nanospa/plot/": "nanospa/plot/*.py",
           "train.py, data.py": "train.py data.py", "sample.py": "sample.py"}
INFRASTRUCTURE = ("nanospa.run", "nanospa.bench", "nanospa.experiments", "nanospa.plot", "train", "sample")


def count(path):
    return len(path.read_text(encoding="utf-8").splitlines())


def core_files():
    """{path relative to nanospa/ (or the root for data.py, train.py): lines} of the core."""
    out = {p.name: count(p) for p in (ROOT / PACKAGE).glob("*.py") if p.name != "__init__.py"}
    out.update({f"signal/{p.name}": count(p) for p in (ROOT / PACKAGE / "signal").glob("*.py")
                if p.name not in SIGNAL_COMMAND})
    out.update({name: count(ROOT / name) for name in CORE_EXTRA})
    return out


def readme_table(title_row):
    """The rows of README's markdown table whose header starts with title_row."""
    lines = README.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title_row))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows


def folder_sizes():
    out = {}
    for name, patterns in FOLDERS.items():
        files = sorted({p for pattern in patterns.split() for p in ROOT.glob(pattern)})
        out[name] = (len(files), sum(count(p) for p in files))
    return out


def test_readme_reading_guide_is_the_core_with_its_sizes():
    """README's two reading lists (read first, read second) together are the core, each file
    once with its line count, and each list's total is its files' sum."""
    listed = {}
    for title in ("| read first | files (lines) |", "| read second | files (lines) |"):
        rows = readme_table(title)
        part = {}
        for step, cell in rows[:-1]:
            for name, n in re.findall(r"([\w/]+\.py) \((\d+)\)", cell):
                assert name not in listed and name not in part, f"README lists {name} twice"
                part[name] = int(n)
        total = int(re.sub(r"\D", "", rows[-1][1]))
        assert total == sum(part.values()), f"README's {title.split('|')[1].strip()!r} total should be {sum(part.values()):,}"
        listed.update(part)
    actual = core_files()
    assert listed == actual, ("README's reading guide is out of date: update it to "
                              + ", ".join(f"{k} ({v})" for k, v in actual.items()))


def test_readme_size_table_is_the_tree():
    rows = {r[0].strip("`"): (int(r[2].replace(",", "")), int(r[3].replace(",", "")))
            for r in readme_table("| folder | what | files | lines |")}
    actual = folder_sizes()
    assert rows == actual, f"README's size table should read {actual}"


def infrastructure_imports(g):
    """['module:line imports target'] where the core or beyond/ imports what it must not."""
    bad = []
    lookups = g.get("__lookups__", set())
    for name, edges in g.items():
        if name == "__lookups__":
            continue
        core = name in ("nanospa",) or (name.count(".") == 1 and name.startswith("nanospa.")
                                        and not any(name.startswith(i) for i in INFRASTRUCTURE + ("nanospa.beyond",))) \
            or (name.startswith(SIGNAL) and name != SIGNAL_CLI and not is_extension(name))
        beyond = name.startswith("nanospa.beyond") or (name.startswith(SIGNAL) and is_extension(name))
        for target, line in edges.items():
            infra = any(target == i or target.startswith(i + ".") for i in INFRASTRUCTURE)
            by_name = (name, target) in lookups and name in ("nanospa.model", "nanospa.config")
            static_extension = is_extension(target) and not by_name and not (
                name.startswith(SIGNAL) and target.startswith("nanospa.signal.beyond") and (name, target) in lookups)
            if core and (infra or static_extension):
                bad.append(f"{FILES[name].relative_to(ROOT)}:{line} imports {target}")
            if beyond and infra and target != "nanospa.run.threads":
                bad.append(f"{FILES[name].relative_to(ROOT)}:{line} imports {target}")
    return bad


def test_the_core_never_imports_the_infrastructure():
    bad = infrastructure_imports(graph())
    assert not bad, "the core reaches into the infrastructure:\n" + "\n".join(bad)


@pytest.mark.parametrize("name, statement", [
    ("nanospa.tensor", "from .run import threads\n"),                 # threads in the engine
    ("nanospa.optim", "def f():\n    from .beyond import kfac\n"),   # an optimiser beyond, from the core
    ("nanospa.model", "from .beyond import norms\n"),              # an extension imported, not looked up
    ("nanospa.signal.maps", "from .beyond import norm_maps\n"),
    ("nanospa.model", "from .run.step import train_step\n"),
    ("nanospa.beyond.kfac", "from ..run.distributed import World\n"),
])
def test_a_planted_infrastructure_import_is_caught(name, statement):
    source = FILES[name].read_text(encoding="utf-8") + "\n\n" + statement
    assert infrastructure_imports(graph(planted(name, source)))


def test_the_paper_model_loads_no_extension():
    """Building the default model (vanilla E-SPA), a step of training and its predictions at
    init, in a fresh process: not one module of nanospa/beyond/ or nanospa/signal/beyond/ is
    loaded. A configuration naming an extension loads it (the check can see one)."""
    import subprocess
    import sys
    code = """
import sys, numpy as np
from nanospa import GPT, GPTConfig
from nanospa.optim import AdamW
from nanospa.predict import predict_kernels
cfg = GPTConfig(vocab_size=64, block_size=32, n_layer=4, n_head=2, n_embd=32{extra})
m = GPT(cfg)
_, loss = m(np.zeros((2, 32), dtype=np.int64), np.ones((2, 32), dtype=np.int64)); loss.backward()
AdamW(m.parameters()).step()
predict_kernels(cfg, plan=m.plan)
print(' '.join(sorted(k for k in sys.modules if k.startswith('nanospa') and 'beyond' in k)))"""
    run = lambda extra: subprocess.run([sys.executable, "-c", code.format(extra=extra)], cwd=ROOT, capture_output=True,  # noqa: E731
                                       text=True, check=True).stdout.strip()
    assert run("") == ""
    for paper in (", attention='uspa', residual='standard', norm='layernorm', pos='learned'",
                  ", attention='value_skipinit', residual='normalised', norm='rmsnorm', pos='sinusoidal'"):
        assert run(paper) == ""
    assert "nanospa.beyond.norms" in run(", residual='standard', norm='dyt'").split()


def test_every_module_opens_with_a_docstring():
    missing = [str(p.relative_to(ROOT)) for name, p in FILES.items() if ast.get_docstring(parsed(name)) is None]
    assert not missing, f"modules without a docstring: {missing}"


# ------------------------------------------------------------------ the checks themselves

def test_the_checks_see_what_they_must():
    """Sanity of the parser on the real tree: known edges are found, the sugar's cycle exists
    and is the only one allowed, the CLI's imports from above signal/ are seen (and exempt)."""
    g = graph()
    assert "nanospa.signal.kernels" in g["nanospa.signal.attn_bias"]           # relative, module level
    assert "nanospa.config" in g[SIGNAL_CLI] and "nanospa.measure" in g[SIGNAL_CLI]   # inside functions
    assert "nanospa.signal" in g["nanospa.model"]                              # from . import signal
    assert "data" in g["nanospa.measure"]                                      # top-level, in a function
    sugar = [t for t in SUGAR_PRIMITIVES if t in FILES]
    assert sugar and all(SUGAR_OWNER in g[t] for t in sugar)                  # primitives import tensor
    assert any(t in g[SUGAR_OWNER] for t in sugar)                            # and the sugar imports them


@pytest.mark.parametrize("statement", [
    "def f():\n    from nanospa import model\n",                 # absolute, inside a function
    "def f():\n    from .. import model\n",                      # relative, inside a function
    "from ..measure import token_batch\n",
    "import data\n",
    "import nanospa\n",
    "def f():\n    import importlib\n    return importlib.import_module('nanospa.experiments.fig1')\n",
])
def test_a_planted_signal_violation_is_caught(statement):
    name = "nanospa.signal.kernels"
    source = FILES[name].read_text(encoding="utf-8") + "\n\n" + statement
    g = graph(planted(name, source))
    assert any(v.startswith("nanospa/signal/kernels.py:") for v in signal_violations(g))


def test_a_planted_cycle_is_caught():
    """signal.kernels importing the model inside a function closes model -> signal -> kernels
    -> model; a cycle through tensor that is not its sugar is caught too."""
    name = "nanospa.signal.kernels"
    source = FILES[name].read_text(encoding="utf-8") + "\n\ndef f():\n    from nanospa import model\n"
    g = graph(planted(name, source))
    found = cycles(g)
    assert any({"nanospa.model", name} <= set(c) for c in found)
    path = cycle_path(g, found[0]).split(" -> ")
    assert path[0] == path[-1] and all(b in g[a] for a, b in zip(path, path[1:]))
    source = FILES["nanospa.tensor"].read_text(encoding="utf-8") + "\n\ndef f():\n    from . import nn\n"
    assert any("nanospa.nn" in c for c in cycles(graph(planted("nanospa.tensor", source))))
