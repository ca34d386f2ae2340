"""Text -> byte tokens for nanospa: datasets, an on-disk token cache, batches.

What lives here: everything `train.py` needs to turn text into training batches.
Nothing here knows about models or devices; arrays are host NumPy arrays.

Datasets (--data=SPEC, or load_dataset(spec)):

  default                     the Python documentation that ships with the interpreter
  PATH                        a UTF-8 text file, or every *.txt under a folder (sorted by
                              relative path, joined by a blank line)
  shakespeare[:FILE]          tiny Shakespeare (char-rnn input.txt, 1,115,394 bytes)
  wikitext2[:ZIP|DIR|FILE]    WikiText-2 raw (Merity et al. 2016)
  wikitext103[:ZIP|DIR|FILE]  WikiText-103 raw

The last val_fraction of the tokens is the validation split, except for WikiText
archives and folders, which bring their own train / valid (/ test) files; one WikiText
file (raw, or tokenised like wiki.valid.tokens or valid.txt) is split by val_fraction.
Without a FILE, shakespeare and wikitext are read from the cache's downloads/ folder, or
downloaded there when the network allows. Named datasets take precedence over paths:
write ./default for a file called "default".

The default corpus needs no download. It is real English written by people, taken
from the running interpreter's standard library, in this order:

1. every topic of the language reference kept for `help()` (`pydoc_data.topics.topics`,
   in sorted key order; about 0.47 MB on Python 3.11);
2. the docstrings (`ast.get_docstring`) of every module, class and function of the
   standard-library `.py` files, files in sorted relative-path order, docstrings in
   source order, exact repeats dropped. Test folders (`test`, `tests`, `idle_test`) and
   `site-packages` are skipped (about 1.76 MB on CPython 3.11);
3. only if the text is still under `DEFAULT_MIN_BYTES` (2 MiB), whole source files of
   the same modules, in the same order, until it is not.

Parts are joined by a blank line. The same interpreter always gives the same bytes;
`meta.json` records the Python version, the part sizes and the SHA-256.

Tokenisation is byte level (vocabulary 256): encode = UTF-8 bytes, decode =
`bytes.decode("utf-8", errors="replace")`. The token file of a byte-level dataset is
therefore the UTF-8 text itself, stored as uint8 (a vocabulary above 256 would use
uint16; see `token_dtype`).

Cache layout (folder: the `cache_dir` argument, else env NANOSPA_CACHE, else
~/.cache/nanospa):

    downloads/                  tinyshakespeare.txt, wikitext-*-raw-v1.zip (place copies here)
    <dataset>/tokens.bin        all tokens of the dataset, uint8
    <dataset>/meta.json         source, bytes, sha256, dtype, vocab_size, fixed splits, ...

Files are written to a temporary name and renamed, so an interrupted run never leaves
a half-written cache behind. A cache entry is rebuilt only when its source changed
(size or modification time) or, for `default`, when the Python version differs.

Also here: `get_batch` (random windows from a seeded numpy Generator), `eval_batches`
(sequential windows), `check_length`, and `unigram_entropy` (the loss of the best
context-free predictor; docs/method.md section 10 compares training runs with it).
"""
import ast
import codecs
import hashlib
import importlib.util
import json
import os
import sys
import sysconfig
import tempfile
import time
import urllib.request
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

VOCAB_SIZE = 256                       # byte-level tokens
DEFAULT_MIN_BYTES = 2 * 1024 * 1024    # the default corpus is at least 2 MiB
FORMAT_VERSION = 1                     # bump when the cache layout changes
DOWNLOAD_TIMEOUT_S = 15                # per socket operation
CHUNK = 1 << 20                        # streaming chunk size in bytes
SEPARATOR = b"\n\n"                    # between files of a folder and parts of `default`

SHAKESPEARE_URL = ("https://raw.githubusercontent.com/karpathy/char-rnn/master/"
                   "data/tinyshakespeare/input.txt")
WIKITEXT_URLS = {
    "wikitext2": "https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-2-raw-v1.zip",
    "wikitext103": "https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-103-raw-v1.zip",
}
WIKITEXT_TITLES = {"wikitext2": "WikiText-2", "wikitext103": "WikiText-103"}
NAMED = ("default", "shakespeare", "wikitext2", "wikitext103")
_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}


class DataError(ValueError):
    """Bad or missing data; the message is one line and names the file or size at fault."""


# ----------------------------------------------------------------------------- tokens

