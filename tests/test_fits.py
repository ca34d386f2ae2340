"""run/fits.py: the lower bound on a step's memory holds and means something, and a size
that cannot fit is refused before the model is built."""
import tracemalloc

import numpy as np
import pytest

import train
from nanospa import GPT, GPTConfig
from nanospa.optim import AdamW
from nanospa.run.fits import check_fits, least_bytes, total
from nanospa.run.settings import SettingsError
from nanospa.run.step import train_step


@pytest.mark.parametrize("kw, batch", [
    (dict(block_size=64, n_embd=64, n_layer=4), 8),                          # dense attention
    (dict(block_size=64, n_embd=32, n_layer=2, dtype="float64"), 16),
    (dict(block_size=512, n_embd=32, n_layer=2), 2),                         # blockwise
    (dict(block_size=32, n_embd=128, n_layer=3), 2),                         # the parameters dominate
])
def test_the_bound_lies_below_a_real_steps_peak_and_near_it(kw, batch):
    """NumPy reports its allocations to tracemalloc: the peak from building the model to the
    end of its second step (AdamW's moments exist from the first)."""
    cfg = GPTConfig(vocab_size=256, n_head=2, **kw)
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (batch, cfg.block_size))
    tracemalloc.start()
    try:
        model = GPT(cfg)
        opt = AdamW(model.parameters(), lr=1e-3)
        for _ in range(2):
            train_step(model, opt, x, x, 1.0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    bound = total(least_bytes(cfg, batch))
    assert bound <= peak, (bound, peak)
    assert bound >= peak / 3, (bound, peak)                 # not a vacuous bound


def test_a_width_that_cannot_fit_is_refused_with_the_estimate():
    cfg = GPTConfig(vocab_size=256, n_embd=4096, n_head=32, n_layer=12)
    with pytest.raises(SettingsError, match=r"needs at least 3\d\.\d GB \(weights 2\d\.\d, .*24\.0 GB available: "
                                            r"lower n_embd or n_layer"):
        check_fits(cfg, 16, available=24e9)
    check_fits(GPTConfig(vocab_size=256), 16, available=24e9)     # the default run fits


def test_train_refuses_before_building_the_model(tmp_path, capsys, monkeypatch):
    """--n_embd=4096 spent minutes in QR before running out of memory; now one line, first."""
    monkeypatch.setattr("nanospa.run.fits.available_bytes", lambda device="cpu": 24e9)
    monkeypatch.setattr(train, "GPT", lambda *a, **k: pytest.fail("the model was built"))
    text = tmp_path / "t.txt"
    text.write_text("some text to train on. " * 200)
    assert train.main([f"--data={text}", f"--out_dir={tmp_path / 'o'}", "--n_embd=4096", "--n_head=32"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: a training run of n_layer=12 n_embd=4096") and err.count("\n") == 1
    assert not (tmp_path / "o" / "ckpt.npz").exists()


def test_the_benchmark_and_the_experiments_refuse_first(tmp_path, capsys, monkeypatch):
    from nanospa.bench import command as bench
    from nanospa.experiments.__main__ import main as experiments
    monkeypatch.setattr("nanospa.run.fits.available_bytes", lambda device="cpu": 1e9)
    assert bench.main(["--config=tiny", "--block_size=1000000", "--torch=no"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: a training step of") and "lower batch_size or block_size" in err
    assert experiments(["fig2", "--preset=tiny", "--n_embd=2048", "--n_head=2", f"--out={tmp_path / 'o'}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: a training step of n_layer=4 n_embd=2048") and "lower n_embd or n_layer" in err
    assert not (tmp_path / "o").exists()


def test_kfacs_factors_lie_below_a_real_kfac_runs_peak():
    """K-FAC's factors and eigenvectors, counted with the step: still a lower bound."""
    from nanospa.beyond.kfac import KFAC
    cfg = GPTConfig(vocab_size=256, n_head=2, block_size=32, n_embd=64, n_layer=2)
    x = np.random.default_rng(0).integers(0, 256, (4, cfg.block_size))
    tracemalloc.start()
    try:
        model = GPT(cfg)
        opt = KFAC(model, lr=1e-3, inv_interval=1)
        for _ in range(2):
            train_step(model, opt, x, x, 1.0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    parts = least_bytes(cfg, 4, kfac=True)
    assert total(least_bytes(cfg, 4)) < total(parts) <= peak, (parts, peak)


def test_kfacs_bound_counts_the_heads_factors_unless_tied():
    """The head is a Linear (C in, V out) with factors C x C and V x V and their eigenvectors;
    tied, it is the embedding's matrix: no factors, and V C parameters fewer."""
    cfg = GPTConfig(vocab_size=50304, n_head=2, block_size=32, n_embd=64, n_layer=2)
    tied = GPTConfig(vocab_size=50304, n_head=2, block_size=32, n_embd=64, n_layer=2, tie_embeddings=True)
    kfac, kfac_tied = least_bytes(cfg, 4, kfac=True)["kfac"], least_bytes(tied, 4, kfac=True)["kfac"]
    assert kfac - kfac_tied == 2 * (64 * 64 + 50304 * 50304) * 4        # 20 GB: refused on a small machine
    assert least_bytes(cfg, 4)["weights"] - least_bytes(tied, 4)["weights"] == 3 * 50304 * 64 * 4


@pytest.mark.parametrize("argv, part, lower", [
    (["--batch_size=1", "--grad_accum=100000000"], "batches", "batch_size, grad_accum, eval_iters or block_size"),
    (["--batch_size=1000000"], "activations", "batch_size or block_size"),
    (["--optimizer=kfac", "--n_embd=1024", "--n_head=8"], "kfac", "n_embd or n_layer"),
])
def test_train_refuses_before_any_batch_is_drawn(argv, part, lower, tmp_path, capsys, monkeypatch):
    """The evaluation batches (2 splits x eval_iters x 2 int64 arrays of batch_size x grad_accum
    sequences) were drawn before the memory check: a huge --batch_size allocated until the
    machine ran out instead of being refused. Now nothing is drawn or built first."""
    monkeypatch.setattr("nanospa.run.fits.available_bytes", lambda device="cpu": 2e9)
    monkeypatch.setattr(train, "get_batch", lambda *a, **k: pytest.fail("a batch was drawn"))
    monkeypatch.setattr(train, "GPT", lambda *a, **k: pytest.fail("the model was built"))
    text = tmp_path / "t.txt"
    text.write_text("some text to train on. " * 200)
    assert train.main([f"--data={text}", f"--out_dir={tmp_path / 'o'}", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: a training run of") and f"{part} " in err and f"lower {lower}" in err, err
    assert not (tmp_path / "o").exists()
