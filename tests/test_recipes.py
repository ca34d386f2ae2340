"""Tests for nanospa/experiments/recipes.py: nanoGPT's recipes as presets, what the runner is
given from them, a shortened run end to end (result.json, table.md, a rerun and --reuse
training nothing), bad input refused before any work, and the shared tiny Shakespeare's
split (skipped when ../shared/data is absent)."""
import json

import numpy as np
import pytest

from nanospa import GPT, GPTConfig
from nanospa.experiments import common, records, recipes, runner
from nanospa.experiments.__main__ import main

from conftest import shared_file

# nanoGPT's published values, written out again here rather than read from the module, so that
# a wrong value there fails. Source: karpathy/nanoGPT, README.md ("I only have a macbook": the
# CPU command line on config/train_shakespeare_char.py; "loss of only 1.88"; GPU: "best
# validation loss is 1.4697"), config/train_shakespeare_char.py, train.py's defaults.
CPU = dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch_size=12, max_iters=2000, lr_decay_iters=2000,
           learning_rate=1e-3, min_lr=1e-4, warmup_iters=100, beta1=0.9, beta2=0.99, weight_decay=0.1, grad_clip=1.0,
           dropout=0.0, bias=False, eval_iters=20)
GPU = dict(CPU, n_layer=6, n_head=6, n_embd=384, block_size=256, batch_size=64, max_iters=5000, lr_decay_iters=5000,
           dropout=0.2, eval_iters=200)
TINY = ["--max_iters=3", "--n_layer=1", "--n_embd=16", "--n_head=2", "--block_size=16", "--batch_size=2",
        "--eval_iters=2", "--workers=0"]


@pytest.fixture
def text(tmp_path, monkeypatch):
    """A small ASCII text file (20,000 bytes); the data cache in tmp_path."""
    monkeypatch.setenv("NANOSPA_CACHE", str(tmp_path / "cache"))
    words = np.random.default_rng(0).choice(["to", "be", "or", "not", "that", "is", "the", "question", "\n"], 6000)
    path = tmp_path / "small.txt"
    path.write_text(" ".join(words)[:20000], encoding="ascii")
    assert path.stat().st_size == 20000
    return path


def test_the_presets_are_nanogpts_published_settings():
    assert recipes.NANOGPT == dict(cpu=CPU, gpu=GPU)
    assert recipes.PUBLISHED == dict(cpu=1.88, gpu=1.4697)
    assert {n: p["seeds"] for n, p in recipes.PRESETS.items()} == dict(cpu=3, gpu=3)


@pytest.mark.parametrize("preset", ["cpu", "gpu"])
def test_the_runner_trains_what_the_preset_says(preset, text):
    """The jobs the runner would train (settings, model configs, optimiser) are nanoGPT's."""
    want = dict(cpu=CPU, gpu=GPU)[preset]
    s = runner.settings_for(recipes, [f"--preset={preset}", f"--data={text}"])
    methods = runner.selected_methods(recipes, s)
    configs = {label: runner.model_config(s, m, 256).to_dict() for label, m in methods.items()}
    jobs = runner.make_jobs(s, methods, configs)
    assert sorted((j["label"], j["seed"]) for j in jobs) == [(l, k) for l in ("espa", "preln") for k in range(3)]
    for job in jobs:
        assert job["steps"] == want["max_iters"] == want["lr_decay_iters"]      # the cosine ends at the last step
        assert job["lr"] == want["learning_rate"]
        assert job["lr"] * job["min_lr_ratio"] == pytest.approx(want["min_lr"])
        assert job["warmup"] == want["warmup_iters"]
        assert job["optimizer"] == dict(beta1=want["beta1"], beta2=want["beta2"])
        for key in ("weight_decay", "grad_clip", "batch_size"):
            assert job[key] == want[key], key
        assert job["eval_batches"] == want["eval_iters"] and job["whole_val"] is True
        assert job["data"] == f"shakespeare:{text.resolve()}"
        assert job["device"] == ("cpu" if preset == "cpu" else "cuda")
        cfg = job["config"]
        for key in ("n_layer", "n_head", "n_embd", "block_size", "dropout", "bias"):
            assert cfg[key] == want[key], key
    pre, espa = configs["preln"], configs["espa"]
    assert {k: pre[k] for k in ("attention", "residual", "norm", "norm_position", "final_norm", "pos", "activation",
                                "tie_embeddings", "mlp_ratio")} == dict(
        attention="softmax", residual="standard", norm="layernorm", norm_position="pre", final_norm="yes",
        pos="learned", activation="gelu", tie_embeddings=True, mlp_ratio=4)
    assert GPTConfig(**espa).to_dict() == GPTConfig(**{**GPTConfig().to_dict(), **{k: espa[k] for k in (
        "vocab_size", "n_layer", "n_head", "n_embd", "block_size", "dropout", "bias")}}).to_dict()   # train.py's model
    untied = runner.settings_for(recipes, [f"--preset={preset}", f"--data={text}", "--preln_tied=False"])
    assert recipes.methods(untied)["preln"].config["tie_embeddings"] is False


def test_train_run_hands_the_methods_betas_to_adamw(monkeypatch):
    seen = []
    real = common.make_optimizer
    monkeypatch.setattr(common, "make_optimizer", lambda s, model, seed: seen.append(dict(s)) or real(s, model, seed))
    cfg = GPTConfig(n_layer=1, n_embd=16, n_head=2, block_size=8)
    tokens = np.random.default_rng(0).integers(0, 256, 500)
    r = common.train_run(cfg, tokens, tokens, steps=1, lr=1e-3, batch_size=2, eval_batches=1,
                         optimizer=dict(beta1=0.9, beta2=0.99), whole_val=True)
    common.train_run(cfg, tokens, tokens, steps=1, lr=1e-3, batch_size=2, eval_batches=1)
    assert (seen[0]["beta1"], seen[0]["beta2"]) == (0.9, 0.99)
    assert (seen[1]["beta1"], seen[1]["beta2"]) == common.BETAS          # the other experiments' unchanged
    assert np.isfinite(r["final_val_whole"])


