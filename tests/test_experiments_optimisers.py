"""The optimisers study (nanospa/experiments/optimisers.py): the tiny preset end to end (the grid
rounds, the extension beyond a best at an edge, the seeds at the best), resuming and --reuse
without retraining, bad settings refused with one line; the iterations ratio, its CPU-second
form, the grid-edge flag and the verdict on a hand-made result."""
import json
import math

import pytest

from nanospa.experiments import optimisers, runner
from nanospa.experiments.__main__ import main

TINY_LABELS = {f"{k}_{o}_d2" for k in ("espa", "pre_ln") for o in ("adamw", "muon", "kfac")}


def _runs(result):
    return {(label, r["lr"], r["seed"]): r for label, m in result["methods"].items() for r in m["runs"]}


@pytest.mark.slow
def test_tiny_runs_the_grid_extends_an_edge_and_adds_seeds_at_the_best(tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["optimisers", "--preset=tiny", f"--out={out}"]) == 0
    result = json.loads((out / "result.json").read_text())
    table = (out / "table.md").read_text()
    assert result["complete"] and set(result["methods"]) == TINY_LABELS
    assert result["settings"]["phase"] == "seeds" and result["settings"]["seeds"] == 2
    for label, m in result["methods"].items():
        kind, opt, _ = label.rsplit("_", 2)
        base = optimisers.grid(kind, opt, 2, tiny=True)
        # two grid points, always a best at an edge, so one more rate beyond it (extend=1)
        assert set(base) < set(m["lrs"]) and len(m["lrs"]) == 3
        _, where = optimisers.grid_best(m, 1, base)                 # round 1's best, on its own grid
        (added,) = set(m["lrs"]) - set(base)                           # ... and the rate beyond that edge
        assert added == optimisers.next_rate(max(base) if where == "high edge" else min(base), where == "high edge")
        best = m["summary"]["best_lr"]
        assert sorted(r["seed"] for r in m["runs"] if r["lr"] == best) == [0, 1]
        assert all(r["seed"] == 0 for r in m["runs"] if r["lr"] != best)
        assert m["steps"] == (6 if kind == "espa" else 3) and f"| {label} |" in table
    assert set(result["analysis"]["ratios"]["2"]) >= {"adamw", "muon", "kfac"}
    assert any(line.startswith("verdict: ") for line in result["findings"])
    assert "verdict: " in table


@pytest.mark.slow
def test_a_stopped_study_resumes_and_reuse_takes_every_finished_run(tmp_path, capsys):
    first, other = tmp_path / "first", tmp_path / "other"
    part = "--methods=espa_adamw_d2,pre_ln_adamw_d2"
    assert main(["optimisers", "--preset=tiny", part, f"--out={first}"]) == 0     # a session that ran a part
    before = _runs(json.loads((first / "result.json").read_text()))
    capsys.readouterr()
    assert main(["optimisers", "--preset=tiny", f"--out={first}"]) == 0             # the next one: the rest
    printed = capsys.readouterr().out
    after = _runs(json.loads((first / "result.json").read_text()))
    assert {k: r["checksum"] for k, r in before.items()} == {k: after[k]["checksum"] for k in before}
    assert printed.count("(kept)") >= len(before)
    assert set(after) > set(before)
    assert main(["optimisers", "--preset=tiny", f"--out={other}", f"--reuse={first}"]) == 0   # nothing to train
    printed = capsys.readouterr().out
    assert "(reused from" in printed and not any(line.rstrip().endswith(" s)") for line in printed.splitlines()
                                                  if line.startswith("["))
    got = _runs(json.loads((other / "result.json").read_text()))
    assert set(got) == set(after) and all(got[k]["history"] == after[k]["history"] for k in got)