def token_dtype(vocab_size):
    """Smallest unsigned dtype that holds ids 0..vocab_size-1 (uint8 up to 256, else uint16)."""
    if not 1 <= vocab_size <= 65536:
        raise ValueError(f"vocab_size must be in 1..65536, got {vocab_size}")
    return np.dtype(np.uint8) if vocab_size <= 256 else np.dtype(np.uint16)


def encode(text):
    """str -> int64 array of UTF-8 byte values, shape (len(text.encode()),)."""
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)


def decode(ids):
    """Byte ids (any integer array-like, values 0..255) -> str; invalid UTF-8 becomes U+FFFD."""
    a = np.asarray(ids).ravel()
    if a.size and (a.min() < 0 or a.max() >= VOCAB_SIZE):
        raise ValueError(f"byte ids must lie in 0..255, got values {a.min()}..{a.max()}")
    return a.astype(np.uint8).tobytes().decode("utf-8", errors="replace")


@dataclass
class Dataset:
    """A prepared dataset: memmapped token splits plus the byte tokenizer.

    train, val: 1-D np.memmap views (uint8) of the cached token file; test: same or None.
    meta: the cache's meta.json (source, bytes, sha256, ...) plus the split sizes used.
    """
    name: str
    description: str
    train: np.ndarray
    val: np.ndarray
    test: object = None
    vocab_size: int = VOCAB_SIZE
    meta: dict = field(default_factory=dict)
    path: str = ""

    def encode(self, text):
        return encode(text)

    def decode(self, ids):
        return decode(ids)


# ----------------------------------------------------------------------------- default corpus

def _stdlib_files(stdlib):
    """Relative posix paths of the stdlib's .py files, sorted; test folders and site-packages skipped."""
    out = []
    for d, dirs, files in os.walk(stdlib):
        dirs[:] = sorted(x for x in dirs if x not in _SKIP_DIRS)
        rel = Path(d).relative_to(stdlib)
        out += [(rel / f).as_posix() for f in files if f.endswith(".py")]
    return sorted(out)


def _docstrings(tree):
    """Docstrings of a module and every class/function in it, in source order."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc:
                yield doc
        kids = []
        for name in ("body", "orelse", "finalbody", "handlers", "cases"):
            value = getattr(node, name, None)
            if isinstance(value, list):
                kids += [k for k in value if isinstance(k, ast.AST)]
        stack.extend(reversed(kids))    # pop() then visits them first to last


def build_default_corpus(min_bytes=DEFAULT_MIN_BYTES, stdlib=None, topics=None):
    """The default corpus as UTF-8 bytes, plus a dict describing its parts.

    stdlib: folder of .py files (default: sysconfig.get_paths()['stdlib']);
    topics: {key: text} (default: pydoc_data.topics.topics). Deterministic: a function of
    those two inputs only. Invariant: len(result) >= min_bytes unless all sources together
    are shorter.
    """
    if stdlib is None:
        stdlib = sysconfig.get_paths()["stdlib"]
    if topics is None:
        from pydoc_data.topics import topics
    stdlib = Path(stdlib)
    parts = [topics[k].strip("\n") for k in sorted(topics)]
    info = {"topics": len(parts), "topic_bytes": sum(len(p.encode()) for p in parts)}
    files = _stdlib_files(stdlib)
    seen, n_doc, doc_bytes, sources = set(), 0, 0, []
    for rel in files:
        src = (stdlib / rel).read_bytes()
        try:
            tree = ast.parse(src)
        except (SyntaxError, ValueError):   # stdlib files are valid Python; be tolerant anyway
            continue
        sources.append((rel, src))
        for doc in _docstrings(tree):
            if doc not in seen:
                seen.add(doc)
                parts.append(doc)
                n_doc += 1
                doc_bytes += len(doc.encode("utf-8", errors="replace"))
    info.update(stdlib_files=len(files), docstrings=n_doc, docstring_bytes=doc_bytes)
    blobs = [p.encode("utf-8", errors="replace") for p in parts]
    size = sum(map(len, blobs)) + len(SEPARATOR) * (len(blobs) - 1)
    n_src, src_bytes = 0, 0
    for rel, src in sources:                # 3. whole sources, only if still short
        if size >= min_bytes:
            break
        blob = importlib.util.decode_source(src).strip("\n").encode("utf-8", errors="replace")
        blobs.append(blob)
        size += len(SEPARATOR) + len(blob)
        n_src, src_bytes = n_src + 1, src_bytes + len(blob)
    info.update(source_files=n_src, source_bytes=src_bytes)
    text = SEPARATOR.join(blobs)
    return text + b"\n", info


# ----------------------------------------------------------------------------- reading text

def _validated_chunks(f, label):
    """Yield the bytes of an open binary file in chunks, raising DataError if it is not UTF-8."""
    dec, offset = codecs.getincrementaldecoder("utf-8")("strict"), 0
    while True:
        chunk = f.read(CHUNK)
        pending = dec.getstate()[0]           # an incomplete character carried over
        try:
            dec.decode(chunk, final=not chunk)
        except UnicodeDecodeError as e:
            bad = (pending + chunk)[e.start:e.start + 1]
            what = ("truncated character" if e.reason == "unexpected end of data"
                    else f"invalid byte 0x{bad.hex()}")
            raise DataError(f"{label} is not UTF-8 text ({what} at byte offset "
                            f"{offset - len(pending) + e.start})") from None
        if not chunk:
            return
        offset += len(chunk)
        yield chunk


def _file_chunks(path):
    with open(path, "rb") as f:
        yield from _validated_chunks(f, str(path))


def _txt_files(folder):
    out = []
    for d, dirs, files in os.walk(folder):
        dirs.sort()
        out += [Path(d) / f for f in files if f.endswith(".txt")]
    return sorted(out, key=lambda p: p.relative_to(folder).as_posix())


def _fingerprint(paths):
    """What makes a cache entry stale: each source's resolved path, size and mtime."""
    out = []
    for p in paths:
        st = os.stat(p)
        out.append([str(Path(p).resolve()), st.st_size, st.st_mtime_ns])
    return out


