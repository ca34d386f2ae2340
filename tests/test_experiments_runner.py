"""nanospa/experiments/runner.py: settings layering (runner defaults < experiment extras <
preset < command line), the GPTConfig of a method, the jobs of a grid, the in-process job
loop, the best learning rate and a method's summary. Whole commands are run end to end in
tests/test_experiments.py; the written outputs are tested in tests/test_experiments_report.py."""
import json
import math
import types

import pytest

from nanospa import backend
from nanospa.experiments import runner
from nanospa.experiments.report import STALL_MARGIN
from nanospa.experiments.runner import Method


def spec(**kw):
    """A stand-in experiment module with two methods."""
    methods = dict(a=Method(dict(attention="espa"), "method a"),
                   b=Method(dict(attention="softmax", residual="standard"), "method b", steps_factor=3))
    base = dict(NAME="demo", TITLE="demo", PAPER="", methods=lambda s: methods)
    return types.SimpleNamespace(**{**base, **kw})


def test_best_rate_is_lowest_mean_and_ignores_diverged():
    runs = [dict(lr=1e-3, final_train=3.0), dict(lr=1e-3, final_train=3.2),
            dict(lr=3e-3, final_train=2.5), dict(lr=3e-3, final_train=math.nan)]
    by_lr, best = runner.best_rate(runs, (1e-3, 3e-3))
    assert by_lr[1e-3] == pytest.approx(3.1) and by_lr[3e-3] == math.inf and best == 1e-3
    assert runner.best_rate([dict(lr=1e-3, final_train=math.nan)], (1e-3,))[1] is None


def test_best_rate_compares_rates_on_the_seeds_they_all_ran():
    runs = [dict(lr=1e-3, seed=0, final_train=1.0), dict(lr=1e-3, seed=1, final_train=2.0),
            dict(lr=1e-3, seed=2, final_train=2.0), dict(lr=3e-3, seed=0, final_train=1.5)]
    by_lr, best = runner.best_rate(runs, [1e-3, 3e-3])
    assert best == 1e-3 and by_lr[1e-3] == pytest.approx(5 / 3)      # seed 0: 1.0 < 1.5; the mean over all three
    runs[0] = dict(runs[0], final_train=math.inf)
    assert runner.best_rate(runs, [1e-3, 3e-3])[1] == 3e-3
    runs[0], runs[1] = dict(runs[0], final_train=1.0), dict(runs[1], final_train=math.nan)   # an added seed diverged
    assert runner.best_rate(runs, [1e-3, 3e-3]) == ({1e-3: math.inf, 3e-3: 1.5}, 3e-3)


def test_settings_layer_defaults_extras_preset_and_command_line():
    s = runner.settings_for(spec(), [])
    assert s["preset"] == "quick" and s["steps"] == runner.PRESETS["quick"]["steps"]
    assert s["out"] == "out/demo" and s["config_overrides"] == {}
    s = runner.settings_for(spec(EXTRA=dict(factor=5), PRESETS=dict(tiny=dict(factor=2, steps=7))),
                            ["--preset=tiny", "--n_layer=6", "--kernel_budget=independent"])
    assert (s["factor"], s["steps"], s["n_layer"]) == (2, 7, 6)    # the experiment's preset, then argv
    assert s["n_embd"] == runner.PRESETS["tiny"]["n_embd"]
    assert s["config_overrides"] == dict(kernel_budget="independent")   # explicit GPTConfig fields only


def test_a_preset_resets_every_key_any_preset_sets():
    """--preset=tiny after the experiment's quick extras: tiny's values, not quick's."""
    s = runner.settings_for(spec(PRESETS=dict(quick=dict(methods="a"))), ["--preset=tiny"])
    assert s["methods"] == "" and s["workers"] == 0


@pytest.mark.parametrize("argv, words", [
    (["--seeds=0"], "seeds must be >= 1"), (["--workers=-1"], "workers and warmup must be >= 0"),
    (["--lrs=0.001,-1"], "lrs must be positive"), (["--device=tpu"], "device must be 'cpu' or 'cuda'"),
])
def test_bad_ranges_are_refused(argv, words):
    with pytest.raises(ValueError, match=words):
        runner.settings_for(spec(), argv)


