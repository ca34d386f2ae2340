"""Tests for nanospa/run/corpus.py: the default corpus, paths, Shakespeare, WikiText, downloads,
fingerprints and the cache folder.

Sources are read through data.load_dataset, the way every caller reads them. No test
touches the network: urllib.request.urlopen is replaced for every test. Tests that read
the shared data folder skip when it is absent.
"""
import hashlib
import inspect
import io
import json
import math
import os
import pathlib
import sys
import urllib.request
import zipfile
from collections import Counter

import numpy as np
import pytest

import data
from conftest import one_line, shared_file, write
from data import DataError, load_dataset
from nanospa.run import corpus


# every test: no network, and the default cache is a fresh temporary folder
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("isolated_data")]


# ----------------------------------------------------------------------------- default corpus

@pytest.fixture(scope="module")
def default_ds(tmp_path_factory):
    """The default corpus, built once for this module (about 2-3 s on one core)."""
    return load_dataset("default", cache_dir=tmp_path_factory.mktemp("cache_a"))


def test_default_corpus_size_and_meta(default_ds):
    ds = default_ds
    n = len(ds.train) + len(ds.val)
    assert n >= corpus.DEFAULT_MIN_BYTES >= 2_000_000
    assert ds.meta["bytes"] == n and ds.vocab_size == 256 and ds.train.dtype == np.uint8
    assert ds.meta["python"] == sys.version
    raw = (pathlib.Path(ds.path) / "tokens.bin").read_bytes()
    assert hashlib.sha256(raw).hexdigest() == ds.meta["sha256"]
    parts = ds.meta["parts"]
    assert parts["topics"] > 50 and parts["docstrings"] > 1000
    assert ds.name == "default" and "docstrings" in ds.description


def test_default_corpus_is_the_documentation(default_ds):
    text = default_ds.decode(default_ds.train[:200_000])
    from pydoc_data.topics import topics
    first = sorted(topics)[0]
    assert text.startswith(topics[first].strip("\n"))     # part 1: topics in sorted order
    full = (bytes(default_ds.train) + bytes(default_ds.val)).decode("utf-8")   # valid UTF-8
    assert inspect.getdoc(json) in full                   # part 2: module docstrings
    assert inspect.getdoc(json.JSONDecoder.decode) in full
    # the parts account for every byte: parts joined by 2-byte blank lines, plus a final newline
    p = default_ds.meta["parts"]
    n_parts = p["topics"] + p["docstrings"] + p["source_files"]
    assert (p["topic_bytes"] + p["docstring_bytes"] + p["source_bytes"] + 2 * (n_parts - 1) + 1
            == default_ds.meta["bytes"])


def test_default_corpus_deterministic(default_ds, tmp_path):
    again = load_dataset("default", cache_dir=tmp_path / "cache_b")
    assert again.path != default_ds.path
    assert again.meta["sha256"] == default_ds.meta["sha256"]
    assert again.meta["bytes"] == default_ds.meta["bytes"]


def test_default_cache_is_reused(default_ds, monkeypatch):
    tokens = pathlib.Path(default_ds.path) / "tokens.bin"
    before = tokens.stat().st_mtime_ns

    def no_rebuild(*a, **k):
        raise AssertionError("the cached default corpus was rebuilt")
    monkeypatch.setattr(corpus, "build_default_corpus", no_rebuild)
    ds = load_dataset("default", cache_dir=pathlib.Path(default_ds.path).parent)
    assert tokens.stat().st_mtime_ns == before
    assert ds.meta["sha256"] == default_ds.meta["sha256"]


