"""train.py --optimizer=kfac: settings, a run that trains, exact resume, and the factors
averaged over MPI ranks (nanospa/beyond/optimizers.py wires nanospa.beyond.kfac.KFAC into the loop)."""
import numpy as np
import pytest

import train
from nanospa import GPT, GPTConfig
from nanospa.beyond.kfac import KFAC
from nanospa.optim import AdamW
from nanospa.beyond.optimizers import OPTIMIZER_DEFAULTS, make_optimizer

from test_distributed import RTOL, log_losses, needs_mpi, run_train
from test_train import read_log, run, text_file  # noqa: F401 (fixture)

pytestmark = pytest.mark.slow       # the full suite only: python -m pytest -m 'not slow' skips it

KFAC_ARGS = ["--optimizer=kfac", "--learning_rate=0.05", "--min_lr=0.005", "--kfac_inv_interval=2"]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOSPA_CACHE", str(tmp_path / "cache"))


def test_make_optimizer_builds_what_the_settings_name():
    model = GPT(GPTConfig(n_layer=2, n_embd=8, n_head=2, block_size=4, vocab_size=11))
    s = {**train.DEFAULTS}
    assert isinstance(make_optimizer(s, model), AdamW)
    s.update(optimizer="kfac", learning_rate=0.07, kfac_damping=0.02, kfac_inv_interval=3, beta1=0.8)
    opt = make_optimizer(s, model, seed=5, rank=2)
    assert isinstance(opt, KFAC)
    assert (opt.lr, opt.damping, opt.inv_interval, opt.b1, opt.seed) == (0.07, 0.02, 3, 0.8, 5)   # every rank alike
    assert len(opt.blocks) == 4 * 2 + 2 * 2 + 1       # q, k, v, proj, fc, proj per block; the head


def test_every_kfac_setting_is_a_train_setting_with_help(capsys):
    assert train.main(["--help"]) == 0
    out = capsys.readouterr().out
    for key, value in OPTIMIZER_DEFAULTS.items():
        assert train.DEFAULTS[key] == value
        line = next(l for l in out.splitlines() if l.lstrip().startswith(f"--{key}="))
        assert len(line.split("  ")[-1].strip()) > 10, line      # a help text, not just the default


@pytest.mark.parametrize("arg, named", [("--optimizer=sgd", "optimizer"), ("--kfac_damping=0", "kfac_damping"),
                                        ("--kfac_fisher=diag", "kfac_fisher"), ("--kfac_ema=1.5", "kfac_ema"),
                                        ("--kfac_inv_interval=0", "kfac_inv_interval")])
def test_bad_optimizer_settings_are_one_line_and_status_2(arg, named, tmp_path, text_file, capsys):
    assert run(tmp_path, text_file, arg) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and named in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists()                  # refused before anything was written


def test_kfac_run_trains_and_resume_reproduces_it_exactly(tmp_path, text_file):
    common = KFAC_ARGS + ["--dtype=float64", "--log_interval=1", "--eval_interval=3", "--lr_decay_iters=8",
                          "--checkpoint_interval=100", "--sample_tokens=0"]
    assert run(tmp_path, text_file, "--max_iters=8", *common, out="whole") == 0
    assert run(tmp_path, text_file, "--max_iters=5", *common, out="split") == 0   # inverses at 0, 2, 4: split mid-interval
    assert run(tmp_path, text_file, "--max_iters=8", "--init_from=resume", *common, out="split") == 0
    whole, split = read_log(tmp_path / "whole"), read_log(tmp_path / "split")
    assert [(r["iter"], r["train_loss"]) for r in whole] == [(r["iter"], r["train_loss"]) for r in split]
    assert whole[-1]["train_loss"] < whole[1]["train_loss"]        # it trained
    w = np.load(tmp_path / "whole" / "ckpt.npz", allow_pickle=False)
    s = np.load(tmp_path / "split" / "ckpt.npz", allow_pickle=False)
    assert any(k.startswith("optim/kfac.UA.") for k in w.files)   # the factors' inverses are saved
    for name in w.files:
        if name.startswith(("model/", "optim/")):
            np.testing.assert_array_equal(w[name], s[name], err_msg=name)


def test_resume_with_another_optimizer_is_refused(tmp_path, text_file, capsys):
    assert run(tmp_path, text_file, "--max_iters=2", "--sample_tokens=0") == 0
    capsys.readouterr()
    assert run(tmp_path, text_file, "--max_iters=4", "--init_from=resume", *KFAC_ARGS) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "optimizer='kfac'" in err and "adamw" in err


@needs_mpi
def test_two_ranks_average_the_factors_as_one_process(tmp_path):
    """The empirical Fisher on the whole local batch: the mean of the ranks' factors is the
    one process's factors, so mpiexec -n 2 trains as one process (float64)."""
    args = ["--optimizer=kfac", "--learning_rate=0.05", "--min_lr=0.005", "--kfac_fisher=empirical",
            "--kfac_stats_fraction=1", "--kfac_inv_interval=2"]
    p1, p2 = run_train(0, tmp_path / "one", *args), run_train(2, tmp_path / "two", *args)
    assert p1.returncode == 0, p1.stderr
    assert p2.returncode == 0, p2.stderr
    (t1, v1), (t2, v2) = log_losses(tmp_path / "one"), log_losses(tmp_path / "two")
    np.testing.assert_allclose(t2, t1, rtol=RTOL, atol=0)
    np.testing.assert_allclose(v2, v1, rtol=RTOL, atol=0)


