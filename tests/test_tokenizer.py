"""Tests for --tokenizer (nanospa/run/tokenizer.py, data.load_dataset(tokenizer=...), train.py and
the experiments runner): the spec and its one-line errors before any work, the byte-level
BPE trained on the training split only, cached beside the byte tokens and reused, exact
decoding, and losses per byte. Tests that train a BPE skip without Hugging Face
`tokenizers` (pip install -e ".[bpe]"); the one on ../shared data skips without it."""
import json
import os
import pathlib

import numpy as np
import pytest

import data
import train
from nanospa.run import tokenizer as subword
from nanospa.experiments.__main__ import main as experiments

from conftest import shared_file

pytestmark = pytest.mark.slow       # the full suite only: python -m pytest -m 'not slow' skips it

MISSING = 'error: --tokenizer=bpe:2048 needs the Hugging Face tokenizers package: pip install -e ".[bpe]"'
TEXT = ("The quick brown fox jumps over the lazy dog.\nNaïve café, déjà vu — 日本語 text.\n"
        "  indented\tline\n\nAnother paragraph with numbers 12345 and 67890.\n") * 60


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


@pytest.fixture
def hide_tokenizers(monkeypatch):
    """As if `tokenizers` were not installed."""
    real = subword.importlib.import_module

    def fake(name, *a, **k):
        if name == "tokenizers":
            raise ImportError("No module named 'tokenizers'")
        return real(name, *a, **k)
    monkeypatch.setattr(subword.importlib, "import_module", fake)


# ---------------------------------------------------------------- specs and errors (no tokenizers needed)

def test_specs():
    assert subword.parse("byte") == ("byte", None)
    assert subword.parse("bpe:2048") == ("bpe", 2048) and subword.parse("bpe:257") == ("bpe", 257)
    for bad in ("bpe:abc", "bpe:1", "bpe:256", "bpe:65537", "bpe:", "bpe:-5", "foo", "BPE:300", ""):
        with pytest.raises(subword.TokenizerError, match="is not a tokenizer: use byte, or bpe:N"):
            subword.parse(bad)


@pytest.fixture
def no_data(monkeypatch):
    """train.py must not get as far as reading data."""
    def refuse(*a, **k):
        raise AssertionError("the data was read")
    monkeypatch.setattr(train, "load_dataset", refuse)