def test_default_corpus_falls_back_to_sources(tmp_path):
    """With a small fake stdlib: topics, then docstrings, then sources only when short."""
    lib = tmp_path / "lib"
    write(lib / "b.py", '"""Module b."""\ndef f():\n    """Function f."""\n')
    write(lib / "a" / "__init__.py", '"""Package a."""\nclass C:\n    """Class C."""\n'
          '    def m(self):\n        """Method m."""\n')
    write(lib / "test" / "t.py", '"""Skipped test module."""\n')
    write(lib / "site-packages" / "s.py", '"""Skipped third-party module."""\n')
    topics = {"zeta": "Zeta topic.\n", "alpha": "Alpha topic.\n"}
    text, info = corpus.build_default_corpus(min_bytes=1, stdlib=lib, topics=topics)
    assert text == (b"Alpha topic.\n\nZeta topic.\n\nPackage a.\n\nClass C.\n\nMethod m.\n\n"
                    b"Module b.\n\nFunction f.\n")
    assert info["source_files"] == 0 and info["docstrings"] == 5 and info["stdlib_files"] == 2
    longer, info = corpus.build_default_corpus(min_bytes=10_000, stdlib=lib, topics=topics)
    assert longer.startswith(text[:-1]) and b"def m(self):" in longer and b"def f():" in longer
    assert info["source_files"] == 2 and b"Skipped" not in longer


# ----------------------------------------------------------------------------- PATH sources, fingerprints, cache folder

def test_cache_dir_argument_overrides_env(tmp_path):
    f = write(tmp_path / "t.txt", "some text\n")
    ds = load_dataset(str(f), cache_dir=tmp_path / "elsewhere")
    assert pathlib.Path(ds.path).parent == tmp_path / "elsewhere"
    assert not (tmp_path / "cache").exists()


def test_path_folder_sorted_and_joined(tmp_path):
    d = tmp_path / "corpus"
    write(d / "sub" / "b.txt", "second\n")          # written first, sorts after a.txt
    write(d / "a.txt", "first")
    write(d / "empty.txt", "")                      # skipped: contributes nothing
    write(d / "notes.md", "not a .txt file")        # ignored
    ds = load_dataset(str(d), val_fraction=0.5)
    assert bytes(ds.train) + bytes(ds.val) == b"first\n\nsecond\n"
    assert ds.description.startswith("2 .txt file(s)")


def test_path_cache_rebuilt_when_source_changes(tmp_path):
    f = write(tmp_path / "t.txt", "old text here\n")
    old = load_dataset(str(f))
    write(f, "new, longer text here\n")
    os.utime(f, ns=(0, f.stat().st_mtime_ns + 1_000_000_000))   # mtime surely differs
    new = load_dataset(str(f))
    assert new.path == old.path
    assert bytes(new.train) + bytes(new.val) == b"new, longer text here\n"


def test_cache_root_argument_then_env_then_home(tmp_path, monkeypatch):
    assert corpus.cache_root(tmp_path / "x") == tmp_path / "x"
    assert corpus.cache_root() == corpus.cache_root("") == tmp_path / "cache"    # env
    monkeypatch.delenv("NANOSPA_CACHE")
    assert corpus.cache_root() == pathlib.Path.home() / ".cache" / "nanospa"


def test_atomic_write_replaces_only_on_success(tmp_path):
    d = tmp_path / "d"
    dest = write(d / "f.bin", b"old")
    with pytest.raises(RuntimeError, match="interrupted"):
        with corpus.atomic_write(dest) as f:
            f.write(b"half")
            raise RuntimeError("interrupted")
    assert dest.read_bytes() == b"old" and [p.name for p in d.iterdir()] == ["f.bin"]
    with corpus.atomic_write(dest) as f:
        f.write(b"new")
    assert dest.read_bytes() == b"new" and [p.name for p in d.iterdir()] == ["f.bin"]


# ----------------------------------------------------------------------------- errors

def test_missing_empty_and_non_utf8_files(tmp_path):
    with pytest.raises(DataError) as e:
        load_dataset(str(tmp_path / "nope.txt"))
    assert "nope.txt" in one_line(e)
    with pytest.raises(DataError) as e:
        load_dataset(str(write(tmp_path / "empty.txt", "")))
    assert "empty.txt" in one_line(e) and "empty" in one_line(e)
    bad = write(tmp_path / "latin1.txt", "caf\u00e9 au lait".encode("latin-1"))
    with pytest.raises(DataError) as e:
        load_dataset(str(bad))
    assert str(bad) in one_line(e) and "0xe9" in one_line(e) and "offset 3" in one_line(e)
    assert issubclass(DataError, ValueError)
    (tmp_path / "nothing").mkdir()
    with pytest.raises(DataError, match="no non-empty .txt files"):
        load_dataset(str(tmp_path / "nothing"))


