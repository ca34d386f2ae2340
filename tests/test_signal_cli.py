"""python -m nanospa.signal: the per-layer table, the measured columns, Figure-1 heatmaps and
bad flags (docs/method.md §3.4, §13)."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import nanospa.signal.__main__ as cli
from nanospa.model import GPTConfig
from nanospa.signal import espa_kernel, kernel_stats

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--n_layer=24", "--block_size=16", "--n_embd=32", "--n_head=2"]


def table_rows(out):
    """The numeric rows of the printed table: lines that start with a layer number."""
    return [line.split() for line in out.splitlines() if line.strip()[:1].isdigit() and "|" in line]


def test_espa_table_prints_schedule_and_target(capsys):
    assert cli.main(SMALL + ["--attention=espa"]) == 0
    out = capsys.readouterr().out
    rows = table_rows(out)
    assert [int(r[0]) for r in rows] == list(range(25))          # layers 0..L, --every=1
    gamma_L = cli._plan(GPTConfig(n_layer=24, block_size=16)).layers[-1]["gamma"]
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


def test_layer_table_construction_error_is_rounding():
    cfg = GPTConfig(n_layer=24, block_size=32, attention="uspa", kernel_budget="independent")
    rows = cli.layer_table(cfg)
    for row in rows[1:]:
        assert row["err"] < 1e-10              # method §14 asks 1e-8; the closed forms reach ~1e-15
        assert row["A_min"] >= 0.0
        assert row["D_min"] >= 1.0 - 1e-12     # D >= 1 for U-SPA (method §14)


def test_softmax_target_is_the_rank_collapse_recursion():
    # method §3.4: uniform causal attention from Sigma_0 = I. After one layer the first and
    # last tokens have cosine exactly 1/sqrt(T) (row 0 is e_0, row T-1 is uniform over T).
    T = 64
    cfg = GPTConfig(n_layer=8, block_size=T, attention="softmax", activation="gelu")
    rows = cli.layer_table(cfg, predicted=None)
    assert rows[1]["target"]["C_min"] == pytest.approx(1 / np.sqrt(T), abs=1e-12)
    means = [r["target"]["C_mean"] for r in rows[1:]]
    assert all(b > a for a, b in zip(means, means[1:]))   # collapse deepens with depth
    assert means[-1] > 0.99                                  # §3.4 table: 0.999 at depth 8


def test_empirical_columns_match_measured_kernels(capsys):
    cfg = GPTConfig(n_layer=6, block_size=16, n_head=2)
    mcfg = cli.measure_config(cfg, 512)
    idx = cli.token_batch(mcfg, 4, seed=0)
    measured = cli.measured_kernels(mcfg, idx, seed=0)
    rows = cli.layer_table(cfg, measured=measured, predicted=cli.predicted_kernels(mcfg, None, idx))
    for l, row in enumerate(rows):
        s = kernel_stats(measured[l])
        assert row["measured"]["C_mean"] == s["mean_offdiag"]
        assert row["measured"]["q_max"] == s["q_max"]
        if row["model"] is not None:
            # finite-width noise: at width 512, depth 6, the measured mean off-diagonal differed
            # from the wide-limit prediction by at most 0.040 over 4 seeds x 2 activations, while
            # the prediction moves by >= 0.06 per layer here, so an off-by-one layer would fail
            assert abs(row["measured"]["C_mean"] - row["model"]["C_mean"]) < 0.06
    assert cli.main(["--n_layer=24", "--block_size=16", "--n_head=2", "--empirical=True",
                     "--width=64", "--every=12"]) == 0
    out = capsys.readouterr().out
    assert "measured q range" in out and len(table_rows(out)) == 3    # layers 0, 12, 24


def test_without_predict_kernels_only_attention_columns(capsys, monkeypatch):
    monkeypatch.setattr(cli, "_predict_kernels", lambda: None)
    assert cli.main(SMALL + ["--every=8"]) == 0
    out = capsys.readouterr().out
    assert "predict_kernels is not available" in out and "model q range" not in out


def test_figure1_png(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path = tmp_path / "fig1.png"
    assert cli.main(SMALL + ["--attention=softmax", f"--plot={path}", "--depths=1,4,24",
                             "--every=24"]) == 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "wrote" in capsys.readouterr().out


def test_figure1_data_and_collapse():
    cfg = GPTConfig(n_layer=24, block_size=16, n_head=2)
    fig = cli.figure1(cfg, depths=(1, 24), empirical=True, width=64, batch=2)
    assert set(fig["kinds"]) == {"softmax", "uspa", "espa"}
    for kind, series in fig["kinds"].items():
        assert "attention-only" in series and "model, measured" in series
        for mats in series.values():
            assert [m.shape for m in mats] == [(16, 16)] * 2
    only = {k: fig["stats"][k]["attention-only"][-1]["C_mean"] for k in fig["kinds"]}
    assert only["softmax"] > 0.999 > only["espa"] and only["uspa"] < 0.999   # §3.4 vs §6, §7


def test_plot_without_matplotlib_says_how_to_install(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)     # import matplotlib -> ImportError
    fig = cli.figure1(GPTConfig(n_layer=24, block_size=8), depths=(1,), kinds=("espa",))
    assert cli.plot_heatmaps(fig, str(tmp_path / "x.png")) is False
    assert "pip install -e .[plot]" in capsys.readouterr().out
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize("argv, words", [
    (["--n_layr=4"], "--n_layer"),                 # unknown key, with a suggestion
    (["--n_layer=four"], "n_layer=four"),          # wrong type
    (["--attention=flash"], "flash"),              # GPTConfig rejects it
    (["--n_layer=24", "--depths=30"], "30"),       # depth beyond n_layer
    (["--tokens=words"], "words"),
    (["n_layer=4"], "n_layer=4"),                  # not --key=value
])
def test_bad_flags_exit_2_with_one_line(argv, words, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and words in err and err.count("\n") == 1


def test_module_entry_point():
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "nanospa.signal", "--n_layer=24", "--block_size=8",
                        "--every=24", "--bogus=1"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert r.returncode == 2 and "unknown setting --bogus" in r.stderr
    r = subprocess.run([sys.executable, "-m", "nanospa.signal", "--help"], cwd=ROOT, env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0 and "--empirical" in r.stdout and "--attention" in r.stdout
