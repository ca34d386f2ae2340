"""README's "From the paper to the code" table is true: every function of every row runs in
each place its brackets name (the plan, the model, the predictions, the `python -m
nanospa.signal` table, train.py, or tests), and of plan, model and predictions in no place
they leave out, found by tracing every Python call (sys.setprofile) while each runs; the
chains of calls from train.py to B_l and phi_hat are the ones README states; an edit of the
sources of B_l, D_l and phi_hat changes what the model computes (no copy or cache stands
between them); and the docstrings, comments and docs name only files that exist.
"""
import re
import sys
from pathlib import Path

import numpy as np
import pytest

import train
from nanospa import GPT, GPTConfig, signal
from nanospa.predict import predict_kernels
from nanospa.signal import __main__ as signal_command
from nanospa.signal import act_transform, activations, attn_bias, budget

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
IDX = np.array([[1, 4, 4, 0, 9, 2, 7, 3], [3, 3, 7, 10, 1, 5, 2, 2]])
BASE = dict(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=8, dtype="float64")
CONFIGS = [dict(), dict(attention="uspa"), dict(attention="value_skipinit"),
           dict(attention="softmax", zero_query=True), dict(attention="softmax", activation="gelu"),
           dict(residual="normalised", norm="layernorm", activation="dks_gelu", pos="sinusoidal"),
           dict(residual="standard", norm="rmsnorm", activation="gelu", attention="softmax")]
EXACT = ("plan", "model", "predictions")      # a row names every one of these a function runs in
PLACES = EXACT + ("table", "train.py", "tests")


def rows():
    """[(quantity, [(path, function, [places])])] of README's table."""
    lines = README.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| quantity | docs | code (where it runs) |"))
    out = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        quantity, _, code = [c.strip() for c in line.strip("|").split("|")]
        names = []
        for part in code.split(";"):
            path, _, funcs = part.strip().partition(" ")
            found = re.findall(r"([\w.]+) \(([^)]*)\)", funcs)
            assert found and re.sub(r"[\w.]+ \([^)]*\)|[, ]", "", funcs) == "", f"{quantity}: cannot read {part!r}"
            names += [(path, name, [p.strip() for p in places.split(",")]) for name, places in found]
        out.append((quantity, names))
    return out


def where(path):
    return ROOT / "nanospa" / path if path != "train.py" else ROOT / path


class Calls:
    """Every (file, qualified name) of a Python function that ran inside the block."""

    def __init__(self):
        self.seen = set()

    def __enter__(self):
        def profile(frame, event, arg):
            if event == "call":
                code = frame.f_code
                self.seen.add((code.co_filename, getattr(code, "co_qualname", code.co_name)))
        sys.setprofile(profile)
        return self

    def __exit__(self, *exc):
        sys.setprofile(None)

    def ran(self, path, name):
        """Whether `name` of file `path` ran; for a name that is not a function (a registry),
        whether anything of its file ran."""
        file = str(where(path))
        return any(f == file and (q == name or q.startswith(name + ".")) for f, q in self.seen) or (
            not callable_in(path, name) and any(f == file for f, _ in self.seen))


def callable_in(path, name):
    text = where(path).read_text(encoding="utf-8")
    leaf = name.split(".")[-1]
    return bool(re.search(rf"^\s*(def|class) {re.escape(leaf)}\b", text, re.M))


def fresh():
    budget._JOINT_CACHE.clear()               # solved afresh in each place, so that the solve itself runs
    act_transform._solve.cache_clear()


