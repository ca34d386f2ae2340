"""Corpus sources and their cache folder: where the text of every dataset comes from.

What lives here: the dataset specs (SPECS, parsed by `resolve`) and, for each, a `Source`
that reads its text as validated UTF-8 byte chunks and names its cache entry and the
fingerprint that makes the entry stale. The sources are the embedded default corpus (the
interpreter's own documentation), a text file or a folder of them, tiny Shakespeare, and
WikiText-2 / -103 (local copies, or a download whose offline error says where to put the
file). Also the cache folder (`cache_root`, env NANOSPA_CACHE), its downloads/ folder,
`atomic_write` (how every file in the cache is written), `intact` (how it is checked when
read back), and DataError.

What does not live here: tokens, the cache entry's tokens.bin and meta.json, splits and
batches. Those are data.py, which calls `cache_root` and `resolve`. DataError is defined
here, the lower of the two layers, and data.py raises the same class.

The default corpus needs no download. It is real English written by people, taken from
the running interpreter's standard library, in this order:

1. every topic of the language reference kept for `help()` (`pydoc_data.topics.topics`,
   in sorted key order; about 0.47 MB on Python 3.11);
2. the docstrings (`ast.get_docstring`) of every module, class and function of the
   standard-library `.py` files, files in sorted relative-path order, docstrings in
   source order, exact repeats dropped. Test folders and site-packages are skipped
   (STDLIB_SKIP_DIRS; about 1.76 MB on CPython 3.11);
3. only if the text is still under DEFAULT_MIN_BYTES (2 MiB), whole source files of the
   same modules, in the same order, until it is not.

Parts are joined by SEPARATOR (a blank line), with one final newline. The same
interpreter always gives the same bytes.

Cache folder (the `cache_dir` argument, else env NANOSPA_CACHE, else ~/.cache/nanospa):

    downloads/    tinyshakespeare.txt, wikitext-*-raw-v1.zip or their extracted folders
                  (place copies here to work offline)
    <key>/        one cache entry per source, written by data.py
"""
import ast
import codecs
import hashlib
import importlib.util
import os
import shutil
import sys
import sysconfig
import tempfile
import urllib.request
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

CACHE_ENV = "NANOSPA_CACHE"            # environment variable naming the cache folder
DEFAULT_CACHE = "~/.cache/nanospa"     # the cache folder when neither argument nor env is set
DOWNLOADS = "downloads"                # cache sub-folder for downloaded (or placed) archives
DEFAULT_MIN_BYTES = 2 * 1024 * 1024    # the default corpus is at least 2 MiB
DOWNLOAD_TIMEOUT_S = 15                # per socket operation
CHUNK = 1 << 20                        # bytes per read when streaming files and downloads
SEPARATOR = b"\n\n"                    # between files of a folder and parts of `default`
KEY_HASH_CHARS = 12                    # hex digits of sha256(path) in a path's cache key

SHAKESPEARE_URL = ("https://raw.githubusercontent.com/karpathy/char-rnn/master/"
                   "data/tinyshakespeare/input.txt")
SHAKESPEARE_FILE = "tinyshakespeare.txt"             # its name in downloads/
WIKITEXT = {    # name: (title, archive URL, the archive's top folder once extracted)
    "wikitext2": ("WikiText-2", "https://s3.amazonaws.com/research.metamind.io/wikitext/"
                  "wikitext-2-raw-v1.zip", "wikitext-2-raw"),
    "wikitext103": ("WikiText-103", "https://s3.amazonaws.com/research.metamind.io/wikitext/"
                    "wikitext-103-raw-v1.zip", "wikitext-103-raw"),
}
WIKITEXT_SPLITS = ("train", "valid", "test")         # train and valid must be present
NAMED = ("default", "shakespeare", *WIKITEXT)
STDLIB_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}

