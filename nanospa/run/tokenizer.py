"""Subword tokens for data.py: the --tokenizer spec and the byte-level BPE of Hugging Face
`tokenizers` (the optional extra [bpe]), trained on a dataset's training split only and
cached beside its byte tokens (docs/tokenizer.md).

    parse(spec)            "byte" -> ("byte", None); "bpe:N" -> ("bpe", N); TokenizerError otherwise
    check(spec)            parse, and for bpe:N that `tokenizers` imports (one line naming the extra)
    BPE                    a trained tokenizer: encode(text) -> ids, decode(ids) -> text, vocab_size
    bpe_splits(folder, splits, corpus, n)   the BPE tokens of each split, from the cache or built once
    bpe_dataset(...)       data.load_dataset's byte splits as BPE tokens, with the Dataset's fields
    char_start(tokens, i)  the start of the UTF-8 character holding byte i (a split inside a
                           character could not be decoded on its own)

The tokenizer [choice]: GPT-2's byte-level BPE as `tokenizers` spells it: no normaliser, the
ByteLevel pre-tokenizer with its regex and no prefix space, the 256 byte symbols as initial
alphabet, no special tokens, BpeTrainer(vocab_size=N). So every text encodes (no unknown
token), decode(encode(text)) == text, and the vocabulary has at most N tokens (fewer when the
training text offers fewer merges; the model's vocab_size is the tokenizer's own size).

Text goes to `tokenizers` in pieces of about PIECE_BYTES, cut just after a newline that sits
between two ASCII letters or digits: the pre-tokenizer cuts there too (the newline is a
pre-token of its own and the next one starts with the letter), and BPE never merges across
pre-tokens, so the pieces train and encode exactly as the whole text would.

Cache entry, <entry>/bpe-<N>/ beside data.py's <entry>/tokens.bin (corpus.cache_root):

    tokenizer.json   the trained tokenizer (tokenizers' own JSON)
    tokens.bin       each split's BPE tokens, uint16, in split order (train, val[, test])
    meta.json        format, tokenizer, corpus (the byte entry's fingerprint, sha256, bytes and
                     the byte range of each split it was made from), token ranges, bytes and
                     tokens per split, vocab_size, the sha256 of the two files above,
                     tokenizers version, build seconds

It is reused while FORMAT_VERSION, the corpus and its split ranges match and both files
still have their sha256 (corpus.intact: a damaged one is named in a note); otherwise rebuilt
(seconds for the 2 MB default corpus). Every file is written through corpus.atomic_write.
Not here: byte tokens, splits and batches (data.py), where the text comes from (corpus.py).
"""
import hashlib
import importlib
import json
import re
import time
from pathlib import Path

import numpy as np

from .cache import naming_entry
from .corpus import DataError, atomic_write, intact

FORMAT_VERSION = 2         # 2: meta.json holds the sha256 of tokenizer.json and tokens.bin
MIN_VOCAB = 257            # more than the 256 byte symbols: at least one merge
MAX_VOCAB = 65536          # the ids must fit uint16
TOKEN_DTYPE = np.uint16
PIECE_BYTES = 1 << 20      # text handed to `tokenizers` at a time
BATCH_PIECES = 16          # pieces per encode_batch call (bounds the memory of its results)
SAFE_CUT = re.compile(rb"[0-9A-Za-z]\n[0-9A-Za-z]")   # cut after the newline: see the docstring
SPEC_HELP = f"byte, or bpe:N with N a whole number of tokens in {MIN_VOCAB}..{MAX_VOCAB}"
MISSING = '--tokenizer={spec} needs the Hugging Face tokenizers package: pip install -e ".[bpe]"'
FILES = ("tokenizer.json", "tokens.bin", "meta.json")
CHECKED = ("tokenizer.json", "tokens.bin")            # checked against meta.json's sha256 on load


class TokenizerError(DataError):
    """A malformed --tokenizer spec or a missing `tokenizers` package (one line)."""


def parse(spec):
    """("byte", None) for "byte", ("bpe", N) for "bpe:N"; TokenizerError for anything else."""
    if spec == "byte":
        return "byte", None
    kind, _, n = str(spec).partition(":")
    if kind == "bpe" and n.isdigit() and MIN_VOCAB <= int(n) <= MAX_VOCAB:
        return "bpe", int(n)
    raise TokenizerError(f"--tokenizer={spec} is not a tokenizer: use {SPEC_HELP}")


def _library(spec):
    try:
        return importlib.import_module("tokenizers")
    except ImportError:
        raise TokenizerError(MISSING.format(spec=spec)) from None


def check(spec):
    """parse(spec), and for bpe:N that `tokenizers` imports: checked before any long work."""
    kind, n = parse(spec)
    if kind == "bpe":
        _library(spec)
    return kind, n


def char_start(tokens, i):
    """The largest j <= i that starts a UTF-8 character of the byte array `tokens` (a byte
    10xxxxxx continues the character before it); len(tokens) for i = len(tokens)."""
    while 0 < i < len(tokens) and (int(tokens[i]) & 0xC0) == 0x80:
        i -= 1
    return i


def pieces(data):
    """The text of UTF-8 bytes `data` as str pieces of about PIECE_BYTES, cut only at SAFE_CUT."""
    data, start = bytes(data), 0
    while start < len(data):
        m = SAFE_CUT.search(data, start + PIECE_BYTES) if len(data) - start > PIECE_BYTES else None
        end = m.start() + 2 if m else len(data)
        yield data[start:end].decode("utf-8")
        start = end


