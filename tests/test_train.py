"""train.py: settings, bad input, logging, checkpoints (atomic writes, exact resume, Ctrl-C),
divergence, and the README's main command. The checkpoint file's own functions are tested in
tests/test_checkpoint.py, the settings parser's in tests/test_settings.py.

Most runs call train.main([...]) in-process on a tiny model (2 layers, width 16, T = 16)
and a small text file in tmp_path; a few run `python train.py` as a subprocess where the
exit status, stderr or a signal is what is tested.
"""
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

import train
from nanospa import backend
from nanospa.run import heads
from nanospa.run import threads as cpu
from nanospa.run import checkpoint
from nanospa.run.checkpoint import load_checkpoint
from nanospa.config import GPTConfig
from nanospa.run.session import settings_of
from nanospa.run.settings import SettingsError

pytestmark = pytest.mark.slow       # the full suite only: python -m pytest -m 'not slow' skips it

ROOT = Path(__file__).resolve().parents[1]
WORDS = ("the model attention layer kernel signal deep network without shortcuts token "
         "sequence learns slowly quickly and or of to a in is").split()
TINY = ["--n_layer=2", "--n_embd=16", "--n_head=2", "--block_size=16", "--batch_size=4",
        "--eval_iters=2", "--sample_tokens=8", "--warmup_iters=2"]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOSPA_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def text_file(tmp_path):
    """About 6 kB of word salad: enough for T = 16 windows in both splits."""
    rng = np.random.default_rng(0)
    path = tmp_path / "tiny.txt"
    path.write_text(" ".join(rng.choice(WORDS, size=1200)) + "\n", encoding="utf-8")
    return path


def run(tmp_path, text_file, *extra, out="out"):
    """train.main with the tiny settings; returns the exit status."""
    return train.main(TINY + [f"--data={text_file}", f"--out_dir={tmp_path / out}", *extra])


