"""python -m nanospa.experiments NAME: every command runs end to end with the tiny preset and
writes result.json, table.md and plot.png (the PNG only when matplotlib is installed). The
runner's and the report's functions have their own tests (tests/test_experiments_runner.py,
tests/test_experiments_report.py); the settings parser's are in tests/test_settings.py."""
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from nanospa.experiments.__main__ import COMMANDS, main
from nanospa.experiments.controls import POSITION_CONTROLS

pytestmark = pytest.mark.slow       # the full suite only: python -m pytest -m 'not slow' skips it

ROOT = Path(__file__).resolve().parents[1]
TRAINING = ("fig2", "table1", "fig3", "table2", "longer", "kfac", "norms")
EXPECTED_METHODS = {
    "fig2": {"softmax", "value_skipinit", "uspa", "espa", "pre_ln", *POSITION_CONTROLS},
    "table1": {a + n for a in ("dks_gelu", "tat_lrelu", "gelu", "sigmoid") for n in ("", "+LN")},
    "fig3": {"softmax+NR", "value_skipinit+NR", "uspa+NR", "espa+NR", "pre_ln"},
    "table2": {"pre_ln", "espa+NR+LN", "espa+NR", "softmax+NR+LN"},
    "longer": {"pre_ln", "espa", "espa_long", "pre_ln_long", *POSITION_CONTROLS},
    "norms": {"pre_ln", "post_ln", "post_ln_nowarmup", "deepnorm", "realformer", "ngpt", "pre_rmsnorm", "pre_dyt",
              "pre_batchnorm", "pre_prepbn", "pre_prepbn_eta0", "pre_groupnorm", "espa", "espa_nr"},
    "kfac": {m + o for m in ("espa", "softmax", "pre_ln") for o in ("_adamw", "_kfac_d0.01")},
}


def has_matplotlib():
    try:
        import matplotlib  # noqa: F401
        return True
    except ImportError:
        return False