def _short_hash(text):
    return hashlib.sha256(text.encode()).hexdigest()[:12]


# ----------------------------------------------------------------------------- sources

@dataclass
class _Source:
    """How to build one cache entry: named splits of byte chunks (split None = by fraction)."""
    name: str
    key: str                 # cache sub-folder
    description: str
    origin: str              # where the text comes from (path, archive, stdlib folder)
    fingerprint: object      # JSON-able; the cache entry is rebuilt when it changes
    splits: list             # [(split name or None, callable -> iterable of bytes)]
    extra: dict = field(default_factory=dict)   # more meta.json fields, filled while building


def _default_source():
    version = sys.version.split()[0]
    stdlib = sysconfig.get_paths()["stdlib"]
    src = _Source("default", f"default-{sys.implementation.name}-{version}", "", 
                  f"pydoc_data.topics + docstrings of {stdlib}", {"python": sys.version}, [])

    def chunks():
        text, info = build_default_corpus(stdlib=stdlib)
        src.description = (
            f"Python {version} documentation: {info['topics']} pydoc reference topics "
            f"({info['topic_bytes']:,} bytes) and {info['docstrings']:,} docstrings from "
            f"{info['stdlib_files']} standard-library files ({info['docstring_bytes']:,} bytes)"
            + (f" and {info['source_files']} source files ({info['source_bytes']:,} bytes)"
               if info["source_files"] else ""))
        src.extra = {"python": sys.version, "parts": info}
        yield text
    src.splits = [(None, chunks)]
    return src


def _path_source(path, name=None, description=None, key=None):
    """A UTF-8 file, or every non-empty *.txt under a folder joined by SEPARATOR."""
    p = Path(path).expanduser()
    if p.is_dir():
        files = [f for f in _txt_files(p) if f.stat().st_size > 0]
        if not files:
            raise DataError(f"folder {p} has no non-empty .txt files")
        description = description or f"{len(files)} .txt file(s) under {p}"
    elif p.is_file():
        if p.stat().st_size == 0:
            raise DataError(f"{p} is empty")
        files = [p]
        description = description or f"text file {p}"
    else:
        raise DataError(f"no such file or folder: {p} (named datasets: {', '.join(NAMED)})")

    def chunks():
        for i, f in enumerate(files):
            if i:
                yield SEPARATOR
            yield from _file_chunks(f)
    key = key or f"{name or 'path'}-{_short_hash(str(p.resolve()))}"
    return _Source(name or str(path), key, description, str(p.resolve()),
                   _fingerprint(files), [(None, chunks)])