def test_selected_methods_keep_the_order_asked_for():
    s = runner.settings_for(spec(), ["--methods=b,a"])
    assert list(runner.selected_methods(spec(), s)) == ["b", "a"]
    with pytest.raises(ValueError, match="unknown method 'c' for demo; methods: a, b"):
        runner.selected_methods(spec(), runner.settings_for(spec(), ["--methods=a,c"]))


def test_model_config_is_base_then_method_then_overrides():
    s = runner.settings_for(spec(), ["--preset=tiny", "--residual=normalised", "--dtype=float64"])
    m = Method(dict(attention="softmax", residual="standard", n_layer=2), "m")
    cfg = runner.model_config(s, m, vocab_size=256)
    assert (cfg.n_layer, cfg.n_embd, cfg.dtype, cfg.vocab_size) == (2, 16, "float64", 256)
    assert (cfg.attention, cfg.residual) == ("softmax", "normalised")


def test_jobs_cover_the_grid_and_stretch_with_steps_factor():
    s = runner.settings_for(spec(), ["--preset=tiny", "--lrs=1e-3,2e-3", "--seeds=2", "--warmup=2",
                                     "--steps=3000"])
    methods = spec().methods(s)
    jobs = runner.make_jobs(s, methods, {k: {"label": k} for k in methods})
    assert len(jobs) == 2 * 2 * 2
    assert {(j["label"], j["lr"], j["seed"]) for j in jobs} == {(k, lr, seed) for k in "ab"
                                                               for lr in (1e-3, 2e-3) for seed in (0, 1)}
    b = [j for j in jobs if j["label"] == "b"][0]
    assert (b["steps"], b["warmup"], b["log_every"]) == (9000, 6, 9)   # 3x steps; <= CURVE_POINTS records
    a = [j for j in jobs if j["label"] == "a"][0]
    assert (a["steps"], a["warmup"], a["log_every"]) == (3000, 2, 3)


def test_jobs_run_in_process_longest_first():
    s = runner.settings_for(spec(), ["--preset=tiny", "--steps=2"])
    methods = spec().methods(s)
    configs = {k: runner.model_config(s, m, 256).to_dict() for k, m in methods.items()}
    seen = []
    runner.run_jobs(runner.make_jobs(s, methods, configs), 0, lambda job, r: seen.append((job, r)))
    assert [job["label"] for job, _ in seen] == ["b", "a"]                 # 6 steps before 2
    for job, r in seen:
        assert r["label"] == job["label"] and r["steps_done"] == job["steps"] and not r["diverged"]
        assert all(round(loss, runner.LOSS_DECIMALS) == loss for _, loss in r["history"])


def test_summary_at_the_best_rate():
    runs = [dict(lr=1e-3, seed=0, final_train=2.0, final_val=2.2, history=[(0, 5.0), (9, 2.0)], cpu_seconds=1.0,
                 steps_done=10),
            dict(lr=1e-3, seed=1, final_train=3.0, final_val=3.2, history=[(0, 6.0), (9, 3.0)], cpu_seconds=3.0,
                 steps_done=10),
            dict(lr=3e-3, seed=0, final_train=math.nan, final_val=math.nan, history=[(0, math.nan)])]
    m = runner.summarise_method(runs, (1e-3, 3e-3), unigram=3.0)
    assert m["best_lr"] == 1e-3 and m["by_lr"] == {"0.001": 2.5, "0.003": math.inf}
    assert (m["final_train"], m["final_train_std"], m["final_val"]) == (2.5, 0.5, pytest.approx(2.7))
    assert m["below_unigram"] == 0.5 and m["stalled"] is False
    assert m["curve"] == [[0, 5.5], [9, 2.5]]
    assert m["step_seconds"] == pytest.approx(0.2)          # median CPU seconds per step over the seeds
    near = runner.summarise_method(runs[:1], (1e-3,), unigram=2.0 + STALL_MARGIN / 2)
    assert near["stalled"] is True
    none = runner.summarise_method(runs[2:], (3e-3,), unigram=3.0)
    assert none["best_lr"] is None and none["stalled"] is None and none["curve"] == []
    assert math.isnan(none["final_train"])


