"""The byte-token cache entry of a dataset: built once from its source, then memory-mapped.

    entry(src, cache)        -> (folder, meta): the entry of corpus source src, built when
                                missing or out of date
    check_cache(cache_dir)   the cache root, or DataError when it cannot hold entries
    naming_entry(folder)     an OSError without a file name as a DataError naming the entry

A cache entry is the folder <cache>/<source key>/ (see corpus.cache_root):

    tokens.bin    all tokens of the dataset, token_dtype(BYTE_VOCAB): its UTF-8 bytes
    meta.json     format, source, fingerprint, bytes, sha256, dtype, vocab_size,
                  fixed splits, build time, and what the source adds

It is rebuilt only when FORMAT_VERSION or the source's fingerprint changed (a source
file's size or modification time or, for `default`, the Python version), or tokens.bin is
missing or damaged: every load checks it against the recorded sha256 (corpus.intact, which
names a damaged file in a note), as a same-size change would keep size and modification
time. Both files are written through corpus.atomic_write.

Not here: where the text comes from (corpus.py), splits and batches (data.py), the BPE's
own entry (tokenizer.py).
"""
import hashlib
import json
import os
import time
from contextlib import contextmanager

import numpy as np

from . import corpus
from .corpus import DataError

BYTE_VOCAB = 256                       # byte-level tokens
FORMAT_VERSION = 1                     # bump when the cache entry's layout changes
TOKENS_FILE, META_FILE = "tokens.bin", "meta.json"     # the two files of a cache entry


def token_dtype(vocab_size):
    """Smallest unsigned dtype that holds ids 0..vocab_size-1 (uint8 up to 256, else uint16)."""
    if not 1 <= vocab_size <= np.iinfo(np.uint16).max + 1:
        raise ValueError(f"vocab_size must be in 1..{np.iinfo(np.uint16).max + 1}, got {vocab_size}")
    return np.dtype(np.uint8) if vocab_size <= np.iinfo(np.uint8).max + 1 else np.dtype(np.uint16)


def entry(src, cache):
    """(folder, meta) of source src's entry under the cache root, built first when needed."""
    folder = cache / src.key
    with naming_entry(folder):
        return folder, _read_meta(folder, src) or _build(folder, src)


def _read_meta(folder, src):
    """meta.json of a complete, up-to-date cache entry whose tokens.bin is intact, else None."""
    try:
        meta = json.loads((folder / META_FILE).read_text())
        ok = (meta.get("format") == FORMAT_VERSION and meta.get("fingerprint") == src.fingerprint
              and corpus.intact(folder / TOKENS_FILE, meta["sha256"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return meta if ok else None


def _build(folder, src):
    """Write folder/tokens.bin (the source's bytes, which are its tokens) and meta.json."""
    t0 = time.perf_counter()
    folder.mkdir(parents=True, exist_ok=True)
    sha, n, bounds = hashlib.sha256(), 0, {}
    with corpus.atomic_write(folder / TOKENS_FILE) as out:
        for split, chunks in src.splits:
            start = n
            for chunk in chunks():          # validated UTF-8 bytes = byte tokens
                out.write(chunk)
                sha.update(chunk)
                n += len(chunk)
            if split is not None:
                bounds["val" if split == "valid" else split] = [start, n]
        if n == 0:
            raise DataError(f"{src.name}: no text in {src.origin}")
    meta = {"format": FORMAT_VERSION, "name": src.name, "description": src.description,
            "source": src.origin, "fingerprint": src.fingerprint, "bytes": n,
            "sha256": sha.hexdigest(), "dtype": str(token_dtype(BYTE_VOCAB)),
            "vocab_size": BYTE_VOCAB, "fixed_splits": bounds or None,
            "build_seconds": round(time.perf_counter() - t0, 3), **src.extra}
    with corpus.atomic_write(folder / META_FILE) as f:
        f.write(json.dumps(meta, indent=1, sort_keys=True).encode())
    return meta


def check_cache(cache_dir=None):
    """corpus.cache_root(cache_dir), or DataError naming it and what set it when it is a file
    or lies under one (or a dangling link), so that no cache entry can be built there."""
    root = p = corpus.cache_root(cache_dir)
    while not (p.exists() or p.is_symlink()) and p != p.parent:
        p = p.parent
    if not p.is_dir():
        where = ("--cache_dir" if cache_dir else f"env {corpus.CACHE_ENV}" if os.environ.get(corpus.CACHE_ENV)
                 else "the default")
        what = "a dangling link" if p.is_symlink() else "a file"
        raise DataError(f"cache folder {root} (from {where}): {p} is {what}, not a folder")
    return root


@contextmanager
def naming_entry(folder):
    """An OSError naming no file (a full disk, a read-only cache) as a DataError naming the entry."""
    try:
        yield
    except OSError as e:
        if e.filename:
            raise
        raise DataError(f"cannot write the cache entry {folder} ({e.strerror or e}); make room or set "
                        f"{corpus.CACHE_ENV} to another folder") from None