def test_the_whole_split_is_every_target_once():
    model = GPT(GPTConfig(n_layer=1, n_embd=16, n_head=2, block_size=8), seed=0)
    tokens = np.random.default_rng(1).integers(0, 256, 100)
    total = 0.0
    for start in range(0, 99, 8):                 # one window at a time; the last one is 3 long
        T = min(8, 99 - start)
        x, y = tokens[start:start + T][None], tokens[start + 1:start + T + 1][None]
        total += model(x, y)[1].item() * x.size
    assert common.evaluate_whole(model, tokens, 8, 3) == pytest.approx(total / 99, rel=1e-6)


def test_a_shortened_run_writes_its_results_and_a_rerun_trains_nothing(text, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    assert main(["recipes", f"--data={text}", *TINY, "--seeds=2", f"--out={out}"]) == 0
    result = json.loads((out / "result.json").read_text())
    assert result["complete"] and records.check(result, out / "result.json") == []
    for label in ("preln", "espa"):
        runs = result["methods"][label]["runs"]
        assert [r["seed"] for r in runs] == [0, 1] and all(r["checksum"] == records.checksum(r) for r in runs)
        assert all(np.isfinite(r["final_val_whole"]) and r["n_params"] > 0 for r in runs)
        a = result["analysis"][label]
        assert a["val"] == pytest.approx(np.mean([r["final_val"] for r in runs]))
        assert a["val_std"] == pytest.approx(np.std([r["final_val"] for r in runs], ddof=1))
    assert result["data"]["train_tokens"] == 18000 and result["data"]["val_tokens"] == 2000   # first 90% / last 10%
    table = (out / "table.md").read_text()
    assert "| preln |" in table and "| espa |" in table and "| 1.88 |" in table and "SHORTENED" in table
    capsys.readouterr()

    def no_training(job):
        raise AssertionError(f"trained {job['label']} again")
    monkeypatch.setattr(runner, "train_job", no_training)
    assert main(["recipes", f"--data={text}", *TINY, "--seeds=2", f"--out={out}"]) == 0
    assert capsys.readouterr().out.count("(kept)") == 4
    assert main(["recipes", f"--data={text}", *TINY, "--seeds=2", f"--out={tmp_path / 'other'}",
                 f"--reuse={out}"]) == 0
    assert capsys.readouterr().out.count("(reused from") == 4


@pytest.mark.parametrize("args, words", [
    (["--seeds=0"], "seeds must be >= 1"),
    (["--preset=laptop"], "unknown preset 'laptop'; presets: cpu, gpu"),
    (["--max_iters=0"], "max_iters and eval_iters must be >= 1"),
    (["--eval_iters=0"], "max_iters and eval_iters must be >= 1"),
    (["--min_lr=0.01"], "min_lr in [0, learning_rate]"),
    (["--beta2=1.0"], "beta1 and beta2 must be in [0, 1)"),
    (["--steps=10"], "--steps: recipes takes nanoGPT's --max_iters instead"),
    (["--lrs=0.01"], "--lrs: recipes takes nanoGPT's --learning_rate instead"),
    (["--data=MISSING"], "no such file"),
    (["--tokenizer=bpe:300"], "recipes trains on characters (bytes)"),
])
def test_bad_input_is_one_error_line_before_any_work(args, words, text, tmp_path, capsys):
    args = [a.replace("MISSING", str(tmp_path / "missing.txt")) for a in args]
    data = [] if any(a.startswith("--data=") for a in args) else [f"--data={text}"]
    assert main(["recipes", *data, *args, f"--out={tmp_path / 'out'}"]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], captured.err
    assert captured.out == "" and not (tmp_path / "out").exists()


def test_without_shared_data_or_a_path_it_asks_for_one(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("NANOSPA_SHARED_DATA", str(tmp_path / "nothing"))
    assert main(["recipes", f"--out={tmp_path / 'out'}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: no tiny Shakespeare at {tmp_path / 'nothing' / 'tinyshakespeare.txt'}: pass "
                          "--data=PATH") and err.count("\n") == 1


def test_the_shared_tiny_shakespeare_is_the_default_with_nanogpts_split(tmp_path, monkeypatch):
    path = shared_file("tinyshakespeare.txt")
    monkeypatch.setenv("NANOSPA_SHARED_DATA", str(path.parent))
    monkeypatch.setenv("NANOSPA_CACHE", str(tmp_path / "cache"))
    s = runner.settings_for(recipes, [])
    assert s["data"] == f"shakespeare:{path.resolve()}" and s["preset"] == "cpu"
    import data
    ds = data.load_dataset(s["data"])
    text = path.read_bytes()
    n = len(text)                                  # nanoGPT: data[:int(n * 0.9)], data[int(n * 0.9):]
    assert bytes(ds.train) == text[:int(n * 0.9)] and bytes(ds.val) == text[int(n * 0.9):]
    assert len(ds.train) == 1_003_854 and text.isascii()          # bytes are characters


def test_help_shows_the_cpu_recipe_in_nanogpts_names(capsys):
    assert main(["recipes", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--max_iters=2000" in out and "--beta2=0.99" in out and "--n_embd=128" in out
    assert not any(f"--{k}=" in out for k in recipes.DERIVED)     # the runner's names it derives