@pytest.mark.parametrize("spec", ["bpe:abc", "bpe:1", "foo"])
def test_train_refuses_a_malformed_spec_in_one_line_before_any_work(spec, tmp_path, capsys, no_data):
    out = tmp_path / "run"
    assert train.main([f"--tokenizer={spec}", f"--out_dir={out}"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: --tokenizer={spec} is not a tokenizer: use {subword.SPEC_HELP}\n"
    assert not out.exists()


def test_a_missing_package_is_one_line_naming_the_extra(tmp_path, capsys, hide_tokenizers, no_data):
    out = tmp_path / "run"
    assert train.main(["--tokenizer=bpe:2048", f"--out_dir={out}"]) == 2
    assert capsys.readouterr().err == MISSING + "\n" and not out.exists()
    assert experiments(["fig2", "--preset=tiny", "--tokenizer=bpe:2048", f"--out={out}"]) == 2
    assert capsys.readouterr().err == MISSING + "\n"
    assert data.main(["--tokenizer=bpe:2048"]) == 2 and capsys.readouterr().err == MISSING + "\n"


def test_the_experiments_refuse_a_malformed_spec(tmp_path, capsys):
    assert experiments(["longer", "--preset=tiny", "--tokenizer=bpe:1", f"--out={tmp_path / 'x'}"]) == 2
    assert "--tokenizer=bpe:1 is not a tokenizer" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_char_start_and_safe_pieces(monkeypatch):
    b = np.frombuffer("aé日b".encode(), dtype=np.uint8)             # a, é (2 bytes), 日 (3 bytes), b
    assert [subword.char_start(b, i) for i in range(len(b) + 1)] == [0, 1, 1, 3, 3, 3, 6, 7]
    monkeypatch.setattr(subword, "PIECE_BYTES", 1000)
    raw = ("word\nnext " * 500).encode() + "ü\n  x\n".encode()
    parts = list(subword.pieces(raw))
    assert "".join(parts).encode() == raw and len(parts) > 1
    assert all(p.endswith("\n") and p[-2].isalnum() for p in parts[:-1])


def test_byte_datasets_keep_one_byte_per_token(text_file, tmp_path):
    ds = data.load_dataset(str(text_file), cache_dir=tmp_path / "cache")
    assert ds.tokenizer == "byte" and ds.codec is None and ds.bytes_per_token == {"train": 1.0, "val": 1.0}
    assert ds.per_byte(val_loss=2.0, train_loss=3.0) == dict(val_loss=2.0, train_loss=3.0, val_loss_per_byte=2.0,
                                                            train_loss_per_byte=3.0)


# ---------------------------------------------------------------- the BPE (needs tokenizers)

def test_bpe_dataset_decodes_exactly_and_is_cached(text_file, tmp_path, monkeypatch):
    pytest.importorskip("tokenizers")
    cache = tmp_path / "cache"
    ds = data.load_dataset(str(text_file), cache_dir=cache, tokenizer="bpe:300", val_fraction=0.3)
    assert ds.tokenizer == "bpe:300" and 256 < ds.vocab_size <= 300 and ds.train.dtype == np.uint16
    assert int(max(ds.train.max(), ds.val.max())) < ds.vocab_size
    assert ds.decode(ds.train) + ds.decode(ds.val) == TEXT                # the split sits between characters
    raw = TEXT.encode()
    n_train = len(ds.decode(ds.train).encode())
    assert abs(n_train - int(len(raw) * 0.7)) <= 3
    assert ds.bytes_per_token["train"] == pytest.approx(n_train / len(ds.train))
    assert ds.bytes_per_token["val"] == pytest.approx((len(raw) - n_train) / len(ds.val))
    assert ds.bytes_per_token["train"] > 1.5                               # repeated text: merges pay
    np.testing.assert_array_equal(ds.encode("The quick brown fox"), ds.codec.encode("The quick brown fox"))
    entry = cache / next(p.name for p in cache.iterdir() if p.name != "downloads") / "bpe-300"
    assert sorted(p.name for p in entry.iterdir()) == sorted(subword.FILES)
    meta = json.loads((entry / "meta.json").read_text())
    assert meta["corpus"]["sha256"] == ds.meta["sha256"] and ds.meta["bpe"]["tokens"] == len(ds.train) + len(ds.val)

    def no_training(*a, **k):
        raise AssertionError("retrained")
    monkeypatch.setattr(subword.BPE, "train", classmethod(no_training))
    again = data.load_dataset(str(text_file), cache_dir=cache, tokenizer="bpe:300", val_fraction=0.3)
    np.testing.assert_array_equal(again.train, ds.train)                  # a second load reuses the entry
    assert again.vocab_size == ds.vocab_size and again.decode(again.val) == ds.decode(ds.val)
    with pytest.raises(AssertionError, match="retrained"):                # another split: another training
        data.load_dataset(str(text_file), cache_dir=cache, tokenizer="bpe:300", val_fraction=0.2)


def damage(path, how):
    """Cut the file in half, or invert 16 bytes in its middle keeping its size and modification time."""
    st, raw = path.stat(), bytearray(path.read_bytes())
    mid = len(raw) // 2
    if how == "truncate":
        path.write_bytes(raw[:mid])
    else:
        raw[mid:mid + 16] = bytes(255 - b for b in raw[mid:mid + 16])
        path.write_bytes(raw)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.mark.parametrize("name, how", [("tokenizer.json", "truncate"), ("tokens.bin", "flip")])
def test_a_damaged_bpe_cache_file_is_named_and_rebuilt(name, how, text_file, tmp_path, monkeypatch, capsys):
    """A truncated tokenizer.json (it no longer loads), or BPE tokens changed in place: a note
    names the file, the run goes on, and the entry is rebuilt as it was."""
    pytest.importorskip("tokenizers")
    monkeypatch.setenv("NANOSPA_CACHE", str(tmp_path / "cache"))
    ds = data.load_dataset(str(text_file), tokenizer="bpe:300")
    fresh = {split: np.array(getattr(ds, split)) for split in ("train", "val")}    # copies: not the memmap
    path = pathlib.Path(ds.path) / "bpe-300" / name
    good = path.read_bytes()
    damage(path, how)
    again = data.load_dataset(str(text_file), tokenizer="bpe:300")
    assert capsys.readouterr().err == (f"note: the cache file {path} is damaged (not the sha256 recorded "
                                       "when it was built); rebuilding it\n")
    np.testing.assert_array_equal(again.train, fresh["train"])
    np.testing.assert_array_equal(again.val, fresh["val"])
    np.testing.assert_array_equal(again.encode(TEXT), ds.encode(TEXT))
    assert again.codec.tok.to_str() == ds.codec.tok.to_str() and path.read_bytes() == good
    data.load_dataset(str(text_file), tokenizer="bpe:300")
    assert capsys.readouterr().err == ""                                  # intact again: no note


def test_a_split_inside_a_character_moves_to_its_start(tmp_path):
    """1,999 bytes of two-byte characters: 70% is byte 1,399, inside one; the split moves to
    1,398 and both splits decode on their own."""
    pytest.importorskip("tokenizers")
    path = tmp_path / "e.txt"
    text = "é" * 999 + "\n"
    path.write_text(text, encoding="utf-8")
    ds = data.load_dataset(str(path), cache_dir=tmp_path / "c", tokenizer="bpe:300", val_fraction=0.3)
    assert len(ds.decode(ds.train).encode()) == 1398 and ds.decode(ds.train) + ds.decode(ds.val) == text


def test_bpe_is_trained_on_the_training_split_only(tmp_path):
    pytest.importorskip("tokenizers")
    path = tmp_path / "t.txt"
    path.write_text("plain words in the training part. " * 300 + "zqxv zqxv zqxv " * 300, encoding="utf-8")
    ds = data.load_dataset(str(path), cache_dir=tmp_path / "c", tokenizer="bpe:400", val_fraction=0.5)
    assert "zq" not in ds.decode(ds.train) and "zqxv" in ds.decode(ds.val)
    vocab = ds.codec.tok.get_vocab()
    assert not any("zq" in t or "qx" in t or "xv" in t for t in vocab)   # only in validation: never merged
    assert any("words" in t for t in vocab)
    again = subword.BPE.train(subword.pieces(np.asarray(ds.decode(ds.train).encode())), 400, "bpe:400")
    assert again.tok.to_str() == ds.codec.tok.to_str()                    # deterministic


def test_train_with_bpe_logs_per_byte_samples_text_and_keeps_its_tokenizer(text_file, tmp_path, capsys):
    pytest.importorskip("tokenizers")
    out = tmp_path / "run"
    common = [f"--data={text_file}", f"--out_dir={out}", "--n_layer=2", "--n_embd=16", "--n_head=2",
              "--block_size=16", "--batch_size=2", "--eval_iters=1", "--eval_interval=4", "--log_interval=2"]
    assert train.main(common + ["--tokenizer=bpe:300", "--max_iters=4", "--sample_tokens=12", "--start=The"]) == 0
    printed = capsys.readouterr().out
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    ds = data.load_dataset(str(text_file), tokenizer="bpe:300")
    for r in log:
        assert r["train_loss_per_byte"] == pytest.approx(r["train_loss"] / ds.bytes_per_token["train"])
        if "val_loss" in r:
            assert r["val_loss_per_byte"] == pytest.approx(r["val_loss"] / ds.bytes_per_token["val"])
            assert r["eval_train_loss_per_byte"] == pytest.approx(r["eval_train_loss"] / ds.bytes_per_token["train"])
    assert "nats/byte" in printed and printed.split("sample:\n", 1)[1].startswith("The")
    from nanospa.run.checkpoint import load_checkpoint
    ckpt = load_checkpoint(str(out / "ckpt.npz"))
    assert ckpt["config"]["vocab_size"] == ds.vocab_size and ckpt["state"]["data"]["tokenizer"] == "bpe:300"
    assert train.main(common + ["--init_from=resume", "--tokenizer=byte", "--max_iters=6"]) == 2
    assert "tokenizer='byte' (checkpoint: 'bpe:300')" in capsys.readouterr().err


def test_experiments_report_losses_per_byte(tmp_path, capsys):
    """Validation text unlike the training text (so that the splits' bytes per token differ):
    each loss is divided by its own split's."""
    pytest.importorskip("tokenizers")
    path = tmp_path / "mixed.txt"
    rng = np.random.default_rng(0)
    odd = "".join(rng.choice(list("qwxzjkv "), size=3000))
    path.write_text(TEXT + odd, encoding="utf-8")
    out = tmp_path / "fig2"
    assert experiments(["fig2", "--preset=tiny", f"--data={path}", "--tokenizer=bpe:300", f"--out={out}",
                        "--methods=espa,pre_ln"]) == 0
    result = json.loads((out / "result.json").read_text())
    bpt = result["data"]["bytes_per_token"]
    assert result["data"]["tokenizer"] == "bpe:300" and abs(bpt["val"] - bpt["train"]) > 0.1 * bpt["train"]
    for m in result["methods"].values():
        s = m["summary"]
        assert s["final_train_per_byte"] == pytest.approx(s["final_train"] / bpt["train"])
        assert s["final_val_per_byte"] == pytest.approx(s["final_val"] / bpt["val"])
    table = (out / "table.md").read_text()
    assert "train nats/byte" in table and "bpe:300" in table


def test_shakespeare_bpe_round_trip(tmp_path):
    pytest.importorskip("tokenizers")
    path = shared_file("tinyshakespeare.txt")
    ds = data.load_dataset(str(path), cache_dir=tmp_path, tokenizer="bpe:2048")
    assert ds.decode(ds.val) == path.read_text(encoding="utf-8")[-len(ds.decode(ds.val)):]
    # English with 1,792 merges: every token covers several characters on average (GPT-2's
    # 50k-token BPE reaches about 4 bytes per token; byte tokens are 1)
    assert 2.0 < ds.bytes_per_token["train"] < 5.0