def read_log(folder):
    with open(folder / "log.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def subprocess_env(tmp_path):
    return dict(os.environ, NANOSPA_CACHE=str(tmp_path / "cache"), OMP_NUM_THREADS="1",
                OPENBLAS_NUM_THREADS="1", PYTHONUNBUFFERED="1")


# ----------------------------------------------------------------------------- settings

def test_defaults_come_from_gptconfig_unless_train_sets_them():
    for f in fields(GPTConfig):
        if f.name == "vocab_size":                     # comes from the dataset
            assert f.name not in train.DEFAULTS
        elif f.name not in train.TRAIN_DEFAULTS:
            assert train.DEFAULTS[f.name] == f.default, f.name
    cfg = GPTConfig(**{k: train.DEFAULTS[k] for k in train.MODEL_KEYS})
    # the default run: a vanilla E-SPA transformer with a shaped activation, >= 12 layers
    assert (cfg.attention, cfg.residual, cfg.norm) == ("espa", "none", "none")
    assert cfg.activation.startswith(("tat_", "dks_")) and cfg.n_layer >= 12


def test_overrides_are_type_checked():
    s = settings_of(["--n_layer=3", "--learning_rate=1", "--eval_only", "--data=some file.txt",
                     "--activation=relu", "--dtype='float64'"], train.DEFAULTS, train.PRESETS)
    assert s["n_layer"] == 3 and s["learning_rate"] == 1.0 and isinstance(s["learning_rate"], float)
    assert s["eval_only"] is True and s["data"] == "some file.txt"
    assert s["activation"] == "relu" and s["dtype"] == "float64"
    assert settings_of(["--activation=3"], train.DEFAULTS, train.PRESETS)["activation"] == "3"  # GPTConfig rejects it
    for bad in ("--n_layer=2.5", "--n_layer=True", "--learning_rate=fast", "--eval_only=1"):
        with pytest.raises(SettingsError, match=bad.split("=")[0]):
            settings_of([bad], train.DEFAULTS, train.PRESETS)


def test_preset_is_applied_before_explicit_overrides():
    s = settings_of(["--n_layer=4", "--preset=gpu"], train.DEFAULTS, train.PRESETS)
    assert s["n_layer"] == 4                           # explicit wins, whatever the order
    assert s["device"] == "cuda" and s["n_embd"] == train.PRESETS["gpu"]["n_embd"]
    with pytest.raises(SettingsError, match="unknown preset 'tpu'"):
        settings_of(["--preset=tpu"], train.DEFAULTS, train.PRESETS)


def test_unknown_key_suggests_the_closest(capsys):
    assert train.main(["--n_layers=3"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "error: unknown setting --n_layers; did you mean --n_layer?"


def test_help_lists_every_key_with_default_and_meaning(capsys):
    assert train.main(["--help"]) == 0
    out = capsys.readouterr().out
    lines = {line.split("=")[0].strip(): line for line in out.splitlines() if line.startswith("  --")}
    assert set(lines) == {f"--{k}" for k in train.DEFAULTS}
    for key, value in train.DEFAULTS.items():
        line = lines[f"--{key}"]
        assert repr(value) in line
        meaning = line.split(repr(value), 1)[1].replace("[GPTConfig]", "").strip()
        assert len(meaning) > 5, line                  # the comment beside the default


# ----------------------------------------------------------------------------- bad input

def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


BAD = {
    "wrong type": (["--batch_size=four"], "batch_size"),
    "non-positive size": (["--block_size=0"], "block_size"),
    "non-positive layers": (["--n_layer=0"], "n_layer"),
    "indivisible width": (["--n_embd=18", "--n_head=4"], "not divisible"),
    "negative learning rate": (["--learning_rate=-0.1"], "learning_rate"),
    "unknown attention": (["--attention=linear"], "attention"),
    "unknown activation": (["--activation=swishy"], "activation"),
    "unsupported dtype": (["--dtype=float16"], "dtype"),
    "unreachable activation target": (["--eta=0.95"], "unreachable"),
    "bad device": (["--device=tpu"], "device"),
    "negative threads": (["--threads=-1"], "threads"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_settings_give_one_line_and_status_2(case, tmp_path, text_file, capsys):
    args, needle = BAD[case]
    assert run(tmp_path, text_file, *args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and needle in err, err
    assert not (tmp_path / "out").exists()             # nothing written for a refused run


@pytest.mark.parametrize("case", ["missing", "empty", "too short", "not utf-8"])
def test_bad_data_gives_one_line_and_status_2(case, tmp_path, capsys):
    path = tmp_path / "data.txt"
    if case == "empty":
        path.write_text("")
    elif case == "too short":
        path.write_text("only a few bytes of text\n")   # val split < block_size + 1
    elif case == "not utf-8":
        path.write_bytes(b"abc\xff" * 100)
    assert train.main(TINY + [f"--data={path}", f"--out_dir={tmp_path / 'out'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "data.txt" in err, err


@pytest.mark.skipif(backend.cuda_available(), reason="this machine has a GPU")
def test_cuda_without_a_gpu_gives_one_line(tmp_path, text_file, capsys):
    assert run(tmp_path, text_file, "--device=cuda") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: device 'cuda'") and "\n" not in err


def test_resume_without_or_with_a_corrupted_checkpoint(tmp_path, text_file, capsys):
    assert run(tmp_path, text_file, "--init_from=resume") == 2
    assert capsys.readouterr().err.strip() == f"error: --init_from=resume: no checkpoint at {tmp_path / 'out' / 'ckpt.npz'}"
    assert run(tmp_path, text_file, "--max_iters=2") == 0
    _truncate(tmp_path / "out" / "ckpt.npz")
    capsys.readouterr()
    assert run(tmp_path, text_file, "--init_from=resume") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: checkpoint {tmp_path / 'out' / 'ckpt.npz'} is unreadable") and "\n" not in err


def test_resume_from_an_incomplete_checkpoint_gives_one_line(tmp_path, text_file, capsys):
    """A readable .npz without the batch generator's state: one line and status 2 (a
    KeyError traceback before nanospa/run/checkpoint.py checked the entries)."""
    assert run(tmp_path, text_file, "--max_iters=2") == 0
    path = tmp_path / "out" / "ckpt.npz"
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    state = json.loads(str(arrays["state"]))
    del state["rng"]
    arrays["state"] = np.array(json.dumps(state))
    np.savez(path, **arrays)
    capsys.readouterr()
    assert run(tmp_path, text_file, "--init_from=resume", "--max_iters=4") == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: checkpoint {path} is incomplete (no state.rng); delete it or use --init_from=scratch"


def test_model_cannot_change_on_resume(tmp_path, text_file, capsys):
    assert run(tmp_path, text_file, "--max_iters=2") == 0
    capsys.readouterr()
    assert run(tmp_path, text_file, "--init_from=resume", "--n_embd=32") == 2
    assert "n_embd=32 (checkpoint: 16)" in capsys.readouterr().err


def test_bad_input_from_the_command_line_has_no_traceback(tmp_path):
    """The real process: exit status 2, one line on stderr, no traceback."""
    p = subprocess.run([sys.executable, str(ROOT / "train.py"), "--n_embd=18", "--n_head=4"],
                       cwd=tmp_path, env=subprocess_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert p.stderr.strip().count("\n") == 0 and p.stderr.startswith("error: ")
    assert "Traceback" not in p.stderr


# ----------------------------------------------------------------------------- a run

def test_run_logs_evaluates_checkpoints_and_samples(tmp_path, text_file, capsys):
    assert run(tmp_path, text_file, "--max_iters=6", "--eval_interval=3", "--log_interval=2") == 0
    out = capsys.readouterr().out
    log = read_log(tmp_path / "out")
    assert [r["iter"] for r in log] == [0, 2, 3, 4, 6]
    for r in log:
        assert {"iter", "train_loss", "lr", "tokens_per_s"} <= set(r)
    evals = [r for r in log if "val_loss" in r]
    assert [r["iter"] for r in evals] == [0, 3, 6]
    for r in evals:                                    # per-layer statistics, layers 0..L
        assert len(r["cos"]) == len(r["q"]) == 3
        assert all(-1.0 <= c <= 1.0 for c in r["cos"]) and all(q > 0 for q in r["q"])
    assert "parameters" in out and "plan:" in out and "sample:" in out
    assert "; activation tat leaky_relu(output_scale=" in out       # the shaped activation, not its spec
    assert str(tmp_path / "out" / "log.jsonl") in out
    with np.load(tmp_path / "out" / "ckpt.npz", allow_pickle=False) as z:
        names = set(z.files)
        state = json.loads(str(z["state"]))
        config = json.loads(str(z["config"]))
    assert {"settings", "config", "state"} <= names
    assert any(n.startswith("model/") for n in names) and "optim/t" in names
    assert state["iter"] == 6 and set(state["rng"]) >= {"bit_generator", "state"}
    assert config["n_layer"] == 2 and config["vocab_size"] == 256


@pytest.mark.parametrize("dropout", [[], ["--dropout=0.2"]])
def test_threads_train_slices_of_the_batch_with_the_same_result(tmp_path, text_file, capsys, dropout):
    # In float64 the sliced batch gives the whole batch's gradients up to the order of one
    # sum, so the losses of 6 steps agree to rounding; float32 runs drift apart further.
    # With dropout each slice draws its own rows' masks: the same masks as one thread.
    common = ["--max_iters=6", "--log_interval=1", "--eval_interval=6", "--dtype=float64", *dropout]
    assert run(tmp_path, text_file, *common, "--threads=1", out="one") == 0
    assert "(1 threads)" in capsys.readouterr().out
    assert run(tmp_path, text_file, *common, "--threads=2", out="two") == 0
    assert "(2 threads)" in capsys.readouterr().out
    one, two = read_log(tmp_path / "one"), read_log(tmp_path / "two")
    assert [r["iter"] for r in one] == [r["iter"] for r in two] == list(range(7))
    np.testing.assert_allclose([r["train_loss"] for r in two], [r["train_loss"] for r in one], rtol=1e-12)
    if not dropout:                                                 # (record 0: evaluation mode's loss)
        assert one[-1]["train_loss"] < one[0]["train_loss"] - 0.05    # it did train
    assert cpu.threads() == 1                                       # restored for the caller


def test_one_long_sequence_keeps_its_threads(tmp_path, text_file, capsys):
    """A batch of one is one slice; the other threads share its attention: blockwise
    attention's blocks, dense attention's heads (run/heads.py)."""
    common = ["--max_iters=1", "--eval_interval=1", "--batch_size=1", "--block_size=96", "--threads=2",
              "--attention_block=32", "--sample_tokens=0"]
    assert run(tmp_path, text_file, *common, "--attention_impl=blockwise", out="blocks") == 0
    assert "(2 threads)" in capsys.readouterr().out
    assert run(tmp_path, text_file, *common, "--attention_impl=dense", out="dense") == 0
    assert "(2 threads)" in capsys.readouterr().out


def test_one_sequence_on_two_threads_is_the_run_of_one_bit_for_bit(tmp_path, text_file, capsys, monkeypatch):
    """Batch 1, float32: --threads=2 splits attention's heads between the threads, and every
    logged number (losses, learning rates, the signal statistics) is the one-thread run's
    exactly."""
    monkeypatch.setattr(heads, "MIN_GROUP_LOGITS", 0)    # a tiny model: split it anyway
    calls = []
    apply = heads.HeadGroups.apply
    monkeypatch.setattr(heads.HeadGroups, "apply", lambda *a, **k: calls.append(1) or apply(*a, **k))
    common = ["--max_iters=4", "--log_interval=1", "--eval_interval=4", "--batch_size=1", "--sample_tokens=0"]
    assert run(tmp_path, text_file, *common, "--threads=1", out="one") == 0
    assert "(1 threads)" in capsys.readouterr().out
    assert run(tmp_path, text_file, *common, "--threads=2", out="two") == 0
    assert "(2 threads)" in capsys.readouterr().out
    timing = {"tokens_per_s", "time", "seconds", "elapsed"}
    one, two = ([{k: v for k, v in r.items() if k not in timing} for r in read_log(tmp_path / d)]
                for d in ("one", "two"))
    assert len(one) == 5 and "val_loss" in one[-1] and one == two
    assert calls                                                    # the heads were split


def test_threads_zero_is_one_per_core_capped():
    assert cpu.cpu_threads(3, batch_size=16) == 3
    assert cpu.cpu_threads(8, batch_size=2) == 2
    assert cpu.cpu_threads(3, batch_size=1, shares_blocks=True) == 3   # attention shares its blocks or heads
    assert 1 <= cpu.cpu_threads(0, batch_size=16) <= 4


@pytest.mark.parametrize("extra", [["--threads=1"], ["--threads=2", "--batch_size=2", "--grad_accum=2"],
                                   ["--threads=2", "--optimizer=kfac", "--kfac_inv_interval=2"],
                                   ["--threads=2", "--grad_accum=2", "--optimizer=kfac", "--dropout=0.2"]])
def test_the_loop_of_train_py_is_train_step(tmp_path, text_file, extra):
    """train.py writes its step out (forward, backward, clip, update: run/step.py's parts);
    the experiments take it as one call, run/step.train_step. From the same start on the same
    batches both reach the same weights and optimiser state, bit for bit: with threads,
    micro-batches and K-FAC's curvature."""
    from data import get_batch, load_dataset
    from nanospa import GPT
    from nanospa.beyond.optimizers import make_optimizer
    from nanospa.run.step import train_step
    assert run(tmp_path, text_file, "--max_iters=3", "--eval_interval=100", "--sample_tokens=0", *extra) == 0
    ckpt = load_checkpoint(str(tmp_path / "out" / "ckpt.npz"))
    s, model = ckpt["settings"], GPT(GPTConfig.from_dict(ckpt["config"]), seed=0)
    model.load_state_dict(model.state_dict())         # train.py's memory layout (its comment says why)
    opt, rng, ds = make_optimizer(s, model, seed=0), np.random.default_rng(0), load_dataset(str(text_file))
    previous = cpu.set_threads(s["threads"])
    try:
        for it in range(3):
            opt.lr = train.cosine_lr(it, s["learning_rate"], s["warmup_iters"], s["lr_decay_iters"], s["min_lr"])
            x, y = get_batch(ds.train, s["batch_size"] * s["grad_accum"], s["block_size"], rng)
            train_step(model, opt, x, y, s["grad_clip"], accum=s["grad_accum"])
    finally:
        cpu.set_threads(previous)
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(v, ckpt["model"][k], err_msg=k)
    for k, v in ckpt["optim"].items():
        np.testing.assert_array_equal(np.asarray(opt.state_dict()[k]), np.asarray(v), err_msg=k)


def test_lr_schedule_is_warmup_then_cosine(tmp_path, text_file):
    assert run(tmp_path, text_file, "--max_iters=12", "--log_interval=1", "--warmup_iters=4",
               "--learning_rate=0.01", "--min_lr=0.001", "--eval_interval=100") == 0
    lrs = [r["lr"] for r in read_log(tmp_path / "out")[1:]]   # record k holds the lr of step k - 1
    expected = [train.cosine_lr(it, 0.01, 4, 12, 0.001) for it in range(12)]
    assert lrs == expected
    assert lrs[:4] == sorted(lrs[:4]) and lrs[4:] == sorted(lrs[4:], reverse=True)


def test_eval_only_reports_and_writes_nothing(tmp_path, text_file, capsys):
    assert run(tmp_path, text_file, "--eval_only") == 0
    out = capsys.readouterr().out
    assert "init: train" in out
    assert "plan note: eta clamped" in out and "a ReLU" in out      # depth 2 cannot reach eta = 0.9
    assert not (tmp_path / "out").exists()


def test_evaluation_and_the_sample_run_without_dropout(tmp_path, text_file, capsys):
    """estimate_loss (losses and signal statistics) and the sample are the model in evaluation
    mode: with --dropout=0.5 they print what the same model without dropout prints."""
    shown = []
    for dropout in ("0.0", "0.5"):
        assert run(tmp_path, text_file, "--eval_only", f"--dropout={dropout}") == 0
        shown.append([line for line in capsys.readouterr().out.splitlines() if line.startswith("init:")])
    assert shown[0] == shown[1] and len(shown[0]) == 3
    samples = []
    for dropout in ("0.0", "0.5"):
        assert run(tmp_path, text_file, "--max_iters=0", f"--dropout={dropout}", out=f"d{dropout}") == 0
        samples.append(capsys.readouterr().out.split("sample:")[1])
    assert samples[0] == samples[1]


def test_eval_only_needs_only_read_access(tmp_path, text_file, capsys, monkeypatch):
    """A finished run on a read-only disk can still be evaluated; training there is refused."""
    assert run(tmp_path, text_file, "--max_iters=2") == 0
    out = tmp_path / "out"
    out.chmod(0o555)                                         # read-only (root ignores it: hence the patch)
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if mode & os.W_OK else real(p, mode, **kw))
    capsys.readouterr()
    assert run(tmp_path, text_file, "--init_from=resume", "--eval_only=True") == 0
    assert "iter 2: train" in capsys.readouterr().out
    assert run(tmp_path, text_file, "--init_from=resume", "--max_iters=4") == 2
    assert f"--out_dir={out}: {out} is not writable" in capsys.readouterr().err
    out.chmod(0o755)


# ----------------------------------------------------------------------------- checkpoints

@pytest.mark.parametrize("dropout", [[], ["--dropout=0.2"]])
def test_resume_reproduces_the_uninterrupted_run(tmp_path, text_file, dropout):
    """With dropout the checkpoint holds its masks' state (the step they are at)."""
    common = ["--log_interval=1", "--eval_interval=3", "--lr_decay_iters=8", "--checkpoint_interval=100", *dropout]
    assert run(tmp_path, text_file, "--max_iters=8", *common, out="whole") == 0
    assert run(tmp_path, text_file, "--max_iters=4", *common, out="split") == 0
    assert run(tmp_path, text_file, "--max_iters=8", "--init_from=resume", *common, out="split") == 0
    whole, split = read_log(tmp_path / "whole"), read_log(tmp_path / "split")
    # Identical records, except that the first half also evaluated at its last step (iter 4).
    assert [(r["iter"], r["train_loss"], r["lr"]) for r in whole] == \
        [(r["iter"], r["train_loss"], r["lr"]) for r in split]
    evals = lambda log: [(r["iter"], r["val_loss"], r["eval_train_loss"], r["cos"], r["q"])
                         for r in log if "val_loss" in r and r["iter"] != 4]
    assert evals(whole) == evals(split) and len(evals(whole)) == 4     # iters 0, 3, 6, 8
    w, s = (np.load(tmp_path / d / "ckpt.npz", allow_pickle=False) for d in ("whole", "split"))
    for name in w.files:
        if name.startswith(("model/", "optim/")):
            np.testing.assert_array_equal(w[name], s[name], err_msg=name)


def test_a_checkpoint_interrupted_mid_write_leaves_the_previous_one(tmp_path, text_file, monkeypatch):
    assert run(tmp_path, text_file, "--max_iters=4") == 0
    path = tmp_path / "out" / "ckpt.npz"
    before = path.read_bytes()

    class Killed(BaseException):
        """Stands for SIGKILL: nothing in train.py handles it."""

    def killed(src, dst):                              # the process dies before the rename
        Path(src).write_bytes(Path(src).read_bytes()[:100])   # and leaves a truncated temp file
        raise Killed

    monkeypatch.setattr(checkpoint.os, "replace", killed)
    with pytest.raises(Killed):
        run(tmp_path, text_file, "--max_iters=8", "--init_from=resume", "--checkpoint_interval=1")
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert load_checkpoint(str(path))["state"]["iter"] == 4
    (tmp_path / "out" / "ckpt.npz.999.tmp").write_bytes(b"PK\x03\x04 truncated")  # a stray temp file
    assert run(tmp_path, text_file, "--max_iters=6", "--init_from=resume") == 0
    assert load_checkpoint(str(path))["state"]["iter"] == 6


def test_non_finite_gradient_stops_and_keeps_the_last_good_checkpoint(tmp_path, text_file, capsys, monkeypatch):
    calls, real = [], train.clip_grad_norm

    def clip(params, max_norm):                        # the 5th step's gradient is non-finite
        calls.append(1)
        return float("nan") if len(calls) == 5 else real(params, max_norm)

    monkeypatch.setattr(train, "clip_grad_norm", clip)
    assert run(tmp_path, text_file, "--max_iters=10", "--checkpoint_interval=2") == 1
    err = capsys.readouterr().err
    path = tmp_path / "out" / "ckpt.npz"
    line = [x for x in err.splitlines() if x.startswith("error:")]
    assert len(line) == 1 and "iter 5" in line[0] and f"{path} (iter 4)" in line[0]
    assert load_checkpoint(str(path))["state"]["iter"] == 4


def test_exploding_learning_rate_stops_cleanly(tmp_path, text_file):
    """A real divergence in a real process: non-zero status, the message, no traceback."""
    p = subprocess.run([sys.executable, str(ROOT / "train.py"), *TINY, f"--data={text_file}",
                        "--learning_rate=1e30", "--warmup_iters=0", "--max_iters=50", "--grad_clip=0.0"],
                       cwd=tmp_path, env=subprocess_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert p.returncode == 1, p.stderr[-2000:]
    assert "error: non-finite loss or gradient at iter" in p.stderr and "Traceback" not in p.stderr


def test_ctrl_c_saves_a_checkpoint_and_resume_continues_exactly(tmp_path, text_file):
    args = [sys.executable, str(ROOT / "train.py"), *TINY, f"--data={text_file}", "--log_interval=1",
            "--eval_interval=1000", "--lr_decay_iters=1000", "--checkpoint_interval=1000",
            "--sample_tokens=0"]
    p = subprocess.Popen(args + ["--max_iters=100000"], cwd=tmp_path, env=subprocess_env(tmp_path),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log, deadline = tmp_path / "out" / "log.jsonl", time.time() + 30
    while time.time() < deadline and not (log.exists() and len(log.read_text().splitlines()) >= 3):
        time.sleep(0.05)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 130, err[-2000:]
    assert f"checkpoint saved to {Path('out') / 'ckpt.npz'}" in err and "Traceback" not in err
    k = load_checkpoint(str(tmp_path / "out" / "ckpt.npz"))["state"]["iter"]
    assert k >= 2
    assert train.main(args[2:] + [f"--out_dir={tmp_path / 'out'}", f"--max_iters={k + 3}",
                                  "--init_from=resume"]) == 0
    assert train.main(args[2:] + [f"--out_dir={tmp_path / 'whole'}", f"--max_iters={k + 3}"]) == 0
    resumed, whole = read_log(tmp_path / "out"), read_log(tmp_path / "whole")
    assert [r["iter"] for r in resumed] == list(range(k + 4))  # 0..k before Ctrl-C, then k+1..k+3
    loss = lambda rows: [r["train_loss"] for r in rows if 0 < r["iter"]]
    assert loss(resumed) == loss(whole)


# ----------------------------------------------------------------------------- README command

def test_readme_command_on_the_default_corpus(tmp_path):
    p = subprocess.run([sys.executable, str(ROOT / "train.py"), "--max_iters=2"], cwd=tmp_path,
                       env=subprocess_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "data: default" in p.stdout and "sample:" in p.stdout
    log = read_log(tmp_path / "out")
    assert [r["iter"] for r in log] == [0, 2] and "val_loss" in log[-1]
    assert (tmp_path / "out" / "ckpt.npz").is_file()


def test_signal_statistics_on_the_first_positions_at_long_context(tmp_path, text_file, capsys, monkeypatch):
    """Above SIGNAL_POSITIONS (here 8, with T = 16), cos[l] and q[l] come from the first 8
    positions; the log says how many, and the init line says so."""
    monkeypatch.setattr(train, "SIGNAL_POSITIONS", 8)
    assert run(tmp_path, text_file, "--max_iters=3", "--eval_interval=3") == 0
    assert "(first 8 positions)" in capsys.readouterr().out
    evals = [r for r in read_log(tmp_path / "out") if "cos" in r]
    assert [r["iter"] for r in evals] == [0, 3] and all(r["signal_positions"] == 8 for r in evals)
    assert all(len(r["cos"]) == 3 and len(r["pred_cos"]) == 3 for r in evals[:1])


MEMORY = """
import os, resource, sys
os.environ["OPENBLAS_NUM_THREADS"] = "1"
sys.path.insert(0, {root!r})
import numpy as np
if sys.argv[1] == "train":
    import train
    assert train.main(sys.argv[2:]) == 0
else:                                    # one training step of the same model on the same data
    from data import get_batch, load_dataset
    from nanospa import GPT, GPTConfig
    from nanospa.optim import AdamW
    from nanospa.run.step import train_step
    ds = load_dataset("default")
    model = GPT(GPTConfig(vocab_size=ds.vocab_size, n_layer=2, n_embd=32, n_head=2, block_size=4096))
    x, y = get_batch(ds.train, 2, 4096, np.random.default_rng(0))
    train_step(model, AdamW(model.parameters(), lr=1e-3), x, y, 1.0)
print("peak", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def test_long_context_costs_what_the_step_costs(tmp_path):
    """T = 4096: train.py's whole run (init and evaluation statistics included) peaks within
    2x the memory of one training step in a process of its own; the (T, T) float64 kernels of
    every layer made it 3 GB against 0.1 GB."""
    def peak(*argv):
        p = subprocess.run([sys.executable, "-c", MEMORY.format(root=str(Path(train.__file__).parent)), *argv],
                           cwd=tmp_path, capture_output=True, text=True, timeout=600,
                           env=dict(os.environ, NANOSPA_CACHE=str(tmp_path / "cache")))
        assert p.returncode == 0, p.stderr[-2000:]
        return int(p.stdout.split("peak ")[-1])
    step_kb = peak("step")
    train_kb = peak("train", "--n_layer=2", "--n_embd=32", "--n_head=2", "--block_size=4096", "--batch_size=2",
                    "--max_iters=1", "--eval_iters=2", "--sample_tokens=0", "--threads=1", f"--out_dir={tmp_path / 'o'}")
    assert train_kb < 2 * step_kb, (train_kb, step_kb)
