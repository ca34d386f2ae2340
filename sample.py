"""Sample from a trained checkpoint:  python sample.py [--key=value ...]   (--help lists every key)

    python sample.py --out_dir=out --start="To be" --num_samples=3 --max_new_tokens=200

Reads out_dir/ckpt.npz (train.py's), rebuilds the model from the checkpoint's own
configuration and weights, and continues the prompt num_samples times with the checkpoint's
own tokenizer (bytes, or the byte-level BPE of its corpus, read from the data cache; refused
when the corpus or the tokenizer is no longer the one the checkpoint records). The prompt is
text, or @FILE for a file's text. Each layer's keys and values are kept between tokens
(--kv_cache, sampling.generate: the same tokens as without). Exit status: 0 done; 2 with one
error: line for a bad setting or a missing, partial, non-finite or foreign checkpoint
(nothing is trained or written).
"""
import os
import sys

import numpy as np

from data import decode, encode, load_dataset
from nanospa import backend
from nanospa.config import GPTConfig
from nanospa.model import GPT
from nanospa.run.checkpoint import (CheckpointError, data_identity, describe_data, different_data, load_checkpoint,
                                    non_finite_arrays)
from nanospa.run.rundir import CKPT_FILE
from nanospa.run.settings import (SettingsError, encode_prompt, help_text, parse_settings, run_command, source_notes,
                                  wants_help)
from nanospa.sampling import generate, kv_cache_refusal

DEFAULTS = dict(
    out_dir="out",             # the run to sample: out_dir/ckpt.npz
    start="\n",                # the prompt: text, or @FILE for the text of a file
    num_samples=3,             # samples, each from the same prompt
    max_new_tokens=300,        # tokens generated per sample
    temperature=0.8,           # sampling temperature (0: the most likely token each time)
    top_k=40,                  # sample among the k most likely tokens; 0 = all
    seed=0,                    # seeds the samples
    device="cpu",              # cpu | cuda (needs CuPy and a GPU)
    kv_cache=True,             # keep each layer's keys and values between tokens: the same tokens, faster
)


def settings(argv):
    s = parse_settings(argv, DEFAULTS)
    del s["_explicit"]
    if not s["out_dir"].strip():                            # "" would read ./ckpt.npz (it read /ckpt.npz)
        raise SettingsError("--out_dir is empty: name the folder of a train.py run")
    for key in ("num_samples", "max_new_tokens"):
        if s[key] < 1:
            raise SettingsError(f"{key} must be a positive integer, got {s[key]!r}")
    if not (s["temperature"] >= 0 and np.isfinite(s["temperature"])):
        raise SettingsError(f"temperature must be finite and >= 0, got {s['temperature']!r}")
    if s["top_k"] < 0 or s["seed"] < 0:
        raise SettingsError(f"top_k and seed must be >= 0, got {s['top_k']!r}, {s['seed']!r}")
    if s["device"] not in ("cpu", "cuda"):
        raise SettingsError(f"device must be 'cpu' or 'cuda', got {s['device']!r}")
    return s


def prompt_text(start):
    """The prompt: the text itself, or the text of a file for @FILE."""
    if not start.startswith("@"):
        return start
    try:
        with open(start[1:], encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise SettingsError(f"--start={start}: cannot read {start[1:]} ({getattr(e, 'strerror', None) or e})") from None


def codec(ckpt, path, vocab_size):
    """(encode, decode) of the checkpoint's tokenizer: bytes, or its corpus's BPE (cached). The
    BPE is trained on the corpus, so it is the checkpoint's only while the corpus is: the
    corpus's sha256 (and the tokenizer file's, where the checkpoint records it) must be the
    ones recorded at training, else another tokenizer would cut the prompt into other tokens."""
    run = ckpt["settings"]
    if run.get("tokenizer", "byte") == "byte":
        return encode, decode
    try:
        ds = load_dataset(run["data"], tokenizer=run["tokenizer"])
    except Exception as e:                                  # the corpus or its cache is gone
        raise CheckpointError(f"{path} was trained with --tokenizer={run['tokenizer']} on --data={run['data']}, "
                              f"whose tokenizer cannot be loaded here ({' '.join(str(e).split())})") from None
    saved, now = ckpt["state"].get("data"), data_identity(ds.meta, run["data"])
    if not saved:                                           # written before checkpoints recorded the corpus
        print(f"note: {path} does not record its corpus: the tokenizer of --data={run['data']} is taken as "
              "its own, unchecked", file=sys.stderr)
    elif different_data(saved, now) or ds.vocab_size != vocab_size:
        raise CheckpointError(f"{path} was trained with the {run['tokenizer']} tokenizer of {describe_data(saved)}; "
                              f"--data={run['data']} is now {describe_data(now)}, whose tokenizer is another "
                              "(the prompt would be cut into other tokens): restore that corpus, or sample a "
                              "checkpoint trained on this one")
    return ds.encode, ds.decode


def sample(s):
    path = os.path.join(s["out_dir"], CKPT_FILE)
    ckpt = load_checkpoint(path, purpose="sample")
    try:
        cfg = GPTConfig(**ckpt["config"])
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{path} does not hold a nanospa model configuration ({e})") from None
    enc, dec = codec(ckpt, path, cfg.vocab_size)
    idx = encode_prompt(enc, prompt_text(s["start"]), cfg.vocab_size)
    backend.use(s["device"])
    model = GPT(cfg, seed=0)
    bad = non_finite_arrays(ckpt, model)
    if bad:
        raise CheckpointError(f"{path} holds non-finite weights ({', '.join(bad[:3])}): it has nothing to sample")
    model.load_state_dict(ckpt["model"])                   # ValueError: a foreign or damaged model
    rng = np.random.default_rng(s["seed"])
    print(f"{path}: iter {ckpt['state']['iter']}, {model.num_params():,} parameters, {cfg.attention} attention; "
          f"prompt of {idx.size} tokens")
    why = kv_cache_refusal(cfg)
    if s["kv_cache"] and why:
        print(f"note: sampling without the KV cache, a window's forward per token ({why})", file=sys.stderr)
    for i in range(s["num_samples"]):
        out = generate(model, idx[None, :], s["max_new_tokens"], temperature=s["temperature"],
                             top_k=s["top_k"] or None, rng=rng, cache=s["kv_cache"])
        print(f"--- sample {i + 1}\n{dec(out[0])}")
    return 0


def main(argv=None):
    """-> exit status: 0, or 2 with one error: line (run/settings.py)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if wants_help(argv):
        print(help_text(__doc__.splitlines()[0], DEFAULTS, source_notes(__file__)))
        return 0
    return run_command(lambda: sample(settings(argv)))


if __name__ == "__main__":
    sys.exit(main())
