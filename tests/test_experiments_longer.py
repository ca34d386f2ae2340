"""Tests for the iterations ratio of nanospa/experiments/longer.py on synthetic loss curves
(smoothing, the crossing, censoring, the per-seed analysis of a result), the study preset
and the positional controls of fig2 and longer (nanospa/experiments/controls.py), and the
seed bands of the plot (report.seed_spread)."""
import json

import numpy as np
import pytest

from nanospa.experiments import fig2, longer, report
from nanospa.experiments.__main__ import main
from nanospa.experiments.controls import POSITION_CONTROLS
from nanospa.experiments.longer import CHECKPOINTS
from nanospa.experiments.runner import selected_methods, settings_for


def curve(steps, scale=1.0, noise=0.0, seed=0, every=1):
    """A Pre-LN-like history [(iteration, loss)]: 2 + 3 exp(-t / (80 scale)) at step t = it + 1,
    logged every `every` iterations and at the last (as the runner logs), optional noise."""
    it = np.unique(np.concatenate([np.arange(0, steps, every), [steps - 1]]))
    loss = 2.0 + 3.0 * np.exp(-(it + 1) / (80.0 * scale))
    loss = loss + noise * np.random.default_rng(seed).standard_normal(len(it))
    return [(int(i), float(v)) for i, v in zip(it, loss)]


def test_a_curve_stretched_5x_in_steps_gives_ratio_5():
    """E-SPA's curve is exactly Pre-LN's stretched 5-fold in steps, logged every 2 steps as
    the runner logs a 2000-step run (run for 2400 steps here, so that the 100% checkpoint,
    reached at step 2000, is not at the very end): the ratio is 5 at every checkpoint (to
    the error of linear interpolation between records, ~1e-4 here)."""
    pre, espa = curve(400), curve(2400, scale=5.0, every=2)
    ratios = longer.iterations_ratio(pre, espa, [40, 100, 200, 400])
    np.testing.assert_allclose(ratios, 5.0, rtol=1e-3)
    np.testing.assert_allclose(longer.iterations_ratio(pre, curve(900, scale=2.0), [40, 100, 200, 400]), 2.0,
                               rtol=1e-3)
    np.testing.assert_allclose(longer.iterations_ratio(pre, pre, [40, 100, 200, 400]), 1.0, rtol=1e-12)


def test_smoothing_is_a_trailing_relative_window():
    steps = np.arange(1, 11, dtype=float)
    loss = np.arange(10, dtype=float)
    sm = longer.smoothed(steps, loss, fraction=0.2)
    # loss = step - 1, linear: the mean over [0.8 t, t] is 0.9 t - 1; step 1: the window is empty
    np.testing.assert_allclose(sm[1:], 0.9 * steps[1:] - 1.0, rtol=1e-12)
    assert sm[0] == 0.0
    bumpy = longer.smoothed([1, 2, 4, 5], [0.0, 10.0, 0.0, 0.0], fraction=0.5)
    assert bumpy[2] == pytest.approx(5.0)                  # step 4: [2, 4], a line from 10 to 0
    assert bumpy[3] == pytest.approx(1.5 * 7.5 / 2 / 2.5)  # step 5: [2.5, 5], 7.5 -> 0 on [2.5, 4], then 0
    np.testing.assert_array_equal(longer.smoothed(steps, loss, fraction=0.0), loss)


def test_the_crossing_is_interpolated_and_a_curve_that_never_gets_there_is_censored():
    assert longer.steps_to_reach([1, 2, 3], [5.0, 3.0, 1.0], 2.0) == pytest.approx(2.5)
    assert longer.steps_to_reach([1, 2, 3], [5.0, 3.0, 1.0], 9.0) == 1.0
    assert longer.steps_to_reach([1, 2, 3], [5.0, 3.0, 2.5], 2.0) is None
    flat = [(i, 4.0) for i in range(2000)]                      # never reaches Pre-LN's loss
    assert longer.iterations_ratio(curve(400), flat, [40, 400, 800]) == [None, None, None]   # 800: past the run


def test_noise_is_smoothed_away():
    """With noise of 0.05 nats per step (about the batch noise of the quick preset), the ratio
    of a 5-fold stretched curve stays within 10% of 5 from the 25% checkpoint on."""
    pre, espa = curve(400, noise=0.05, seed=1), curve(2400, scale=5.0, noise=0.05, seed=2, every=2)
    np.testing.assert_allclose(longer.iterations_ratio(pre, espa, [100, 200, 400]), 5.0, rtol=0.1)


SCALES = (4.0, 4.5, 6.0)


def fake_result(seeds=3, steps=400, factor=5):
    """A result dict as the runner writes it, with synthetic curves: espa_long is pre_ln
    stretched 4, 4.5, 6-fold for seeds 0, 1, 2; the ALiBi control like Pre-LN."""
    def method(histories, n):
        runs = [dict(seed=s, lr=1e-3, diverged=False, history=h) for s, h in enumerate(histories)]
        return dict(steps=n, runs=runs, summary=dict(best_lr=1e-3, final_train=2.0, curve=[]))
    pre = [curve(steps, noise=0.0) for _ in range(seeds)]
    espa = [curve(steps * factor, scale=SCALES[s], every=2) for s in range(seeds)]
    return dict(settings=dict(steps=steps, factor=factor),
                methods=dict(pre_ln=method(pre, steps), pre_ln_alibi=method(pre, steps),
                             espa_long=method(espa, steps * factor)))


