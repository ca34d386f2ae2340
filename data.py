"""The dataset and batch API: byte tokens, the cached token file, splits, training batches.

What lives here: byte-level tokens (`encode`, `decode`, `token_dtype`, VOCAB_SIZE);
`load_dataset`, which turns a dataset spec into a `Dataset` of memory-mapped train / val
(/ test) token arrays, building its cache entry once, in byte tokens or (tokenizer="bpe:N")
in the subword tokens of nanospa/run/tokenizer.py; `check_length`, `get_batch`
(random windows), `unigram_entropy` (the loss of the best context-free predictor;
docs/method.md section 10 compares training runs with it);
DataError; and `python data.py`, which prepares a dataset and prints a one-line summary.
Arrays are host NumPy arrays; nothing here knows about models or devices.

What does not live here: where the text comes from. The dataset specs (default, PATH,
shakespeare, wikitext2, wikitext103), the embedded default corpus, downloads,
fingerprints and the cache folder (env NANOSPA_CACHE) are nanospa/run/corpus.py.

Tokenisation is byte level by default (vocabulary 256): encode = UTF-8 bytes, decode =
`bytes.decode("utf-8", errors="replace")`. The token file of a dataset is therefore its
UTF-8 text itself, stored as uint8 (a vocabulary above 256 would use uint16; see
`token_dtype`). With tokenizer="bpe:N" a byte-level BPE is trained on the training split
of those bytes and every split is encoded with it, cached in the entry's bpe-N/ folder
(nanospa/run/tokenizer.py, docs/tokenizer.md); Dataset.encode / decode then use it, and
Dataset.bytes_per_token holds each split's UTF-8 bytes per token (1 for byte tokens), so
that a loss in nats per token can also be given per byte (Dataset.per_byte).

The last val_fraction of the tokens is the validation split, except for sources that
bring their own splits (WikiText archives and folders), which also give a test split. The
cache entry of a dataset (tokens.bin, meta.json) is nanospa/run/cache.py's.
"""
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from nanospa.run import corpus
from nanospa.run import tokenizer as subword
from nanospa.run.cache import BYTE_VOCAB, TOKENS_FILE, check_cache, entry, token_dtype  # noqa: F401 (token_dtype: data's API)
from nanospa.run.corpus import DataError
from nanospa.run.settings import parse_settings, run_command

VOCAB_SIZE = BYTE_VOCAB                # byte-level tokens
DEFAULT_VAL_FRACTION = 0.1             # the last 10% is validation, as in nanoGPT
COUNT_CHUNK = 1 << 24                  # tokens per np.bincount call (it widens them to intp)


# ----------------------------------------------------------------------------- tokens

def encode(text):
    """str -> int64 array of UTF-8 byte values, shape (len(text.encode()),)."""
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)


def decode(ids):
    """Byte ids (any integer array-like, values 0..255) -> str; invalid UTF-8 becomes U+FFFD."""
    a = np.asarray(ids).ravel()
    if a.size and (a.min() < 0 or a.max() >= VOCAB_SIZE):
        raise ValueError(f"byte ids must lie in 0..{VOCAB_SIZE - 1}, got values {a.min()}..{a.max()}")
    return a.astype(np.uint8).tobytes().decode("utf-8", errors="replace")


@dataclass
class Dataset:
    """A prepared dataset: memmapped token splits plus their tokenizer.

    train, val: 1-D np.memmap views (uint8 bytes, uint16 BPE ids) of the cached token file;
    test: same or None. meta: the cache's meta.json (source, bytes, sha256, ...) plus the
    split sizes used (and, for BPE, tokenizer, bpe: its entry's meta). path: the cache
    entry's folder. tokenizer: "byte" or "bpe:N"; codec: the BPE (None for bytes);
    bytes_per_token: {split: UTF-8 bytes / tokens of that split}.
    """
    name: str
    description: str
    train: np.ndarray
    val: np.ndarray
    test: object = None
    vocab_size: int = VOCAB_SIZE
    meta: dict = field(default_factory=dict)
    path: str = ""
    tokenizer: str = "byte"
    codec: object = None
    bytes_per_token: dict = field(default_factory=lambda: {"train": 1.0, "val": 1.0})

    def encode(self, text):
        return encode(text) if self.codec is None else self.codec.encode(text)

    def decode(self, ids):
        return decode(ids) if self.codec is None else self.codec.decode(ids)

    def per_byte(self, **losses):
        """The losses (nats per token) and, as NAME_per_byte, the same per UTF-8 byte: the loss
        divided by the bytes per token of its split (names starting with val: val, else train)."""
        split = lambda name: "val" if name.startswith("val") else "train"
        return dict(losses, **{f"{k}_per_byte": v / self.bytes_per_token[split(k)] for k, v in losses.items()})

    def loss_text(self, r):
        """'train X, val Y' of an evaluation record (eval_train_loss, val_loss), and for
        subword tokens the same per byte."""
        text = f"train {r['eval_train_loss']:.4f}, val {r['val_loss']:.4f}"
        if self.codec is not None:
            text += f" nats/token ({r['eval_train_loss_per_byte']:.4f}, {r['val_loss_per_byte']:.4f} nats/byte)"
        return text


# ----------------------------------------------------------------------------- cache entry

