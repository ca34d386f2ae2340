"""nanospa/run/checkpoint.py: the .npz layout (no pickles), atomic writes, loading with one-line
errors for missing, unreadable and incomplete files, the model check on resume, and the
training state that makes a resume exact. train.py's use of it (a resumed run equals the
uninterrupted one, Ctrl-C) is tested in tests/test_train.py."""
import json
import math
from pathlib import Path

import numpy as np
import pytest

from nanospa import GPT, AdamW, GPTConfig
from nanospa.run import checkpoint
from nanospa.run.checkpoint import (CheckpointError, NotFiniteError, check_same_data, check_same_model, data_identity,
                                load_checkpoint, restore, save_checkpoint, training_state)

SETTINGS = dict(n_layer=2, learning_rate=1e-3, data="default")


def tiny():
    cfg = GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=8, dtype="float64")
    model = GPT(cfg, seed=0)
    optimizer = AdamW(model.parameters(), lr=1e-2)
    idx = np.random.default_rng(0).integers(0, 11, (2, 8))
    _, loss = model(idx, idx)
    loss.backward()
    optimizer.step()                                   # non-zero moments and t = 1
    optimizer.zero_grad()
    return cfg, model, optimizer


def saved(tmp_path, best_val=2.5, iteration=7, draws=3):
    cfg, model, optimizer = tiny()
    rng = np.random.default_rng(5)
    rng.integers(0, 100, size=draws)                   # the batches drawn so far
    path = tmp_path / "ckpt.npz"
    save_checkpoint(str(path), model, optimizer, SETTINGS, cfg, training_state(iteration, best_val, rng))
    return path, cfg, model, optimizer, rng


def test_layout_is_arrays_and_json_without_pickles(tmp_path):
    path, cfg, model, optimizer, _ = saved(tmp_path)
    with np.load(path, allow_pickle=False) as z:     # loads with pickles refused
        names = set(z.files)
        for name in ("settings", "config", "state"):
            assert z[name].shape == () and z[name].dtype.kind == "U"
        assert json.loads(str(z["settings"])) == SETTINGS
        assert json.loads(str(z["config"])) == cfg.to_dict()
        state = json.loads(str(z["state"]))
    assert names == ({f"model/{k}" for k in model.state_dict()} | {f"optim/{k}" for k in optimizer.state_dict()}
                     | {"settings", "config", "state"})
    assert state["iter"] == 7 and state["best_val_loss"] == 2.5 and state["data_position"] is None
    assert set(state["rng"]) >= {"bit_generator", "state"}


def test_load_returns_what_was_saved(tmp_path):
    path, cfg, model, optimizer, _ = saved(tmp_path)
    ckpt = load_checkpoint(str(path))
    assert set(ckpt) == {"model", "optim", "settings", "config", "state"}
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(ckpt["model"][k], v, err_msg=k)
    for k, v in optimizer.state_dict().items():
        np.testing.assert_array_equal(ckpt["optim"][k], v, err_msg=k)
    assert GPTConfig(**ckpt["config"]) == cfg


def test_restore_continues_the_batches_and_the_optimiser_exactly(tmp_path):
    path, cfg, model, optimizer, rng = saved(tmp_path)
    expected_batches = rng.integers(0, 100, size=10)   # what the uninterrupted run draws next
    ckpt = load_checkpoint(str(path))
    fresh_model = GPT(cfg, seed=1)
    fresh_model.load_state_dict(ckpt["model"])
    fresh_opt, fresh_rng = AdamW(fresh_model.parameters(), lr=1e-2), np.random.default_rng(99)
    assert restore(ckpt, fresh_opt, fresh_rng) == (7, 2.5)
    np.testing.assert_array_equal(fresh_rng.integers(0, 100, size=10), expected_batches)
    for k, v in optimizer.state_dict().items():
        np.testing.assert_array_equal(fresh_opt.state_dict()[k], v, err_msg=k)


def test_no_evaluation_yet_is_stored_as_null_and_restored_as_inf(tmp_path):
    path, _, _, optimizer, _ = saved(tmp_path, best_val=math.inf)
    ckpt = load_checkpoint(str(path))
    assert ckpt["state"]["best_val_loss"] is None
    assert restore(ckpt, optimizer, np.random.default_rng(0))[1] == math.inf


def test_an_interrupted_write_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    path, cfg, model, optimizer, rng = saved(tmp_path)
    before = path.read_bytes()

    class Killed(BaseException):
        """Stands for SIGKILL between writing the temporary file and renaming it."""

    def killed(src, dst):
        raise Killed

    monkeypatch.setattr(checkpoint.os, "replace", killed)
    with pytest.raises(Killed):
        save_checkpoint(str(path), model, optimizer, SETTINGS, cfg, training_state(8, 2.0, rng))
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.npz"]     # the temporary file is gone
    assert load_checkpoint(str(path))["state"]["iter"] == 7


def test_missing_and_unreadable_files_give_one_line(tmp_path):
    path = tmp_path / "ckpt.npz"
    with pytest.raises(CheckpointError, match=f"^--init_from=resume: no checkpoint at {path}$"):
        load_checkpoint(str(path))
    path.write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(str(path))
    assert str(e.value).startswith(f"checkpoint {path} is unreadable (") and "\n" not in str(e.value)
    assert str(e.value).endswith("delete it or use --init_from=scratch")


@pytest.mark.parametrize("drop, needle", [("state.rng", "state.rng"), ("optim/t", "optim/t"),
                                          ("model", "model/*"), ("config", "config")])
