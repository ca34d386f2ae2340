"""Tests for nanospa/signal/__main__.py, the command line `python -m nanospa.signal`: the
printed plan and per-layer table, --empirical, --help, bad settings (one line, exit status 2)
and --plot through nanospa/experiments/fig1.py (docs/method.md §3.4, §13). The table's
numbers: tests/test_signal_table.py."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import nanospa.signal.__main__ as cli
from nanospa.config import GPTConfig
from nanospa.experiments.fig1 import figure1, plot_heatmaps
from nanospa.signal import espa_kernel, input_kernel, kernel_stats, make_plan

pytestmark = pytest.mark.slow       # the full suite only: python -m pytest -m 'not slow' skips it

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--n_layer=24", "--block_size=16", "--n_embd=32", "--n_head=2"]
ENV = dict(os.environ, OMP_NUM_THREADS="1")


def table_rows(out):
    """The numeric rows of the printed table: lines that start with a layer number."""
    return [line.split() for line in out.splitlines() if line.strip()[:1].isdigit() and "|" in line]


def module(*argv):
    return subprocess.run([sys.executable, "-m", "nanospa.signal", *argv], cwd=ROOT, env=ENV,
                          capture_output=True, text=True)


def test_espa_table_prints_schedule_and_target(capsys):
    assert cli.main(SMALL + ["--attention=espa"]) == 0
    out = capsys.readouterr().out
    rows = table_rows(out)
    assert [int(r[0]) for r in rows] == list(range(25))          # layers 0..L, --every=1
    gamma_L = make_plan(GPTConfig(n_layer=24, block_size=16)).schedule[-1]
    last = rows[-1]
    assert float(last[1]) == pytest.approx(gamma_L, rel=1e-3)     # printed with 4 significant digits
    target = kernel_stats(espa_kernel(16, gamma_L))
    cols = out.splitlines()
    assert "attn-only C_min C_mean" in out and "model q range" in out
    # after the first "|": target C_min, C_mean (4 decimals)
    t_min, t_mean = map(float, " ".join(last).split("|")[1].split()[:2])
    assert t_min == pytest.approx(target["min_entry"], abs=1e-4)
    assert t_mean == pytest.approx(target["mean_offdiag"], abs=1e-4)
    assert len(cols) > 25


def test_plan_and_activation_lines(capsys):
    assert cli.main(SMALL + ["--kernel_budget=independent", "--every=24"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("nanospa.signal: attention=espa activation=tat_lrelu")
    plan = make_plan(GPTConfig(n_layer=24, block_size=16, n_embd=32, n_head=2, kernel_budget="independent"))
    assert lines[1] == "plan: " + ", ".join(f"{k}={v}" for k, v in plan.info.items())
    assert lines[2] == "activation: tat leaky_relu " + ", ".join(f"{k}={v:.6g}" for k, v in plan.params.items())
    assert cli.main(["--n_layer=2", "--block_size=4", "--activation=gelu", "--attention=softmax"]) == 0
    assert "activation: plain gelu" in capsys.readouterr().out


def test_show_formats_nested_info():
    assert cli.show(0.5) == "0.5" and cli.show("joint") == "joint"
    assert cli.show((1, 2)) == "[1, 2]"
    info = make_plan(GPTConfig(n_layer=2, block_size=6, kernel_budget="mlp_aware", activation="dks_lrelu",
                               gamma_final=0.05)).info
    text = cli.show(info["mlp_aware"])                           # a tuple of read-only mappings
    assert text.startswith("[{'realised': True") and "'layer': 2}]" in text


def test_empirical_columns(capsys):
    assert cli.main(["--n_layer=24", "--block_size=16", "--n_head=2", "--empirical=True",
                     "--width=64", "--every=12"]) == 0
    out = capsys.readouterr().out
    assert "measured q range" in out and len(table_rows(out)) == 3    # layers 0, 12, 24
    assert "measured: GPT at init, n_embd=64, float64, 4 sequences of distinct tokens, seed 0" in out


def test_sinusoidal_positions_without_empirical():
    """The table of a model with sinusoidal positions predicts from their input kernel; it
    used to crash without --empirical (no token batch to take Sigma_0 from)."""
    r = module("--pos=sinusoidal", "--n_layer=4", "--block_size=8")
    assert r.returncode == 0, r.stderr
    rows = table_rows(r.stdout)
    assert [int(row[0]) for row in rows] == [0, 1, 2, 3, 4]
    # layer 0, model columns: the sinusoidal Sigma_0 at the default n_embd = 128
    s = kernel_stats(input_kernel(T=8, pos="sinusoidal", n_embd=128))
    c_min, c_mean = map(float, " ".join(rows[0]).split("|")[2].split()[-2:])
    assert c_min == pytest.approx(s["min_entry"], abs=5e-5) and c_mean == pytest.approx(s["mean_offdiag"], abs=5e-5)


def test_help_lists_every_setting(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("python -m nanospa.signal [--key=value ...]")
    for name in list(GPTConfig().to_dict()) + list(cli.SETTINGS):
        assert f"--{name}=" in out
    for note in cli.NOTES.values():
        assert note in out


@pytest.mark.parametrize("argv, words", [
    (["--n_layr=4"], "--n_layer"),                 # unknown key, with a suggestion
    (["--n_layer=four"], "n_layer=four"),          # wrong type
    (["--attention=flash"], "flash"),              # GPTConfig rejects it
    (["--n_layer=24", "--depths=30"], "30"),       # depth beyond n_layer
    (["--tokens=words"], "words"),
    (["n_layer=4"], "n_layer=4"),                  # not --key=value
    (["--every=0"], "--every must be >= 1"),
    (["--n_layer=2", "--empirical=True", "--width=30"], "width=30 is not divisible by n_head=4"),
    (["--n_layer=2", "--kernel_budget=independent", "--eta=0.95"], "eta=0.95 is unreachable"),  # plan error
])
def test_bad_flags_exit_2_with_one_line(argv, words, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and words in err and err.count("\n") == 1


def test_output_paths_and_seed_are_checked_before_any_work(tmp_path, capsys):
    """A plot in a missing folder (or where a folder is) and a negative seed: one line, and
    nothing computed first (no table printed)."""
    for argv, words in [([f"--plot={tmp_path / 'missing' / 'fig1.png'}"], "its folder"),
                        ([f"--plot={tmp_path}"], "a folder, not a file"),
                        (["--seed=-1"], "--seed must be >= 0, got -1")]:
        assert cli.main(SMALL + argv) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.startswith("error: ") and words in err and err.count("\n") == 1
    assert not (tmp_path / "missing").exists()


def test_module_entry_point():
    r = module("--n_layer=24", "--block_size=8", "--every=24", "--bogus=1")
    assert r.returncode == 2 and "unknown setting --bogus" in r.stderr and r.stdout == ""
    r = module("--help")
    assert r.returncode == 0 and "--empirical" in r.stdout and "--attention" in r.stdout


# ------------------------------------------------------------------ --plot (experiments/fig1.py)

def test_figure1_png(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path = tmp_path / "fig1.png"
    assert cli.main(SMALL + ["--attention=softmax", f"--plot={path}", "--depths=1,4,24",
                             "--every=24"]) == 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = capsys.readouterr().out
    assert f"wrote {path}" in out and "columns: depths 1, 4, 24" in out


def test_figure1_data_and_collapse():
    cfg = GPTConfig(n_layer=24, block_size=16, n_head=2)
    fig = figure1(cfg, depths=(1, 24), empirical=True, width=64, batch=2)
    assert set(fig["kinds"]) == {"softmax", "uspa", "espa"} and fig["depths"] == [1, 24]
    for kind, series in fig["kinds"].items():
        assert "attention-only" in series and "model, measured" in series
        for mats in series.values():
            assert [m.shape for m in mats] == [(16, 16)] * 2
            assert all(np.allclose(np.diag(m), 1.0) for m in mats)      # normalised kernels
        assert len(fig["per_layer"][kind]["attention-only"]) == 25
    only = {k: fig["stats"][k]["attention-only"][-1]["C_mean"] for k in fig["kinds"]}
    assert only["softmax"] > 0.999 > only["espa"] and only["uspa"] < 0.999   # §3.4 vs §6, §7


def test_plot_without_matplotlib_says_how_to_install(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)     # import matplotlib -> ImportError
    fig = figure1(GPTConfig(n_layer=24, block_size=8), depths=(1,), kinds=("espa",))
    assert plot_heatmaps(fig, str(tmp_path / "x.png")) is False
    assert "pip install -e .[plot]" in capsys.readouterr().out
    assert not (tmp_path / "x.png").exists()
    # through the command line: refused before any work, one error line, exit 2, no file
    path = tmp_path / "y.png"
    assert cli.main(["--n_layer=4", "--block_size=8", "--kernel_budget=independent", "--eta=0.5",
                     f"--plot={path}"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error: --plot=") and "pip install -e .[plot]" in captured.err
    assert len(captured.err.strip().splitlines()) == 1
    assert not table_rows(captured.out) and not path.exists()
