"""Checkpoints of train.py: one .npz file per run, written atomically, read back and checked.

    save_checkpoint(path, model, optimizer, settings, cfg, state)   atomic write
    load_checkpoint(path)      -> dict(model=, optim=, settings=, config=, state=)
    check_same_model(settings, saved, keys)   the model may not change on resume
    training_state(iteration, best_val_loss, rng)   -> the `state` entry of a checkpoint
    restore(ckpt, optimizer, rng)             -> (iteration, best_val_loss); exact resume
    CheckpointError            missing, unreadable or incompatible (one-line message)

The file (np.savez, no pickled objects, docs/style.md §5):

    model/NAME    every array of model.state_dict() (parameters and SPA buffers, host arrays)
    optim/NAME    every array of optimizer.state_dict() (AdamW: t, m.i, v.i)
    settings      train.py's settings, JSON in a 0-d unicode array
    config        GPTConfig.to_dict(), JSON
    state         JSON: iter (optimiser steps done), best_val_loss (null before an
                  evaluation), rng (bit-generator state of the training batches' Generator),
                  data_position (null: batches are random windows, there is no position)

An exact resume needs exactly these: the weights, AdamW's moments and step count, and the
batch generator's state, so that the resumed run draws the batches the uninterrupted one
would have drawn (tests/test_train.py checks that the two runs log equal losses).

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


class CheckpointError(ValueError):
    """A checkpoint that is missing, unreadable or does not fit the run; one-line message."""


def save_checkpoint(path, model, optimizer, settings, cfg, state):
    """Write an .npz atomically: temporary file in the same folder, fsync, os.replace. A kill
    at any moment leaves either the previous checkpoint or the new one, never half of one."""
    arrays = {f"model/{k}": v for k, v in model.state_dict().items()}
    arrays.update({f"optim/{k}": v for k, v in optimizer.state_dict().items()})
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


def load_checkpoint(path):
    """-> dict(model=, optim=, settings=, config=, state=); CheckpointError when the file is
    missing, is not a readable .npz, or lacks an entry that restore() needs."""
    if not os.path.isfile(path):
        raise CheckpointError(f"--init_from=resume: no checkpoint at {path}")
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        ckpt = {name: json.loads(str(arrays.pop(name))) for name in JSON_PARTS}
    except (OSError, ValueError, KeyError, EOFError, TypeError, zipfile.BadZipFile) as e:
        reason = " ".join(f"{type(e).__name__}: {e}".split())
        raise CheckpointError(f"checkpoint {path} is unreadable ({reason}); "
                              "delete it or use --init_from=scratch") from None
    for part in ("model", "optim"):
        ckpt[part] = {k.split("/", 1)[1]: v for k, v in arrays.items() if k.startswith(part + "/")}
    missing = [f"state.{k}" for k in STATE_KEYS if not isinstance(ckpt["state"], dict) or k not in ckpt["state"]]
    missing += [name for name in ("settings", "config") if not isinstance(ckpt[name], dict)]
    missing += ["optim/t"] if "t" not in ckpt["optim"] else []
    missing += ["model/*"] if not ckpt["model"] else []
    if missing:
        raise CheckpointError(f"checkpoint {path} is incomplete (no {', '.join(missing)}); "
                              "delete it or use --init_from=scratch")
    return ckpt


def check_same_model(settings, saved, keys):
    """CheckpointError naming every model setting (of `keys`) that differs from the saved one."""
    changed = [f"{k}={settings[k]!r} (checkpoint: {saved[k]!r})" for k in keys
               if k in saved and settings[k] != saved[k]]
    if changed:
        raise CheckpointError("the model cannot change on resume: " + ", ".join(changed))


def training_state(iteration, best_val_loss, rng):
    """The `state` entry after `iteration` steps; best_val_loss inf (no evaluation yet) -> None."""
    return dict(iter=iteration, best_val_loss=best_val_loss if best_val_loss < math.inf else None,
                rng=rng.bit_generator.state, data_position=None)  # random windows: no position


def restore(ckpt, optimizer, rng):
    """Load the optimiser state and the batch generator's state in place (the model's arrays
    are loaded by the caller, model.load_state_dict(ckpt["model"])); -> (iteration, best val
    loss, inf when none was recorded)."""
    optimizer.load_state_dict(ckpt["optim"])
    rng.bit_generator.state = ckpt["state"]["rng"]
    best = ckpt["state"]["best_val_loss"]
    return ckpt["state"]["iter"], (math.inf if best is None else best)