def _download(url, dest, hint):
    """Fetch url to dest atomically (tmp + rename); DataError with `hint` when offline."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    print(f"downloading {url} -> {dest}", file=sys.stderr)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=dest.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as r:
            while True:
                chunk = r.read(CHUNK)
                if not chunk:
                    break
                out.write(chunk)
        os.replace(tmp, dest)
    except Exception as e:                  # URLError, timeouts, HTTP errors, disk errors
        if os.path.exists(tmp):
            os.unlink(tmp)
        reason = " ".join(str(getattr(e, "reason", e)).split()) or type(e).__name__
        raise DataError(f"cannot download {url} ({reason}); {hint}") from None
    return dest


def _shakespeare_source(local, cache):
    if local:
        return _path_source(local, "shakespeare", f"tiny Shakespeare from {local}")
    dest = cache / "downloads" / "tinyshakespeare.txt"
    if not dest.is_file():
        _download(SHAKESPEARE_URL, dest, f"offline? put char-rnn's input.txt at {dest} "
                  "or pass --data=shakespeare:/path/to/input.txt")
    return _path_source(dest, "shakespeare", "tiny Shakespeare (char-rnn input.txt)",
                        key="shakespeare")


def _wikitext_split_files(folder):
    """{split: path} for WikiText files in folder or one of its sub-folders (raw names preferred)."""
    for d in [folder] + sorted(x for x in folder.iterdir() if x.is_dir()):
        found = {}
        for split in ("train", "valid", "test"):
            for cand in (f"wiki.{split}.raw", f"wiki.{split}.tokens", f"{split}.txt"):
                if (d / cand).is_file():
                    found[split] = d / cand
                    break
        if "train" in found and "valid" in found:
            return found
    return None


def _zip_members(p):
    """{split: member name} of a WikiText zip archive (raw members preferred)."""
    try:
        with zipfile.ZipFile(p) as zf:
            names = zf.namelist()
    except (zipfile.BadZipFile, OSError) as e:
        raise DataError(f"cannot read zip archive {p} ({e})") from None
    found = {}
    for split in ("train", "valid", "test"):
        for suffix in (f"wiki.{split}.raw", f"wiki.{split}.tokens"):
            hit = sorted(n for n in names if n.rsplit("/", 1)[-1] == suffix)
            if hit:
                found[split] = hit[0]
                break
    if "train" not in found or "valid" not in found:
        raise DataError(f"zip archive {p} has no wiki.train.raw and wiki.valid.raw members")
    return found


def _wikitext_source(which, local, cache):
    """A WikiText zip, extracted folder, or single file (the last is split by val_fraction)."""
    title, url = WIKITEXT_TITLES[which], WIKITEXT_URLS[which]
    zname = url.rsplit("/", 1)[1]                        # wikitext-2-raw-v1.zip
    if local:
        p = Path(local).expanduser()
        if not p.exists():
            raise DataError(f"no such file or folder: {p}")
        key = f"{which}-{_short_hash(str(p.resolve()))}"
    else:
        key, downloads = which, cache / "downloads"
        folder = downloads / zname[:-len("-v1.zip")]     # the archive's folder, wikitext-2-raw
        p = folder if folder.is_dir() else downloads / zname
        if not p.exists():
            _download(url, p, f"offline? put {zname} (or its extracted folder {folder.name}/) "
                      f"in {downloads} or pass --data={which}:/path/to/{zname}")
    if p.is_file() and not zipfile.is_zipfile(p):
        return _path_source(p, which, f"{title} single file {p.name}, split by val_fraction", key)
    if p.is_dir():
        files = _wikitext_split_files(p)
        if files is None:
            raise DataError(f"{p} has no {title} train and valid files (wiki.train.raw, "
                            f"wiki.train.tokens or train.txt); pass one file to split by "
                            f"val_fraction, e.g. --data={which}:{p / 'valid.txt'}")
        splits = [(s, (lambda f=f: _file_chunks(f))) for s, f in files.items()]
        return _Source(which, key, f"{title} ({', '.join(f.name for f in files.values())}), "
                       "with the dataset's own splits", str(p.resolve()),
                       _fingerprint(files.values()), splits)
    members = _zip_members(p)

    def member(n):
        with zipfile.ZipFile(p) as zf, zf.open(n) as f:
            yield from _validated_chunks(f, f"{p}:{n}")
    splits = [(s, (lambda n=n: member(n))) for s, n in members.items()]
    return _Source(which, key, f"{title} ({', '.join(members.values())}), with the dataset's "
                   "own splits", str(p.resolve()), _fingerprint([p]), splits)


def _resolve(spec, cache):
    if not isinstance(spec, str) or not spec:
        raise DataError(f"data spec must be a non-empty string, got {spec!r}")
    name, _, local = spec.partition(":")
    if name not in NAMED:
        return _path_source(spec)
    if name == "default":
        if local:
            raise DataError(f"'default' takes no path, got {spec!r}")
        return _default_source()
    if name == "shakespeare":
        return _shakespeare_source(local, cache)
    return _wikitext_source(name, local, cache)


# ----------------------------------------------------------------------------- cache

def cache_root(cache_dir=None):
    """The cache folder: cache_dir, else env NANOSPA_CACHE, else ~/.cache/nanospa."""
    root = cache_dir or os.environ.get("NANOSPA_CACHE") or "~/.cache/nanospa"
    return Path(root).expanduser()


def _write_json(path, obj):
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def _read_meta(folder, src):
    """meta.json of a complete, up-to-date cache entry, else None."""
    try:
        meta = json.loads((folder / "meta.json").read_text())
        ok = (meta.get("format") == FORMAT_VERSION and meta.get("fingerprint") == src.fingerprint
              and (folder / "tokens.bin").stat().st_size == meta["bytes"] * np.dtype(meta["dtype"]).itemsize)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return meta if ok else None


def _build(folder, src):
    """Write folder/tokens.bin (uint8 bytes = tokens) and folder/meta.json; returns the meta."""
    t0 = time.perf_counter()
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix="tokens.bin.", suffix=".tmp")
    sha, n, bounds = hashlib.sha256(), 0, {}
    try:
        with os.fdopen(fd, "wb") as out:
            for split, chunks in src.splits:
                start = n
                for chunk in chunks():      # validated UTF-8 bytes = byte tokens
                    out.write(chunk)
                    sha.update(chunk)
                    n += len(chunk)
                if split is not None:
                    bounds["val" if split == "valid" else split] = [start, n]
        if n == 0:
            raise DataError(f"{src.name}: no text in {src.origin}")
        os.replace(tmp, folder / "tokens.bin")
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    meta = {"format": FORMAT_VERSION, "name": src.name, "description": src.description,
            "source": src.origin, "fingerprint": src.fingerprint, "bytes": n,
            "sha256": sha.hexdigest(), "dtype": str(token_dtype(VOCAB_SIZE)),
            "vocab_size": VOCAB_SIZE, "fixed_splits": bounds or None,
            "build_seconds": round(time.perf_counter() - t0, 3), **src.extra}
    _write_json(folder / "meta.json", meta)
    return meta


def load_dataset(spec="default", cache_dir=None, val_fraction=0.1, min_tokens=None):
    """Prepare (once) and open a dataset; see the module docstring for `spec`.

    val_fraction: the last fraction of the tokens is validation, 0 < val_fraction < 1
    (ignored by WikiText archives, which come with their own splits).
    min_tokens: if given, DataError when the dataset has fewer tokens in total.
    Returns a Dataset whose train/val are np.memmap views of <cache>/<key>/tokens.bin.
    """
    if not (isinstance(val_fraction, (int, float)) and 0 < val_fraction < 1):
        raise DataError(f"val_fraction must be between 0 and 1 (exclusive), got {val_fraction!r}")
    cache = cache_root(cache_dir)
    src = _resolve(spec, cache)
    folder = cache / src.key
    meta = _read_meta(folder, src) or _build(folder, src)
    tokens = np.memmap(folder / "tokens.bin", dtype=meta["dtype"], mode="r")
    bounds = meta["fixed_splits"]
    if bounds:
        train, val = tokens[slice(*bounds["train"])], tokens[slice(*bounds["val"])]
        test = tokens[slice(*bounds["test"])] if "test" in bounds else None
    else:
        n_train = int(len(tokens) * (1.0 - val_fraction))     # first (1 - f) is train
        train, val, test = tokens[:n_train], tokens[n_train:], None
    if min_tokens is not None and len(tokens) < min_tokens:
        raise DataError(f"{src.name} has {len(tokens):,} tokens, fewer than min_tokens={min_tokens:,}")
    meta = dict(meta, split={"train": len(train), "val": len(val),
                             "test": None if test is None else len(test),
                             "val_fraction": None if bounds else val_fraction})
    return Dataset(meta["name"], meta["description"], train, val, test, meta["vocab_size"],
                   meta, str(folder))


# ----------------------------------------------------------------------------- batches

def check_length(ds, block_size):
    """DataError unless both splits hold at least block_size + 1 tokens (one window + target)."""
    for split in ("train", "val"):
        n = len(getattr(ds, split))
        if n < block_size + 1:
            raise DataError(f"{ds.name}: {split} split has {n:,} tokens, needs at least "
                            f"block_size + 1 = {block_size + 1:,}; use more text, a smaller "
                            "block_size or a different val_fraction")


def get_batch(tokens, batch_size, block_size, rng):
    """Random windows: x = tokens[i:i+T], y = tokens[i+1:i+T+1] for B starts i ~ U[0, N-T).

    tokens: 1-D integer array (N,), e.g. ds.train; rng: numpy.random.Generator.
    Returns x, y: int64 arrays (B, T) with y[:, :-1] == x[:, 1:].
    """
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    if batch_size < 1 or block_size < 1:
        raise ValueError(f"batch_size and block_size must be >= 1, got {batch_size}, {block_size}")
    n = len(tokens)
    if n < block_size + 1:
        raise DataError(f"split has {n:,} tokens, needs at least block_size + 1 = {block_size + 1:,}")
    ix = rng.integers(0, n - block_size, size=batch_size)          # (B,)
    idx = ix[:, None] + np.arange(block_size + 1)                  # (B, T+1)
    chunk = np.asarray(tokens[idx]).astype(np.int64)               # (B, T+1)
    return np.ascontiguousarray(chunk[:, :-1]), np.ascontiguousarray(chunk[:, 1:])


def eval_batches(tokens, batch_size, block_size, max_batches=None):
    """Sequential non-overlapping windows starting at 0, T, 2T, ...; yields (x, y) int64 (b, T).

    Every full window of the split is visited once (the last batch may have b < B), so
    the mean loss over them is a deterministic estimate on the whole split.
    """
    n_win = (len(tokens) - 1) // block_size
    starts = np.arange(n_win) * block_size
    for k, b in enumerate(range(0, n_win, batch_size)):
        if max_batches is not None and k >= max_batches:
            return
        idx = starts[b:b + batch_size, None] + np.arange(block_size + 1)   # (b, T+1)
        chunk = np.asarray(tokens[idx]).astype(np.int64)
        yield np.ascontiguousarray(chunk[:, :-1]), np.ascontiguousarray(chunk[:, 1:])


def unigram_entropy(tokens, vocab_size=VOCAB_SIZE):
    """H = -sum_v p_v log p_v in nats, p_v the frequency of token v in `tokens`.

    The cross-entropy of the best context-free predictor on that text: a language model
    whose loss stays near this value has learnt token frequencies and nothing else.
    """
    n = len(tokens)
    if n == 0:
        raise ValueError("unigram_entropy needs at least one token, got an empty array")
    counts = np.zeros(vocab_size, dtype=np.int64)
    for s in range(0, n, 1 << 24):                 # chunks: bincount widens to intp
        c = np.bincount(np.asarray(tokens[s:s + (1 << 24)]), minlength=vocab_size)
        if len(c) > vocab_size:
            raise ValueError(f"token id {len(c) - 1} out of range for vocab_size={vocab_size}")
        counts += c
    p = counts[counts > 0] / n
    return float(-(p * np.log(p)).sum())


# ----------------------------------------------------------------------------- command line

def main(argv=None):
    """python data.py [--data=SPEC] [--cache_dir=DIR] [--val_fraction=F]: prepare and summarise."""
    opts = {"data": "default", "cache_dir": "", "val_fraction": "0.1"}
    for arg in sys.argv[1:] if argv is None else argv:
        if arg in ("-h", "--help"):
            print(main.__doc__.strip() + "\n\n" + __doc__[__doc__.index("Datasets"):
                                                            __doc__.index("The default corpus")].rstrip())
            return 0
        key, eq, value = arg[2:].partition("=")
        if not arg.startswith("--") or not eq or key not in opts:
            print(f"error: unknown argument {arg!r} (use --data=, --cache_dir=, --val_fraction=)",
                  file=sys.stderr)
            return 2
        opts[key] = value
    try:
        try:
            f = float(opts["val_fraction"])
        except ValueError:
            raise DataError(f"val_fraction must be a number, got {opts['val_fraction']!r}") from None
        t0 = time.perf_counter()
        ds = load_dataset(opts["data"], opts["cache_dir"] or None, f)
        h = unigram_entropy(ds.train, ds.vocab_size)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{ds.name}: {len(ds.train):,} train / {len(ds.val):,} val tokens (vocab {ds.vocab_size}, "
          f"{ds.meta['dtype']}), unigram entropy {h:.3f} nats, {time.perf_counter() - t0:.1f}s, "
          f"cached at {ds.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
