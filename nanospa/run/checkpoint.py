"""Checkpoints of train.py: one .npz file per run, written atomically, read back and checked.

    save_checkpoint(path, model, optimizer, settings, cfg, state)   atomic write of a finite state
    load_checkpoint(path)      -> dict(model=, optim=, settings=, config=, state=)
    check_same_model(settings, saved, keys)   the model may not change on resume
    data_identity(meta, spec)  -> what a checkpoint records of its corpus and tokenizer
    check_same_data(path, saved, current, allow)   resuming on another corpus is refused
    training_state(iteration, best_val_loss, rng, data=None, train_loss=None, best_train_loss=inf) -> `state`
    restore(ckpt, optimizer, rng, model=None, path=None)   -> (iteration, best_val_loss); a
                               non-finite parameter or optimiser array is refused, nothing loaded
    bad_state(state), non_finite_arrays(ckpt, model)   the checks of load_checkpoint and restore
    CheckpointError            missing, unreadable or incompatible (one-line message)
    NotFiniteError             save_checkpoint refused a non-finite state (a divergence)

The file (np.savez, no pickled objects, docs/style.md §5):

    model/NAME    every array of model.state_dict() (parameters and SPA buffers, host arrays)
    optim/NAME    every array of optimizer.state_dict() (AdamW: t, m.i, v.i)
    settings      train.py's settings, JSON in a 0-d unicode array
    config        GPTConfig.to_dict(), JSON
    state         JSON: iter (optimiser steps done), best_val_loss (null before an
                  evaluation), rng (bit-generator state of the training batches' Generator),
                  data_position (null: batches are random windows, there is no position),
                  train_loss (the saved state's loss on its step's batch), best_train_loss
                  (the lowest training loss so far: what "good" is measured against), data,
                  dropout_masks (with dropout: the state of the model's masks, beyond/dropout.py
                  DropoutMasks: its key and step)

An exact resume needs exactly these: the weights, AdamW's moments and step count, and the
batch generator's and the dropout masks' states, so that the resumed run draws the batches
and masks the uninterrupted one would have drawn (tests/test_train.py checks that the two
runs log equal losses).

Not here: when to save (train.py's loop), log.jsonl (train.py), the model's own key, shape
and dtype checks (nanospa.nn.Module.load_state_dict).
"""
import json
import math
import os
import zipfile

import numpy as np

JSON_PARTS = ("settings", "config", "state")      # stored as JSON strings
STATE_KEYS = ("iter", "best_val_loss", "rng")      # what restore() reads from `state`
TOKENIZER = "byte"                                 # data.py's default tokenizer (a meta without one: bytes)


class CheckpointError(ValueError):
    """A checkpoint that is missing, unreadable or does not fit the run; one-line message."""


class NotFiniteError(ValueError):
    """A state with a nan or inf parameter, optimiser array or loss: not written."""


def non_finite(model, optimizer, arrays, loss=None):
    """Names of the parameters (model/NAME), optimiser arrays (optim/NAME) and the loss that
    are not finite; buffers are not checked (a fixed mask may hold -inf by design)."""
    names = [f"model/{k}" for k, _ in model.named_parameters()] + [f"optim/{k}" for k in optimizer.state_dict()]
    bad = [n for n in names if np.issubdtype(arrays[n].dtype, np.floating) and not np.isfinite(arrays[n]).all()]
    return bad + (["loss"] if loss is not None and not math.isfinite(loss) else [])


def save_checkpoint(path, model, optimizer, settings, cfg, state):
    """Write an .npz atomically: temporary file in the same folder, fsync, os.replace, fsync of
    the folder. A kill at any moment leaves either the previous checkpoint or the new one,
    never half of one. NotFiniteError, and nothing written, for a non-finite state."""
    arrays = {f"model/{k}": v for k, v in model.state_dict().items()}
    arrays.update({f"optim/{k}": v for k, v in optimizer.state_dict().items()})
    bad = non_finite(model, optimizer, arrays, state.get("train_loss"))
    if bad:
        raise NotFiniteError(f"non-finite {', '.join(bad[:3])}{' and more' if len(bad) > 3 else ''} "
                             f"at iter {state.get('iter')}; {path} not written")
    masks = getattr(model, "dropout_masks", None)
    state = state if masks is None else dict(state, dropout_masks=masks.state())
    for name, obj in zip(JSON_PARTS, (settings, cfg.to_dict(), state)):
        arrays[name] = np.array(json.dumps(obj))                 # a 0-d unicode array, not a pickle
    tmp = f"{path}.{os.getpid()}.tmp"                           # same folder: os.replace is atomic
    try:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    _sync_folder(os.path.dirname(path) or ".")