SPECS = """\
  default                     the Python documentation that ships with the interpreter
  PATH                        a UTF-8 text file, or every *.txt under a folder (sorted by
                              relative path, joined by a blank line)
  shakespeare[:FILE]          tiny Shakespeare (char-rnn input.txt, 1,115,394 bytes)
  wikitext2[:ZIP|DIR|FILE]    WikiText-2 raw (Merity et al. 2016)
  wikitext103[:ZIP|DIR|FILE]  WikiText-103 raw

WikiText archives and folders bring their own train / valid (/ test) files; one WikiText
file (raw, or tokenised like wiki.valid.tokens or valid.txt) is split by val_fraction, as
are all other sources. Without a FILE, shakespeare and wikitext are read from the cache's
downloads/ folder, or downloaded there when the network allows. Named datasets take
precedence over paths: write ./default for a file called "default".
"""


class DataError(ValueError):
    """Bad or missing data; the message is one line and names the file or size at fault."""


# ----------------------------------------------------------------------------- cache folder

def cache_root(cache_dir=None):
    """The cache folder: cache_dir, else env NANOSPA_CACHE, else ~/.cache/nanospa."""
    return Path(cache_dir or os.environ.get(CACHE_ENV) or DEFAULT_CACHE).expanduser()



@contextmanager
def atomic_write(dest):
    """Open dest for binary writing; the bytes land in dest only if the block succeeds.

    They go to a temporary file beside dest, renamed over it at the end and removed on
    any error, so an interrupted run never leaves a half-written file in the cache.
    """
    dest = Path(dest)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=dest.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def intact(path, sha256):
    """Whether the cache file `path` still has the sha256 recorded when it was written. If
    not (a damaged disk, a stray edit), a one-line note on stderr names it; the caller then
    rebuilds it. Size and modification time are no proof: a same-size change keeps both."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    if h.hexdigest() == sha256:
        return True
    print(f"note: the cache file {path} is damaged (not the sha256 recorded when it was built); "
          "rebuilding it", file=sys.stderr)
    return False


def _download(url, dest, hint):
    """Fetch url to dest (atomically); DataError ending with `hint` when that fails."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    print(f"downloading {url} -> {dest}", file=sys.stderr)
    try:
        with atomic_write(dest) as out, urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as r:
            shutil.copyfileobj(r, out, CHUNK)
    except Exception as e:                  # URLError, timeouts, HTTP errors, disk errors
        reason = " ".join(str(getattr(e, "reason", e)).split()) or type(e).__name__
        raise DataError(f"cannot download {url} ({reason}); {hint}") from None
    return dest


# ----------------------------------------------------------------------------- default corpus

def _utf8(text):
    return text.encode("utf-8", errors="replace")   # a lone surrogate in a docstring -> "?"


def _stdlib_files(stdlib):
    """Relative posix paths of the stdlib's .py files, sorted; STDLIB_SKIP_DIRS skipped."""
    out = []
    for d, dirs, files in os.walk(stdlib):
        dirs[:] = sorted(x for x in dirs if x not in STDLIB_SKIP_DIRS)
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
        for name in ("body", "orelse", "finalbody", "handlers", "cases"):   # nested statements
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
    blobs = [_utf8(topics[k].strip("\n")) for k in sorted(topics)]          # 1. topics
    info = {"topics": len(blobs), "topic_bytes": sum(map(len, blobs))}
    files = _stdlib_files(stdlib)
    seen, n_doc, doc_bytes, sources = set(), 0, 0, []
    for rel in files:                                                       # 2. docstrings
        src = (stdlib / rel).read_bytes()
        try:
            tree = ast.parse(src)
        except (SyntaxError, ValueError):   # stdlib files are valid Python; be tolerant anyway
            continue
        sources.append(src)
        for doc in _docstrings(tree):
            if doc not in seen:
                seen.add(doc)
                blobs.append(_utf8(doc))
                n_doc, doc_bytes = n_doc + 1, doc_bytes + len(blobs[-1])
    info.update(stdlib_files=len(files), docstrings=n_doc, docstring_bytes=doc_bytes)
    size = sum(map(len, blobs)) + len(SEPARATOR) * (len(blobs) - 1)
    n_src, src_bytes = 0, 0
    for src in sources:                                     # 3. whole sources, only if still short
        if size >= min_bytes:
            break
        blobs.append(_utf8(importlib.util.decode_source(src).strip("\n")))
        size += len(SEPARATOR) + len(blobs[-1])
        n_src, src_bytes = n_src + 1, src_bytes + len(blobs[-1])
    info.update(source_files=n_src, source_bytes=src_bytes)
    return SEPARATOR.join(blobs) + b"\n", info


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
    """What makes a cache entry stale: each source file's resolved path, size and mtime."""
    out = []
    for p in paths:
        st = os.stat(p)
        out.append([str(Path(p).resolve()), st.st_size, st.st_mtime_ns])
    return out