def test_a_dangling_link_in_a_data_folder_is_named(tmp_path):
    folder = tmp_path / "texts"
    write(folder / "a.txt", "some text here\n" * 20)
    (folder / "b.txt").symlink_to(tmp_path / "gone.txt")
    with pytest.raises(DataError) as e:
        load_dataset(str(folder))
    assert one_line(e) == (f"{folder / 'b.txt'} is a dangling link (to {tmp_path / 'gone.txt'}); remove it or "
                           "point it at a text file")
    (tmp_path / "link.txt").symlink_to(tmp_path / "gone.txt")
    with pytest.raises(DataError, match="link.txt is a dangling link"):
        load_dataset(str(tmp_path / "link.txt"))


def test_non_utf8_error_offset_across_chunks(tmp_path, monkeypatch):
    """A bad byte after a character split across read chunks is located exactly."""
    monkeypatch.setattr(corpus, "CHUNK", 4)
    raw = "ab\u20acd".encode() + b"\xff" + b"zz"        # euro sign spans chunks 1 and 2
    f = write(tmp_path / "x.txt", raw)
    with pytest.raises(DataError) as e:
        load_dataset(str(f))
    assert "0xff at byte offset 6" in one_line(e)
    f2 = write(tmp_path / "y.txt", b"abc\xe2\x82")     # truncated euro sign at the end
    with pytest.raises(DataError, match="truncated character at byte offset 3"):
        load_dataset(str(f2))


# ----------------------------------------------------------------------------- shakespeare / wikitext

SHAKESPEARE_LIKE = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\n"
                    "All:\nSpeak, speak.\n\n") * 20


def test_shakespeare_from_local_copy_and_cache_folder(tmp_path):
    f = write(tmp_path / "input.txt", SHAKESPEARE_LIKE)
    ds = load_dataset(f"shakespeare:{f}")
    assert ds.name == "shakespeare"
    assert bytes(ds.train) + bytes(ds.val) == SHAKESPEARE_LIKE.encode()
    write(tmp_path / "cache" / "downloads" / "tinyshakespeare.txt", SHAKESPEARE_LIKE)
    ds2 = load_dataset("shakespeare")                  # found in the cache, no network
    assert pathlib.Path(ds2.path).name == "shakespeare"
    assert bytes(ds2.train) == bytes(ds.train)


def test_offline_errors_say_where_to_put_the_file(tmp_path):
    cache = tmp_path / "cache"
    with pytest.raises(DataError) as e:
        load_dataset("shakespeare")
    msg = one_line(e)
    assert str(cache / "downloads" / "tinyshakespeare.txt") in msg
    assert "--data=shakespeare:" in msg and "network disabled" in msg
    for which, zname in (("wikitext2", "wikitext-2-raw-v1.zip"),
                         ("wikitext103", "wikitext-103-raw-v1.zip")):
        with pytest.raises(DataError) as e:
            load_dataset(which)
        msg = one_line(e)
        assert zname in msg and str(cache / "downloads") in msg and f"--data={which}:" in msg
    assert list((cache / "downloads").iterdir()) == []          # no partial downloads left


def test_download_is_written_atomically_and_cached(tmp_path, monkeypatch):
    calls = []

    def fake_urlopen(url, timeout=None):
        calls.append((url, timeout))
        return io.BytesIO(SHAKESPEARE_LIKE.encode())
    monkeypatch.setattr(urllib.request, "urlopen", fake_urlopen)
    ds = load_dataset("shakespeare")
    assert calls == [(corpus.SHAKESPEARE_URL, corpus.DOWNLOAD_TIMEOUT_S)]
    assert [p.name for p in (tmp_path / "cache" / "downloads").iterdir()] == ["tinyshakespeare.txt"]
    assert bytes(ds.train) + bytes(ds.val) == SHAKESPEARE_LIKE.encode()
    load_dataset("shakespeare")
    assert len(calls) == 1                                       # second load: no download