def _sync_folder(folder):
    """fsync a folder, so that the rename survives a power cut (POSIX; skipped elsewhere)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def load_checkpoint(path, purpose="resume"):
    """-> dict(model=, optim=, settings=, config=, state=); CheckpointError when the file is
    missing, is not a readable .npz, or lacks an entry that restore() needs. `purpose`
    ("resume" or "sample") words the messages for the command that reads it."""
    what = "--init_from=resume" if purpose == "resume" else "sample.py"
    todo = "delete it or use --init_from=scratch" if purpose == "resume" else "train it with train.py, or name another --out_dir"
    if os.path.isdir(path):
        raise CheckpointError(f"{path} is a folder, not a checkpoint file")
    if not os.path.isfile(path):
        raise CheckpointError(f"{what}: no checkpoint at {path}" + ("" if purpose == "resume" else f"; {todo}"))
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        ckpt = {name: json.loads(str(arrays.pop(name))) for name in JSON_PARTS}
    except (OSError, ValueError, KeyError, EOFError, TypeError, zipfile.BadZipFile) as e:
        reason = " ".join(f"{type(e).__name__}: {e}".split())
        raise CheckpointError(f"checkpoint {path} is unreadable ({reason}); {todo}") from None
    for part in ("model", "optim"):
        ckpt[part] = {k.split("/", 1)[1]: v for k, v in arrays.items() if k.startswith(part + "/")}
    missing = [f"state.{k}" for k in STATE_KEYS if not isinstance(ckpt["state"], dict) or k not in ckpt["state"]]
    missing += [name for name in ("settings", "config") if not isinstance(ckpt[name], dict)]
    missing += ["optim/t"] if "t" not in ckpt["optim"] else []
    missing += ["model/*"] if not ckpt["model"] else []
    if missing:
        raise CheckpointError(f"checkpoint {path} is incomplete (no {', '.join(missing)}); {todo}")
    bad = bad_state(ckpt["state"])
    if bad:
        raise CheckpointError(f"checkpoint {path} is not a state train.py writes ({bad}); {todo}")
    return ckpt


def _number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def bad_state(state):
    """What is wrong with a checkpoint's `state`, or None: iter a whole number >= 0 (a negative
    one would cut the whole log on resume), the losses finite numbers or null."""
    it = state["iter"]
    if not (isinstance(it, int) and not isinstance(it, bool) and it >= 0):
        return f"state.iter={it!r}, not a whole number >= 0"
    for key in ("best_val_loss", "best_train_loss", "train_loss"):
        v = state.get(key)
        if v is not None and not (_number(v) and math.isfinite(v)):
            return f"state.{key}={v!r}, not a finite number"
    pending = state.get("pending_record")
    if pending is not None and not (isinstance(pending, dict) and pending.get("iter") == it):
        return f"state.pending_record is not the record of iter {it}"
    return None


def non_finite_arrays(ckpt, model=None):
    """Names of the checkpoint's non-finite parameters (model/NAME, when the model is given:
    its buffers may hold -inf by design) and optimiser arrays (optim/NAME)."""
    params = {name for name, _ in model.named_parameters()} if model is not None else set()
    arrays = [(f"model/{k}", v) for k, v in ckpt["model"].items() if k in params]
    arrays += [(f"optim/{k}", v) for k, v in ckpt["optim"].items()]
    return [name for name, v in arrays
            if np.issubdtype(np.asarray(v).dtype, np.floating) and not np.isfinite(v).all()]


def check_same_model(settings, saved, keys):
    """CheckpointError naming every model setting (of `keys`) that differs from the saved one."""
    changed = [f"{k}={settings[k]!r} (checkpoint: {saved[k]!r})" for k in keys
               if k in saved and settings[k] != saved[k]]
    if changed:
        raise CheckpointError("the model cannot change on resume: " + ", ".join(changed))


def data_identity(meta, spec):
    """What a checkpoint records of its corpus (a data.Dataset's meta and the --data spec):
    the sha256 of its tokens names the text, whatever its path or modification time."""
    bpe = meta.get("bpe") or {}                  # a subword tokenizer: the sha256 of its own file too
    return dict(spec=spec, name=meta.get("name"), tokens=meta.get("bytes"), sha256=meta.get("sha256"),
                tokenizer=meta.get("tokenizer", TOKENIZER), vocab_size=meta.get("vocab_size"),
                tokenizer_sha256=(bpe.get("sha256") or {}).get("tokenizer.json"))


def different_data(saved, current):
    """The fields of two data_identity dicts that differ (the corpus's sha256, the tokenizer and,
    where both record it, the sha256 of the tokenizer's own file): [] when they are the same."""
    keys = ["sha256", "tokenizer"] + (["tokenizer_sha256"] if saved.get("tokenizer_sha256")
                                      and current.get("tokenizer_sha256") else [])
    return [k for k in keys if saved.get(k) != current.get(k)]


def describe_data(d):
    return (f"{d.get('name')!r} ({d.get('tokens') or 0:,} bytes, sha256 {str(d.get('sha256'))[:12]}, "
            f"{d.get('tokenizer')} tokens" + (f", tokenizer sha256 {d['tokenizer_sha256'][:12]}"
                                             if d.get("tokenizer_sha256") else "") + ")")


def check_same_data(path, saved, current, allow=False):
    """-> whether the checkpoint at `path` was trained on another corpus or tokenizer than
    `current` (both data_identity dicts; saved None, an older checkpoint: False, unchecked);
    CheckpointError when it was and `allow` is false."""
    if not saved or not different_data(saved, current):
        return False
    if allow:
        return True
    what = describe_data
    raise CheckpointError(f"{path} was trained on {what(saved)}, --data={current['spec']} is {what(current)}: "
                          "resuming on another corpus is refused; pass --new_data=True to continue on it "
                          "(its best validation loss then starts afresh)")


def training_state(iteration, best_val_loss, rng, data=None, train_loss=None, best_train_loss=math.inf):
    """The `state` entry after `iteration` steps; a best loss of inf (none seen yet) -> None."""
    return dict(iter=iteration, best_val_loss=best_val_loss if best_val_loss < math.inf else None,
                rng=rng.bit_generator.state, data_position=None,  # random windows: no position
                train_loss=train_loss, data=data,
                best_train_loss=best_train_loss if best_train_loss < math.inf else None)


def restore(ckpt, optimizer, rng, model=None, path="the checkpoint"):
    """Load the model's arrays and dropout masks' state (when given), the optimiser state and
    the batch generator's state in place; -> (iteration, best val loss, inf when none was
    recorded). A mismatch is a CheckpointError naming `path`."""
    bad = non_finite_arrays(ckpt, model)           # never a good state: nothing is loaded, or written
    if bad:
        raise CheckpointError(f"checkpoint {path} holds non-finite values ({', '.join(bad[:3])}"
                              f"{' and more' if len(bad) > 3 else ''}): not a state to resume from; resume an "
                              "earlier copy, or use --init_from=scratch")
    try:
        if model is not None:
            model.load_state_dict(ckpt["model"])
            masks = getattr(model, "dropout_masks", None)
            if masks is not None:                       # the masks of the step it stopped at
                saved = ckpt["state"].get("dropout_masks")   # none: written without dropout
                masks.load(saved if saved is not None else dict(masks.state(), step=ckpt["state"]["iter"]))
        optimizer.load_state_dict(ckpt["optim"])
        rng.bit_generator.state = ckpt["state"]["rng"]
        best = ckpt["state"]["best_val_loss"]
        return int(ckpt["state"]["iter"]), (math.inf if best is None else float(best))
    except (ValueError, TypeError, KeyError) as e:
        raise CheckpointError(f"checkpoint {path} does not fit this run ({' '.join(str(e).split())}); "
                              "delete it or use --init_from=scratch") from None