def test_an_incomplete_checkpoint_gives_one_line(drop, needle, tmp_path):
    path, *_ = saved(tmp_path)
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    if drop == "state.rng":
        state = json.loads(str(arrays["state"]))
        del state["rng"]
        arrays["state"] = np.array(json.dumps(state))
    elif drop == "config":
        arrays["config"] = np.array(json.dumps([1, 2]))
    else:
        arrays = {k: v for k, v in arrays.items() if not k.startswith(drop)}
    broken = Path(tmp_path / "broken.npz")
    np.savez(broken, **arrays)
    with pytest.raises(CheckpointError, match="is incomplete") as e:
        load_checkpoint(str(broken))
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_the_model_cannot_change_on_resume():
    saved_settings = dict(n_layer=2, n_embd=16, learning_rate=1e-3)
    check_same_model(dict(saved_settings, learning_rate=5.0), saved_settings, ["n_layer", "n_embd"])  # not a model key
    check_same_model(dict(n_layer=2, n_embd=16, pos="none"), saved_settings, ["n_layer", "n_embd", "pos"])  # not saved
    with pytest.raises(CheckpointError, match=r"^the model cannot change on resume: n_layer=3 \(checkpoint: 2\), "
                                              r"n_embd=32 \(checkpoint: 16\)$"):
        check_same_model(dict(n_layer=3, n_embd=32), saved_settings, ["n_layer", "n_embd"])


# ----------------------------------------------------------------------------- finite states only

@pytest.mark.parametrize("spoil", ["parameter", "optimiser moment", "loss"])
def test_a_non_finite_state_is_never_written(spoil, tmp_path):
    path, cfg, model, optimizer, rng = saved(tmp_path)
    before = path.read_bytes()
    loss = None
    if spoil == "parameter":
        model.parameters()[1].data[0] = np.inf
    elif spoil == "optimiser moment":
        optimizer.v[0][...] = np.nan
    else:
        loss = float("nan")
    with pytest.raises(NotFiniteError) as e:
        save_checkpoint(str(path), model, optimizer, SETTINGS, cfg, training_state(8, 2.0, rng, train_loss=loss))
    msg = str(e.value)
    assert msg.startswith("non-finite ") and f"at iter 8; {path} not written" in msg
    assert {"parameter": "model/", "optimiser moment": "optim/v.0", "loss": "loss"}[spoil] in msg
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["ckpt.npz"]


def test_the_corpus_and_tokenizer_are_recorded_and_checked(tmp_path):
    meta = dict(name="tiny.txt", bytes=1000, sha256="ab" * 32, vocab_size=256)
    ident = data_identity(meta, "tiny.txt")
    assert ident == dict(spec="tiny.txt", name="tiny.txt", tokens=1000, sha256="ab" * 32, tokenizer="byte",
                         vocab_size=256, tokenizer_sha256=None)
    path, cfg, model, optimizer, rng = saved(tmp_path)
    save_checkpoint(str(path), model, optimizer, SETTINGS, cfg, training_state(3, 2.0, rng, ident, 1.5))
    stored = load_checkpoint(str(path))["state"]
    assert stored["data"] == ident and stored["train_loss"] == 1.5
    moved = dict(ident, spec="/elsewhere/tiny.txt")                 # same text, another path: the same corpus
    assert check_same_data(path, stored["data"], moved) is False
    other = dict(ident, sha256="cd" * 32, name="other.txt", spec="other.txt")
    with pytest.raises(CheckpointError) as e:
        check_same_data(path, stored["data"], other)
    assert str(e.value).startswith(f"{path} was trained on 'tiny.txt' (1,000 bytes, sha256 abababababab, byte tokens), "
                                   "--data=other.txt is 'other.txt'")
    assert "--new_data=True" in str(e.value)
    assert check_same_data(path, stored["data"], other, allow=True) is True
    assert check_same_data(path, None, other) is False              # an older checkpoint: unchecked
    with pytest.raises(CheckpointError, match="resuming on another corpus"):
        check_same_data(path, ident, dict(ident, tokenizer="bpe:512"))
    bpe = dict(ident, tokenizer="bpe:300", tokenizer_sha256="01" * 32)   # the same corpus, another BPE file
    with pytest.raises(CheckpointError, match="tokenizer sha256 010101010101"):
        check_same_data(path, bpe, dict(bpe, tokenizer_sha256="02" * 32))
    assert check_same_data(path, dict(bpe, tokenizer_sha256=None), bpe) is False    # recorded by one side only


def test_a_checkpoint_that_does_not_fit_names_the_file(tmp_path):
    path, cfg, model, optimizer, rng = saved(tmp_path)
    ckpt = load_checkpoint(str(path))
    del ckpt["model"][next(iter(ckpt["model"]))]
    with pytest.raises(CheckpointError, match=f"^checkpoint {path} does not fit this run \\(state dict mismatch"):
        restore(ckpt, optimizer, rng, model, path)
    ckpt = load_checkpoint(str(path))
    ckpt["state"]["rng"] = {"bit_generator": "nonsense"}
    with pytest.raises(CheckpointError, match=f"^checkpoint {path} does not fit this run"):
        restore(ckpt, optimizer, rng, model, path)
    folder = tmp_path / "folder.npz"
    folder.mkdir()
    with pytest.raises(CheckpointError, match="is a folder, not a checkpoint file"):
        load_checkpoint(str(folder))