@pytest.mark.parametrize("argv, words", [
    (["--depths=0"], "depths must be distinct positive integers"),
    (["--depths=4,4"], "depths must be distinct positive integers"),
    (["--extend=-1"], "extend >= 0"),
    (["--grid_seeds=0"], "grid_seeds must be >= 1"),
    (["--espa_factor=0"], "espa_factor >= 1"),
    (["--methods=espa_adamw_d5"], "unknown method 'espa_adamw_d5'"),
    (["--depths=a"], "--depths=a: expected int"),
])
def test_bad_settings_are_one_error_line_and_status_2(argv, words, tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["optimisers", "--preset=tiny", f"--out={out}", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and words in err and err.count("\n") == 1
    assert not out.exists()


def test_the_next_rate_is_on_the_half_decade_ladder():
    assert optimisers.next_rate(1e-3, up=True) == 3e-3 and optimisers.next_rate(3e-3, up=True) == 1e-2
    assert optimisers.next_rate(1e-3, up=False) == 3e-4 and optimisers.next_rate(3e-4, up=False) == 1e-4
    assert optimisers.next_rate(1.0, up=True) == 3.0 and optimisers.next_rate(2e-2, up=False) == 1e-2
    assert optimisers.next_rate(2e-2, up=True) == 3e-2


def test_every_grid_puts_the_expected_best_inside_and_depths_take_the_nearest():
    assert optimisers.grid("espa", "adamw", 24) == (3e-5, 1e-4, 3e-4, 1e-3)       # fit: 1.6e-4
    assert optimisers.grid("espa", "adamw", 20) == optimisers.grid("espa", "adamw", 24)
    assert optimisers.grid("espa", "adamw", 8) == optimisers.grid("espa", "adamw", 4)    # a tie: the shallower
    assert optimisers.grid("pre_ln", "kfac", 4, tiny=True) == (1e-1, 3e-1)
    s = runner.settings_for(optimisers, ["--preset=full"])
    ms = optimisers.methods(s)
    assert len(ms) == 18 and s["n_embd"] == 128 and s["n_head"] == 4 and s["batch_size"] == 12
    assert ms["espa_kfac_d24"].steps_factor == 2 and ms["pre_ln_kfac_d24"].steps_factor == 1
    assert ms["espa_kfac_d24"].optimizer["kfac_damping"] == 1e-2 and ms["pre_ln_muon_d4"].optimizer["optimizer"] == "muon"
    assert all(4 <= len(m.lrs) <= 5 for m in ms.values())


# ------------------------------------------------------------------ a hand-made result

def history(steps, stretch):
    """A loss curve 2 + 3 exp(-s / (30 stretch)) at step s = it + 1, one record per step: a
    curve stretched k-fold in steps reaches any loss after k times the steps."""
    return [[it, 2.0 + 3.0 * math.exp(-(it + 1) / (30.0 * stretch))] for it in range(steps)]


def method(kind, opt, depth, steps, stretches, step_seconds, lrs=(1e-3, 3e-3, 1e-2), best=3e-3):
    """A result's method: seed s at `best` has the curve stretched stretches[s]; the other rates
    (seed 0) end 0.2 higher."""
    runs = []
    for lr in lrs:
        for seed, k in (enumerate(stretches) if lr == best else [(0, stretches[0])]):
            h = history(steps, k)
            final = h[-1][1] + (0.0 if lr == best else 0.2)
            runs.append(dict(lr=lr, seed=seed, history=h, final_train=final, final_val=final, diverged=False,
                             steps_done=steps, cpu_seconds=step_seconds * steps))
    return dict(description=f"{kind} {opt}", steps=steps, lrs=list(lrs), runs=runs, config={},
                extra=dict(kind=kind, opt=opt, depth=depth),
                summary=runner.summarise_method(runs, lrs, unigram=3.3))


def hand_made():
    m = {
        "pre_ln_adamw_d4": method("pre_ln", "adamw", 4, 100, (1.0, 1.0), 0.10, lrs=(1e-3, 3e-3), best=3e-3),
        "espa_adamw_d4": method("espa", "adamw", 4, 200, (1.2, 1.2), 0.08),
        "espa_muon_d4": method("espa", "muon", 4, 200, (1.2, 3.0), 0.10),        # seed 1 never gets there
        "espa_kfac_d4": method("espa", "kfac", 4, 200, (3.0, 3.0), 0.20),        # neither seed does
        "pre_ln_adamw_d12": method("pre_ln", "adamw", 12, 100, (1.0, 1.0), 0.30),
        "espa_adamw_d12": method("espa", "adamw", 12, 200, (1.8, 1.8), 0.24),     # reached, but beyond 1.5x
    }
    result = dict(methods=m, settings=dict(grid_seeds=1, seeds=2, phase="seeds"),
                  data=dict(tokenizer="byte", unigram_entropy=3.3))
    result["analysis"] = optimisers.analysis(result)
    return result


def test_the_iterations_ratio_per_step_and_per_cpu_second():
    a = hand_made()["analysis"]
    r = a["ratios"]["4"]["adamw"]
    assert r["per_seed"] == pytest.approx([1.2, 1.2], rel=0.02) and r["reached"] == r["seeds"] == 2
    assert r["cost"] == pytest.approx(0.8) and r["seconds"] == pytest.approx(0.8 * r["mean"])
    muon, kfac = a["ratios"]["4"]["muon"], a["ratios"]["4"]["kfac"]
    assert muon["per_seed"][1] is None and muon["reached"] == 1 and muon["limit"] == 2.0
    assert kfac["reached"] == 0 and kfac["mean"] is None
    assert a["ratios"]["12"]["adamw"]["mean"] == pytest.approx(1.8, rel=0.02)
    assert a["cost"]["espa_kfac_d4"] == pytest.approx(2.5) and a["cost"]["espa_muon_d4"] == pytest.approx(1.25)
    assert a["grid"]["pre_ln_adamw_d4"] == dict(best=3e-3, where="high edge", reported=3e-3)
    assert a["grid"]["espa_adamw_d4"]["where"] == "interior"


def test_the_findings_flag_an_edge_say_not_reached_and_compute_the_verdict():
    lines = optimisers.findings(hand_made())
    text = "\n".join(lines)
    assert "not interior: extend the grid" in text and "pre_ln_adamw_d4 (best 0.003 at the high edge)" in text
    assert "depth 4, K-FAC: vanilla E-SPA's iterations ratio against Pre-LN with AdamW not reached (> 2)" in text
    assert "1 of 2 seeds not reached, > 2" in text
    verdict = [line for line in lines if line.startswith("verdict: ")]
    assert len(verdict) == 1
    assert "AdamW: within 1.5x at depths 4 (in CPU seconds at depths 4, 12)" in verdict[0]   # 1.8 x 0.8 = 1.44
    assert "Muon: within 1.5x at no depth (in CPU seconds at no depth)" in verdict[0]
    assert "K-FAC: within 1.5x at no depth" in verdict[0]
    assert "provisional: pre_ln_adamw_d4" in verdict[0]
    assert "K-FAC's CPU cost per step relative to AdamW's: depth 4 E-SPA 2.50x" in text


def test_a_seed_that_diverged_at_the_grid_best_is_flagged_and_makes_the_verdict_provisional():
    result = hand_made()
    runs = result["methods"]["espa_adamw_d4"]["runs"]
    bad = next(r for r in runs if r["lr"] == 3e-3 and r["seed"] == 1)
    bad.update(final_train=math.nan, diverged=True)
    m = result["methods"]["espa_adamw_d4"]
    m["summary"] = runner.summarise_method(runs, m["lrs"], unigram=3.3)
    assert m["summary"]["best_lr"] != 3e-3                          # the summary moved; the grid's best did not
    result["analysis"] = optimisers.analysis(result)
    text = "\n".join(optimisers.findings(result))
    assert "espa_adamw_d4 (grid best 0.003, reported 0.001)" in text
    assert "provisional: pre_ln_adamw_d4, espa_adamw_d4" in text


def test_an_out_another_command_holds_is_refused_and_help_lists_the_settings(tmp_path, capsys):
    from nanospa.run.rundir import RunLock
    out = tmp_path / "o"
    with RunLock(out, key="out"):
        assert main(["optimisers", "--preset=tiny", f"--out={out}"]) == 2
        captured = capsys.readouterr()
        assert captured.err.startswith(f"error: --out={out} is in use by pid") and "runs on" not in captured.out
    assert main(["optimisers", "--help"]) == 0
    text = capsys.readouterr().out
    assert all(f"--{k}=" in text for k in ("depths", "grid_seeds", "extend", "espa_factor"))


def test_an_out_that_is_a_file_is_refused_before_any_work(tmp_path, capsys):
    blocker = tmp_path / "taken"
    blocker.write_text("x")
    assert main(["optimisers", "--preset=tiny", f"--out={blocker}"]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"error: --out={blocker}: {blocker} is a file, not a folder\n" and "runs on" not in captured.out