WIKI = {"train": " \n = Valkyria Chronicles III = \n \n Senjō no Valkyria 3 is a game .\n" * 30,
        "valid": " \n = Homarus gammarus = \n \n Homarus gammarus is a lobster .\n" * 5,
        "test": " \n = Robert Boulter = \n \n Robert Boulter is an actor .\n" * 5}


def wiki_zip(path, prefix="wikitext-2-raw/"):
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        for split, text in WIKI.items():
            z.writestr(f"{prefix}wiki.{split}.raw", text.encode())
    return path


def check_wiki_splits(ds):
    assert bytes(ds.train) == WIKI["train"].encode()
    assert bytes(ds.val) == WIKI["valid"].encode()
    assert bytes(ds.test) == WIKI["test"].encode()
    assert ds.meta["split"]["val_fraction"] is None


def test_wikitext_zip_folder_and_cache(tmp_path):
    z = wiki_zip(tmp_path / "w.zip")
    ds = load_dataset(f"wikitext2:{z}", val_fraction=0.5)   # the archive's splits win
    check_wiki_splits(ds)
    assert ds.name == "wikitext2"
    wiki_zip(tmp_path / "cache" / "downloads" / "wikitext-2-raw-v1.zip")
    check_wiki_splits(load_dataset("wikitext2"))
    with zipfile.ZipFile(z) as zf:                       # the extracted folder works too
        zf.extractall(tmp_path / "x")
    check_wiki_splits(load_dataset(f"wikitext2:{tmp_path / 'x'}"))
    with pytest.raises(DataError, match="no wiki.train.raw"):
        with zipfile.ZipFile(tmp_path / "other.zip", "w") as zf:
            zf.writestr("readme.txt", "nothing here")
        load_dataset(f"wikitext103:{tmp_path / 'other.zip'}")


def test_wikitext_member_not_utf8(tmp_path):
    z = tmp_path / "w.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("wikitext-2-raw/wiki.train.raw", b"ok\n")
        zf.writestr("wikitext-2-raw/wiki.valid.raw", b"bad \xff\n")
    with pytest.raises(DataError) as e:
        load_dataset(f"wikitext2:{z}")
    assert "wiki.valid.raw is not UTF-8" in one_line(e)


def test_shared_tiny_shakespeare():
    f = shared_file("tinyshakespeare.txt")
    ds = load_dataset(f"shakespeare:{f}")
    assert len(ds.train) + len(ds.val) == 1_115_394
    assert len(ds.train) == int(1_115_394 * 0.9)                 # first 90%, as in nanoGPT
    assert ds.meta["sha256"] == "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
    counts = Counter(bytes(ds.train))
    n = len(ds.train)
    expected = -sum(c / n * math.log(c / n) for c in counts.values())
    assert len(counts) == 65                                     # 65 distinct characters
    assert data.unigram_entropy(ds.train, 256) == pytest.approx(expected, rel=1e-12)


def test_shared_wikitext2_valid():
    f = shared_file("wikitext-2/valid.txt")
    ds = load_dataset(f"wikitext2:{f}")
    assert len(ds.train) + len(ds.val) == 1_121_681
    text = ds.decode(np.concatenate([ds.train, ds.val]))
    assert "\ufffd" not in text                                   # valid UTF-8 throughout
    lines = text.splitlines()
    assert len(lines) == 3760
    assert sum(len(line.split()) for line in lines) == 213_886   # the README's count
    assert " = Homarus gammarus = " in lines[:5]
    with pytest.raises(DataError, match="valid.txt"):            # no train file in the folder
        load_dataset(f"wikitext2:{f.parent}")