def load_dataset(spec="default", cache_dir=None, val_fraction=DEFAULT_VAL_FRACTION, min_tokens=None,
                 tokenizer="byte"):
    """Prepare (once) and open a dataset; `spec` is one of corpus.SPECS.

    val_fraction: the last fraction of the tokens is validation, 0 < val_fraction < 1
    (ignored by WikiText archives and folders, which come with their own splits).
    min_tokens: if given, DataError when the dataset has fewer tokens in total.
    tokenizer: "byte", or "bpe:N" (checked first: run/tokenizer.check); with BPE the train /
    val split point moves back to the start of the UTF-8 character it falls in, if needed.
    Returns a Dataset whose train/val are np.memmap views of <cache>/<key>/tokens.bin
    (bytes) or <cache>/<key>/bpe-N/tokens.bin (BPE).
    """
    kind, n = subword.check(tokenizer)                 # before any long work: a bad spec, no package
    if not (isinstance(val_fraction, (int, float)) and 0 < val_fraction < 1):
        raise DataError(f"val_fraction must be between 0 and 1 (exclusive), got {val_fraction!r}")
    cache = check_cache(cache_dir)                     # DataError: a file where the folder should be
    src = corpus.resolve(spec, cache)
    folder, meta = entry(src, cache)                   # built once, then memory-mapped (run/cache.py)
    tokens = np.memmap(folder / TOKENS_FILE, dtype=meta["dtype"], mode="r")
    bounds = meta["fixed_splits"]
    if bounds:
        splits = {name: slice(*bounds[name]) for name in ("train", "val", "test") if name in bounds}
    else:
        n_train = int(len(tokens) * (1.0 - val_fraction))     # first (1 - f) is train
        n_train = subword.char_start(tokens, n_train) if kind == "bpe" else n_train
        splits = {"train": slice(0, n_train), "val": slice(n_train, len(tokens))}
    if min_tokens is not None and len(tokens) < min_tokens:
        raise DataError(f"{src.name} has {len(tokens):,} tokens, fewer than min_tokens={min_tokens:,}")
    arrays = {name: tokens[s] for name, s in splits.items()}
    extra = {}
    if kind == "bpe":                                  # the same byte splits, as BPE tokens
        arrays, meta, extra = subword.bpe_dataset(folder, arrays, splits, meta, tokenizer, n)
    test = arrays.get("test")
    meta = dict(meta, split={"train": len(arrays["train"]), "val": len(arrays["val"]),
                             "test": None if test is None else len(test),
                             "val_fraction": None if bounds else val_fraction})
    return Dataset(meta["name"], meta["description"], arrays["train"], arrays["val"], test, meta["vocab_size"],
                   meta, str(folder), **extra)


# ----------------------------------------------------------------------------- batches

def check_length(ds, block_size):
    """DataError unless both splits hold at least block_size + 1 tokens (one window + target)."""
    for split in ("train", "val"):
        n = len(getattr(ds, split))
        if n < block_size + 1:
            raise DataError(f"{ds.name}: {split} split has {n:,} tokens, needs at least "
                            f"block_size + 1 = {block_size + 1:,}; use more text, a smaller "
                            "block_size or a different val_fraction")


def _windows(tokens, starts, block_size):
    """x = tokens[i:i+T], y = tokens[i+1:i+T+1] for each start i: two int64 (b, T) arrays."""
    idx = starts[:, None] + np.arange(block_size + 1)              # (b, T+1)
    chunk = np.asarray(tokens[idx]).astype(np.int64)               # (b, T+1)
    return np.ascontiguousarray(chunk[:, :-1]), np.ascontiguousarray(chunk[:, 1:])


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
    return _windows(tokens, rng.integers(0, n - block_size, size=batch_size), block_size)


def unigram_entropy(tokens, vocab_size=VOCAB_SIZE):
    """H = -sum_v p_v log p_v in nats, p_v the frequency of token v in `tokens`.

    The cross-entropy of the best context-free predictor on that text: a language model
    whose loss stays near this value has learnt token frequencies and nothing else.
    """
    n = len(tokens)
    if n == 0:
        raise ValueError("unigram_entropy needs at least one token, got an empty array")
    counts = np.zeros(vocab_size, dtype=np.int64)
    for s in range(0, n, COUNT_CHUNK):             # chunks bound the intp copy bincount makes
        c = np.bincount(np.asarray(tokens[s:s + COUNT_CHUNK]), minlength=vocab_size)
        if len(c) > vocab_size:
            raise ValueError(f"token id {len(c) - 1} out of range for vocab_size={vocab_size}")
        counts += c
    p = counts[counts > 0] / n
    return float(-(p * np.log(p)).sum())


# ----------------------------------------------------------------------------- command line

def main(argv=None):
    """python data.py [--data=SPEC] [--cache_dir=DIR] [--val_fraction=F] [--tokenizer=byte|bpe:N]: prepare and summarise."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a in ("-h", "--help") for a in argv):
        print(main.__doc__.strip() + "\n\nSPEC:\n" + corpus.SPECS.rstrip())
        return 0
    return run_command(_prepare, argv)


def _prepare(argv):
    s = parse_settings(argv, {"data": "default", "cache_dir": "", "val_fraction": DEFAULT_VAL_FRACTION,
                              "tokenizer": "byte"})
    t0 = time.perf_counter()
    ds = load_dataset(s["data"], s["cache_dir"] or None, s["val_fraction"], tokenizer=s["tokenizer"])
    h = unigram_entropy(ds.train, ds.vocab_size)
    print(f"{ds.name}: {len(ds.train):,} train / {len(ds.val):,} val tokens (vocab {ds.vocab_size}, "
          f"{ds.meta['dtype']}, {ds.tokenizer}: {ds.bytes_per_token['train']:.3f} bytes/token), unigram entropy "
          f"{h:.3f} nats, {time.perf_counter() - t0:.1f}s, cached at {ds.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