def check_outputs(out, capsys):
    assert (out / "result.json").is_file() and (out / "table.md").is_file()
    printed = capsys.readouterr().out
    if has_matplotlib():
        assert (out / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        assert not (out / "plot.png").exists() and "pip install -e .[plot]" in printed
    return json.loads((out / "result.json").read_text()), (out / "table.md").read_text()


@pytest.mark.parametrize("name", TRAINING)
def test_training_command_tiny(name, tmp_path, capsys):
    out = tmp_path / name
    assert main([name, "--preset=tiny", f"--out={out}"]) == 0
    result, table = check_outputs(out, capsys)
    assert result["complete"] and set(result["methods"]) == EXPECTED_METHODS[name]
    for label, m in result["methods"].items():
        lrs = m["lrs"]                                  # the shared grid, or the method's own
        assert len(m["runs"]) == len(lrs) * result["settings"]["seeds"]
        assert m["summary"]["best_lr"] in lrs
        assert math.isfinite(m["summary"]["final_train"])
        assert f"| {label} |" in table
    assert result["findings"] and result["provenance"]["command"].startswith(
        f"python -m nanospa.experiments {name} --preset=tiny")
    assert "## What the paper reports" in table and "Time taken" in table


def test_longer_runs_factor_times_the_steps(tmp_path, capsys):
    out = tmp_path / "longer"
    assert main(["longer", "--preset=tiny", "--factor=3", "--steps=2", "--methods=espa,espa_long",
                 f"--out={out}"]) == 0
    result, _ = check_outputs(out, capsys)
    steps = {k: m["runs"][0]["steps_done"] for k, m in result["methods"].items()}
    assert steps == {"espa": 2, "espa_long": 6}


def test_fig1_tiny(tmp_path, capsys):
    out = tmp_path / "fig1"
    assert main(["fig1", "--preset=tiny", f"--out={out}"]) == 0
    result, table = check_outputs(out, capsys)
    assert set(result["stats"]) == {"softmax", "uspa", "espa"}
    for kind, series in result["stats"].items():
        assert {"attention-only", "model, measured"} <= set(series)
        assert all(len(v) == len(result["depths"]) for v in series.values())
    # method §3.4: the attention-only standard-attention kernel collapses towards 1 1^T
    soft = result["stats"]["softmax"]["attention-only"]
    assert soft[-1]["C_mean"] > soft[0]["C_mean"]
    assert "standard attention | attention-only" in table
    kernels = np.load(out / "kernels.npz")
    assert kernels["espa/model, measured/depth1"].shape == (8, 8)      # tiny preset: T = 8


def test_fig1_keeps_its_kernels_file_whole_when_writing_fails(tmp_path, capsys, monkeypatch):
    """kernels.npz is written beside itself and renamed: a write that fails half-way leaves
    the previous file as it was and no temporary file behind."""
    out = tmp_path / "fig1"
    assert main(["fig1", "--preset=tiny", f"--out={out}"]) == 0
    before = (out / "kernels.npz").read_bytes()

    def half_then_fail(f, **arrays):
        f.write(b"PK half a file")
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(np, "savez_compressed", half_then_fail)
    assert main(["fig1", "--preset=tiny", f"--out={out}"]) == 2
    assert "kernels.npz: No space left on device" in capsys.readouterr().err
    assert (out / "kernels.npz").read_bytes() == before
    assert sorted(p.name for p in out.iterdir() if p.name.endswith(".tmp")) == []


def test_explicit_config_fields_apply_to_every_method(tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["fig2", "--preset=tiny", "--kernel_budget=independent", "--n_layer=24",
                 "--methods=espa,pre_ln", f"--out={out}"]) == 0
    result = json.loads((out / "result.json").read_text())
    assert {m["config"]["kernel_budget"] for m in result["methods"].values()} == {"independent"}
    assert result["methods"]["pre_ln"]["config"]["residual"] == "standard"   # method fields kept


@pytest.mark.parametrize("argv, words", [
    (["fig2", "--preset=huge"], "huge"),
    (["fig2", "--lrs=fast"], "lrs=fast"),
    (["fig2", "--stepz=3"], "--steps"),
    (["fig2", "--preset=tiny", "--methods=espa,flash"], "flash"),
    (["fig2", "--preset=tiny", "--attention=flash"], "flash"),
    (["fig1", "--depths=99"], "99"),
    (["fig9"], "fig9"),
    (["fig2", "--preset=tiny", "--min_lr_ratio=-1"], "min_lr_ratio must be in [0, 1]"),
    (["fig2", "--preset=tiny", "--weight_decay=-0.1"], "weight_decay must be finite and >= 0"),
    (["fig2", "--preset=tiny", "--grad_clip=-1"], "grad_clip must be finite and >= 0"),
])
def test_bad_settings_exit_2(argv, words, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and words in err and err.count("\n") == 1


def test_pool_workers_and_module_entry_point(tmp_path):
    """Two spawned single-threaded workers, through `python -m`."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = tmp_path / "pool"
    r = subprocess.run([sys.executable, "-m", "nanospa.experiments", "fig2", "--preset=tiny",
                        "--workers=2", "--lrs=1e-3,2e-3", "--methods=espa,softmax", f"--out={out}"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    result = json.loads((out / "result.json").read_text())
    assert sorted(len(m["runs"]) for m in result["methods"].values()) == [2, 2]
    assert "[4/4]" in r.stdout


def _children(pid):
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return {int(c) for c in path.read_text().split()} if path.exists() else set()


def _alive(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc to see the workers")
def test_sigterm_stops_the_workers_too_and_keeps_the_finished_runs(tmp_path):
    """A stopped experiment leaves no worker behind (one kept a core busy for 12 minutes
    after a SIGTERM): exit 143, one line on stderr, the workers gone."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = tmp_path / "stopped"
    p = subprocess.Popen([sys.executable, "-m", "nanospa.experiments", "fig2", "--preset=tiny", "--workers=2",
                          "--lrs=1e-3,2e-3", "--methods=espa,softmax", "--steps=100000", f"--out={out}"],
                         cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while len(_children(p.pid)) < 2 and time.time() < deadline:    # the workers (and a resource tracker)
        time.sleep(0.2)
    time.sleep(2.0)                                                 # they have started their jobs
    workers = _children(p.pid)
    assert len(workers) >= 2 and p.poll() is None
    p.terminate()
    _, err = p.communicate(timeout=60)
    assert p.returncode == 143, err
    assert err.strip().splitlines() == ["SIGTERM stopped: result.json holds the finished runs; the running ones were stopped"]
    deadline = time.time() + 30
    while any(_alive(w) for w in workers) and time.time() < deadline:
        time.sleep(0.2)
    assert not any(_alive(w) for w in workers)


@pytest.mark.parametrize("name", ["fig1", "fig2", "budget"])
def test_an_out_that_is_a_file_is_refused_before_any_work(name, tmp_path, capsys):
    blocker = tmp_path / "taken"
    blocker.write_text("x")
    for out, words in [(blocker, "is a file, not a folder"), (blocker / "sub", "is a file, so no folder can be made "
                                                                         "under it")]:
        t0 = time.time()
        assert main([name, "--preset=tiny", f"--out={out}"]) == 2
        captured = capsys.readouterr()
        assert captured.err == f"error: --out={out}: " + (f"{out} " if out == blocker else f"{blocker} ") \
            + words + "\n", captured.err
        assert "runs on" not in captured.out and time.time() - t0 < 5     # no data, no training


def test_an_unknown_experiment_suggests_the_closest(capsys):
    assert main(["fig22"]) == 2
    assert capsys.readouterr().err.startswith("error: unknown experiment 'fig22'; did you mean fig2?")


def test_dispatcher_lists_every_command(capsys):
    assert main(["--help"]) == 0
    text = capsys.readouterr().out
    assert all(name in text for name in COMMANDS)


@pytest.mark.parametrize("name", ["fig1", "fig2", "budget"])
def test_an_out_another_command_holds_is_refused_before_any_work(name, tmp_path, capsys):
    """Every command that writes a result folder holds it (budget: its init check and its
    training under one lock); the folder and what it holds are left as they were."""
    from nanospa.run.rundir import RunLock
    out = tmp_path / "o"
    with RunLock(out, key="out"):                 # flock: a second open of the lock conflicts
        (out / "result.json").write_text("{}")
        assert main([name, "--preset=tiny", "--measure_width=8" if name == "budget" else "--preset=tiny",
                     f"--out={out}"]) == 2
        captured = capsys.readouterr()
        assert captured.err.startswith(f"error: --out={out} is in use by pid {os.getpid()}") and "runs on" not in captured.out
        assert sorted(p.name for p in out.iterdir()) == ["result.json", "run.lock"]
