"""Tests for data.py: byte tokens, the cache entry, splits, batches, unigram entropy, the CLI.

The sources of the text (default corpus, paths, Shakespeare, WikiText, downloads) are
tested in test_corpus.py. No test touches the network: urllib.request.urlopen is replaced
for every test, and the cache is a fresh temporary folder.
"""
import hashlib
import math
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import data
from conftest import one_line, write
from data import DataError, load_dataset
from nanospa.run import corpus

ROOT = pathlib.Path(__file__).resolve().parents[1]


# every test: no network, and the default cache is a fresh temporary folder
pytestmark = pytest.mark.usefixtures("isolated_data")


# ----------------------------------------------------------------------------- splits and the cache entry

def test_path_file_split_and_memmap(tmp_path):
    text = "Hello, world! Ünïcödé €.\n" * 40          # multi-byte characters included
    f = write(tmp_path / "t.txt", text)
    ds = load_dataset(str(f))
    raw = text.encode()
    n_train = int(len(raw) * 0.9)
    assert isinstance(ds.train, np.memmap) and isinstance(ds.val, np.memmap)
    assert ds.train.dtype == np.uint8 and ds.test is None
    assert len(ds.train) == n_train and len(ds.val) == len(raw) - n_train
    assert bytes(ds.train) + bytes(ds.val) == raw
    assert ds.meta["sha256"] == hashlib.sha256(raw).hexdigest()
    assert ds.meta["split"] == {"train": n_train, "val": len(raw) - n_train, "test": None,
                                "val_fraction": 0.1}
    ds4 = load_dataset(str(f), val_fraction=0.25)
    assert len(ds4.val) == len(raw) - int(len(raw) * 0.75)
    # the cache lives under NANOSPA_CACHE (set by the autouse fixture)
    assert pathlib.Path(ds.path).parent == pathlib.Path(os.environ["NANOSPA_CACHE"])


def flip_bytes(path):
    """Invert 16 bytes in the middle of a file, keeping its size and modification time."""
    st, raw = path.stat(), bytearray(path.read_bytes())
    mid = len(raw) // 2
    raw[mid:mid + 16] = bytes(255 - b for b in raw[mid:mid + 16])
    path.write_bytes(raw)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_a_same_size_damage_of_the_token_cache_is_named_and_rebuilt(tmp_path, capsys):
    """Size and modification time stay, so only the recorded sha256 can tell."""
    f = write(tmp_path / "t.txt", "Hello, world! Ünïcödé €.\n" * 40)
    tokens = pathlib.Path(load_dataset(str(f)).path) / "tokens.bin"
    fresh = tokens.read_bytes()
    flip_bytes(tokens)
    ds = load_dataset(str(f))
    assert capsys.readouterr().err == (f"note: the cache file {tokens} is damaged (not the sha256 recorded "
                                       "when it was built); rebuilding it\n")
    assert bytes(ds.train) + bytes(ds.val) == fresh == f.read_bytes() == tokens.read_bytes()
    load_dataset(str(f))
    assert capsys.readouterr().err == ""                         # intact again: no note


def test_bad_arguments(tmp_path):
    f = write(tmp_path / "t.txt", "text\n")
    for frac in (0, 1, -0.1, 1.5, "0.1"):
        with pytest.raises(DataError, match="val_fraction"):
            load_dataset(str(f), val_fraction=frac)
    with pytest.raises(DataError, match="min_tokens"):
        load_dataset(str(f), min_tokens=100)
    with pytest.raises(DataError, match="no path"):
        load_dataset("default:/x")


def test_check_length_names_sizes(tmp_path):
    ds = load_dataset(str(write(tmp_path / "t.txt", "x" * 100)))    # 90 train, 10 val
    data.check_length(ds, 9)                                        # 10 >= 9 + 1: fine
    with pytest.raises(DataError) as e:
        data.check_length(ds, 10)
    msg = one_line(e)
    assert "val split has 10 tokens" in msg and "block_size + 1 = 11" in msg


# ----------------------------------------------------------------------------- batches

def test_get_batch_shapes_shift_and_determinism(tmp_path):
    tokens = np.arange(200, dtype=np.uint8)
    x, y = data.get_batch(tokens, 8, 16, np.random.default_rng(0))
    assert x.shape == y.shape == (8, 16) and x.dtype == y.dtype == np.int64
    assert x.flags.c_contiguous and y.flags.c_contiguous
    np.testing.assert_array_equal(y, x + 1)                      # y is x shifted by one
    np.testing.assert_array_equal(np.diff(x, axis=1), 1)         # windows are contiguous
    assert x.min() >= 0 and y.max() <= 199
    x2, y2 = data.get_batch(tokens, 8, 16, np.random.default_rng(0))
    np.testing.assert_array_equal(x, x2)
    x3, _ = data.get_batch(tokens, 8, 16, np.random.default_rng(1))
    assert not np.array_equal(x, x3)
    # every start is reachable, including the last one (N - T - 1)
    starts = data.get_batch(tokens, 5000, 16, np.random.default_rng(2))[0][:, 0]
    assert starts.min() == 0 and starts.max() == 200 - 16 - 1