@pytest.fixture(scope="module")
def places(tmp_path_factory):
    out = {}
    fresh()
    with Calls() as c:
        plans = [signal.make_plan(GPTConfig(**BASE, **kw)) for kw in CONFIGS]
    out["plan"] = c
    fresh()
    with Calls() as c:
        for kw, plan in zip(CONFIGS, plans):
            model = GPT(GPTConfig(**BASE, **kw), seed=0, plan=plan)
            _, loss = model(IDX, np.roll(IDX, -1, axis=1))
            loss.backward()
    out["model"] = c
    fresh()
    with Calls() as c:
        for kw, plan in zip(CONFIGS, plans):
            predict_kernels(GPTConfig(**BASE, **kw), plan=plan, softmax_samples=2)
    out["predictions"] = c
    fresh()
    with Calls() as c:
        signal_command.main(["--n_layer=3", "--block_size=8"])
    out["table"] = c
    folder = tmp_path_factory.mktemp("train")
    text = folder / "input.txt"
    text.write_text("To be, or not to be, that is the question.\n" * 200, encoding="utf-8")
    fresh()
    with Calls() as c:
        assert train.main([f"--data={text}", f"--out_dir={folder / 'out'}", "--max_iters=1", "--n_layer=2",
                           "--batch_size=2", "--block_size=16", "--eval_iters=1", "--sample_tokens=0"]) == 0
    out["train.py"] = c
    return out


TESTS_TEXT = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "tests").glob("test_*.py")
                       if p.name != "test_paper_map.py")


def runs_in(places, place, path, name):
    if place == "tests":
        return bool(re.search(rf"\b{re.escape(name.split('.')[-1])}\b", TESTS_TEXT))
    return places[place].ran(path, name)


def wrong_places(places, path, name, named):
    """What a row's brackets get wrong for one function: places named where it does not run,
    and places of EXACT where it runs that the row leaves out."""
    bad = [f"named {p} but does not run there" for p in named if p not in PLACES or not runs_in(places, p, path, name)]
    bad += [f"runs in {p} too" for p in EXACT if p not in named and runs_in(places, p, path, name)]
    return bad


@pytest.mark.parametrize("quantity, names", rows(), ids=[r[0] for r in rows()])
def test_each_function_runs_where_its_row_says(quantity, names, places, capsys):
    capsys.readouterr()
    for path, name, named in names:
        assert where(path).is_file(), f"{quantity}: no file {path}"
        leaf = name.split(".")[-1]
        assert re.search(rf"\b{re.escape(leaf)}\b", where(path).read_text(encoding="utf-8")), f"{quantity}: {name} not in {path}"
        bad = wrong_places(places, path, name, named)
        assert not bad, f"{quantity}: {path} {name}: " + "; ".join(bad)


def test_the_table_is_read_and_a_wrong_row_fails(places):
    """The parser sees every row and every function; a function given a place where it does not
    run (realise is the predictions', not the model's) or missing one where it does (the
    budget's walk runs attention_map in the plan) is caught."""
    assert len(rows()) >= 20 and sum(len(names) for _, names in rows()) >= 45
    assert wrong_places(places, "signal/cholesky.py", "realise", ["predictions"]) == []
    assert wrong_places(places, "signal/cholesky.py", "realise", ["model", "predictions"]) == \
        ["named model but does not run there"]
    assert wrong_places(places, "signal/maps.py", "attention_map", ["predictions"]) == ["runs in plan too"]
    assert wrong_places(places, "signal/cholesky.py", "espa_attention_reference", ["tests"]) == []
    assert not places["model"].ran("signal/cholesky.py", "espa_attention_reference")


def chain(place_of_call, target):
    """The qualified names of the calls from train.py's train() down to `target` (a function
    object): the shortest chain among all the times it runs inside place_of_call."""
    found = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code is target.__code__:
            names, f = [], frame
            while f is not None:
                name = getattr(f.f_code, "co_qualname", f.f_code.co_name)
                if not name.endswith(("<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>")):  # Python < 3.12's frames
                    names.append(name)
                if f.f_code is train.train.__code__:
                    break
                f = f.f_back
            found.append(names[::-1])
    sys.setprofile(profile)
    try:
        place_of_call()
    finally:
        sys.setprofile(None)
    return min(found, key=len)