def test_experiment_runs_train_with_the_methods_optimizer(monkeypatch):
    """experiments/common.train_run with optimizer settings: K-FAC's curvature pass runs every
    step, and the run differs from AdamW's at the same learning rate."""
    from nanospa.experiments import common
    calls = []
    original = KFAC.update_curvature
    monkeypatch.setattr(KFAC, "update_curvature", lambda self, x, y, **kw: (calls.append(1), original(self, x, y, **kw)))
    cfg = GPTConfig(n_layer=2, n_embd=16, n_head=2, block_size=8, vocab_size=20)
    tokens = np.random.default_rng(0).integers(0, 20, size=400)
    adam = common.train_run(cfg, tokens, tokens, steps=4, lr=0.01, batch_size=4, eval_batches=1)
    assert not calls
    kfac = common.train_run(cfg, tokens, tokens, steps=4, lr=0.01, batch_size=4, eval_batches=1,
                            optimizer=dict(optimizer="kfac", kfac_inv_interval=2))
    assert len(calls) == 4 and kfac["history"][1:] != adam["history"][1:]


def test_kfac_findings_read_the_gap_from_the_summaries():
    from nanospa.experiments import kfac

    def method(final, below=1.0, stalled=False, step_seconds=0.1):
        curve = [[i, final + 1 - i / 10] for i in range(10)]
        return dict(summary=dict(final_train=final, best_lr=0.1, below_unigram=below, stalled=stalled,
                                 step_seconds=step_seconds, curve=curve))
    result = dict(methods={"espa_adamw": method(2.5), "espa_kfac_d0.01": method(2.2, step_seconds=0.2),
                           "espa_kfac_d0.001": method(2.3), "softmax_adamw": method(3.3, 0.0, True),
                           "softmax_kfac_d0.01": method(3.3, 0.0, True), "pre_ln_adamw": method(2.21),
                           "pre_ln_kfac_d0.01": method(2.0)})
    lines = kfac.findings(result)
    assert kfac.best_kfac(result, "espa") == "espa_kfac_d0.01"
    assert any("gap is +0.290 with AdamW and -0.010 with K-FAC -> closed" in l for l in lines), lines
    assert any("does not rescue it" in l for l in lines)
    result["methods"]["espa_kfac_d0.01"] = method(2.4)        # K-FAC narrows the gap only
    result["methods"]["espa_kfac_d0.001"] = method(2.45)
    assert any("-> narrower, not closed" in l for l in kfac.findings(result))
    result["methods"]["espa_adamw"] = method(2.1)             # vanilla E-SPA already ahead
    assert any("no gap to close" in l for l in kfac.findings(result))


@needs_mpi
def test_sampled_fisher_resumed_under_another_number_of_ranks_is_the_same_run(tmp_path):
    """K-FAC with the default sampled Fisher: 2 ranks, then 1, then 2 again (resuming each
    time) train as one process throughout (float64): the targets are drawn for the whole
    batch and each rank uses its share, so the number of ranks does not enter the run."""
    args = ["--optimizer=kfac", "--learning_rate=0.05", "--min_lr=0.005", "--kfac_inv_interval=2",
            "--kfac_stats_fraction=0.5", "--lr_decay_iters=6"]
    assert run_train(0, tmp_path / "one", *args).returncode == 0
    out = tmp_path / "mixed"
    for n, until, more in ((2, 2, []), (0, 4, ["--init_from=resume"]), (2, 6, ["--init_from=resume"])):
        p = run_train(n, out, *args, f"--max_iters={until}", *more)
        assert p.returncode == 0, p.stderr
    logs = [{r["iter"]: r for r in read_log(p)} for p in (tmp_path / "one", out)]
    assert sorted(logs[0]) == sorted(logs[1])
    for it, r in logs[0].items():                            # every step's loss; the evaluations both made
        np.testing.assert_allclose(logs[1][it]["train_loss"], r["train_loss"], rtol=RTOL, atol=0)
        if "val_loss" in r and "val_loss" in logs[1][it]:
            np.testing.assert_allclose(logs[1][it]["val_loss"], r["val_loss"], rtol=RTOL, atol=0)


def settings_of(tmp_path, text_file, *args):
    from nanospa.run.checkpoint import load_checkpoint
    out = tmp_path / "o"
    assert run(tmp_path, text_file, "--max_iters=1", *args, out="o") == 0
    s = load_checkpoint(str(out / "ckpt.npz"))["settings"]
    return s["learning_rate"], s["min_lr"]


@pytest.mark.parametrize("args, rates", [
    ([], (2e-3, 2e-4)),                                                     # AdamW as ever
    (["--optimizer=kfac"], (3e-2, 3e-3)),                                   # K-FAC's own
    (["--optimizer=kfac", "--learning_rate=0.05"], (0.05, 3e-3)),            # an explicit value wins
    (["--optimizer=kfac", "--learning_rate=0.05", "--min_lr=0.001"], (0.05, 1e-3)),
])
def test_the_default_rates_follow_the_optimiser(tmp_path, text_file, args, rates):
    assert settings_of(tmp_path, text_file, *args) == pytest.approx(rates)


def test_a_resumed_kfac_run_keeps_its_own_rates(tmp_path, text_file):
    assert run(tmp_path, text_file, "--max_iters=1", "--optimizer=kfac", "--learning_rate=0.05", out="o") == 0
    assert run(tmp_path, text_file, "--max_iters=2", "--init_from=resume", out="o") == 0
    from nanospa.run.checkpoint import load_checkpoint
    s = load_checkpoint(str(tmp_path / "o" / "ckpt.npz"))["settings"]
    assert (s["learning_rate"], s["min_lr"]) == (0.05, 3e-3)