def test_analysis_per_seed_mean_and_spread():
    r = longer.analysis(fake_result(factor=8))["iterations_ratio"]
    assert set(r) == {"pre_ln", "pre_ln_alibi"}
    a = r["pre_ln"]
    assert a["steps"] == [40, 100, 200, 400] and a["against"] == "espa_long" and a["seeds"] == 3
    for v in a["per_seed"].values():
        np.testing.assert_allclose(v, v[-1], rtol=1e-3)                          # the same at every S
    np.testing.assert_allclose([v[-1] for v in a["per_seed"].values()], SCALES, rtol=1e-3)
    np.testing.assert_allclose(a["mean"], np.mean(SCALES), rtol=1e-3)
    np.testing.assert_allclose(a["std"], np.std(SCALES), rtol=1e-2)
    # with 5 x steps, seed 2 (6-fold slower) cannot reach the 100% loss (step 2400 > 2000):
    # censored, and left out of the mean and spread, which the line says
    a = longer.analysis(fake_result(factor=5))["iterations_ratio"]["pre_ln"]
    assert a["reached"] == [3, 3, 3, 2] and a["mean"][-1] == pytest.approx(4.25, rel=1e-3)
    line = longer.ratio_line("pre_ln", a)
    assert "S = 400 (100%): 4.25 ± 0.25 (1 of 3 seeds not reached) [seeds: 4.00, 4.50, -]" in line
    a = longer.analysis(fake_result(factor=2))["iterations_ratio"]["pre_ln"]
    assert a["reached"][-1] == 0 and "S = 400 (100%): > 2 (not reached)" in longer.ratio_line("pre_ln", a)


def test_findings_and_rerender_carry_the_ratios(tmp_path, capsys):
    """A tiny run with 2 seeds: result.json has the analysis, the findings its lines, and the
    plot draws bands (seed_spread) without failing."""
    out = tmp_path / "longer"
    assert main(["longer", "--preset=tiny", "--seeds=2", f"--out={out}",
                 "--methods=pre_ln,pre_ln_spa_prior,espa,espa_long,pre_ln_long"]) == 0
    result = json.loads((out / "result.json").read_text())
    ratios = result["analysis"]["iterations_ratio"]
    assert set(ratios) == {"pre_ln", "pre_ln_spa_prior", "pre_ln_long"} and ratios["pre_ln"]["seeds"] == 2
    assert ratios["pre_ln_long"]["steps"] == [max(1, round(c * 2 * result["settings"]["steps"])) for c in CHECKPOINTS]
    gap = (result["methods"]["espa_long"]["summary"]["final_train"]
           - result["methods"]["pre_ln_long"]["summary"]["final_train"])
    assert sum(line.startswith(f"both trained 2x as long: vanilla E-SPA minus Pre-LN final train loss {gap:+.3f}")
               for line in result["findings"]) == 1
    assert any(line.startswith("iterations ratio, espa_long against pre_ln") for line in result["findings"])
    assert report.seed_spread(result["methods"]["pre_ln"], 1).shape == (len(result["methods"]["pre_ln"]["summary"]["curve"]),)
    assert "iterations ratio" in (out / "table.md").read_text()


def test_study_preset_and_the_positional_controls():
    s = settings_for(longer, ["--preset=study", "--out=/tmp/never-written"])
    assert s["seeds"] == 3 and s["steps"] == 400 and s["factor"] == 5
    assert list(selected_methods(longer, s)) == ["pre_ln", *POSITION_CONTROLS, "espa", "espa_long", "pre_ln_long"]
    s = settings_for(fig2, ["--preset=study", "--out=/tmp/never-written"])
    methods = selected_methods(fig2, s)
    assert s["seeds"] == 3 and set(POSITION_CONTROLS) <= set(methods)
    for label, pos in POSITION_CONTROLS.items():
        assert methods[label].config == dict(methods["pre_ln"].config, pos=pos)
    quick = settings_for(fig2, ["--out=/tmp/never-written"])
    assert list(selected_methods(fig2, quick)) == ["softmax", "value_skipinit", "uspa", "espa", "pre_ln"]


def test_long_lrs_sets_the_long_pre_ln_grid_and_defaults_to_the_window_middle():
    study = settings_for(longer, ["--preset=study", "--out=/tmp/never-written"])
    assert selected_methods(longer, study)["pre_ln_long"].lrs == (1e-2,)      # the middle of (3e-3, 1e-2, 3e-2)
    grid = settings_for(longer, ["--preset=study", "--long_lrs=3e-3,1e-2,3e-2", "--out=/tmp/never-written"])
    methods = selected_methods(longer, grid)
    assert methods["pre_ln_long"].lrs == (3e-3, 1e-2, 3e-2)
    assert methods["pre_ln"].lrs == (3e-3, 1e-2, 3e-2)                        # the others unchanged
    for bad in ("--long_lrs=-1e-3", "--long_lrs=0,1e-3"):
        with pytest.raises(ValueError, match="long_lrs"):
            selected_methods(longer, settings_for(longer, ["--preset=study", bad, "--out=/tmp/never-written"]))