def test_the_chains_from_train_to_B_l_and_phi_hat_are_readmes(tmp_path):
    """README says how many calls train.py's train() takes to reach B_l and D_l (espa_bias)
    and phi_hat's parameters (activation_transform); the trace says the same."""
    text = tmp_path / "input.txt"
    text.write_text("To be, or not to be, that is the question.\n" * 200, encoding="utf-8")

    def run():
        fresh()
        assert train.main([f"--data={text}", f"--out_dir={tmp_path / 'out'}", "--eval_only", "--n_layer=2",
                           "--batch_size=2", "--block_size=16", "--eval_iters=1", "--sample_tokens=0"]) == 0
    for target in (attn_bias.espa_bias, act_transform.activation_transform):
        calls = chain(run, target)
        written = " -> ".join(f"`{c}`" for c in calls)
        claim = re.search(rf"in (\w+) calls \(({re.escape(written)})\)", README.replace("\n", " "))
        assert claim, f"README should say: train.py reaches {target.__name__} in {len(calls) - 1} calls ({written})"
        assert claim.group(1) == ["zero", "one", "two", "three", "four", "five", "six", "seven"][len(calls) - 1]


# ---------------------------------------------------------------- an edit of the source is seen

def out(kw=None):
    model = GPT(GPTConfig(**{**BASE, **(kw or {})}), seed=0)
    return model(IDX)[0].data


def test_an_edit_of_espa_bias_changes_the_model(monkeypatch):
    """B_l and D_l: the model's output follows espa_bias (its row normaliser moved)."""
    before = out()
    real = attn_bias.espa_bias
    monkeypatch.setattr(attn_bias, "espa_bias", lambda T, g, gp: dict(real(T, g, gp), lse=real(T, g, gp)["lse"] * 1.5))
    assert np.abs(out() - before).max() > 1e-6


def test_an_edit_of_the_activation_registry_changes_the_model(monkeypatch):
    """phi: the engine evaluates the registry's entry (gelu scaled by 1.01)."""
    before = out(dict(activation="gelu"))
    g = activations.ACTIVATIONS["gelu"]
    monkeypatch.setitem(activations.ACTIVATIONS.own, "gelu", activations.BaseActivation(
        lambda x, xp=None: 1.01 * g.fn(x, xp), lambda x, xp: 1.01 * g.d1(x, xp), g.d2, g.kinked))
    assert np.abs(out(dict(activation="gelu")) - before).max() > 1e-6


def test_an_edit_of_activation_transform_changes_the_model(monkeypatch):
    """phi_hat's parameters: the model takes DKS/TAT's solution from activation_transform."""
    before = out()
    real = act_transform.activation_transform

    def shifted(**spec):
        t = real(**spec)
        return act_transform._make(t.activation, t.method, t.depth, dict(t.params, output_scale=t.params["output_scale"] * 1.1))
    monkeypatch.setattr(act_transform, "activation_transform", shifted)
    monkeypatch.setattr(signal, "activation_transform", shifted)
    assert np.abs(out() - before).max() > 1e-6


# ---------------------------------------------------------------- signposts name files that exist

FILE_REF = re.compile(r"(?<![\w/.-])((?:[\w-]+/)*[\w-]+\.py)\b")
# Other projects' files, cited as sources (docs/norms.md; nanoGPT's config in recipes.py,
# docs/results.md): not ours to find.
CITED = {"classification/models/prepbn.py", "slab_deit.py", "llama/modeling_llama.py",
         "config/train_shakespeare_char.py"}