class BPE:
    """A trained byte-level BPE (a tokenizers.Tokenizer): encode, decode, vocab_size."""

    def __init__(self, tok, spec):
        self.tok, self.spec = tok, spec
        self.vocab_size = tok.get_vocab_size()

    @classmethod
    def train(cls, text_pieces, n, spec):
        lib = _library(spec)
        tok = lib.Tokenizer(lib.models.BPE())
        tok.pre_tokenizer = lib.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = lib.decoders.ByteLevel()
        trainer = lib.trainers.BpeTrainer(vocab_size=n, initial_alphabet=lib.pre_tokenizers.ByteLevel.alphabet(),
                                          special_tokens=[], show_progress=False)
        tok.train_from_iterator(text_pieces, trainer)
        return cls(tok, spec)

    @classmethod
    def load(cls, path, spec):
        return cls(_library(spec).Tokenizer.from_file(str(path)), spec)

    def encode(self, text):
        """str -> int64 ids (len,)."""
        return np.asarray(self.tok.encode(text).ids, dtype=np.int64)

    def encode_pieces(self, text_pieces):
        """Yield uint16 id arrays of successive pieces (encode_batch, BATCH_PIECES at a time)."""
        batch = []
        for piece in text_pieces:
            batch.append(piece)
            if len(batch) == BATCH_PIECES:
                yield from self._encode(batch)
                batch = []
        yield from self._encode(batch)

    def _encode(self, batch):
        for enc in self.tok.encode_batch(batch, add_special_tokens=False) if batch else []:
            yield np.asarray(enc.ids, dtype=TOKEN_DTYPE)

    def decode(self, ids):
        """ids -> str (bytes that do not form UTF-8 become U+FFFD)."""
        return self.tok.decode([int(i) for i in np.asarray(ids).ravel()])


def _read(folder, corpus, spec):
    """meta.json of a complete, up-to-date entry whose files are intact, else None."""
    try:
        meta = json.loads((folder / "meta.json").read_text())
        ok = (meta.get("format") == FORMAT_VERSION and meta.get("tokenizer") == spec and meta.get("corpus") == corpus
              and all(intact(folder / name, meta["sha256"][name]) for name in CHECKED))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return meta if ok else None


def _build(folder, splits, corpus, n, spec):
    """Train on splits["train"], encode every split, write the entry; -> its meta."""
    t0 = time.perf_counter()
    folder.mkdir(parents=True, exist_ok=True)
    bpe = BPE.train(pieces(splits["train"]), n, spec)
    bounds, total, sha = {}, 0, hashlib.sha256()
    with atomic_write(folder / "tokens.bin") as out:
        for name, data in splits.items():
            start = total
            for ids in bpe.encode_pieces(pieces(data)):
                out.write(ids.tobytes())
                sha.update(ids.tobytes())
                total += len(ids)
            bounds[name] = [start, total]
    text = bpe.tok.to_str().encode()
    with atomic_write(folder / "tokenizer.json") as f:
        f.write(text)
    meta = {"format": FORMAT_VERSION, "tokenizer": spec, "corpus": corpus, "splits": bounds,
            "bytes_per_split": {k: len(v) for k, v in splits.items()}, "tokens": total,
            "vocab_size": bpe.vocab_size, "dtype": np.dtype(TOKEN_DTYPE).name,
            "sha256": {"tokens.bin": sha.hexdigest(), "tokenizer.json": hashlib.sha256(text).hexdigest()},
            "tokenizers_version": _library(spec).__version__, "build_seconds": round(time.perf_counter() - t0, 3)}
    with atomic_write(folder / "meta.json") as f:
        f.write(json.dumps(meta, indent=1, sort_keys=True).encode())
    return meta


def bpe_splits(folder, splits, corpus, n):
    """The BPE tokens of each split (a dict name -> UTF-8 byte array; "train" trains it) from
    the entry `folder`, built first when missing or stale. corpus: JSON-able identity of the
    byte text (data.py: fingerprint, sha256, bytes and each split's byte range).
    -> ({name: uint16 memmap}, BPE, meta)."""
    spec, folder = f"bpe:{n}", Path(folder)
    corpus = json.loads(json.dumps(corpus))                    # as meta.json holds it (lists, not tuples)
    meta = _read(folder, corpus, spec) or _build(folder, splits, corpus, n, spec)
    tokens = np.memmap(folder / "tokens.bin", dtype=TOKEN_DTYPE, mode="r") if meta["tokens"] else np.zeros(0, TOKEN_DTYPE)
    out = {name: tokens[a:b] for name, (a, b) in meta["splits"].items()}
    return out, BPE.load(folder / "tokenizer.json", spec), meta


def bpe_dataset(folder, arrays, splits, meta, tokenizer, n):
    """data.load_dataset's byte splits (arrays, cut at `splits` of the cache entry `folder`
    whose meta.json is `meta`) as the BPE tokens of tokenizer = "bpe:N" -> (arrays, meta,
    extra): meta with the BPE's, extra the Dataset's fields (tokenizer, codec, bytes_per_token:
    each split's UTF-8 bytes per token)."""
    ident = dict(fingerprint=meta["fingerprint"], sha256=meta["sha256"], bytes=meta["bytes"],
                 splits={name: [s.start, s.stop] for name, s in splits.items()})
    with naming_entry(folder):
        arrays, codec, bpe = bpe_splits(folder / f"bpe-{n}", arrays, ident, n)
    extra = dict(tokenizer=tokenizer, codec=codec, bytes_per_token={
        k: v / max(1, bpe["splits"][k][1] - bpe["splits"][k][0]) for k, v in bpe["bytes_per_split"].items()})
    meta = dict(meta, tokenizer=tokenizer, vocab_size=codec.vocab_size, dtype=bpe["dtype"], bpe=bpe)
    return arrays, meta, extra