def test_get_batch_on_memmap_and_errors(tmp_path):
    ds = load_dataset(str(write(tmp_path / "t.txt", "abcdefghij" * 20)))
    x, y = data.get_batch(ds.train, 4, 8, np.random.default_rng(0))
    assert type(x) is np.ndarray and x.dtype == np.int64
    np.testing.assert_array_equal(x[:, 1:], y[:, :-1])
    with pytest.raises(DataError, match="needs at least block_size"):
        data.get_batch(ds.val, 4, 20, np.random.default_rng(0))    # val has 20 tokens
    with pytest.raises(TypeError, match="Generator"):
        data.get_batch(ds.train, 4, 8, 0)


# ----------------------------------------------------------------------------- tokens, entropy

def test_encode_decode_roundtrip():
    s = "héllo wörld €\n"
    ids = data.encode(s)
    assert ids.dtype == np.int64 and len(ids) == len(s.encode())
    assert data.decode(ids) == s
    assert data.decode([104, 0xff, 105]) == "h\ufffdi"            # invalid UTF-8 -> U+FFFD
    with pytest.raises(ValueError, match="0..255"):
        data.decode([300])
    assert data.token_dtype(256) == np.uint8 and data.token_dtype(257) == np.uint16


def test_unigram_entropy_known_distributions():
    uniform = np.tile(np.arange(256, dtype=np.uint8), 3)
    assert data.unigram_entropy(uniform, 256) == pytest.approx(math.log(256), rel=1e-12)
    two = np.array([0] * 1 + [1] * 3, dtype=np.uint8)           # p = (1/4, 3/4)
    h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert data.unigram_entropy(two, 256) == pytest.approx(h, rel=1e-12)
    assert data.unigram_entropy(np.full(10, 7, np.uint8), 256) == 0.0
    with pytest.raises(ValueError, match="out of range"):
        data.unigram_entropy(np.array([5]), 4)
    with pytest.raises(ValueError, match="empty"):
        data.unigram_entropy(np.array([], np.uint8), 256)


# ----------------------------------------------------------------------------- command line

def test_cli_summary_and_errors(tmp_path, capsys):
    f = write(tmp_path / "t.txt", "a b c d e f g h i j\n" * 10)
    assert data.main([f"--data={f}"]) == 0
    out = capsys.readouterr().out.strip()
    assert "\n" not in out and "180 train / 20 val tokens" in out and str(tmp_path / "cache") in out
    assert data.main(["--data=/no/such/file"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: no such file") and "\n" not in err
    assert data.main(["--bogus=1"]) == 2


def test_cli_help_lists_the_specs(capsys):
    assert data.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("python data.py [--data=SPEC]") and corpus.SPECS.rstrip() in out
    assert all(name in corpus.SPECS for name in corpus.NAMED + ("PATH",))

def test_a_cache_folder_that_is_a_file_is_one_line_naming_its_setting(tmp_path, monkeypatch, capsys):
    f = write(tmp_path / "t.txt", "a b c d e f g h i j\n" * 10)
    monkeypatch.setenv("NANOSPA_CACHE", str(f))                  # a file where the cache folder goes
    with pytest.raises(DataError) as e:
        load_dataset(str(f))
    assert one_line(e) == f"cache folder {f} (from env NANOSPA_CACHE): {f} is a file, not a folder"
    with pytest.raises(DataError, match=f"cache folder {f / 'sub'} \\(from --cache_dir\\): {f} is a file"):
        load_dataset(str(f), cache_dir=str(f / "sub"))
    assert data.main([f"--data={f}"]) == 2
    assert capsys.readouterr().err.startswith("error: cache folder ")
    assert data.main(["--val_fraction=half"]) == 2
    assert capsys.readouterr().err == "error: --val_fraction=half: expected float like the default 0.1\n"


def test_a_full_disk_while_building_the_cache_names_the_entry(tmp_path, monkeypatch):
    f = write(tmp_path / "t.txt", "a b c d e f g h i j\n" * 10)

    class Full:                                                  # what a write on a full disk raises
        def __init__(self, *a, **k):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def write(self, chunk):
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(data.corpus, "atomic_write", Full)
    with pytest.raises(DataError) as e:
        load_dataset(str(f))
    msg = one_line(e)
    assert msg.startswith("cannot write the cache entry ") and "(No space left on device)" in msg
    assert str(tmp_path / "cache") in msg and "NANOSPA_CACHE" in msg


def test_cli_subprocess_exits_2_without_traceback(tmp_path):
    r = subprocess.run([sys.executable, "data.py", f"--data={tmp_path / 'missing.txt'}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, NANOSPA_CACHE=str(tmp_path / "c")))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0 and "missing.txt" in r.stderr
