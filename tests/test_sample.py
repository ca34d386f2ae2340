"""python sample.py: a trained checkpoint continues a prompt with its own configuration and
tokenizer; the same seed gives the same samples; @FILE prompts; a missing, partial, foreign
or damaged checkpoint and bad settings are one error line, exit 2."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import sample
import train

from test_train import TINY, text_file  # noqa: F401 (fixture)

pytestmark = pytest.mark.slow       # the full suite only: python -m pytest -m 'not slow' skips it
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOSPA_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def run_dir(tmp_path, text_file):
    out = tmp_path / "out"
    assert train.main(TINY + [f"--data={text_file}", f"--out_dir={out}", "--max_iters=20", "--sample_tokens=0"]) == 0
    return out


def samples(out, capsys, *args):
    assert sample.main([f"--out_dir={out}", *args]) == 0
    return capsys.readouterr().out.split("--- sample ")[1:]


def test_samples_continue_the_prompt_and_repeat_with_the_seed(run_dir, capsys):
    a = samples(run_dir, capsys, "--start=To be", "--num_samples=2", "--max_new_tokens=30", "--seed=3")
    b = samples(run_dir, capsys, "--start=To be", "--num_samples=2", "--max_new_tokens=30", "--seed=3")
    c = samples(run_dir, capsys, "--start=To be", "--num_samples=2", "--max_new_tokens=30", "--seed=4")
    assert len(a) == 2 and a == b and a != c
    assert all(s.split("\n", 1)[1].startswith("To be") for s in a)


def test_temperature_zero_is_the_models_own_greedy_continuation(run_dir, capsys, text_file):
    """The samples are the model's: greedy decoding equals sampling.generate on the same weights."""
    from nanospa.run.checkpoint import load_checkpoint
    from nanospa import GPT, GPTConfig
    from nanospa.sampling import generate
    got = samples(run_dir, capsys, "--start=To be", "--num_samples=1", "--max_new_tokens=12", "--temperature=0")
    ckpt = load_checkpoint(str(run_dir / "ckpt.npz"))
    model = GPT(GPTConfig(**ckpt["config"]))
    model.load_state_dict(ckpt["model"])
    out = generate(model, sample.encode("To be")[None, :], 12, temperature=0)
    assert got[0].split("\n", 1)[1].rstrip("\n") == sample.decode(out[0])


def test_the_kv_cache_changes_no_sample(run_dir, capsys):
    """--kv_cache=False (the window's whole forward per token) samples the same text."""
    args = ("--start=To be", "--num_samples=2", "--max_new_tokens=40", "--seed=3")
    assert samples(run_dir, capsys, *args) == samples(run_dir, capsys, *args, "--kv_cache=False")


def test_a_model_the_cache_cannot_run_is_sampled_without_it_and_says_so(tmp_path, text_file, capsys):
    out = tmp_path / "bn"
    assert train.main(TINY + [f"--data={text_file}", f"--out_dir={out}", "--max_iters=2", "--sample_tokens=0",
                              "--residual=standard", "--norm=batchnorm", "--norm_causal=True"]) == 0
    capsys.readouterr()
    assert sample.main([f"--out_dir={out}", "--num_samples=1", "--max_new_tokens=5"]) == 0
    out_err = capsys.readouterr()
    assert out_err.out.count("--- sample") == 1
    assert "note: sampling without the KV cache" in out_err.err and "norm_causal=True" in out_err.err
    assert sample.main([f"--out_dir={out}", "--num_samples=1", "--max_new_tokens=5", "--kv_cache=False"]) == 0
    assert "KV cache" not in capsys.readouterr().err


def test_a_prompt_from_a_file(run_dir, capsys, tmp_path):
    (tmp_path / "prompt.txt").write_text("Whence is that knocking?", encoding="utf-8")
    got = samples(run_dir, capsys, f"--start=@{tmp_path / 'prompt.txt'}", "--num_samples=1", "--max_new_tokens=5")
    assert got[0].split("\n", 1)[1].startswith("Whence is that knocking?")


