"""train.py's check of its settings before any data is read (the Session calls it): each
key's range (CHECKS, what GPTConfig does not check itself), the tokenizer spec, the
optimiser's settings, the learning rates' order, then GPTConfig's own check of the model's
fields. A bad setting is one SettingsError line naming it as the user wrote it.
"""
import math
from dataclasses import fields

from ..beyond.optimizers import check_optimizer
from ..config import GPTConfig
from .settings import SettingsError
from .tokenizer import check as check_tokenizer

CHECKS = [  # settings GPTConfig does not check itself: (keys, test, what a good value is)
    (("batch_size", "block_size", "eval_interval", "eval_iters", "log_interval", "checkpoint_interval", "grad_accum"),
     lambda v: v > 0, "a positive integer"),
    (("threads", "seed", "max_iters", "warmup_iters", "lr_decay_iters", "sample_tokens", "top_k"),
     lambda v: v >= 0, ">= 0"),
    (("learning_rate", "min_lr", "weight_decay", "grad_clip"), lambda v: 0 <= v < math.inf, "finite and >= 0"),
    (("beta1", "beta2"), lambda v: 0 <= v < 1, "in [0, 1)"),
    (("temperature",), lambda v: 0 < v < math.inf, "finite and > 0"),
    (("device",), lambda v: v in ("cpu", "cuda"), "'cpu' or 'cuda'"),
    (("init_from",), lambda v: v in ("scratch", "resume"), "'scratch' or 'resume'"),
    (("start",), lambda v: v != "", "a non-empty prompt"),
]


def check_settings(s, explicit=(), unset="the default"):
    """SettingsError naming the first bad setting, as the user wrote it (`explicit`: the keys
    set on the command line; the others are named as coming from `unset`); then GPTConfig's
    own check of the model's fields (those of s), before any data is read."""
    check_tokenizer(s["tokenizer"])                   # a bad spec, or bpe:N without its package: one line now
    for keys, ok, what in CHECKS:
        for key in keys:
            if not ok(s[key]):
                raise SettingsError(f"{key} must be {what}, got {s[key]!r}")
    try:
        check_optimizer(s)                            # --optimizer and the kfac_* settings
    except ValueError as e:
        raise SettingsError(str(e)) from None
    if s["min_lr"] > s["learning_rate"]:
        given = lambda k: f"{k}={s[k]!r}" + ("" if k in explicit else f" ({unset})")
        raise SettingsError(f"{given('min_lr')} is above {given('learning_rate')}: the learning rate would "
                            "rise during the decay; set --min_lr to at most --learning_rate")
    GPTConfig(**{f.name: s[f.name] for f in fields(GPTConfig) if f.name in s})   # ValueError names a bad model field