def prose(path):
    """The comments and docstrings of a Python file (the code's string literals are data: file
    names a test writes), or the whole of a Markdown file."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".md":
        return text
    import ast
    import io
    import tokenize
    parts = [t.string for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            parts.append(ast.get_docstring(node, clean=False) or "")
    return "\n".join(parts)


def stale_references(root=ROOT):
    """['file: name'] for each file name in a docstring, comment or doc that no file of ours
    ends with. docs/decisions.md is the dated record of what changed: it names files that went."""
    ours = {p.relative_to(root).as_posix() for p in root.rglob("*.py") if ".venv" not in p.parts}
    sources = [root / n for n in ("train.py", "data.py", "sample.py", "setup.py", "README.md")]
    sources += sorted((root / "nanospa").rglob("*.py")) + sorted((root / "tests").glob("*.py"))
    sources += [p for p in sorted((root / "docs").glob("*.md")) if p.name != "decisions.md"]
    bad = []
    for path in sources:
        for ref in FILE_REF.findall(prose(path)):
            if ref not in CITED and not any(n == ref or n.endswith("/" + ref) for n in ours):
                bad.append(f"{path.relative_to(root)}: {ref}")
    return bad


def test_docstrings_comments_and_docs_name_only_files_that_exist():
    bad = stale_references()
    assert not bad, "names of files that do not exist:\n" + "\n".join(bad)


def test_a_moved_file_in_a_docstring_is_caught(tmp_path):
    """The check fails on a planted stale name: the old place of a file that moved."""
    import shutil
    for name in ("train.py", "data.py", "sample.py", "setup.py", "README.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "nanospa", tmp_path / "nanospa", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "tests", tmp_path / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    for script in ROOT.glob("results/**/*.py"):                 # results' scripts, named by the docs
        (tmp_path / script.relative_to(ROOT)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(script, tmp_path / script.relative_to(ROOT))
    assert stale_references(tmp_path) == []
    model = tmp_path / "nanospa" / "model.py"
    moved = "signal/" + "predict.py"                  # nanospa/predict.py's old place
    model.write_text(model.read_text(encoding="utf-8").replace('"""', f'"""See {moved}. ', 1), encoding="utf-8")
    assert stale_references(tmp_path) == [f"nanospa/model.py: {moved}"]


def test_the_eta_target_is_one_constant_that_the_model_follows(monkeypatch):
    """TAT's eta = 0.9 is written once (depth_targets.DEFAULT_TARGETS, dks's default) and the
    budget reads it as budget.ETA: moving it moves the model, under both the default budget
    and the independent one (once a second constant decided the model and this one nothing)."""
    from nanospa.signal import depth_targets
    assert budget.ETA == depth_targets.DEFAULT_TARGETS["eta"] == 0.9
    source = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "nanospa" / "signal").rglob("*.py"))
    assert len(re.findall(r"\b0\.9\b(?!\d)", re.sub(r"#.*|\"\"\"[\s\S]*?\"\"\"", "", source))) == 1
    deep = dict(n_layer=16, block_size=8)                   # eta = 0.9 reachable: not clamped
    for kw in (deep, dict(deep, kernel_budget="independent")):
        before = out(kw)
        monkeypatch.setattr(budget, "ETA", 0.8)
        budget._JOINT_CACHE.clear()
        assert np.abs(out(kw) - before).max() > 1e-6
        monkeypatch.undo()
        budget._JOINT_CACHE.clear()


def test_readme_states_the_default_plan_it_prints():
    """README's reading guide gives the default model's plan (its numbers come from the second
    pass); they are the plan GPT(GPTConfig()) builds, to the digits written."""
    m = re.search(r"gamma_1 \.\. gamma_(\d+) = ([\d.]+) \.\. ([\d.]+) and a TAT leaky ReLU at eta = ([\d.]+) "
                  r"\(slope ([\d.]+),\s+output scale ([\d.]+)\)", README)
    assert m, "README's sentence on the default plan is gone or reworded: update this test with it"
    cfg = GPTConfig()
    plan = budget.make_plan(cfg)
    act = signal.activation_transform(**plan.activation)
    written = [float(x) for x in m.groups()[1:]]
    actual = [plan.schedule[1], plan.schedule[-1], plan.activation["eta"],
              act["negative_slope"], act["output_scale"]]
    assert int(m.group(1)) == cfg.n_layer
    for w, a in zip(written, actual):
        assert abs(w - a) <= 0.5 * 10 ** -(len(str(w).split(".")[1])), (w, a)