def test_bad_checkpoints_and_settings_are_one_line(run_dir, capsys, tmp_path):
    def refused(args, words):
        assert sample.main(args) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("error:") and words in err, err
    refused([f"--out_dir={tmp_path / 'none'}"], "no checkpoint at")
    (tmp_path / "part").mkdir()
    (tmp_path / "part" / "ckpt.npz").write_bytes((run_dir / "ckpt.npz").read_bytes()[:500])    # cut short
    refused([f"--out_dir={tmp_path / 'part'}"], "unreadable")
    (tmp_path / "foreign").mkdir()
    np.savez(tmp_path / "foreign" / "ckpt.npz", weights=np.zeros(3))                          # not nanospa's
    refused([f"--out_dir={tmp_path / 'foreign'}"], "'settings'")                          # names what is missing
    refused([f"--out_dir={run_dir}", "--num_samples=0"], "num_samples must be a positive integer")
    refused([f"--out_dir={run_dir}", "--start=@/no/such/file"], "cannot read /no/such/file")
    refused([f"--out_dir={run_dir}", "--temperature=-1"], "temperature must be")


def test_the_command_line(run_dir):
    p = subprocess.run([sys.executable, str(ROOT / "sample.py"), f"--out_dir={run_dir}", "--num_samples=1",
                        "--max_new_tokens=5"], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0 and "--- sample 1" in p.stdout, p.stderr


def test_a_corpus_changed_since_training_is_refused_not_retokenised(tmp_path, capsys, text_file):
    """The BPE is trained on the corpus: after an edit to it, sample.py trained another one and
    cut the prompt into other tokens. The checkpoint's corpus and tokenizer sha256 are
    compared now; with the corpus as it was, it samples again."""
    pytest.importorskip("tokenizers")
    out = tmp_path / "bpe"
    assert train.main(TINY + [f"--data={text_file}", f"--out_dir={out}", "--max_iters=4", "--sample_tokens=0",
                              "--tokenizer=bpe:300"]) == 0
    assert samples(out, capsys, "--start=The ", "--num_samples=1", "--max_new_tokens=3")
    original = text_file.read_bytes()
    text_file.write_bytes(original.replace(b"the", b"a"))                     # the corpus, edited
    assert sample.main([f"--out_dir={out}", "--start=The "]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "was trained with the bpe:300 tokenizer of" in err and "whose tokenizer is another" in err
    text_file.write_bytes(original)
    assert samples(out, capsys, "--start=The ", "--num_samples=1", "--max_new_tokens=3")


def test_what_it_cannot_sample_is_refused_before_the_model(run_dir, capsys, tmp_path):
    from test_train_faults import spoil_checkpoint
    def refused(args, words):
        assert sample.main(args) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and words in err, err
    refused(["--out_dir=", "--start=x"], "--out_dir is empty")                      # it read /ckpt.npz
    refused([f"--out_dir={run_dir}", "--start=caf\udce9"], "--start: the prompt is not UTF-8 text")   # argv's bytes
    (tmp_path / "nan").mkdir()
    (tmp_path / "nan" / "ckpt.npz").write_bytes((run_dir / "ckpt.npz").read_bytes())
    spoil_checkpoint(tmp_path / "nan" / "ckpt.npz", array="model/")
    refused([f"--out_dir={tmp_path / 'nan'}"], "holds non-finite weights (model/")


def test_train_encodes_the_prompt_before_training(tmp_path, text_file, capsys):
    """A --start the tokenizer cannot encode was found after the whole run had trained."""
    out = tmp_path / "o"
    assert train.main(TINY + [f"--data={text_file}", f"--out_dir={out}", "--max_iters=4", "--start=caf\udce9"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error: --start: the prompt is not UTF-8 text") and "model:" not in captured.out
    assert not out.exists()
