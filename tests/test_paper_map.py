"""README's "From the paper to the code" table is true: every function a row names runs in
one of the places the row says ("called by": the model, the predictions, the `python -m
nanospa.signal` table, train.py, or tests), and in each of those places one of the row's
functions runs (a row such as "model.py Block.sublayer; signal/maps.py BlockMaps.combine"
pairs the model's code with its wide-limit map), found by tracing every Python call
(sys.setprofile) while each runs; and an edit of the sources of B_l, D_l and phi_hat
changes what the model computes (no copy or cache stands between them).
"""
import re
import sys
from pathlib import Path

import numpy as np
import pytest

import train
from nanospa import GPT, GPTConfig, signal
from nanospa.signal import __main__ as signal_command
from nanospa.signal import act_transform, activations, attn_bias, budget

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
IDX = np.array([[1, 4, 4, 0, 9, 2, 7, 3], [3, 3, 7, 10, 1, 5, 2, 2]])
BASE = dict(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=8, dtype="float64")
CONFIGS = [dict(), dict(attention="uspa"), dict(attention="value_skipinit"),
           dict(attention="softmax", zero_query=True), dict(attention="softmax", activation="gelu"),
           dict(residual="normalised", norm="layernorm", activation="dks_gelu", pos="sinusoidal")]


def rows():
    lines = README.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| quantity | docs | code | called by |"))
    out = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        quantity, _, code, called = [c.strip() for c in line.strip("|").split("|")]
        names = []
        for part in code.split(";"):
            path, _, funcs = part.strip().partition(" ")
            names += [(path, f.strip()) for f in funcs.split(",")]
        out.append((quantity, names, [c.strip().split(" ")[0] for c in called.split(",")]))
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


@pytest.fixture(scope="module")
def contexts(tmp_path_factory):
    budget._JOINT_CACHE.clear()               # solved afresh here, so that the solve itself runs
    act_transform._solve.cache_clear()
    out = {}
    with Calls() as c:
        for kw in CONFIGS:
            model = GPT(GPTConfig(**BASE, **kw), seed=0)
            _, loss = model(IDX, np.roll(IDX, -1, axis=1))
            loss.backward()
    out["model"] = c
    with Calls() as c:
        for kw in CONFIGS:
            signal.predict_kernels(GPTConfig(**BASE, **kw), softmax_samples=2)
    out["predictions"] = c
    with Calls() as c:
        signal_command.main(["--n_layer=3", "--block_size=8"])
    out["table"] = c
    folder = tmp_path_factory.mktemp("train")
    text = folder / "input.txt"
    text.write_text("To be, or not to be, that is the question.\n" * 200, encoding="utf-8")
    with Calls() as c:
        assert train.main([f"--data={text}", f"--out_dir={folder / 'out'}", "--max_iters=1", "--n_layer=2",
                           "--batch_size=2", "--block_size=16", "--eval_iters=1", "--sample_tokens=0"]) == 0
    out["train.py"] = c
    return out


TESTS_TEXT = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "tests").glob("test_*.py")
                       if p.name != "test_paper_map.py")


@pytest.mark.parametrize("quantity, names, called", rows(), ids=[r[0] for r in rows()])
def test_each_row_names_what_runs_there(quantity, names, called, contexts, capsys):
    capsys.readouterr()

    def runs(context, path, name):
        if context == "tests":
            return bool(re.search(rf"\b{re.escape(name.split('.')[-1])}\b", TESTS_TEXT))
        return contexts[context].ran(path, name)

    for path, name in names:
        assert where(path).is_file(), f"{quantity}: no file {path}"
        leaf = name.split(".")[-1]
        assert re.search(rf"\b{re.escape(leaf)}\b", where(path).read_text(encoding="utf-8")), f"{quantity}: {name} not in {path}"
        assert any(runs(c, path, name) for c in called), f"{quantity}: {path} {name} runs in none of {called}"
    for context in called:
        assert any(runs(context, path, name) for path, name in names), f"{quantity}: nothing of it runs in {context}"


def test_the_table_is_read_and_a_wrong_row_fails(contexts):
    """The parser sees every row, and a row naming a function the model does not call (the
    float64 realise is the predictions', not the model's) is caught."""
    assert len(rows()) >= 20
    assert contexts["predictions"].ran("signal/attn_bias.py", "realise")
    assert not contexts["model"].ran("signal/attn_bias.py", "realise")
    assert not contexts["model"].ran("signal/attn_bias.py", "espa_attention_reference")


# ---------------------------------------------------------------- an edit of the source is seen

def out(kw=None):
    model = GPT(GPTConfig(**BASE, **(kw or {})), seed=0)
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
    monkeypatch.setitem(activations.ACTIVATIONS, "gelu", activations.BaseActivation(
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