def _path_key(prefix, path):
    """Cache key of a source read from `path`: one entry per resolved path."""
    return f"{prefix}-{hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:KEY_HASH_CHARS]}"


# ----------------------------------------------------------------------------- sources

@dataclass
class Source:
    """How to build one cache entry: named splits of validated UTF-8 byte chunks."""
    name: str
    key: str                 # cache sub-folder
    description: str
    origin: str              # where the text comes from (path, archive, stdlib folder)
    fingerprint: object      # JSON-able; the cache entry is rebuilt when it changes
    splits: list             # [(split name or None, callable -> iterable of bytes)]; None:
                             # one text that data.py splits by val_fraction
    extra: dict = field(default_factory=dict)   # more meta.json fields, filled while building


def _default_source():
    """The default corpus; its description and extra are set only when it is built (seconds)."""
    version = sys.version.split()[0]
    stdlib = sysconfig.get_paths()["stdlib"]
    src = Source("default", f"default-{sys.implementation.name}-{version}", "",
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
    if p.is_symlink() and not p.exists():
        raise DataError(f"{p} is a dangling link (to {os.readlink(p)})")
    if p.is_dir():
        files = _txt_files(p)
        for f in (f for f in files if f.is_symlink() and not f.exists()):
            raise DataError(f"{f} is a dangling link (to {os.readlink(f)}); remove it or point it at a text file")
        files = [f for f in files if f.stat().st_size > 0]
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
    return Source(name or str(path), key or _path_key(name or "path", p), description,
                  str(p.resolve()), _fingerprint(files), [(None, chunks)])


def _shakespeare_source(local, cache):
    if local:
        return _path_source(local, "shakespeare", f"tiny Shakespeare from {local}")
    dest = cache / DOWNLOADS / SHAKESPEARE_FILE
    if not dest.is_file():
        _download(SHAKESPEARE_URL, dest, f"offline? put char-rnn's input.txt at {dest} "
                  "or pass --data=shakespeare:/path/to/input.txt")
    return _path_source(dest, "shakespeare", "tiny Shakespeare (char-rnn input.txt)",
                        key="shakespeare")


def _wikitext_split_files(folder):
    """{split: path} for WikiText files in folder or one of its sub-folders (raw names preferred)."""
    for d in [folder] + sorted(x for x in folder.iterdir() if x.is_dir()):
        found = {}
        for split in WIKITEXT_SPLITS:
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
    for split in WIKITEXT_SPLITS:
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
    title, url, top = WIKITEXT[which]
    zname = url.rsplit("/", 1)[1]                        # wikitext-2-raw-v1.zip
    if local:
        p = Path(local).expanduser()
        if not p.exists():
            raise DataError(f"no such file or folder: {p}")
        key = _path_key(which, p)
    else:
        key, downloads = which, cache / DOWNLOADS
        folder = downloads / top
        p = folder if folder.is_dir() else downloads / zname
        if not p.exists():
            _download(url, p, f"offline? put {zname} (or its extracted folder {top}/) "
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
        return Source(which, key, f"{title} ({', '.join(f.name for f in files.values())}), "
                      "with the dataset's own splits", str(p.resolve()),
                      _fingerprint(files.values()), splits)
    members = _zip_members(p)

    def member(n):
        with zipfile.ZipFile(p) as zf, zf.open(n) as f:
            yield from _validated_chunks(f, f"{p}:{n}")
    splits = [(s, (lambda n=n: member(n))) for s, n in members.items()]
    return Source(which, key, f"{title} ({', '.join(members.values())}), with the dataset's "
                  "own splits", str(p.resolve()), _fingerprint([p]), splits)


def resolve(spec, cache):
    """The Source of a dataset spec (see SPECS); cache: the cache folder, for downloads/."""
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
