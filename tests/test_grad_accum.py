"""--grad_accum=k (nanospa/run/step.py): k micro-batches of batch_size sequences are one step
on batch_size * k sequences: the same loss and every gradient as the k-times-larger batch to
float64 rounding, with threads, with K-FAC (its curvature statistics included) and under
mpiexec; checkpoints and exact resume unchanged; tokens/s counts every micro-batch; a bad
value is one error line, exit 2."""
import json

import numpy as np
import pytest

import train
from nanospa.run.checkpoint import load_checkpoint

from test_distributed import RTOL, log_losses, needs_mpi, run_train
from test_train import text_file  # noqa: F401 (fixture)

pytestmark = pytest.mark.slow       # the full suite only: python -m pytest -m 'not slow' skips it
# float64, so that "the same to rounding" is measurable: the two runs add the same per-sequence
# gradients in another grouping (observed: 1e-16 relative); RTOL (1e-10) leaves 6 orders of margin
TINY = ["--dtype=float64", "--n_layer=2", "--n_embd=16", "--n_head=2", "--block_size=16", "--max_iters=6",
        "--eval_interval=3", "--eval_iters=2", "--log_interval=1", "--checkpoint_interval=3", "--sample_tokens=0",
        "--warmup_iters=2", "--threads=1"]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOSPA_CACHE", str(tmp_path / "cache"))


def train_run(tmp_path, text_file, name, *args):
    out = tmp_path / name
    assert train.main(TINY + [f"--data={text_file}", f"--out_dir={out}", *args]) == 0
    return out


def same_run(a, b, rtol=RTOL):
    (ta, va), (tb, vb) = log_losses(a), log_losses(b)
    np.testing.assert_allclose(tb, ta, rtol=rtol, atol=0)
    np.testing.assert_allclose(vb, va, rtol=rtol, atol=0)
    pa, pb = load_checkpoint(str(a / "ckpt.npz"))["model"], load_checkpoint(str(b / "ckpt.npz"))["model"]
    for k in pa:
        np.testing.assert_allclose(pb[k], pa[k], rtol=RTOL, atol=1e-13, err_msg=k)


@pytest.mark.parametrize("extra", [[], ["--threads=2"], ["--optimizer=kfac", "--learning_rate=0.05",
                                                         "--min_lr=0.005", "--kfac_inv_interval=2"]])
def test_micro_batches_are_the_larger_batch(tmp_path, text_file, extra):
    big = train_run(tmp_path, text_file, "big", "--batch_size=8", *extra)
    accum = train_run(tmp_path, text_file, "accum", "--batch_size=2", "--grad_accum=4", *extra)
    same_run(big, accum)


def test_a_planted_difference_is_caught(tmp_path, text_file):
    """The comparison has teeth: another batch (a micro-batch twice over) is not the same run."""
    big = train_run(tmp_path, text_file, "big", "--batch_size=8")
    half = train_run(tmp_path, text_file, "half", "--batch_size=4", "--grad_accum=1")
    with pytest.raises(AssertionError):
        same_run(big, half)


def test_resume_with_micro_batches_is_the_uninterrupted_run(tmp_path, text_file):
    whole = train_run(tmp_path, text_file, "whole", "--batch_size=2", "--grad_accum=3", "--lr_decay_iters=6")
    split = train_run(tmp_path, text_file, "split", "--batch_size=2", "--grad_accum=3", "--lr_decay_iters=6",
                      "--max_iters=3")
    assert train.main(TINY + [f"--data={text_file}", f"--out_dir={split}", "--init_from=resume"]) == 0
    same_run(whole, split, rtol=0)                     # exact: the same steps, the same order


def test_tokens_per_second_count_every_micro_batch(tmp_path, text_file, monkeypatch):
    ticks = iter(range(10 ** 6))
    monkeypatch.setattr(train.time, "perf_counter", lambda: float(next(ticks)))
    out = train_run(tmp_path, text_file, "o", "--batch_size=2", "--grad_accum=3", "--max_iters=1",
                    "--eval_interval=100")
    record = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()][-1]
    assert record["iter"] == 1 and record["tokens_per_s"] == 2 * 3 * 16   # B A T tokens in one tick


@pytest.mark.parametrize("value, words", [("0", "grad_accum must be a positive integer, got 0"),
                                          ("2.5", "--grad_accum=2.5: expected int")])
def test_bad_values_are_one_line_and_status_2(tmp_path, text_file, capsys, value, words):
    assert train.main(TINY + [f"--data={text_file}", f"--out_dir={tmp_path / 'o'}", f"--grad_accum={value}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err and not (tmp_path / "o").exists()


@needs_mpi
@pytest.mark.parametrize("extra", [[], ["--optimizer=kfac", "--learning_rate=0.05", "--min_lr=0.005",
                                        "--kfac_inv_interval=2", "--kfac_stats_fraction=0.5"]])
def test_micro_batches_on_two_ranks_are_the_one_process_larger_batch(tmp_path, extra):
    one = tmp_path / "one"
    two = tmp_path / "two"
    p1 = run_train(0, one, "--batch_size=8", *extra)
    p2 = run_train(2, two, "--batch_size=4", "--grad_accum=2", *extra)
    assert p1.returncode == 0, p1.stderr
    assert p2.returncode == 0, p2.stderr
    same_run(one, two)