@pytest.mark.skipif(backend.cuda_available(), reason="this machine has a GPU")
def test_a_missing_gpu_is_one_line_and_status_2(tmp_path, capsys):
    """--device=cuda without CuPy or a GPU: an error line, not a traceback (it was one)."""
    assert runner.main(spec(), ["--preset=tiny", "--device=cuda", f"--out={tmp_path / 'o'}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: device 'cuda'") and err.count("\n") == 1


def test_rerender_rewrites_table_and_findings_without_training(tmp_path, capsys):
    from nanospa.experiments import fig2
    out = tmp_path / "fig2"
    assert fig2.main(["--preset=tiny", "--methods=espa,softmax", f"--out={out}"]) == 0
    before = json.loads((out / "result.json").read_text())
    (out / "table.md").unlink()
    after = runner.rerender(fig2, out)
    assert after["findings"] == before["findings"] and after["methods"] == before["methods"]
    assert all(m["plan"]["policy"] == "joint" for m in after["methods"].values())   # a dict, not its repr
    assert (out / "table.md").read_text().count("| espa |") == 1


def test_the_study_preset_gives_each_kind_its_window_and_lrs_overrides_it():
    from nanospa.experiments import fig2, longer
    from nanospa.experiments.controls import STUDY_WINDOWS
    s = runner.settings_for(fig2, ["--preset=study"])
    got = {label: m.grid(s) for label, m in fig2.methods(s).items()}
    assert got["espa"] == got["softmax"] == STUDY_WINDOWS["vanilla"]
    assert got["pre_ln"] == STUDY_WINDOWS["pre_ln"]
    assert got["pre_ln_rope"] == got["pre_ln_nopos"] == STUDY_WINDOWS["control"]
    s = runner.settings_for(longer, ["--preset=study"])
    ms = runner.selected_methods(longer, s)
    assert "pre_ln_long" in ms and ms["pre_ln_long"].grid(s) == STUDY_WINDOWS["pre_ln"][1:2]
    assert ms["espa_long"].grid(s) == STUDY_WINDOWS["vanilla"] and ms["espa_long"].steps_factor == 5
    for argv in (["--preset=study", "--lrs=1e-3"], ["--preset=quick"]):
        s = runner.settings_for(fig2, argv)
        assert {m.grid(s) for m in fig2.methods(s).values()} == {tuple(s["lrs"])}


def test_rerender_without_matplotlib_removes_the_stale_picture_and_holds_the_folder(tmp_path, capsys, monkeypatch):
    """A plot.png of the folder's earlier results stood beside the rewritten table when the new
    one could not be drawn; and rerender wrote into a folder another command held."""
    from nanospa.experiments import fig2
    from nanospa.run.rundir import RunDirError, RunLock
    out = tmp_path / "fig2"
    assert fig2.main(["--preset=tiny", "--methods=espa", f"--out={out}"]) == 0
    (out / "plot.png").write_bytes(b"an earlier picture")
    with RunLock(out, key="out"):
        with pytest.raises(RunDirError, match=f"--out={out} is in use by pid"):
            runner.rerender(fig2, out)
    monkeypatch.setattr("nanospa.experiments.report.pyplot", lambda path: None)
    capsys.readouterr()
    runner.rerender(fig2, out)
    assert not (out / "plot.png").exists() and f"removed {out / 'plot.png'}" in capsys.readouterr().out


def test_an_explicit_shape_no_method_trains_is_named(tmp_path, capsys):
    """scaling's methods set their own width: --n_embd=32 trained nothing at width 32."""
    from nanospa.experiments import scaling
    assert scaling.main(["--preset=tiny", "--methods=espa_w128_d24", "--lrs=1e-3", "--n_embd=32", "--n_layer=4",
                         f"--out={tmp_path / 's'}"]) == 0
    captured = capsys.readouterr()
    assert "note: --n_layer=4, --n_embd=32 applies to no method here" in captured.err
    assert "- Setting: depth 4, width 128," in (tmp_path / "s" / "table.md").read_text()
